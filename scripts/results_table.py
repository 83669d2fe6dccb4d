"""The README's results table, regenerated from the run directories that `run_recipe.sh` filled.

Every figure comes from the run's own records, never from a checkpoint, so that the small files
can be kept in docs/runs/ after the checkpoints are gone: scores, signatures and the chosen
checkpoint's step from the test report, its rival from the validation reports, the CPU, its flags,
precision, threads and parameter count from the ``session`` records training writes at each start
or resume, steps and training seconds from its ``stop`` record, the command from ``command.txt``.
Nothing is typed in by hand.

Usage: python scripts/results_table.py RUN_DIR [RUN_DIR ...] [--curves DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from transformer.config_loading import load_config
from transformer.plots import plot_training_curves
from transformer.runtime.machine import machine_text
from transformer.training.metrics import read_metrics

HEADER = ["run", "BLEU", "chrF2", "TER", "params", "training", "machine", "checkpoint", "command"]


def read_json(path: Path) -> dict:
    if not path.is_file():
        raise SystemExit(f"error: {path} is missing: run the recipe (scripts/run_recipe.sh) or scripts/demo.sh first")
    return json.loads(path.read_text(encoding="utf-8"))


def describe_sessions(sessions: list[dict]) -> tuple[str, str]:
    """(training conditions, machine) of a run's ``session`` records; each distinct machine is named."""
    conditions = sorted({f"{s['precision']}, {s['threads']} thread{'s' * (s['threads'] > 1)}" for s in sessions})
    machines = sorted({machine_text(s) for s in sessions})
    resumed = f", {len(sessions)} sessions" if len(sessions) > 1 else ""
    return "; ".join(conditions) + resumed, " / ".join(machines)


def describe_run(run_dir: Path) -> tuple[list[str], dict]:
    """One table row for ``run_dir`` and the test report's signatures."""
    cfg = load_config(run_dir / "config.yaml")
    test = read_json(run_dir / f"{cfg.data.test_split}.json")
    # the recipe's three candidates (older recipes scored no last checkpoint; demo.sh scores none)
    reports = {name: run_dir / f"{cfg.data.valid_split}.{name}.json" for name in ("best", "averaged", "last")}
    valid = {name: read_json(path) for name, path in reports.items() if path.is_file()}
    chosen = Path(test["checkpoint"]).stem.removeprefix("checkpoint_")
    records = read_metrics(run_dir)
    sessions = [r for r in records if r["kind"] == "session"]
    stops = [r for r in records if r["kind"] == "stop"]
    if not sessions or not stops:
        raise SystemExit(f"error: {run_dir}/metrics.jsonl has no {'stop' if sessions else 'session'} record: "
                         f"training has not finished, or ran on a version that did not write them")
    conditions, machine = describe_sessions(sessions)
    command = (run_dir / "command.txt").read_text(encoding="utf-8").strip() if (run_dir / "command.txt").is_file() \
        else "not recorded"
    scores, decoding = test["scores"], test["decoding"]
    valid_bleu = ", ".join(f"{name} {report['scores']['bleu']['score']:.2f}" for name, report in valid.items())
    search = f"beam {decoding['beam_size']}, length penalty {decoding['length_penalty']}"  # as test was decoded
    choice = (f"validation BLEU, {search}: {valid_bleu}" if valid else
              f"best on validation during training, {cfg.train.best_metric}; test: {search}")
    data = cfg.data
    row = [f"{run_dir.name}: {Path(data.dataset).name} {data.src_lang}→{data.tgt_lang} ({data.test_split})",
           f"{scores['bleu']['score']:.2f}", f"{scores['chrf']['score']:.2f}", f"{scores['ter']['score']:.2f}",
           f"{sessions[-1]['parameters'] / 1e6:.1f}M (d {cfg.model.d_model}, {cfg.model.n_encoder_layers}+"
           f"{cfg.model.n_decoder_layers} layers, {cfg.data.vocab_size // 1000}k "
           f"{'joint' if cfg.data.joint_vocab else 'separate'} vocab)",
           f"{stops[-1]['elapsed'] / 60:.0f} min, {stops[-1]['step']:,} steps, {conditions}",
           machine,
           f"{chosen}, step {test['step']:,} ({choice})",
           f"`{command}`"]
    return row, {name: score["signature"] for name, score in scores.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories of finished recipes")
    parser.add_argument("--curves", type=Path, help="also draw each run's training curves as DIR/<run>.png")
    args = parser.parse_args(argv)
    rows, signatures = [], {}
    for run_dir in args.runs:
        row, signatures[run_dir] = describe_run(run_dir)
        rows.append(row)
        if args.curves:
            args.curves.mkdir(parents=True, exist_ok=True)
            print(f"curves: {plot_training_curves(run_dir, args.curves / f'{run_dir.name}.png')}", file=sys.stderr)
    print("| " + " | ".join(HEADER) + " |\n|" + "---|" * len(HEADER))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    for name in ("bleu", "chrf", "ter"):
        print(f"\n{name}: " + " / ".join(sorted({f'`{s[name]}`' for s in signatures.values()})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
