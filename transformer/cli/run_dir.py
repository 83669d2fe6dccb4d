"""The commands around a run directory: train a model, average its checkpoints, plot its curves."""

from __future__ import annotations

import argparse
from pathlib import Path

from transformer.data.textio import InputError


# -- train ---------------------------------------------------------------------------------------
def train_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="transformer-train", description="Train a translation model.")
    parser.add_argument("config", help="YAML file with overrides of the defaults")
    parser.add_argument("overrides", nargs="*", help="section.key=value, e.g. train.max_steps=1000")
    parser.add_argument("--resume", nargs="?", const="", default=None, metavar="CHECKPOINT",
                        help="resume from CHECKPOINT (default: the run directory's last checkpoint, "
                             "which is also used automatically when it exists; an error if there is none)")
    return parser


def train_main(args: argparse.Namespace) -> int:
    from transformer.config_loading import load_config
    from transformer.training import train
    from transformer.training.checkpoints import resumable

    cfg = load_config(args.config, args.overrides)
    if args.resume == "" and not resumable(Path(cfg.train.run_dir)):  # asked to resume: a new run would hide a typo
        raise InputError(f"--resume: {cfg.train.run_dir} holds no checkpoint to resume from")
    summary = train(cfg, Path(args.resume) if args.resume else None)
    best = "none" if summary.best_score is None else f"{abs(summary.best_score):.2f}"
    print(f"done: {summary.stop_reason}; step {summary.step}; best {summary.best_metric} {best}; "
          f"checkpoint {summary.checkpoint}; {summary.seconds / 60:.1f} min")
    return {"SIGINT": 130, "SIGTERM": 143}.get(summary.signal, 0)  # the shell's codes for these signals


# -- average -------------------------------------------------------------------------------------
def average_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="transformer-average",
                                     description="Average the parameters of several checkpoints.")
    parser.add_argument("checkpoints", nargs="*", help="checkpoint files to average")
    parser.add_argument("--run-dir", help="take the last N numbered checkpoints of this run")
    parser.add_argument("--last", type=int, default=5, help="how many with --run-dir (default 5)")
    parser.add_argument("--output", required=True, help="where to write the averaged checkpoint")
    return parser


def average_main(args: argparse.Namespace) -> int:
    from transformer.checkpoint import average_checkpoints, save_checkpoint, step_checkpoints

    paths = [Path(p) for p in args.checkpoints]
    if args.last < 1:
        raise InputError(f"--last must be >= 1, got {args.last}")
    if args.run_dir:
        paths += step_checkpoints(Path(args.run_dir))[-args.last:]
    state = average_checkpoints(paths)
    save_checkpoint(state, args.output)
    print(f"averaged {len(paths)} checkpoints into {args.output}")
    return 0


# -- plot ----------------------------------------------------------------------------------------
def plot_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="transformer-plot",
                                     description="Draw a run's training curves (loss, learning rate, BLEU) to PNG.")
    parser.add_argument("run_dir")
    parser.add_argument("--output", help="PNG file (default RUN_DIR/training_curves.png)")
    return parser


def plot_main(args: argparse.Namespace) -> int:
    from transformer.plots import plot_training_curves

    print(plot_training_curves(Path(args.run_dir), Path(args.output) if args.output else None))
    return 0
