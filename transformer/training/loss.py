"""The training loss (§5.4): cross-entropy against label-smoothed targets."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def label_smoothed_cross_entropy(logits: Tensor, target: Tensor, epsilon: float, pad_id: int) -> tuple[Tensor, Tensor]:
    """Sums over non-padding tokens of the label-smoothed loss (§5.4) and of the plain NLL (for perplexity).

    The smoothed target puts 1 - epsilon on the reference token and spreads epsilon uniformly over
    the vocabulary. Computed in float32 whatever the autocast precision; only the first sum has a
    gradient. Shapes: logits (B, T, V), target (B, T) -> two scalars.
    """
    logits, target = logits.flatten(0, 1).float(), target.flatten()
    loss = F.cross_entropy(logits, target, ignore_index=pad_id, label_smoothing=epsilon, reduction="sum")
    with torch.no_grad():
        nll = F.cross_entropy(logits, target, ignore_index=pad_id, reduction="sum")
    return loss, nll
