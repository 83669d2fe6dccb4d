"""Peak resident memory of a training and of a translation phase, each in a fresh process.

A fresh process per phase, so that each peak is that phase's own and not the benchmark's (which
holds two models, three translators and the corpus by then); it is set up as the commands set
themselves up (threads, malloc), since malloc's settings change how much freed memory is kept.
"""

from __future__ import annotations

import multiprocessing
import resource
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from transformer.config import ModelConfig
from transformer.data.batch import Batch
from transformer.decoding.translator import Translator

from .training import build_trainees, train_step
from .workload import configure_process


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


def training_memory(cfg: ModelConfig, vocab_size: int, batches: list[Batch], threads: int) -> dict:
    """Peak RSS of training steps of our model in fp32 (run in a fresh process)."""
    configure_process(threads)
    before = peak_rss_mb()
    ours = build_trainees(cfg, vocab_size)["ours"]
    optimizer = ours.optimizer()
    for batch in batches:
        train_step(ours, optimizer, batch, "fp32")
    return {"rss_after_imports_mb": before, "peak_rss_mb": peak_rss_mb(), "steps": len(batches)}


def translation_memory(checkpoint: Path, sources: list[str], threads: int) -> dict:
    """Peak RSS of loading a checkpoint and translating with beam 5 in fp32 (run in a fresh process)."""
    configure_process(threads)
    before = peak_rss_mb()
    Translator.from_checkpoint(checkpoint, "cpu").translate(sources, beam_size=5)
    return {"rss_after_imports_mb": before, "peak_rss_mb": peak_rss_mb(), "sentences": len(sources)}


def in_fresh_process(function: Callable[..., dict], *args) -> dict:
    """Run ``function(*args)`` in a spawned process, so that its memory peak is its own."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as executor:
        return executor.submit(function, *args).result()
