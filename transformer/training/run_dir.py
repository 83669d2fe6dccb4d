"""The run directory of a training: created, held by one training at a time, and proven writable before any work is
done."""

from __future__ import annotations

import os
from pathlib import Path

from transformer.atomic_file import hold
from transformer.config import ConfigError
from transformer.release_format import ENGINE_WEIGHTS, WEIGHTS
from transformer.training.checkpoints import resumable


def prepare_run_dir(run_dir: Path) -> int | None:
    """Create the run directory, hold it (`lock_run_dir`: the returned descriptor) and prove it is writable before
    any work is done; an exported model's folder is refused (its config.yaml would be the run's)."""
    exported = next((name for name in (WEIGHTS, *ENGINE_WEIGHTS) if (run_dir / name).is_file()), None)
    # training replaced the export's config.yaml, and it no longer loaded; a run's own folder may hold such a file
    if exported and not resumable(run_dir):
        raise ConfigError(f"train.run_dir: {run_dir} is an exported model's folder (it holds {exported}): training "
                          f"would write over its config.yaml; give the run a train.run_dir of its own")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"train.run_dir: cannot write to {run_dir} ({error.strerror})") from None
    lock = lock_run_dir(run_dir)  # first: the files below may be another run's, still in use
    try:
        probe = run_dir / ".write_test"
        probe.write_bytes(b"ok")
        probe.unlink()
        for stale in run_dir.glob(".checkpoint_*.tmp"):  # left by a crash while writing a checkpoint
            stale.unlink()
    except OSError as error:
        if lock is not None:
            os.close(lock)
        raise ConfigError(f"train.run_dir: cannot write to {run_dir} ({error.strerror})") from None
    return lock


def lock_run_dir(run_dir: Path) -> int | None:
    """Hold the run directory for this process until the returned descriptor is closed (`hold`): a second training
    started in it (the same command in another terminal, a scheduler's restart while the first still runs)
    interleaved its checkpoints and metrics.jsonl with the first's. The kernel lets go of the lock when the
    process dies, so a killed run leaves none behind. None where the file system has no locks."""
    try:
        return hold(run_dir)
    except BlockingIOError:
        raise ConfigError(f"train.run_dir: {run_dir} is in use by another training process; wait for it to end "
                          f"(or stop it), or give this run another train.run_dir") from None
    except OSError as error:  # a directory it may write into but not read
        raise ConfigError(f"train.run_dir: cannot read {run_dir} ({error.strerror})") from None
