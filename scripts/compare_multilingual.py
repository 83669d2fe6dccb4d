"""One multilingual model against bilingual models of the same directions, at matched budgets (issue 33).

Each direction of the multilingual config's ``data.pairs`` gets a bilingual model of the same
architecture and settings (its own vocabulary of ``--bilingual-vocab`` pieces, no tag) trained for
``--steps`` updates; the multilingual model trains for ``--steps`` times the number of directions,
so that every direction sees, on average, as many batches in both. Each model is chosen on its
validation split (checkpoint_best) and scored on each direction's test split, the multilingual
model also on ``--zero-shot`` directions it never saw. The table (Markdown) goes to stdout and
``RUN_ROOT/comparison.md``; every run's reports stay in ``RUN_ROOT``.

Usage: python scripts/compare_multilingual.py --steps 1500 [--parallel 7] [--run-root runs/compare] \
           [section.key=value ...]     (overrides for every run, e.g. train.device=cuda train.precision=bf16)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from transformer.config_loading import load_config

CONFIG = "configs/multi30k_multilingual.yaml"


def train_and_score(config: str, run_dir: Path, steps: int, overrides: list[str],
                    directions: list[tuple[str, str]], split: str) -> dict[str, dict]:
    """Train one model for ``steps`` updates, then score ``directions`` on ``split`` with its best-on-validation
    checkpoint: {"src-tgt": the report's scores}. The run's log is ``run_dir``/log.txt."""
    run_dir.mkdir(parents=True, exist_ok=True)
    settings = [f"train.run_dir={run_dir}", f"train.max_steps={steps}", "train.max_time=",
                f"train.valid_every={max(steps // 4, 1)}", f"train.save_every={max(steps // 4, 1)}", *overrides]
    with open(run_dir / "log.txt", "w") as log:
        subprocess.run(["transformer-train", config, *settings], stdout=log, stderr=subprocess.STDOUT, check=True)
        scores = {}
        for src, tgt in directions:
            report = run_dir / f"test.{src}-{tgt}.json"
            subprocess.run(["transformer-evaluate", "--checkpoint", str(run_dir / "checkpoint_best.pt"),
                            "--src-lang", src, "--tgt-lang", tgt, "--split", split, "--report", str(report)],
                           stdout=log, stderr=subprocess.STDOUT, check=True)
            scores[f"{src}-{tgt}"] = json.loads(report.read_text())["scores"]
    return scores


def comparison_table(bilingual: dict[str, dict], multilingual: dict[str, dict], steps: int, n_directions: int) -> str:
    """Markdown: per direction BLEU / chrF of its bilingual model and of the multilingual one, and the BLEU
    difference; directions without a bilingual model (zero-shot) show the multilingual scores alone."""
    lines = [f"| direction | bilingual ({steps:,} steps) BLEU / chrF | multilingual ({steps * n_directions:,} steps) "
             f"BLEU / chrF | BLEU difference |", "|---|---|---|---|"]
    for direction, scores in multilingual.items():
        ours = f"{scores['bleu']['score']:.2f} / {scores['chrf']['score']:.2f}"
        if direction in bilingual:
            theirs = bilingual[direction]
            lines.append(f"| {direction} | {theirs['bleu']['score']:.2f} / {theirs['chrf']['score']:.2f} | {ours} | "
                         f"{scores['bleu']['score'] - theirs['bleu']['score']:+.2f} |")
        else:
            lines.append(f"| {direction} (zero-shot) | none | {ours} | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, required=True, help="updates of each bilingual model (N)")
    parser.add_argument("--run-root", type=Path, default=Path("runs/compare_multilingual"))
    parser.add_argument("--config", default=CONFIG, help="the multilingual config (its data.pairs are compared)")
    parser.add_argument("--bilingual-vocab", type=int, default=8000, help="SentencePiece pieces of a bilingual model")
    parser.add_argument("--zero-shot", nargs="*", default=["de-fr"], help="directions to score that no model saw")
    parser.add_argument("--parallel", type=int, default=1, help="trainings at a time (a GPU runs several at once)")
    args, overrides = parser.parse_known_args(argv)
    data = load_config(args.config, overrides).data
    pairs = data.pairs
    directions = [tuple(pair.split("-")) for pair in pairs]
    zero_shot = [tuple(pair.split("-")) for pair in args.zero_shot]
    jobs = {pair: (args.config, args.run_root / f"bilingual_{src}_{tgt}", args.steps,
                   ["data.pairs=", f"data.src_lang={src}", f"data.tgt_lang={tgt}",
                    f"data.vocab_size={args.bilingual_vocab}", *overrides], [(src, tgt)], data.test_split)
            for pair, (src, tgt) in zip(pairs, directions)}
    jobs["multilingual"] = (args.config, args.run_root / "multilingual", args.steps * len(pairs), overrides,
                            directions + zero_shot, data.test_split)
    with ThreadPoolExecutor(args.parallel) as pool:  # the multilingual run, the longest, first
        futures = {name: pool.submit(train_and_score, *job) for name, job in reversed(jobs.items())}
        results = {name: future.result() for name, future in futures.items()}
    multilingual = results.pop("multilingual")
    bilingual = {pair: scores[pair] for pair, scores in results.items()}
    table = comparison_table(bilingual, multilingual, args.steps, len(pairs))
    (args.run_root / "comparison.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
