"""Benchmark training, decoding, batching, memory and serving on this machine; print tables, write JSON.

One run measures, on the same machine and the same batches:

1. training throughput (target tokens/s of forward + backward + Adam step) of our `Transformer`
   against a baseline assembled from `torch.nn.Transformer` with the same sizes and embeddings,
   each with its loss and optimizer (ours as in training; the baseline torch's stock
   cross_entropy with the same label smoothing; both with fused Adam), on Multi30k token-budget
   batches, in fp32 and bf16 autocast. The two alternate (A B A B ...) over ``--rounds`` rounds
   and medians are reported: the machine may be shared;
2. model FLOPs utilisation: the FLOP/s of those steps against a matmul peak measured here;
3. where a training step spends its time: forward / loss / backward / optimizer, and torch.profiler's
   operators by self time, for both models in both precisions (also drawn beside the JSON:
   benchmark.json -> benchmark_profiles.png);
4. decoding Multi30k test2016: greedy and beam 5, with the decoder cache and without it
   (recomputing the prefix, timed on the first ``--no-cache-sentences`` sentences, with the
   cached search timed on the same ones for the speed-up), in fp32, bf16 weights and int8, with
   one batch at a time on every thread and with ``--decode-workers`` batches at once sharing
   the threads, and the BLEU of each run's translations of the whole split; and the time of
   ``Translator.translate`` (beam 5, its own token-budget batches), as transformer-translate runs;
5. padding of the token-budget batches against random batches of the same mean size;
6. peak resident memory of a training and of a translation phase, each in a fresh process;
7. our decoder against CTranslate2 on the same weights: test2016 with beam 5, ours in fp32, bf16
   and int8 and CTranslate2 in float32 and int8, with the same threads and workers: seconds,
   sentences/s, BLEU and the ratio ours / CTranslate2 (needs the `export` extra).

8. with ``--parts serving`` (not in the default run): transformer-serve on loopback under 32
   concurrent clients, with cross-request batching and one request at a time: requests/s,
   sentences/s, latency percentiles, lost and mismatched answers;
9. with ``--parts gpu --device cuda`` (not in the default run): training on a GPU, ours against the
   baseline at the paper's base size and the Multi30k recipe's, at 4k and 25k-token batches of the
   corpus's sentence lengths, bf16 and fp16, eager and compiled: tokens/s, MFU, profiles (under 3
   minutes on one H100; docs/gpu.md).

``--parts`` runs some of them only, e.g. ``--parts engines`` (the others' tables are left out).

Usage:
    python scripts/benchmark.py --output runs/benchmark.json              # about 6 min on 2 cores
    python scripts/benchmark.py --checkpoint runs/multi30k_de_en/checkpoint_best.pt --rounds 7
    python scripts/benchmark.py --tiny --output /tmp/benchmark.json       # every mode in seconds
    python scripts/benchmark.py --parts engines --checkpoint runs/multi30k_de_en/checkpoint_best.pt
    python scripts/benchmark.py --parts serving --checkpoint C --threads 2 # the load test alone
    python scripts/benchmark.py --parts gpu --device cuda --output gpu.json

The corpus is ``--data``/multi30k (default ``$TRANSFORMER_DATA`` or ../shared/data); a
SentencePiece model of 8000 pieces is trained on its training split in a temporary directory.
Decoding uses ``--checkpoint`` (default runs/multi30k_de_en/checkpoint_best.pt). ``--tiny`` uses
a tiny model, a slice of the corpus (or, without one, a synthetic corpus) and a randomly
initialised model for decoding, so that every mode runs in seconds (tests/test_benchmark.py).

bf16 is measured only where the CPU computes it natively (AVX512-BF16 or AMX): emulated, it is
far slower than fp32 and the benchmark would not finish; the JSON's "skipped" and the report say so.
The parts live in scripts/benchmarks/: workload.py (settings, machine, corpus, padding),
training.py, gpu.py, decoding.py, engines.py, memory.py, serving.py and report.py.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

import datasets
import torch
from benchmarks.decoding import decoding_benchmark, random_checkpoint
from benchmarks.engines import engines_benchmark
from benchmarks.gpu import gpu_benchmark, gpu_profiles, gpu_report
from benchmarks.memory import in_fresh_process, training_memory, translation_memory
from benchmarks.report import plot_profiles, print_report
from benchmarks.serving import serving_benchmark
from benchmarks.training import training_benchmark
from benchmarks.workload import (
    FULL,
    TINY,
    batching_benchmark,
    configure_process,
    environment,
    load_workload,
    skipped_precisions,
    test_texts,
)

from transformer.atomic_file import atomic_write

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CHECKPOINT = ROOT / "runs" / "multi30k_de_en" / "checkpoint_best.pt"
PARTS = ("batching", "training", "decoding", "engines", "memory", "serving", "gpu")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny model and few batches: every mode in seconds")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS[:-2]),
                        help="what to measure (default: all but serving and gpu)")
    parser.add_argument("--device", type=torch.device, default="cuda",
                        help="where the gpu part trains (default cuda; cpu tries its cases there); the others run on "
                             "the CPU")
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
    for name in ("threads", "rounds", "batches", "no_cache_sentences", "decode_batch"):  # None: its default
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.checkpoint is not None and not args.checkpoint.is_file():
        parser.error(f"--checkpoint {args.checkpoint}: no such file")
    if "gpu" in args.parts and args.device.type == "cuda" and not torch.cuda.is_available():  # it ran on the CPU
        parser.error("--parts gpu trains on CUDA, which this torch or machine has not: give --device cpu to try its "
                     "cases on the CPU")
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
    fast_bf16 = results["environment"]["fast_bf16"]
    if skipped := skipped_precisions(fast_bf16):
        results["skipped"] = skipped
    with tempfile.TemporaryDirectory(prefix="benchmark-") as tmp:
        workload = load_workload(args.data, settings, args.tiny, Path(tmp))
        results["corpus"] = workload.corpus
        checkpoint = args.checkpoint or (DEFAULT_CHECKPOINT if DEFAULT_CHECKPOINT.exists() and not args.tiny
                                         else random_checkpoint(workload, settings.model))
        parts = set(args.parts)
        test_sources, test_references = test_texts(workload, checkpoint)
        if "batching" in parts:
            results["batching"] = batching_benchmark(workload)
        if "training" in parts:
            results["training"] = training_benchmark(workload, settings, fast_bf16)
        if "decoding" in parts:
            # --tiny shows the form of the figures: one run of a search, one process an engine, not the best of two
            results["decoding"] = decoding_benchmark(checkpoint, test_sources, test_references,
                                                     settings.decode_batch, settings.no_cache_sentences,
                                                     args.decode_workers, fast_bf16, repeats=1 if args.tiny else 2)
        if "engines" in parts:
            results["engines"] = engines_benchmark(checkpoint, test_sources, test_references, args.decode_workers,
                                                   fast_bf16, Path(tmp), repeats=1 if args.tiny else 2)
        if "memory" in parts:
            results["memory"] = {
                "training": in_fresh_process(training_memory, settings.model, workload.vocab_size,
                                             workload.train_batches, args.threads),
                "translation": in_fresh_process(translation_memory, checkpoint, test_sources, args.threads)}
        if "serving" in parts:
            results["serving"] = serving_benchmark(checkpoint, test_sources, settings.serve_clients,
                                                   settings.serve_requests, settings.serve_time_cap_s)
        if "gpu" in parts:
            def save_so_far(gpu: dict) -> None:  # each case as it ends: a call cut short by its limit keeps them
                write_json(args.output, {**results, "gpu": gpu})
                if profiles := gpu_profiles(gpu):
                    plot_profiles(profiles, profiles_path(args.output))

            results["gpu"] = gpu_benchmark(workload, settings.rounds, settings.batches, args.device, args.tiny,
                                           save_so_far)
    results["environment"]["load_average_at_end"] = os.getloadavg()
    print_report(results)
    if "gpu" in results:
        gpu_report(results["gpu"])
    write_json(args.output, results)
    if profiles := step_profiles(results):
        print(f"wrote {plot_profiles(profiles, profiles_path(args.output))}")
    print(f"\nwrote {args.output}")


def step_profiles(results: dict) -> dict[str, dict]:
    """Every profiled training step of the run, labelled: the CPU's by precision and model, the GPU's by case."""
    training = results.get("training", {}).get("profile", {})
    cpu = {f"{precision} {model}": profile for precision, models in training.items()
           for model, profile in models.items()}
    return {**cpu, **(gpu_profiles(results["gpu"]) if "gpu" in results else {})}


def profiles_path(output: Path) -> Path:
    """Where the plot of the profiled steps goes: beside the JSON (benchmark.json -> benchmark_profiles.png)."""
    return output.with_name(f"{output.stem}_profiles.png")


def write_json(path: Path, results: dict) -> None:
    """``results`` into ``path`` whole or not at all: a run killed while writing leaves the last complete file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as partial:
        partial.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
