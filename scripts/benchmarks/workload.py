"""What the benchmark runs on: its settings, this machine, the corpus and its batches, and padding.

The environment is recorded with the figures because they depend on it: the CPU's flags decide
whether bf16 and int8 are fast, and the load average says whether the machine was shared. bf16 is
only measured where the CPU computes it natively: emulated, a bf16 matrix product ran at about
1 GFLOP/s on an AVX2-only CPU, and the benchmark never finished its training part.

Padding is measured here because it is a property of the batches, not of a model: the token-budget
batches that training uses against random batches of the same mean number of sentences.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from datasets import Dataset

from transformer.checkpoint import load_checkpoint
from transformer.config import DataConfig, ModelConfig
from transformer.config_loading import config_from_dict
from transformer.data.batch import Batch, make_batch, training_batch
from transformer.data.batching import TrainBatches, padding_overhead, token_batches
from transformer.data.cleaning import clean_training_pairs
from transformer.data.loading import load_split
from transformer.data.tokenizer import train_tokenizer
from transformer.fast.malloc import keep_freed_memory
from transformer.runtime.machine import describe_machine

BF16_EMULATED = "bf16 is emulated on this CPU (no avx512_bf16/amx_bf16)"


@dataclass
class Settings:
    """What differs between the full benchmark and ``--tiny``."""

    model: ModelConfig
    vocab_size: int
    batch_tokens: int
    train_samples: int | None  # first N training pairs; None = all
    batches: int  # training batches per model and round
    rounds: int
    test_sentences: int | None  # None = the whole test split
    no_cache_sentences: int
    decode_batch: int  # sentences per decoding batch
    matmul_size: int
    serve_clients: int  # concurrent clients of the serving load test
    serve_requests: int  # requests of 1-4 sentences each, per mode
    serve_time_cap_s: float  # per mode


# dropout 0.1 wherever nn.Transformer puts it (sublayers, attention weights, after the FFN's ReLU)
DROPOUT = dict(dropout=0.1, attention_dropout=0.1, activation_dropout=0.1)
FULL = Settings(ModelConfig(d_model=256, n_heads=4, d_ff=1024, n_encoder_layers=3, n_decoder_layers=3, **DROPOUT),
                vocab_size=8000, batch_tokens=4096, train_samples=None, batches=4, rounds=5, test_sentences=None,
                no_cache_sentences=200, decode_batch=64, matmul_size=2048, serve_clients=32, serve_requests=512,
                serve_time_cap_s=300)
TINY = Settings(ModelConfig(d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2, **DROPOUT),
                vocab_size=500, batch_tokens=512, train_samples=2000, batches=2, rounds=2, test_sentences=12,
                no_cache_sentences=6, decode_batch=4, matmul_size=256, serve_clients=4, serve_requests=16,
                serve_time_cap_s=60)


# -- machine -----------------------------------------------------------------------------------

def environment() -> dict:
    """This machine (`describe_machine`) and its load average when the benchmark starts."""
    return {**describe_machine(), "load_average_at_start": os.getloadavg()}


def native_precisions(precisions: tuple[str, ...], fast_bf16: bool) -> tuple[str, ...]:
    """``precisions`` less bf16 where the CPU only emulates it (``fast_bf16`` False)."""
    return tuple(precision for precision in precisions if fast_bf16 or precision != "bf16")


def skipped_precisions(fast_bf16: bool) -> dict[str, str]:
    """The precisions left out of every measurement, with the reason, for the report."""
    return {} if fast_bf16 else {"bf16": BF16_EMULATED}


def configure_process(threads: int) -> None:
    """Threads and malloc as the commands set them: in the benchmark's process and in each fresh one."""
    torch.set_num_threads(threads)
    keep_freed_memory()


# -- corpus ------------------------------------------------------------------------------------

@dataclass
class Workload:
    """The corpus as the benchmark uses it."""

    data: DataConfig
    corpus: str  # "multi30k" or "synthetic"
    tokenizer_dir: Path
    vocab_size: int
    train_batches: list[Batch]
    src_lengths: list[int]  # every cleaned training pair, + eos
    tgt_lengths: list[int]  # + bos / eos
    test_sources: list[str]
    test_references: list[str]
    encoded: Dataset  # the cleaned training pairs, as training reads them


def write_synthetic_corpus(directory: Path, seed: int = 0) -> Path:
    """Random word sequences as a de/en corpus in Multi30k's layout, for --tiny without the corpus."""
    rng = random.Random(seed)
    words = "ein zwei drei hund katze mann frau kind spielt rennt liest im park auf der strasse".split()
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 2000), ("val", 50), ("test2016", 50)):
        lines = [" ".join(rng.choices(words, k=rng.randint(3, 15))) for _ in range(n)]
        (directory / f"{split}.de").write_text("".join(f"{line}\n" for line in lines))
        (directory / f"{split}.en").write_text("".join(f"{line.upper()}\n" for line in lines))
    return directory


def load_workload(data_root: Path, settings: Settings, tiny: bool, tmp: Path) -> Workload:
    """Train the tokenizer on the training split, encode and clean it, cut token-budget batches."""
    directory, corpus = data_root / "multi30k", "multi30k"
    if not directory.is_dir():
        if not tiny:
            sys.exit(f"corpus not found: {directory}; set --data or $TRANSFORMER_DATA (or run with --tiny)")
        print(f"corpus not found: {directory}; --tiny measures a synthetic corpus instead", file=sys.stderr)
        directory, corpus = write_synthetic_corpus(tmp / "synthetic"), "synthetic"
    cfg = DataConfig(dataset=str(directory), src_lang="de", tgt_lang="en", valid_split="val",
                     test_split="test2016", vocab_size=settings.vocab_size, batch_tokens=settings.batch_tokens,
                     max_train_samples=settings.train_samples)
    train = load_split(cfg, cfg.train_split, tmp / "cache")
    tokenizer = train_tokenizer(cfg, train["src"], train["tgt"], tmp, seed=1)
    encoded, _ = clean_training_pairs(train, cfg, tokenizer, tmp / "cache")
    src_lengths, tgt_lengths = [n + 1 for n in encoded["src_len"]], [n + 1 for n in encoded["tgt_len"]]
    order = token_batches(src_lengths, tgt_lengths, cfg.batch_tokens, seed=0, epoch=0, pool_batches=cfg.pool_batches)
    batches = []
    for indices in order[:settings.batches]:
        rows = encoded[indices]
        batches.append(make_batch(rows["src_ids"], rows["tgt_ids"], indices, cfg.pad_id, cfg.bos_id, cfg.eos_id))
    test = load_split(cfg, cfg.test_split, tmp / "cache")
    limit = settings.test_sentences or len(test)
    return Workload(cfg, corpus, tmp, tokenizer.src_vocab_size, batches, src_lengths, tgt_lengths,
                    test["src"][:limit], test["tgt"][:limit], encoded)


def batching_benchmark(workload: Workload, seed: int = 0) -> dict:
    """Padding of a token-budget epoch against random batches with the same mean number of sentences, and
    the milliseconds it takes to build a training batch (`batch_building`)."""
    src, tgt = workload.src_lengths, workload.tgt_lengths
    budget = token_batches(src, tgt, workload.data.batch_tokens, seed, 0, workload.data.pool_batches)
    size = max(1, round(len(src) / len(budget)))
    order = np.random.default_rng(seed).permutation(len(src)).tolist()
    fixed = [order[i:i + size] for i in range(0, len(order), size)]
    return {"batch_tokens": workload.data.batch_tokens, "sentences": len(src), "mean_batch_sentences": size,
            "token_budget": {"src": padding_overhead(budget, src), "tgt": padding_overhead(budget, tgt)},
            "random_fixed_size": {"src": padding_overhead(fixed, src), "tgt": padding_overhead(fixed, tgt)},
            "batch_building_ms": batch_building(workload)}


def batch_building(workload: Workload, count: int = 50) -> dict[str, float]:
    """Median milliseconds to build each of an epoch's first ``count`` training batches in GPU shapes
    (data.pad_to_multiple=8, data.pad_rows) from the encoded corpus: as `TrainBatches` does (arrow's take of
    the rows), and through `Dataset.__getitem__` and Python lists, as it did before (both padded by
    `make_batch`'s scatter since commit ea750df). A step of the recipe's model under CUDA graphs takes a few
    milliseconds on a GPU, and the host builds the next batch in that time or adds to it."""
    cfg = replace(workload.data, pad_to_multiple=8, pad_rows=True)
    batches = TrainBatches(workload.encoded, cfg, seed=0)
    order, stream = batches.epoch_batches(0)[:count], iter(batches)

    def milliseconds(build: Callable[[list[int]], object]) -> float:
        times = []
        for indices in order:
            start = time.perf_counter()
            build(indices)
            times.append(1e3 * (time.perf_counter() - start))
        return statistics.median(times)

    def through_getitem(indices: list[int]) -> None:
        rows = workload.encoded[indices]
        training_batch(rows["src_ids"], rows["tgt_ids"], indices, cfg)

    return {"TrainBatches": milliseconds(lambda indices: next(stream)), "Dataset.__getitem__": milliseconds(
        through_getitem)}


def test_texts(workload: Workload, checkpoint: Path) -> tuple[list[str], list[str]]:
    """The workload's test sentences and references in the checkpoint's languages (the workload's own are
    de→en): a model decodes sentences of its own source language, scored against its target language."""
    langs = config_from_dict(load_checkpoint(checkpoint)["config"], where=str(checkpoint)).data
    if (langs.src_lang, langs.tgt_lang) == (workload.data.src_lang, workload.data.tgt_lang):
        return workload.test_sources, workload.test_references
    cfg = replace(workload.data, src_lang=langs.src_lang, tgt_lang=langs.tgt_lang)
    test = load_split(cfg, cfg.test_split, workload.tokenizer_dir / "cache")
    return test["src"][: len(workload.test_sources)], test["tgt"][: len(workload.test_sources)]
