"""This checkout against another commit, in one run: did a change slow it down? The part that
search_versions.py (beam search) and training_versions.py (training steps) share: the other commit in a
temporary git worktree, rounds that time both versions in alternating order in fresh processes, and
the medians with the ratio this/base.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def worktree(commit: str, directory: Path) -> Path:
    """``commit`` checked out in ``directory``, a temporary git worktree."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(directory), commit], check=True,
                   capture_output=True)
    return directory


@contextlib.contextmanager
def checkouts(base: str, this: str, tmp: Path) -> Iterator[dict[str, Path]]:
    """{"this": this checkout (or ``this`` commit's worktree), "base": ``base``'s worktree}, removed at the end.
    A commit for ``this`` times it instead of the checkout, whose uncommitted edits would be timed with it."""
    versions = {"this": worktree(this, tmp / "this") if this else ROOT, "base": worktree(base, tmp / "base")}
    try:
        yield versions
    finally:
        for code in versions.values():
            if code != ROOT:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(code)], check=True)


def run_fresh(code: Path, source: str, *args: str) -> dict:
    """Run Python ``source`` with ``args`` in a fresh one-thread process that imports the package from ``code``;
    the JSON object its last line prints. A failure ends the comparison with its last line of error."""
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", source, *args], env=env, cwd=code, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"the timed run of {code} failed: {run.stderr.strip().splitlines()[-1]}")
    return json.loads(run.stdout.splitlines()[-1])


def alternate(versions: dict[str, Path], rounds: int, timed: Callable[[Path], dict]) -> dict[str, list[dict]]:
    """``timed(code)`` of each version in every round, the order reversed from round to round; each result printed."""
    results: dict[str, list[dict]] = {name: [] for name in versions}
    for round_ in range(rounds):
        for name, code in list(versions.items())[:: 1 if round_ % 2 == 0 else -1]:
            found = timed(code)
            results[name].append(found)
            print(f"round {round_ + 1} {name}: {found['seconds']:.2f} s, CPU {found['cpu_seconds']:.2f} s", flush=True)
    return results


def print_medians(results: dict[str, list[dict]], figures: dict[str, str]) -> None:
    """Per figure (label: key of the results), the median seconds of both versions and the ratio this/base."""
    for label, key in figures.items():
        this, before = (statistics.median(r[key] for r in results[version]) for version in ("this", "base"))
        print(f"  {label}: this {this:.2f} s, base {before:.2f} s, ratio this/base {this / before:.3f}")
