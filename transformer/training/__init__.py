"""Training (§5): the loop, one update, the loss and schedule, checkpoints, progress and metrics."""

from transformer.training.loop import train

__all__ = ["train"]
