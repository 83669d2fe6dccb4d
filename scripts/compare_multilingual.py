"""One multilingual model against bilingual models of the same directions, at matched budgets (issue 33).

Each direction of the multilingual config's ``data.pairs`` gets a bilingual model of the same
architecture and settings (its own vocabulary of ``--bilingual-vocab`` pieces, no tag) trained for
``--steps`` updates; the multilingual model trains for ``--steps`` times the number of directions.
Its batches mix the directions in proportion to their pairs, so with equal pairs per direction (as
Multi30k's) every direction gets, on average, as many target tokens in both. The learning-rate
schedules are the same curve over their budgets (`bilingual_schedule`): the bilingual warm-up is the
config's divided by the number of directions, at the same peak (a cooldown is a share of the budget
already). Each model is chosen on its
validation split (checkpoint_best) and scored on each direction's test split, the multilingual model
also on ``--zero-shot`` directions it never saw. The table (Markdown) goes to stdout and
``RUN_ROOT/comparison.md``; every run's log and reports stay in ``RUN_ROOT``, and a line on stderr says
when each run starts and ends. Run again, it resumes each run where it stopped (Ctrl-C saves them).

Usage: python scripts/compare_multilingual.py --steps 1500 [--parallel 7] [--run-root runs/compare] \
           [--zero-shot de-fr,fr-cs] [section.key=value ...]   (overrides for every run, e.g. train.device=cuda)
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path

import yaml

from transformer.config import ConfigError, TrainConfig
from transformer.config_loading import anchored_overrides, load_config
from transformer.data.languages import one_direction
from transformer.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "multi30k_multilingual.yaml"
# what the script sets for each run: an override of these would unmatch the budgets
CONTROLLED = ("data.pairs=", "data.src_lang=", "data.tgt_lang=", "train.run_dir=", "train.max_steps=",
              "train.max_time=", "train.valid_every=", "train.save_every=")


class RunFailed(Exception):
    """A training or an evaluation of the comparison ended with an error; its log says why."""


class RunInterrupted(RunFailed):
    """A training or an evaluation ended by Ctrl-C (SIGINT), which reaches the script and its runs alike."""


def bilingual_schedule(train: TrainConfig, n_directions: int) -> list[str]:
    """Overrides that compress the multilingual run's learning-rate curve into a bilingual budget of 1 /
    ``n_directions`` of its steps: the warm-up divided by ``n_directions``, at the same peak learning rate.

    The noam schedule's peak, lr * d_model^-0.5 * warmup^-0.5, grows as the warm-up shrinks, so its
    scale shrinks with the square root of the warm-up's ratio; an inverse_sqrt schedule's lr is its peak.
    """
    warmup = max(train.warmup_steps // n_directions, 1)
    lr = train.lr * (warmup / train.warmup_steps) ** 0.5 if train.lr_schedule == "noam" else train.lr
    return [f"train.warmup_steps={warmup}", f"train.lr={lr!r}"]


def train_and_score(config: Path, run_dir: Path, steps: int, settings: list[str],
                    directions: list[tuple[str, str]], split: str) -> dict[str, dict]:
    """Train one model for ``steps`` updates, then score ``directions`` on ``split`` with its best-on-validation
    checkpoint: {"src-tgt": the report's scores}. The run's output goes to ``run_dir``/log.txt (appended: a re-run
    resumes the training)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    every = max(steps // 4, 1)
    budget = [f"train.run_dir={run_dir}", f"train.max_steps={steps}", "train.max_time=",
              f"train.valid_every={every}", f"train.save_every={every}"]
    commands = [["transformer-train", str(config), *settings, *budget]]
    reports = {f"{src}-{tgt}": run_dir / f"test.{src}-{tgt}.json" for src, tgt in directions}
    commands += [["transformer-evaluate", "--checkpoint", str(run_dir / "checkpoint_best.pt"), "--src-lang", src,
                  "--tgt-lang", tgt, "--split", split, "--report", str(reports[f"{src}-{tgt}"])]
                 for src, tgt in directions]
    start = time.monotonic()
    print(f"== {run_dir.name}: training {steps:,} steps, then scoring {len(directions)} direction(s); its output: "
          f"{run_dir / 'log.txt'}", file=sys.stderr, flush=True)
    with open(run_dir / "log.txt", "a") as log:
        for command in commands:
            print("==", shlex.join(command), file=log, flush=True)
            status = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode
            if status in (130, -signal.SIGINT):  # the train command saves a checkpoint and exits 130
                raise RunInterrupted(f"{command[0]} of {run_dir.name} was interrupted")
            if status != 0:
                raise RunFailed(f"{command[0]} of {run_dir.name} failed (exit {status}): see {run_dir / 'log.txt'}")
    print(f"== {run_dir.name}: done in {(time.monotonic() - start) / 60:.1f} min", file=sys.stderr, flush=True)
    return {direction: json.loads(report.read_text())["scores"] for direction, report in reports.items()}


def trained_budget(run_dir: Path) -> int | None:
    """train.max_steps of the run already in ``run_dir`` (its config.yaml), None where there is none."""
    try:
        return int(yaml.safe_load((run_dir / "config.yaml").read_text())["train"]["max_steps"])
    except (OSError, yaml.YAMLError, TypeError, KeyError, ValueError):
        return None


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


def run_all(jobs: dict[str, tuple], parallel: int) -> dict[str, dict[str, dict]]:
    """Every job through `train_and_score`, ``parallel`` at a time, the first listed first; the first failure, or
    Ctrl-C, cancels the jobs not yet started and is raised once the running ones end."""
    stopped = threading.Event()  # a worker set free by a failure takes the next job before the pool is shut down

    def unless_stopped(job: tuple) -> dict[str, dict] | None:
        if stopped.is_set():
            return None
        try:
            return train_and_score(*job)
        except BaseException:
            stopped.set()
            raise

    with ThreadPoolExecutor(parallel) as pool:
        futures = {name: pool.submit(unless_stopped, job) for name, job in jobs.items()}
        try:
            done, _ = wait(futures.values(), return_when=FIRST_EXCEPTION)
        except KeyboardInterrupt:  # the runs under way have the signal too: they save and end
            stopped.set()
            pool.shutdown(cancel_futures=True)
            raise
        failed = [future for future in done if future.exception() is not None]
        if failed:
            pool.shutdown(cancel_futures=True)
            raise failed[0].exception()
        return {name: future.result() for name, future in futures.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="section.key=value for every run (e.g. train.device=cuda)")
    parser.add_argument("--steps", type=int, required=True, help="updates of each bilingual model (N)")
    parser.add_argument("--run-root", type=Path, default=ROOT / "runs" / "compare_multilingual",
                        help="where the runs and comparison.md go (default: runs/compare_multilingual in the checkout)")
    parser.add_argument("--config", type=Path, default=CONFIG,
                        help="the multilingual config, its data.pairs the directions (default: "
                             f"{CONFIG.relative_to(ROOT)})")
    parser.add_argument("--bilingual-vocab", type=int, default=8000,
                        help="SentencePiece pieces of a bilingual model (default: 8000)")
    parser.add_argument("--zero-shot", default="de-fr", help="directions to score that no model saw, comma-separated "
                        "as data.pairs (default: de-fr; '' for none)")
    parser.add_argument("--parallel", type=int, default=1,
                        help="trainings at a time (default: 1; a GPU runs several at once)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.parallel < 1 or args.bilingual_vocab < 1:
        parser.error("--steps, --parallel and --bilingual-vocab must be positive")
    if controlled := [o for o in args.overrides if o.startswith(CONTROLLED)]:
        parser.error(f"{controlled[0]}: the comparison sets this itself, to match the budgets")
    args.zero_shot = [direction.strip() for direction in args.zero_shot.split(",") if direction.strip()]
    if malformed := [d for d in args.zero_shot if len(d.split("-")) != 2 or "" in d.split("-")]:
        parser.error(f"--zero-shot {malformed[0]!r}: give directions as source-target, e.g. de-fr")
    args.overrides = anchored_overrides(args.overrides, Path.cwd())  # the runs start in the checkout
    try:
        cfg = load_config(args.config, args.overrides)
    except (ConfigError, OSError) as error:
        parser.error(str(error))
    if len(cfg.data.pairs) < 2:
        parser.error(f"{args.config}: data.pairs lists {cfg.data.pairs}; a multilingual config needs two or more")
    for direction in args.zero_shot:  # before hours of training, not when the multilingual model is scored
        if direction in cfg.data.pairs:
            parser.error(f"--zero-shot {direction}: a direction of data.pairs, which the models are trained on")
        try:
            one_direction(cfg.data, *direction.split("-"))
        except InputError as error:
            parser.error(f"--zero-shot {direction}: {error}")
    pairs, root = cfg.data.pairs, args.run_root.resolve()
    directions = [tuple(pair.split("-")) for pair in pairs]
    jobs = {"multilingual": (args.config.resolve(), root / "multilingual", args.steps * len(pairs), args.overrides,
                             directions + [tuple(d.split("-")) for d in args.zero_shot], cfg.data.test_split)}
    for pair, (src, tgt) in zip(pairs, directions):  # the script's settings after the user's: they win
        settings = [*args.overrides, "data.pairs=", f"data.src_lang={src}", f"data.tgt_lang={tgt}",
                    f"data.vocab_size={args.bilingual_vocab}", *bilingual_schedule(cfg.train, len(pairs))]
        jobs[pair] = (args.config.resolve(), root / f"bilingual_{src}_{tgt}", args.steps, settings, [(src, tgt)],
                      cfg.data.test_split)
    for name, (_, run_dir, steps, *_) in jobs.items():  # a run trained further would be tabled at this budget
        if (trained := trained_budget(run_dir)) is not None and trained > steps:
            parser.error(f"--steps {args.steps}: {run_dir} holds a run trained for {trained:,} steps, more than its "
                         f"{steps:,} here; give another --run-root, or --steps {trained // (steps // args.steps):,}")
    try:
        results = run_all(jobs, args.parallel)  # the multilingual run, the longest, starts first
    except (KeyboardInterrupt, RunInterrupted):
        print("compare_multilingual: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    except RunFailed as error:
        print(f"compare_multilingual: {error}", file=sys.stderr)
        return 1
    multilingual = results.pop("multilingual")
    table = comparison_table({pair: scores[pair] for pair, scores in results.items()}, multilingual, args.steps,
                             len(pairs))
    (root / "comparison.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
