"""Training metrics: a JSONL log and TensorBoard scalars while training."""

from __future__ import annotations

import json
import time
from pathlib import Path

from transformer.atomic_file import atomic_write

METRICS_FILE = "metrics.jsonl"


class MetricsLogger:
    """Append one JSON object per event to ``run_dir/metrics.jsonl`` and mirror numbers to TensorBoard.

    A run resumed at ``resume_step`` (0: started over, before its first checkpoint) first drops the records
    written after that step by the interrupted session, in the JSONL and in TensorBoard, so the logs hold
    each step once, as an uninterrupted run would.
    """

    def __init__(self, run_dir: Path, tensorboard: bool = True, resume_step: int = 0) -> None:
        self.path = run_dir / METRICS_FILE
        if self.path.exists():
            kept = [r for r in read_metrics(run_dir) if r["step"] <= resume_step]
            with atomic_write(self.path) as partial:  # a kill while rewriting it must not lose the run's history
                partial.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # events after the resumed checkpoint's step go, as in the JSONL (its own validation stays); also for a
            # run started over before its first checkpoint, whose killed session's events would show twice
            self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=resume_step + 1)

    def log(self, kind: str, step: int, **values: float) -> None:
        """Record ``values`` of ``kind`` ("train" or "valid") at ``step``, in the log and TensorBoard."""
        self.note(kind, step, **values)
        if self.writer is not None:
            for name, value in values.items():
                if isinstance(value, (int, float)):
                    self.writer.add_scalar(f"{kind}/{name}", value, step)

    def note(self, kind: str, step: int, **values) -> None:
        """Record ``values`` of ``kind`` at ``step`` in the log only (not numbers to plot, e.g. the machine)."""
        record = {"kind": kind, "step": step, "time": round(time.time(), 3), **values}
        with self.path.open("a", encoding="utf-8") as file:
            file.write(json.dumps(record) + "\n")

    def flush(self) -> None:
        """Put TensorBoard's queued events on disk: called before each checkpoint, since a resume from it never
        logs its steps again, and events still queued when the process is killed are lost."""
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_metrics(run_dir: Path) -> list[dict]:
    """The records of a run's metrics log, skipping lines that are none: a last line cut short by a crash, or
    one damaged on disk (bytes that are not UTF-8, JSON that is no record)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no metrics log at {path}")
    records = []
    for line in path.read_bytes().decode("utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("kind"), str) and isinstance(record.get("step"), int):
            records.append(record)
    return records
