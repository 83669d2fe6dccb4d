"""Benchmark training, decoding, batching and memory on this machine; print a table, write JSON.

One run measures, on the same machine and the same batches:

1. training throughput (target tokens/s of forward + backward + Adam step) of our `Transformer`
   against a baseline assembled from `torch.nn.Transformer` with the same sizes and embeddings,
   each with its loss and optimizer (ours as in training; the baseline torch's stock
   cross_entropy with the same label smoothing and default Adam), on Multi30k token-budget
   batches, in fp32 and bf16 autocast. The two alternate (A B A B ...) over ``--rounds`` rounds
   and medians are reported: the machine may be shared;
2. model FLOPs utilisation: the FLOP/s of those steps against a matmul peak measured here;
3. where a training step spends its time: forward / backward / optimizer, and torch.profiler's
   operators by self time, for both models in both precisions;
4. decoding Multi30k test2016: greedy and beam 5, with the decoder cache and without it
   (recomputing the prefix, timed on the first ``--no-cache-sentences`` sentences, with the
   cached search timed on the same ones for the speed-up), in fp32, bf16 weights and int8, with
   one batch at a time on every thread and with ``--decode-workers`` batches at once sharing
   the threads, and the BLEU of each run's translations of the whole split; and the time of
   ``Translator.translate`` (beam 5, its own token-budget batches), as transformer-translate runs;
5. padding of the token-budget batches against random batches of the same mean size;
6. peak resident memory of a training and of a translation phase, each in a fresh process.

Usage:
    python scripts/benchmark.py --output runs/benchmark.json              # about 6 min on 2 cores
    python scripts/benchmark.py --checkpoint runs/multi30k_de_en/checkpoint_best.pt --rounds 7
    python scripts/benchmark.py --tiny --output /tmp/benchmark.json       # every mode in seconds

The corpus is ``--data``/multi30k (default ``$TRANSFORMER_DATA`` or ../shared/data); a
SentencePiece model of 8000 pieces is trained on its training split in a temporary directory.
Decoding uses ``--checkpoint`` (default runs/multi30k_de_en/checkpoint_best.pt). ``--tiny`` uses
a tiny model, a slice of the corpus (or, without one, a synthetic corpus) and a randomly
initialised model for decoding, so that every mode runs in seconds (tests/test_benchmark.py).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import multiprocessing
import os
import platform
import random
import resource
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import datasets
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer.checkpoint import save_checkpoint
from transformer.config import Config, DataConfig, DecodeConfig, ModelConfig, TrainConfig, config_to_dict
from transformer.data.batching import Batch, make_batch, pad_sequences, padding_overhead, token_batches
from transformer.data.loading import clean_training_pairs, load_split
from transformer.data.tokenizer import train_tokenizer
from transformer.decoding.translator import Translator
from transformer.evaluate import score_translations
from transformer.fast.loss import label_smoothed_cross_entropy
from transformer.fast.malloc import keep_freed_memory
from transformer.model.layers import sinusoidal_positional_encoding
from transformer.model.transformer import Transformer, count_parameters
from transformer.runtime.precision import autocast, cpu_has_fast_bf16
from transformer.runtime.threads import parallel_map
from transformer.training.schedule import build_optimizer

CPU = torch.device("cpu")
PAD_ID = DataConfig().pad_id
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CHECKPOINT = ROOT / "runs" / "multi30k_de_en" / "checkpoint_best.pt"
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")
# torch.profiler operators grouped by what they compute (first matching name fragment wins)
CATEGORIES = (("attention", ("scaled_dot_product", "flash_attention")), ("matmul", ("mm", "matmul", "linear")),
              ("dropout", ("dropout", "bernoulli")), ("softmax", ("softmax",)), ("layer norm", ("layer_norm",)),
              ("copy/cast", ("copy_", "_to_copy", "clone", "contiguous")), ("embedding", ("embedding",)),
              ("elementwise", ("add", "mul", "div", "sub", "lerp", "sqrt", "relu", "threshold", "fill", "where")))


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


# dropout 0.1 wherever nn.Transformer puts it (sublayers, attention weights, after the FFN's ReLU)
DROPOUT = dict(dropout=0.1, attention_dropout=0.1, activation_dropout=0.1)
FULL = Settings(ModelConfig(d_model=256, n_heads=4, d_ff=1024, n_encoder_layers=3, n_decoder_layers=3, **DROPOUT),
                vocab_size=8000, batch_tokens=4096, train_samples=None, batches=4, rounds=5, test_sentences=None,
                no_cache_sentences=200, decode_batch=64, matmul_size=2048)
TINY = Settings(ModelConfig(d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2, **DROPOUT),
                vocab_size=500, batch_tokens=512, train_samples=2000, batches=2, rounds=2, test_sentences=12,
                no_cache_sentences=6, decode_batch=4, matmul_size=256)


# -- environment -------------------------------------------------------------------------------

def environment() -> dict:
    """CPU model and the flags that decide bf16/int8 speed, torch version and threads."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")]
    flags = set(cpuinfo.split())
    return {"cpu": names[0] if names else platform.processor(), "cores": os.cpu_count(),
            "flags": {flag: flag in flags for flag in FLAGS}, "fast_bf16": cpu_has_fast_bf16(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
            "python": platform.python_version(), "threads": torch.get_num_threads(),
            "load_average_at_start": os.getloadavg()}


# -- data --------------------------------------------------------------------------------------

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
                    test["src"][:limit], test["tgt"][:limit])


# -- training ----------------------------------------------------------------------------------

class TorchTransformer(nn.Module):
    """The baseline: `torch.nn.Transformer` between the embeddings, positions and tied output
    projection of our model (§3.4, §3.5). nn.Transformer adds a final LayerNorm to each stack."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, pad_id: int) -> None:
        super().__init__()
        self.pad_id, self.scale = pad_id, math.sqrt(cfg.d_model)
        self.embedding = nn.Embedding(vocab_size, cfg.d_model, padding_idx=pad_id)  # source, target and output
        nn.init.normal_(self.embedding.weight, std=cfg.d_model**-0.5)
        self.register_buffer("table", sinusoidal_positional_encoding(cfg.max_positions, cfg.d_model),
                             persistent=False)
        self.dropout = nn.Dropout(cfg.dropout)
        self.transformer = nn.Transformer(cfg.d_model, cfg.n_heads, cfg.n_encoder_layers, cfg.n_decoder_layers,
                                          cfg.d_ff, cfg.dropout, batch_first=True)

    def embed(self, tokens: Tensor) -> Tensor:
        return self.dropout(self.embedding(tokens) * self.scale + self.table[: tokens.size(1)])

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """src (B, S), tgt_in (B, T) -> logits (B, T, V)."""
        padding = src == self.pad_id  # (B, S); True = ignore, nn.Transformer's convention
        length = tgt_in.size(1)
        future = torch.ones(length, length, dtype=torch.bool, device=src.device).triu(1)  # (T, T)
        states = self.transformer(self.embed(src), self.embed(tgt_in), tgt_mask=future, src_key_padding_mask=padding,
                                  memory_key_padding_mask=padding, tgt_is_causal=True)
        return F.linear(states, self.embedding.weight)


def build_models(cfg: ModelConfig, vocab_size: int) -> dict[str, nn.Module]:
    """Ours and the baseline, from the same seed."""
    torch.manual_seed(0)
    ours = Transformer(cfg, vocab_size, pad_id=PAD_ID)
    torch.manual_seed(0)
    return {"ours": ours, "baseline": TorchTransformer(cfg, vocab_size, PAD_ID)}


def make_optimizer(name: str, model: nn.Module) -> torch.optim.Optimizer:
    """Ours: Adam as `training.Trainer` builds it (fused); the baseline: torch.optim.Adam's default
    (on the CPU, its single-tensor loop).

    The learning rate stays at a small constant: the schedule costs nothing and is left out.
    """
    train = TrainConfig()
    if name == "ours":
        optimizer = build_optimizer(model.parameters(), train, CPU)
    else:
        optimizer = torch.optim.Adam(model.parameters(), betas=(train.adam_beta1, train.adam_beta2),
                                     eps=train.adam_eps, weight_decay=train.weight_decay)
    for group in optimizer.param_groups:
        group["lr"] = 1e-4
    return optimizer


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Batch, precision: str) -> dict[str, float]:
    """One update like `Trainer.update`; returns seconds of forward + loss, backward, step.

    Ours uses training's loss; the baseline torch's cross_entropy with the same label smoothing.
    """
    start = time.perf_counter()
    with autocast(CPU, precision):
        logits = model(batch.src, batch.tgt_in)
    if isinstance(model, Transformer):
        loss, _ = label_smoothed_cross_entropy(logits, batch.tgt_out, TrainConfig().label_smoothing, PAD_ID)
    else:
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch.tgt_out.flatten(), ignore_index=PAD_ID,
                               label_smoothing=TrainConfig().label_smoothing, reduction="sum")
    forward = time.perf_counter()
    (loss / batch.n_tgt_tokens).backward()
    backward = time.perf_counter()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"forward": forward - start, "backward": backward - forward, "optimizer": time.perf_counter() - backward}


def time_training(models: dict[str, nn.Module], batches: list[Batch], precision: str, rounds: int) -> dict:
    """Target tokens/s of each model, alternating models round by round after one warm-up step each."""
    optimizers = {name: make_optimizer(name, model.train()) for name, model in models.items()}
    for name, model in models.items():
        train_step(model, optimizers[name], batches[0], precision)  # kernels chosen, Adam state allocated
    tokens = sum(batch.n_tgt_tokens for batch in batches)
    rates: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            start = time.perf_counter()
            for batch in batches:
                train_step(model, optimizers[name], batch, precision)
            rates[name].append(tokens / (time.perf_counter() - start))
    result = {name: {"tokens_per_s": statistics.median(values), "rounds": values} for name, values in rates.items()}
    result["ratio"] = result["ours"]["tokens_per_s"] / result["baseline"]["tokens_per_s"]
    return result


def step_flops(cfg: ModelConfig, vocab_size: int, batch: Batch) -> float:
    """Matmul FLOPs of one training step on the batch's padded shapes: 6 x multiply-adds of the forward.

    Multiply-adds: every weight matrix times the positions it is applied to, plus QKᵀ and the
    weighted sum of the values (2 x Tq x Tk x d_model per sentence and attention, the causal half
    included). Backward costs twice the forward, hence 3 x 2 FLOPs per multiply-add.
    """
    d, d_ff = cfg.d_model, cfg.d_ff
    sentences, src_len = batch.src.shape
    tgt_len = batch.tgt_in.size(1)
    src_positions, tgt_positions = sentences * src_len, sentences * tgt_len
    weights = cfg.n_encoder_layers * (4 * d * d + 2 * d * d_ff) * src_positions  # self-attention, FFN
    weights += cfg.n_decoder_layers * ((6 * d * d + 2 * d * d_ff) * tgt_positions  # self, cross Q and out, FFN
                                       + 2 * d * d * src_positions)  # cross-attention K, V of the memory
    weights += d * vocab_size * tgt_positions  # output projection
    attention = 2 * d * sentences * (cfg.n_encoder_layers * src_len**2
                                     + cfg.n_decoder_layers * (tgt_len**2 + tgt_len * src_len))
    return 6.0 * (weights + attention)


def matmul_peak(dtype: torch.dtype, size: int, repeats: int = 5) -> float:
    """Best FLOP/s of a size x size matrix product in ``dtype`` (what autocast runs the Linears in)."""
    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    a @ b  # warm-up
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def category(name: str) -> str:
    return next((label for label, parts in CATEGORIES if any(part in name for part in parts)), "other")


def profile_training(model: nn.Module, batches: list[Batch], precision: str, top: int = 12) -> dict:
    """Phase times of plain steps, then torch.profiler's operators by self CPU time, both per step."""
    optimizer = make_optimizer("ours" if isinstance(model, Transformer) else "baseline", model.train())
    train_step(model, optimizer, batches[0], precision)
    phases = [train_step(model, optimizer, batch, precision) for batch in batches]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        for batch in batches:
            train_step(model, optimizer, batch, precision)
    events = sorted(profiler.key_averages(), key=lambda e: -e.self_cpu_time_total)
    per_step = 1e-3 / len(batches)  # µs over all steps -> ms per step
    categories: dict[str, float] = {}
    for event in events:
        label = category(event.key)
        categories[label] = categories.get(label, 0.0) + event.self_cpu_time_total * per_step
    phases_ms = {name: 1e3 * statistics.mean(p[name] for p in phases) for name in phases[0]}
    return {"phases_ms": {**phases_ms, "step": sum(phases_ms.values())},
            "categories_ms": dict(sorted(categories.items(), key=lambda kv: -kv[1])),
            "top_ops_ms": [{"op": e.key, "self_ms": e.self_cpu_time_total * per_step,
                            "calls": e.count / len(batches)} for e in events[:top]]}


def training_benchmark(workload: Workload, settings: Settings, rounds: int) -> dict:
    """Throughput of both models in fp32 and bf16, their FLOPs utilisation, and profiles of both."""
    models = build_models(settings.model, workload.vocab_size)
    batches = workload.train_batches
    tokens = sum(batch.n_tgt_tokens for batch in batches)
    flops_per_token = sum(step_flops(settings.model, workload.vocab_size, b) for b in batches) / tokens
    peaks = {precision: matmul_peak(dtype, settings.matmul_size)
             for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))}
    result = {"parameters": {name: count_parameters(model) for name, model in models.items()},
              "batches": len(batches), "target_tokens": tokens, "padded_target_tokens": sum(
                  batch.tgt_in.numel() for batch in batches), "flops_per_target_token": flops_per_token,
              "matmul_peak_flops": peaks, "matmul_size": settings.matmul_size}
    for precision in ("fp32", "bf16"):
        timing = time_training(models, batches, precision, rounds)
        for name in models:
            achieved = timing[name]["tokens_per_s"] * flops_per_token
            timing[name].update(flops_per_s=achieved, mfu=achieved / peaks[precision])
        result[precision] = timing
    result["profile"] = {precision: {name: profile_training(model, batches, precision)
                                     for name, model in models.items()} for precision in ("fp32", "bf16")}
    return result


# -- decoding ----------------------------------------------------------------------------------

def random_checkpoint(workload: Workload, cfg: ModelConfig) -> Path:
    """A randomly initialised model saved next to the workload's tokenizer, for --tiny decoding.

    A random model rarely emits eos, so its outputs are cut at the source length + 2 tokens.
    """
    torch.manual_seed(0)
    data = workload.data
    model = Transformer(cfg, workload.vocab_size, pad_id=data.pad_id, bos_id=data.bos_id, eos_id=data.eos_id)
    path = workload.tokenizer_dir / "checkpoint_random.pt"
    config = Config(model=cfg, data=data, decode=DecodeConfig(max_len_a=1.0, max_len_b=2))
    save_checkpoint({"model": model.state_dict(), "config": config_to_dict(config)}, path)
    return path


def load_translators(checkpoint: Path) -> dict[str, Translator]:
    """The checkpoint's model in fp32, with bf16 weights, and with int8 Linear layers, on the CPU."""
    return {"fp32": Translator.from_checkpoint(checkpoint, "cpu"),
            "bf16": Translator.from_checkpoint(checkpoint, "cpu", dtype="bf16"),
            "int8": Translator.from_checkpoint(checkpoint, "cpu", quantize="int8")}


def decode_batches(ids: list[list[int]], size: int, pad_id: int) -> list[tuple[list[int], Tensor]]:
    """Batches of ``size`` sentences of similar length, longest first, as (positions, src (B, S))."""
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    chunks = [order[i:i + size] for i in range(0, len(order), size)]
    return [(chunk, pad_sequences([ids[i] for i in chunk], pad_id)) for chunk in chunks]


def run_search(translator: Translator, batches: list[tuple[list[int], Tensor]], beam_size: int,
               use_cache: bool, workers: int = 1, repeats: int = 2) -> tuple[dict, list[list[int]]]:
    """Time greedy (beam 1) or beam search over the batches, ``workers`` batches at once (as
    ``transformer-translate --workers``); returns the rates of the fastest of ``repeats`` runs and
    the token ids.

    The first run of a search meets matrix shapes that oneDNN has not seen, and in bf16 it builds
    a kernel for each: the uncached bf16 search, which meets new shapes at every step, ran 1.3-1.7x
    slower the first time (fp32 and int8: within 10%). The fastest run compares the searches in
    their steady state.
    """
    def search(batch: tuple[list[int], Tensor]) -> tuple[list[int], list[list[int]]]:
        indices, src = batch
        return indices, [hyps[0].tokens for hyps in translator.search_batch(src, beam_size, use_cache=use_cache)]

    seconds = math.inf
    for _ in range(repeats):
        found: dict[int, list[int]] = {}
        start = time.perf_counter()
        for indices, outputs in parallel_map(search, batches, workers):
            found.update(zip(indices, outputs))
        seconds = min(seconds, time.perf_counter() - start)
    tokens = sum(len(ids) + 1 for ids in found.values())  # + eos
    rates = {"sentences": len(found), "seconds": seconds, "sentences_per_s": len(found) / seconds,
             "target_tokens": tokens, "tokens_per_s": tokens / seconds}
    return rates, [found[i] for i in sorted(found)]


def decoding_benchmark(checkpoint: Path, sources: list[str], references: list[str], batch_size: int,
                       no_cache_sentences: int, worker_counts: list[int]) -> dict:
    """Greedy and beam 5, cached on every sentence and cached vs uncached on a subset, per precision
    and number of workers; BLEU of every cached run over the whole split."""
    result: dict = {"checkpoint": str(checkpoint), "sentences": len(sources), "batch_size": batch_size,
                    "no_cache_sentences": min(no_cache_sentences, len(sources)), "threads": torch.get_num_threads()}
    for precision, translator in load_translators(checkpoint).items():
        tokenizer = translator.tokenizer
        ids = [x + [tokenizer.eos_id] for x in tokenizer.encode_src(sources)]
        every = decode_batches(ids, batch_size, tokenizer.pad_id)
        partial = no_cache_sentences < len(ids)
        subset = decode_batches(ids[:no_cache_sentences], batch_size, tokenizer.pad_id)
        runs = []
        for workers, (search, beam_size) in itertools.product(worker_counts, (("greedy", 1), ("beam5", 5))):
            cached, outputs = run_search(translator, every, beam_size, True, workers)
            cached_subset = run_search(translator, subset, beam_size, True, workers)[0] if partial else cached
            uncached_subset = run_search(translator, subset, beam_size, False, workers)[0]
            runs.append({"search": search, "workers": workers, "cache": cached, "cache_subset": cached_subset,
                         "no_cache_subset": uncached_subset,
                         "cache_speedup": uncached_subset["seconds"] / cached_subset["seconds"],
                         "bleu": score_translations(tokenizer.decode_tgt(outputs), [references])["bleu"].score})
        result[precision] = runs
        result.setdefault("translate_beam5_seconds", {})[precision] = time_translator(translator, sources,
                                                                                      worker_counts)
    return result


def time_translator(translator: Translator, sources: list[str], worker_counts: list[int]) -> dict[str, float]:
    """Seconds of ``Translator.translate`` with beam 5 and its own token-budget batches (what
    transformer-translate runs), per number of workers."""
    seconds = {}
    for workers in worker_counts:
        translator.workers = workers
        start = time.perf_counter()
        translator.translate(sources, beam_size=5)
        seconds[str(workers)] = time.perf_counter() - start
    translator.workers = 1
    return seconds


# -- batching and memory -----------------------------------------------------------------------

def batching_benchmark(workload: Workload, seed: int = 0) -> dict:
    """Padding of a token-budget epoch against random batches with the same mean number of sentences."""
    src, tgt = workload.src_lengths, workload.tgt_lengths
    budget = token_batches(src, tgt, workload.data.batch_tokens, seed, 0, workload.data.pool_batches)
    size = max(1, round(len(src) / len(budget)))
    order = np.random.default_rng(seed).permutation(len(src)).tolist()
    fixed = [order[i:i + size] for i in range(0, len(order), size)]
    return {"batch_tokens": workload.data.batch_tokens, "sentences": len(src), "mean_batch_sentences": size,
            "token_budget": {"src": padding_overhead(budget, src), "tgt": padding_overhead(budget, tgt)},
            "random_fixed_size": {"src": padding_overhead(fixed, src), "tgt": padding_overhead(fixed, tgt)}}


def peak_rss_mb() -> float:
    """Peak resident memory of this process's own address space, in MiB.

    ru_maxrss is not used where /proc is available: Linux carries it over fork + exec, so a
    spawned child would report its parent's peak if that were higher.
    """
    try:
        status = Path("/proc/self/status").read_text().splitlines()
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024  # kB
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def configure_process(threads: int) -> None:
    """Threads and malloc as the commands set them: in the benchmark's process and in each fresh one."""
    torch.set_num_threads(threads)
    keep_freed_memory()


def training_memory(cfg: ModelConfig, vocab_size: int, batches: list[Batch], threads: int) -> dict:
    """Peak RSS of training steps of our model in fp32 (run in a fresh process)."""
    configure_process(threads)
    before = peak_rss_mb()
    model = build_models(cfg, vocab_size)["ours"]
    optimizer = make_optimizer("ours", model.train())
    for batch in batches:
        train_step(model, optimizer, batch, "fp32")
    return {"rss_after_imports_mb": before, "peak_rss_mb": peak_rss_mb(), "steps": len(batches)}


def translation_memory(checkpoint: Path, sources: list[str], threads: int) -> dict:
    """Peak RSS of loading a checkpoint and translating with beam 5 in fp32 (run in a fresh process)."""
    configure_process(threads)
    before = peak_rss_mb()
    Translator.from_checkpoint(checkpoint, "cpu").translate(sources, beam_size=5)
    return {"rss_after_imports_mb": before, "peak_rss_mb": peak_rss_mb(), "sentences": len(sources)}


def in_fresh_process(function, *args) -> dict:
    """Run ``function(*args)`` in a spawned process, so that its memory peak is its own."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as executor:
        return executor.submit(function, *args).result()


# -- report ------------------------------------------------------------------------------------

def print_table(title: str, header: list[str], rows: list[list]) -> None:
    cells = [header] + [[f"{c:,.3g}" if isinstance(c, float) and abs(c) < 10 else
                         f"{c:,.0f}" if isinstance(c, float) else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    print(f"\n== {title}")
    for row in cells:
        print("  ".join(cell.rjust(width) if i else cell.ljust(width) for i, (cell, width) in
                        enumerate(zip(row, widths))))


def print_report(results: dict) -> None:
    env, train = results["environment"], results["training"]
    flags = " ".join(f"{flag}={'yes' if on else 'no'}" for flag, on in env["flags"].items())
    print(f"cpu: {env['cpu']} ({env['cores']} cores), torch {env['torch']}, {env['threads']} threads\nflags: {flags}")
    print_table(f"training: target tokens/s, median of {len(train['fp32']['ours']['rounds'])} rounds of "
                f"{train['batches']} batches", ["precision", "ours", "nn.Transformer", "ours/baseline",
                                                "MFU ours", "MFU baseline", "matmul peak GFLOP/s"],
                [[p, train[p]["ours"]["tokens_per_s"], train[p]["baseline"]["tokens_per_s"], train[p]["ratio"],
                  f"{train[p]['ours']['mfu']:.1%}", f"{train[p]['baseline']['mfu']:.1%}",
                  train["matmul_peak_flops"][p] / 1e9] for p in ("fp32", "bf16")])
    for precision, profile in train["profile"].items():
        labels = list(dict.fromkeys([*profile["ours"]["phases_ms"], *profile["ours"]["categories_ms"],
                                     *profile["baseline"]["categories_ms"]]))
        print_table(f"{precision} training step, ms: phases, then torch.profiler self time by kind of operator",
                    ["", "ours", "baseline"], [[label, *(p["phases_ms"].get(label, p["categories_ms"].get(label, 0.0))
                                                         for p in profile.values())] for label in labels])
    decoding = results["decoding"]
    rows = [[precision, run["search"], run["workers"], run["cache"]["sentences_per_s"], run["cache"]["tokens_per_s"],
             run["cache"]["seconds"], run["no_cache_subset"]["sentences_per_s"], run["cache_speedup"],
             f"{run['bleu']:.2f}"]
            for precision in ("fp32", "bf16", "int8") for run in decoding[precision]]
    print_table(f"decoding {decoding['sentences']} sentences, batch {decoding['batch_size']}, {decoding['threads']} "
                f"threads shared by the workers (no cache: first {decoding['no_cache_sentences']})",
                ["precision", "search", "workers", "sent/s", "tok/s", "seconds", "no-cache sent/s", "cache speed-up",
                 "BLEU"], rows)
    print_table("Translator.translate of the same sentences, beam 5, in its token-budget batches: seconds",
                ["precision", *(f"workers={workers}" for workers in decoding["translate_beam5_seconds"]["fp32"])],
                [[precision, *seconds.values()] for precision, seconds in decoding["translate_beam5_seconds"].items()])
    batching = results["batching"]
    print_table(f"padding ({batching['batch_tokens']}-token batches, {batching['mean_batch_sentences']} sentences "
                f"on average)", ["batches", "src", "tgt"],
                [[name, f"{batching[name]['src']:.1%}", f"{batching[name]['tgt']:.1%}"]
                 for name in ("token_budget", "random_fixed_size")])
    print_table("peak resident memory, MB (fresh process)", ["phase", "after imports", "peak"],
                [[phase, m["rss_after_imports_mb"], m["peak_rss_mb"]] for phase, m in results["memory"].items()])


# -- main --------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny model and few batches: every mode in seconds")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="CPU threads")
    parser.add_argument("--rounds", type=int, help="training rounds per model and precision (default 5; tiny 2)")
    parser.add_argument("--batches", type=int, help="training batches per round (default 4; tiny 2)")
    parser.add_argument("--output", type=Path, default=Path("benchmark.json"), help="JSON file to write")
    data = os.environ.get("TRANSFORMER_DATA", ROOT / ".." / "shared" / "data")
    parser.add_argument("--data", type=Path, default=Path(data),
                        help="folder holding multi30k/ (default $TRANSFORMER_DATA or ../shared/data)")
    parser.add_argument("--checkpoint", type=Path, help=f"trained model for decoding (default {DEFAULT_CHECKPOINT})")
    parser.add_argument("--no-cache-sentences", type=int, help="sentences decoded without the cache (default 200)")
    parser.add_argument("--decode-batch", type=int, help="sentences per decoding batch (default 64; tiny 4)")
    parser.add_argument("--decode-workers", type=int, nargs="+", default=[1, 2],
                        help="decode with each of these numbers of workers (default 1 2)")
    args = parser.parse_args(argv)
    if min(args.decode_workers) < 1:
        parser.error(f"--decode-workers must be >= 1, got {args.decode_workers}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    base = TINY if args.tiny else FULL
    settings = replace(base, batches=args.batches or base.batches, rounds=args.rounds or base.rounds,
                       no_cache_sentences=args.no_cache_sentences or base.no_cache_sentences,
                       decode_batch=args.decode_batch or base.decode_batch)
    configure_process(args.threads)
    datasets.disable_progress_bars()
    results: dict = {"environment": environment(), "settings": {**asdict(settings), "tiny": args.tiny}}
    with tempfile.TemporaryDirectory(prefix="benchmark-") as tmp:
        workload = load_workload(args.data, settings, args.tiny, Path(tmp))
        results["corpus"] = workload.corpus
        checkpoint = args.checkpoint or (DEFAULT_CHECKPOINT if DEFAULT_CHECKPOINT.exists() and not args.tiny
                                         else random_checkpoint(workload, settings.model))
        results["batching"] = batching_benchmark(workload)
        results["training"] = training_benchmark(workload, settings, settings.rounds)
        results["decoding"] = decoding_benchmark(checkpoint, workload.test_sources, workload.test_references,
                                                 settings.decode_batch, settings.no_cache_sentences,
                                                 args.decode_workers)
        results["memory"] = {
            "training": in_fresh_process(training_memory, settings.model, workload.vocab_size,
                                         workload.train_batches, args.threads),
            "translation": in_fresh_process(translation_memory, checkpoint, workload.test_sources, args.threads)}
    results["environment"]["load_average_at_end"] = os.getloadavg()
    print_report(results)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {args.output}")


if __name__ == "__main__":
    main()
