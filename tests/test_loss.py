"""The label-smoothed loss (plain torch): its value worked out by hand."""

import pytest
import torch

from transformer.training.loss import label_smoothed_cross_entropy


def test_label_smoothing_matches_a_hand_computation():
    logits = torch.tensor([[[2.0, 1.0, 0.0, -1.0], [0.5, 0.5, 0.5, 0.5]]])  # (B=1, T=2, V=4)
    target = torch.tensor([[1, 0]])  # second position is padding (pad_id=0)
    smoothed, nll = label_smoothed_cross_entropy(logits, target, epsilon=0.1, pad_id=0)
    log_p = torch.log_softmax(logits[0, 0], dim=-1)
    q = torch.full((4,), 0.1 / 4)
    q[1] += 0.9  # (1 - eps) on the reference, eps spread over all 4 classes
    assert smoothed.item() == pytest.approx(-(q * log_p).sum().item(), rel=1e-6)
    assert nll.item() == pytest.approx(-log_p[1].item(), rel=1e-6)
