"""Training steps of this checkout against another commit's, in one run: did a change slow training down on
the CPU? (issue 32: nothing gets slower on the CPU.)

    python -m scripts.benchmarks.training_versions --base ea89009^ --steps 60 --rounds 3 [section.key=value ...]

Each round trains the Multi30k de→en recipe's model (``--config``, this checkout's) from scratch for
``--steps`` updates with both versions, in alternating order, in fresh processes on one thread: the same
config, corpus, seed and precision (``--precision``; auto is bf16 where the CPU computes it). A run
trains its tokenizer and encodes the corpus before its first step; the figures are the training loop's
wall seconds (the run's own clock, from the first update to the last) and the whole run's CPU seconds.
It prints their medians, the ratios this/base, and whether the logged losses are identical.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from .versions import ROOT, alternate, checkouts, print_medians, run_fresh

TIMED = """
import json, sys, time
from transformer import load_config
from transformer.training import train
from transformer.training.metrics import read_metrics
config, run_dir, *overrides = sys.argv[1:]
cpu = time.process_time()
summary = train(load_config(config, [f"train.run_dir={run_dir}", *overrides]))
print(json.dumps({"seconds": summary.seconds, "cpu_seconds": time.process_time() - cpu, "step": summary.step,
                  "losses": [r["loss"] for r in read_metrics(run_dir) if r["kind"] == "train"]}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare with")
    parser.add_argument("--this", default="", help="a commit to time instead of this checkout")
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "multi30k_de_en.yaml")
    parser.add_argument("overrides", nargs="*", help="section.key=value for both versions' runs")
    data_root = Path(os.environ.get("TRANSFORMER_DATA", ROOT.parent / "shared" / "data"))
    parser.add_argument("--data", type=Path, default=data_root / "multi30k")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    args = parser.parse_args()
    overrides = [f"data.dataset={args.data.resolve()}", f"train.max_steps={args.steps}", "train.max_time=",
                 "train.valid_every=0", "train.save_every=0", "train.log_every=10", "train.threads=1",
                 f"train.precision={args.precision}", *args.overrides]
    with tempfile.TemporaryDirectory() as tmp:
        with checkouts(args.base, args.this, Path(tmp)) as versions:  # each run in a new directory of its own
            results = alternate(versions, args.rounds, lambda code: run_fresh(
                code, TIMED, str(args.config.resolve()), tempfile.mkdtemp(dir=tmp), *overrides))
    print(f"{args.config.name}, {args.steps} updates, {args.precision}, 1 thread, median of {args.rounds}, "
          f"this {args.this or 'checkout'} against base {args.base}:")
    print_medians(results, {"training loop, wall": "seconds",
                            "whole run (tokenizer, data, training), CPU": "cpu_seconds"})
    print(f"losses identical: {results['this'][-1]['losses'] == results['base'][-1]['losses']} "
          f"({len(results['this'][-1]['losses'])} logged)")


if __name__ == "__main__":
    main()
