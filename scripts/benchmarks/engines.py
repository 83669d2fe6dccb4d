"""Our decoder against CTranslate2 on the same weights: test2016 with beam 5, as a user runs each.

Ours is `Translator.translate` (fp32, bf16 weights where the CPU computes bf16 natively, int8 Linear
layers); CTranslate2 is `CTranslate2Translator` on a folder converted from the same checkpoint, in
float32 and int8. Both take the checkpoint's decoding settings with beam 5 and the same threads:
with W workers ours decodes W batches at once on threads // W threads each, and CTranslate2 gets
inter_threads=W, intra_threads=threads // W. The side-by-side table gives CTranslate2 our token
budget (batch_type "tokens", decode.batch_tokens // beam); CTranslate2 at its own batch settings
is a sweep (`CTRANSLATE2_BATCHES`, all timed in one process per precision and worker count), and
"best" takes each engine's fastest run per precision and worker count. Each run is a
process of its own (once CTranslate2's thread pool has run in a process, ours there was 1.7x slower
on a 2-core Xeon). Each engine runs ``repeats`` times, alternating with the others so that a shared
machine slows them alike, and its fastest run counts. The ratio is ours / CTranslate2 seconds in
the same precision (above 1: ours is slower); BLEU is of each engine's own translations.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from transformer.decoding.translator import Translator
from transformer.evaluate import score_translations
from transformer.fast.malloc import keep_freed_memory

from .decoding import LOAD_OPTIONS
from .workload import native_precisions

CTRANSLATE2_PRECISIONS = {"fp32": None, "int8": "int8"}  # our name -> the quantization of the export
BEAM_SIZE = 5
# CTranslate2's own batching: sentences per batch ("examples", its default type), or source tokens
CTRANSLATE2_BATCHES = [("examples", 16), ("examples", 32), ("examples", 64), ("examples", 128), ("tokens", 2048)]


def engine_keys(fast_bf16: bool) -> list[tuple[str, str]]:
    """(engine, precision) of every engine compared here, in the order of the report."""
    return ([("ours", precision) for precision in native_precisions(tuple(LOAD_OPTIONS), fast_bf16)]
            + [("ctranslate2", precision) for precision in CTRANSLATE2_PRECISIONS])


def load_engine(checkpoint: Path, key: tuple[str, str], workers: int, tmp: Path) -> object:
    """The translator of ``key`` (engine, precision), with ``translate(sentences, beam_size=...)``;
    CTranslate2's needs the `export` extra, and batches within our token budget."""
    engine, precision = key
    if engine == "ours":
        return Translator.from_checkpoint(checkpoint, "cpu", workers=workers, **LOAD_OPTIONS[precision])
    from transformer.deploy.ctranslate2 import CTranslate2Translator
    from transformer.deploy.ctranslate2_export import export_ctranslate2
    quantization = CTRANSLATE2_PRECISIONS[precision]
    folder = tmp / f"ctranslate2-{precision}"
    if not folder.is_dir():
        export_ctranslate2(checkpoint, folder, quantization)
    engine = CTranslate2Translator(folder, compute_type=quantization or "float32",
                                   threads=max(1, torch.get_num_threads() // workers), workers=workers)
    engine.batch_type, engine.batch_size = "tokens", max(engine.decode.batch_tokens // BEAM_SIZE, 1)
    return engine


def run_in_own_process(checkpoint: Path, key: tuple[str, str], workers: int, tmp: Path, sources: list[str],
                       threads: int) -> tuple[float, list[str], int]:
    """Seconds, translations and process id of one run of engine ``key`` in a fresh process, after a
    warm-up there."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_load_and_time, checkpoint, key, workers, tmp, sources, threads).result()


def _load_and_time(checkpoint: Path, key: tuple[str, str], workers: int, tmp: Path, sources: list[str],
                   threads: int) -> tuple[float, list[str], int]:
    keep_freed_memory()  # as the commands run (a spawned process starts without it): ours 3-4% faster
    torch.set_num_threads(threads)
    engine = load_engine(checkpoint, key, workers, tmp)
    engine.translate(sources[:32], beam_size=BEAM_SIZE)  # warm-up: first shapes, oneDNN kernels
    return (*timed(lambda: engine.translate(sources, beam_size=BEAM_SIZE)), os.getpid())


def timed(translate: Callable[[], list[str]]) -> tuple[float, list[str]]:
    """Seconds of one call of ``translate`` and its translations."""
    start = time.perf_counter()
    outputs = translate()
    return time.perf_counter() - start, outputs


def ctranslate2_batches(checkpoint: Path, precision: str, workers: int, tmp: Path, sources: list[str],
                        threads: int, repeats: int) -> dict[tuple[str, int], float]:
    """Seconds of CTranslate2 at each of its own batch settings (`CTRANSLATE2_BATCHES`), the fastest of
    ``repeats`` runs each, alternating, in one fresh process."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_time_batches, checkpoint, precision, workers, tmp, sources, threads, repeats).result()


def _time_batches(checkpoint: Path, precision: str, workers: int, tmp: Path, sources: list[str], threads: int,
                  repeats: int) -> dict[tuple[str, int], float]:
    torch.set_num_threads(threads)
    engine = load_engine(checkpoint, ("ctranslate2", precision), workers, tmp)
    engine.translate(sources[:32], beam_size=BEAM_SIZE)  # warm-up
    seconds = {batch: math.inf for batch in CTRANSLATE2_BATCHES}
    for _ in range(repeats):
        for batch in seconds:
            engine.batch_type, engine.batch_size = batch
            seconds[batch] = min(seconds[batch], timed(lambda: engine.translate(sources, beam_size=BEAM_SIZE))[0])
    return seconds


def engines_benchmark(checkpoint: Path, sources: list[str], references: list[str], worker_counts: list[int],
                      fast_bf16: bool, tmp: Path, repeats: int = 2) -> dict:
    """Seconds, sentences/s and BLEU of each engine and precision per number of workers, and the
    ratios ours / CTranslate2 in our token budget; CTranslate2's seconds at its own batch settings, and the
    best of each engine; ``{"skipped": reason}`` without the `export` extra."""
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return {"skipped": 'CTranslate2 is not installed (pip install -e ".[export]")'}
    result: dict = {"checkpoint": str(checkpoint), "sentences": len(sources), "beam_size": BEAM_SIZE,
                    "threads": torch.get_num_threads(), "runs": [], "ctranslate2_batches": [], "best": []}
    for workers in worker_counts:
        seconds = {key: math.inf for key in engine_keys(fast_bf16)}
        outputs: dict[tuple[str, str], list[str]] = {}
        processes: dict[tuple[str, str], list[int]] = {key: [] for key in seconds}
        for _ in range(repeats):
            for key in seconds:
                elapsed, outputs[key], process = run_in_own_process(checkpoint, key, workers, tmp, sources,
                                                                    result["threads"])
                seconds[key] = min(seconds[key], elapsed)
                processes[key].append(process)
        for (name, precision), elapsed in seconds.items():
            result["runs"].append({
                "engine": name, "precision": precision, "workers": workers, "seconds": elapsed,
                "processes": processes[name, precision],
                "sentences_per_s": len(sources) / elapsed,
                "bleu": score_translations(outputs[name, precision], [references])["bleu"].score})
        result.setdefault("ratio", {})[str(workers)] = {
            precision: seconds["ours", precision] / seconds["ctranslate2", precision]
            for precision in CTRANSLATE2_PRECISIONS}
        for precision in CTRANSLATE2_PRECISIONS:
            own = ctranslate2_batches(checkpoint, precision, workers, tmp, sources, result["threads"], repeats)
            result["ctranslate2_batches"] += [
                {"precision": precision, "workers": workers, "batch_type": kind, "max_batch_size": size,
                 "seconds": elapsed, "sentences_per_s": len(sources) / elapsed}
                for (kind, size), elapsed in own.items()]
            (kind, size), fastest = min(own.items(), key=lambda item: item[1])
            best = {"precision": precision, "workers": workers, "ours": seconds["ours", precision],
                    "ctranslate2": min(fastest, seconds["ctranslate2", precision]),
                    "ctranslate2_batches": f"{kind} {size}" if fastest < seconds["ctranslate2", precision]
                    else "our token budget"}
            result["best"].append({**best, "ratio": best["ours"] / best["ctranslate2"]})
    return result
