"""What training shows of its progress: a bar whose total (and so its ETA) follows the limit that
will stop training first (``train.max_steps``, ``max_epochs`` or ``max_time``, not 100,000 steps when
45 minutes end the run long before), and the averages logged every ``train.log_every`` steps."""

from __future__ import annotations

import math
import time
from collections import deque

from tqdm import tqdm

from transformer.config import TrainConfig
from transformer.training.metrics import MetricsLogger


def expected_total_steps(step: int, max_steps: int, max_epochs: int = 0, epoch_steps_left: int | None = None,
                         time_left: float | None = None, steps_per_second: float | None = None) -> int | None:
    """The step at which training will stop: the first of its limits to bind, as far as can be told.

    Args:
        step: updates done so far.
        max_epochs, epoch_steps_left: the epoch limit (0: none) and the updates until it is reached
            (None while an epoch's length is unknown: a stream's, before its first epoch ends).
        time_left, steps_per_second: seconds left of ``max_time`` (None: no time limit) and the recent
            speed (None before it is measured).

    Returns:
        The step, or None while a limit in force cannot be estimated (the bar then shows no total).
    """
    limits = [max_steps]
    if max_epochs:
        if epoch_steps_left is None:
            return None
        limits.append(step + epoch_steps_left)
    if time_left is not None:
        if not steps_per_second:
            return None
        limits.append(step + math.ceil(max(time_left, 0.0) * steps_per_second))
    return max(step, min(limits))


def epoch_steps_left(max_epochs: int, epoch: int, position: int, epoch_batches: int | None,
                     accumulate: int = 1) -> int | None:
    """Updates until ``max_epochs`` epochs are done, from the batch stream's place (``epoch`` and the
    ``position`` of its next batch) and an epoch's length in batches (None: unknown)."""
    if epoch_batches is None:
        return None
    return max(0, math.ceil(((max_epochs - epoch) * epoch_batches - position) / accumulate))


class StepRate:
    """Updates per second over the last ``window`` seconds, validation pauses included (they spend the
    time budget too)."""

    def __init__(self, step: int, now: float, window: float = 300.0) -> None:
        self.samples: deque[tuple[float, int]] = deque([(now, step)])
        self.window = window

    def add(self, step: int, now: float) -> None:
        self.samples.append((now, step))
        while len(self.samples) > 2 and self.samples[1][0] <= now - self.window:
            self.samples.popleft()  # the oldest sample left is the last one at or before the window's start

    @property
    def per_second(self) -> float | None:
        (start, first), (end, last) = self.samples[0], self.samples[-1]
        return (last - first) / (end - start) if end > start and last > first else None


class TrainingBar(tqdm):
    """tqdm over training updates, its total set by `expected_total_steps` after every update."""

    def __init__(self, cfg: TrainConfig, step: int, enabled: bool = True) -> None:
        super().__init__(total=None, initial=step, disable=not enabled, unit="step", dynamic_ncols=True)
        self.cfg, self.budget, self.rate = cfg, cfg.max_time_seconds, StepRate(step, time.monotonic())

    def advance(self, step: int, elapsed: float, epoch_steps: int | None) -> None:
        """Count one update; ``elapsed``: seconds of training so far, ``epoch_steps``: as `epoch_steps_left`."""
        if self.disable:
            return
        self.rate.add(step, time.monotonic())
        self.total = expected_total_steps(step, self.cfg.max_steps, self.cfg.max_epochs, epoch_steps,
                                          self.budget - elapsed if self.budget else None, self.rate.per_second)
        self.update(1)


def log_window(logger: MetricsLogger | None, bar: tqdm, step: int, window: dict[str, float], speed: dict[str, float],
               stats: dict[str, float]) -> None:
    """Log the averages since the last log line (``window``: token-weighted sums; lr and gradient norm of this
    step) and the tokens per second since ``speed["start"]``, and restart both."""
    seconds = max(time.monotonic() - speed["start"], 1e-9)
    tokens = max(window["tokens"], 1.0)
    values = {"loss": window["loss"] / tokens, "nll": window["nll"] / tokens, "lr": stats["lr"],
              "grad_norm": stats["grad_norm"], "tokens_per_s": speed["tokens"] / seconds}
    bar.set_postfix({"loss": f"{values['loss']:.3f}", "lr": f"{values['lr']:.2e}",
                     "tok/s": f"{values['tokens_per_s']:.0f}"})
    if logger:
        logger.log("train", step, **values)
    window.update(loss=0.0, nll=0.0, tokens=0.0)
    speed.update(tokens=0.0, start=time.monotonic())
