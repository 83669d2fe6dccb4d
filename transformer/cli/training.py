"""The commands of a training run, around its run directory: train a model, average its checkpoints, plot its curves."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from transformer.cli.model_options import OVERRIDE
from transformer.cli.paths import GivenOnce, path_argument
from transformer.errors import InputError

log = logging.getLogger(__name__)
DEFAULT_LAST = 5  # transformer-average --run-dir's checkpoints (scripts/run_recipe.sh averages 3)


# -- train ---------------------------------------------------------------------------------------
def train_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="transformer-train", description="Train a translation model.")
    parser.add_argument("config", type=path_argument, help="YAML file with overrides of the defaults")
    parser.add_argument("overrides", nargs="*", default=[],  # a default: else argparse says it is required
                        help="section.key=value, e.g. train.max_steps=1000")
    # bare --resume: True (argparse passes a string const through path_argument); --resume "$UNSET" is refused
    parser.add_argument("--resume", nargs="?", const=True, default=None, metavar="CHECKPOINT", type=path_argument,
                        help="resume from CHECKPOINT, another run's too (with the tokenizer beside it); default: "
                             "the run directory's last checkpoint, which is also used automatically when it exists; "
                             "an error if there is none")
    return parser


def train_main(args: argparse.Namespace) -> int:
    from transformer.config_loading import load_config
    from transformer.training import train
    from transformer.training.checkpoints import resumable

    if isinstance(args.resume, str) and OVERRIDE.match(args.resume) and not Path(args.resume).exists():
        # --resume train.run_dir=x: a bare --resume, and an override whose place among the others is lost
        key = args.resume.split("=", 1)[0]
        if any(override.split("=", 1)[0] == key for override in args.overrides):
            raise InputError(f"--resume {args.resume}: {key} is given twice, and which comes last is unclear; give "
                             f"--resume at the end")
        args.resume, args.overrides = True, [args.resume, *args.overrides]
    cfg = load_config(args.config, args.overrides)
    if args.resume is True and not resumable(Path(cfg.train.run_dir)):  # asked to resume: a new run would hide a typo
        raise InputError(f"--resume: {cfg.train.run_dir} holds no checkpoint to resume from")
    summary = train(cfg, Path(args.resume) if isinstance(args.resume, str) else None)
    best = "none" if summary.best_score is None else f"{abs(summary.best_score):.2f}"
    if int(os.environ.get("RANK", 0)) == 0:  # under torchrun, rank 0's: the others do not validate
        print(f"done: {summary.stop_reason}; step {summary.step}; best {summary.best_metric} {best}; "
              f"checkpoint {summary.checkpoint or 'none written (the weights were never finite at a save)'}; "
              f"{summary.seconds / 60:.1f} min")
    return {"SIGINT": 130, "SIGTERM": 143}.get(summary.signal, 0)  # the shell's codes for these signals


# -- average -------------------------------------------------------------------------------------
def average_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="transformer-average",
                                     description="Average the parameters of several checkpoints of one run.")
    parser.add_argument("checkpoints", nargs="*", default=[], type=path_argument, help="checkpoint files to average")
    parser.add_argument("--run-dir", type=path_argument, action=GivenOnce,
                        help="take the last N numbered checkpoints of this run")
    parser.add_argument("--last", type=int, help=f"how many with --run-dir (default {DEFAULT_LAST})")
    parser.add_argument("--output", required=True, type=path_argument, action=GivenOnce,
                        help="where to write the averaged checkpoint, e.g. RUN_DIR/checkpoint_averaged.pt (not a "
                             "name training writes); the tokenizer is copied beside it")
    return parser


def average_main(args: argparse.Namespace) -> int:
    from transformer.averaging import average_checkpoints
    from transformer.checkpoint import step_checkpoints, tokenizer_beside, written_by_training
    from transformer.cli.output import check_output
    from transformer.data.tokenizer import check_trained_with

    paths, output = [Path(p) for p in args.checkpoints], Path(args.output)
    if args.last is not None and not args.run_dir:  # else ignored, unsaid
        raise InputError("--last counts the numbered checkpoints of --run-dir: give --run-dir, or the files")
    last = DEFAULT_LAST if args.last is None else args.last
    if last < 1:
        raise InputError(f"--last must be >= 1, got {last}")
    if args.run_dir and not Path(args.run_dir).is_dir():
        raise InputError(f"--run-dir {args.run_dir}: no such folder")
    if args.run_dir:
        found = step_checkpoints(Path(args.run_dir))
        if not found:
            raise InputError(f"--run-dir {args.run_dir}: no numbered checkpoints (checkpoint_step<N>.pt) to average")
        paths += found[-last:]
        if len(found) < last:  # training keeps train.keep_last of them: say it, rather than average fewer unsaid
            log.warning("--last %d: %s holds %d numbered checkpoints; averaging those", last, args.run_dir,
                        len(found))
    if not paths:
        raise InputError("no checkpoints to average: give checkpoint files or --run-dir")
    if output.is_file() and not _is_checkpoint(output):  # metrics.jsonl, a report, notes.pt: a run's records, lost
        raise InputError(f"--output {output}: exists and is no checkpoint; writing the average over it would "
                         f"lose it; give a new file, e.g. checkpoint_averaged.pt")
    if written_by_training(output.name):  # a resume would read it, and find no optimizer state
        raise InputError(f"--output {output}: training writes and resumes from files of that name; name the "
                         f"averaged checkpoint otherwise, e.g. checkpoint_averaged.pt")
    beside = [file for path in paths for file in path.parent.glob("spm*.model")]  # their tokenizers
    check_output(args.output, "--output", reads=paths + beside)  # writing over an input would destroy it
    state = average_checkpoints(paths)
    tokenizer = tokenizer_beside(paths, state.get("tokenizer_files") or [])
    if tokenizer:  # the one the checkpoints were trained with, which the output gets beside it
        check_trained_with({name: path.read_bytes() for name, path in tokenizer.items()}, state, paths[0],
                           paths[0].parent)
    _write_averaged(state, tokenizer, output)
    print(f"averaged {len(paths)} checkpoint{'s' if len(paths) > 1 else ''} into {output}; tokenizer beside it: "
          f"{', '.join(tokenizer) or 'none'}")
    return 0


def _write_averaged(state: dict, tokenizer: dict[str, Path], output: Path) -> None:
    """Write the checkpoint with its tokenizer beside it, which translating it reads from there; errors name
    ``output``, not the temporary file it is written to first."""
    from transformer.checkpoint import save_checkpoint
    from transformer.cli.output import unwritable
    from transformer.data.tokenizer import install_tokenizer

    try:
        install_tokenizer({name: path.read_bytes() for name, path in tokenizer.items()}, output.parent,
                          f"the checkpoints' ({', '.join(map(str, tokenizer.values()))})",
                          "write the averaged checkpoint into another folder")
        save_checkpoint(state, output)
    except OSError as error:
        raise unwritable("--output", output, error) from None


# -- plot ----------------------------------------------------------------------------------------
def plot_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="transformer-plot",
                                     description="Draw a run's training curves (loss, learning rate, BLEU) to PNG.")
    parser.add_argument("run_dir", type=path_argument)
    parser.add_argument("--output", type=path_argument, action=GivenOnce,
                        help="PNG file (default RUN_DIR/training_curves.png)")
    return parser


def plot_main(args: argparse.Namespace) -> int:
    from transformer.plots import plot_training_curves
    from transformer.training.metrics import METRICS_FILE

    run_dir = Path(args.run_dir)
    if run_dir.name == METRICS_FILE and run_dir.is_file():  # the log itself given: its run's
        run_dir = run_dir.parent
    members = sorted(path.name for path in run_dir.glob("seed_*") if (path / METRICS_FILE).is_file())
    if members and not (run_dir / METRICS_FILE).exists():  # scripts/run_ensemble_recipe.sh's folder
        raise InputError(f"{run_dir}: an ensemble's folder; plot one of its members' runs ({', '.join(members)}), "
                         f"e.g. {run_dir / members[0]}")
    print(plot_training_curves(run_dir, Path(args.output) if args.output else None))
    return 0


def _is_checkpoint(path: Path) -> bool:
    """Whether ``path`` loads as a checkpoint: by its contents, not its name (a text file named notes.pt is none)."""
    from transformer.checkpoint import CheckpointError, load_checkpoint

    try:
        load_checkpoint(path)
    except CheckpointError:
        return False
    return True
