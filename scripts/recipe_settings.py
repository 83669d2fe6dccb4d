"""What scripts/run_recipe.sh and scripts/demo.sh read from their config before they run anything, in one Python
start (each costs seconds): the overrides with their relative paths anchored where the script was started
(train.run_dir=runs/x, data.dataset=corpus/), the run directory, the validation and test splits, and the command as
the user gave it (for scripts/results_table.py). A bad config or override is its one line, exit 2, before any work.

Usage: python scripts/recipe_settings.py [--given-config C] [--dataset D] [--check-test-split] [--average-last N]
                                         [--recipe single|ensemble]
                                         -- SCRIPT CONFIG STARTED [OVERRIDE...]
Prints the run directory, the validation split, the test split, the command, then the overrides to train with,
each ending in NUL (values may hold spaces, quotes and newlines).
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path

from transformer import load_config
from transformer.cli import EXIT_USAGE, USER_ERRORS
from transformer.config import ConfigError
from transformer.config_loading import anchored_overrides
from transformer.data.corpus import check_splits


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("script", help="the script as the user runs it, e.g. scripts/run_recipe.sh")
    parser.add_argument("config", help="the config file")
    parser.add_argument("started", help="the folder the script was started in: relative overrides are from there")
    parser.add_argument("--given-config", help="the config as the user named it, for the command (the demo names none)")
    parser.add_argument("--dataset", help="data.dataset to train on, ahead of the user's overrides (the demo's)")
    parser.add_argument("--check-test-split", action="store_true",
                        help="refuse a test split the corpus lacks now, not after hours of training")
    parser.add_argument("--average-last", default="", help="run_recipe.sh's AVERAGE_LAST, part of the command")
    parser.add_argument("--recipe", choices=["single", "ensemble"],
                        help="the recipe's kind: a run directory holding the other kind's run is refused")
    parser.add_argument("overrides", nargs="*", help="section.key=value overrides, as the user gave them")
    args = parser.parse_args()
    try:
        dataset = [f"data.dataset={args.dataset}"] if args.dataset else []  # found by the demo: not anchored
        overrides = dataset + anchored_overrides(args.overrides, args.started)
        cfg = load_config(args.config, overrides)
        if args.average_last and not (args.average_last.isdigit() and int(args.average_last) >= 1):
            raise ConfigError(f"AVERAGE_LAST={args.average_last}: give how many numbered checkpoints to average "
                              f"(1 or more)")
        if args.check_test_split:
            check_splits(cfg.data, ("test_split",))
        if args.recipe:
            check_run_directory(Path(cfg.train.run_dir), args.recipe)
    except USER_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    config = [args.given_config] if args.given_config else []
    command = shlex.join(["bash", args.script, *config, *args.overrides])
    command = f"AVERAGE_LAST={shlex.quote(args.average_last)} {command}" if args.average_last else command
    print(cfg.train.run_dir, cfg.data.valid_split, cfg.data.test_split, command, *overrides, sep="\0", end="\0")
    return 0


def ensemble_members(run_dir: Path) -> list[Path]:
    """The member folders seed_K of a `run_ensemble_recipe.sh` run in ``run_dir``, by K: not their logs (seed_K.log),
    nor a copy beside them (seed_1_old)."""
    return sorted((path for path in run_dir.glob("seed_*") if path.is_dir() and re.fullmatch(r"seed_\d+", path.name)),
                  key=lambda path: int(path.name.removeprefix("seed_")))


def check_run_directory(run_dir: Path, recipe: str) -> None:
    """A ConfigError where ``run_dir`` holds the other recipe's run: run_recipe.sh and run_ensemble_recipe.sh both
    default to the config's train.run_dir, and each wrote its reports and command.txt over the other's."""
    members = [path.name for path in ensemble_members(run_dir)]
    checkpoints = sorted(path.name for path in run_dir.glob("checkpoint_*.pt"))
    if recipe == "single" and members:
        raise ConfigError(f"train.run_dir={run_dir} holds an ensemble recipe's members ({', '.join(members)}): give "
                          f"this run a folder of its own (train.run_dir=...)")
    if recipe == "ensemble" and checkpoints:
        raise ConfigError(f"train.run_dir={run_dir} holds a single run's checkpoints ({checkpoints[0]}, ...): give "
                          f"the ensemble a folder of its own (train.run_dir=...)")


if __name__ == "__main__":
    sys.exit(main())
