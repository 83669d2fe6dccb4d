"""Decoding speed and quality per precision: greedy and beam 5, with the decoder cache and without.

Each precision (fp32, bf16 weights where the CPU computes bf16 natively, int8 Linear layers)
decodes the test split greedily and with beam 5, one batch at a time on every thread and with
several batches at once sharing the threads (as ``transformer-translate --workers``); the BLEU of
each run's translations shows what a precision costs in quality. The search without the cache
recomputes every prefix: it is timed on the first ``no_cache_sentences`` sentences, against the
cached search on the same ones, for the speed-up the cache gives. ``Translator.translate`` is
timed too, with its own token-budget batches, as transformer-translate runs it.
"""

from __future__ import annotations

import itertools
import math
import time
from pathlib import Path

import torch
from torch import Tensor

from transformer.checkpoint import save_checkpoint
from transformer.config import Config, DecodeConfig, ModelConfig
from transformer.config_loading import config_to_dict
from transformer.data.batch import pad_sequences
from transformer.decoding.inputs import SOURCE_LENGTH_MULTIPLE
from transformer.decoding.translator import Translator
from transformer.evaluate import score_translations
from transformer.model.transformer import Transformer
from transformer.runtime.threads import parallel_map

from .workload import Workload, native_precisions

# how Translator.from_checkpoint loads each precision
LOAD_OPTIONS = {"fp32": {}, "bf16": {"dtype": "bf16"}, "int8": {"quantize": "int8"}}
PRECISIONS = tuple(LOAD_OPTIONS)
SEARCHES = (("greedy", 1), ("beam5", 5))  # name, beam size
DecodeBatch = tuple[list[int], Tensor]  # positions in the split, source ids (B, S)


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


def load_translators(checkpoint: Path, precisions: tuple[str, ...]) -> dict[str, Translator]:
    """The checkpoint's model on the CPU in each precision: fp32, bf16 weights, int8 Linear layers."""
    return {precision: Translator.from_checkpoint(checkpoint, "cpu", **LOAD_OPTIONS[precision])
            for precision in precisions}


def decode_batches(ids: list[list[int]], size: int, pad_id: int) -> list[DecodeBatch]:
    """Batches of ``size`` sentences of similar length, longest first, as (positions, src (B, S)), padded as the
    translator pads them (`SOURCE_LENGTH_MULTIPLE`)."""
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    chunks = [order[i:i + size] for i in range(0, len(order), size)]
    return [(chunk, pad_sequences([ids[i] for i in chunk], pad_id, SOURCE_LENGTH_MULTIPLE)) for chunk in chunks]


def search_once(translator: Translator, src: Tensor, beam_size: int, use_cache: bool) -> list[list[int]]:
    """The best output's token ids for each source of one batch (B, S), greedy for beam size 1: the
    benchmark's one call of `Translator.search_batch`."""
    decode = translator.settings(beam_size=beam_size, nbest=1)
    return [hyps[0].tokens for hyps in translator.search_batch(src, decode, use_cache)]


def run_search(translator: Translator, batches: list[DecodeBatch], beam_size: int, use_cache: bool,
               workers: int = 1, repeats: int = 2) -> tuple[dict, list[list[int]]]:
    """Time greedy (beam 1) or beam search over the batches, ``workers`` batches at once (as
    ``transformer-translate --workers``); returns the rates of the fastest of ``repeats`` runs and
    the token ids in the order of the split.

    The first run of a search meets matrix shapes that oneDNN has not seen, and in bf16 it builds
    a kernel for each: the uncached bf16 search, which meets new shapes at every step, ran 1.3-1.7x
    slower the first time (fp32 and int8: within 10%). The fastest run compares the searches in
    their steady state.
    """
    def search(batch: DecodeBatch) -> tuple[list[int], list[list[int]]]:
        indices, src = batch
        return indices, search_once(translator, src, beam_size, use_cache)

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
                       no_cache_sentences: int, worker_counts: list[int], fast_bf16: bool, repeats: int = 2) -> dict:
    """Greedy and beam 5, cached on every sentence and cached vs uncached on a subset, per precision
    (bf16 only with ``fast_bf16``) and number of workers, each the fastest of ``repeats`` runs (`run_search`); BLEU
    of every cached run over the whole split."""
    result: dict = {"checkpoint": str(checkpoint), "sentences": len(sources), "batch_size": batch_size,
                    "no_cache_sentences": min(no_cache_sentences, len(sources)), "threads": torch.get_num_threads()}
    translators = load_translators(checkpoint, native_precisions(PRECISIONS, fast_bf16))
    for precision, translator in translators.items():
        tokenizer = translator.tokenizer
        ids = [x + [tokenizer.eos_id] for x in tokenizer.encode_src(sources)]
        every = decode_batches(ids, batch_size, tokenizer.pad_id)
        partial = no_cache_sentences < len(ids)
        subset = decode_batches(ids[:no_cache_sentences], batch_size, tokenizer.pad_id)
        runs = []
        for workers, (search, beam_size) in itertools.product(worker_counts, SEARCHES):
            cached, outputs = run_search(translator, every, beam_size, True, workers, repeats)
            cached_subset = run_search(translator, subset, beam_size, True, workers, repeats)[0] if partial else cached
            uncached_subset = run_search(translator, subset, beam_size, False, workers, repeats)[0]
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
