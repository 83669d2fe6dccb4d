"""Training metrics: a JSONL log and TensorBoard scalars while training."""

from __future__ import annotations

import json
import time
from pathlib import Path

METRICS_FILE = "metrics.jsonl"


class MetricsLogger:
    """Append one JSON object per event to ``run_dir/metrics.jsonl`` and mirror numbers to TensorBoard."""

    def __init__(self, run_dir: Path, tensorboard: bool = True) -> None:
        self.path = run_dir / METRICS_FILE
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(run_dir / "tensorboard"))

    def log(self, kind: str, step: int, **values: float) -> None:
        """Record ``values`` of ``kind`` ("train" or "valid") at ``step``."""
        record = {"kind": kind, "step": step, "time": round(time.time(), 3), **values}
        with self.path.open("a", encoding="utf-8") as file:
            file.write(json.dumps(record) + "\n")
        if self.writer is not None:
            for name, value in values.items():
                if isinstance(value, (int, float)):
                    self.writer.add_scalar(f"{kind}/{name}", value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_metrics(run_dir: Path) -> list[dict]:
    """The records of a run's metrics log, skipping a last line cut short by a crash."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no metrics log at {path}")
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
