"""The label-smoothed loss: its value by hand, its gradient against autograd of the formula."""

import pytest
import torch

from transformer.fast.loss import label_smoothed_cross_entropy


def test_label_smoothing_matches_a_hand_computation():
    logits = torch.tensor([[[2.0, 1.0, 0.0, -1.0], [0.5, 0.5, 0.5, 0.5]]])  # (B=1, T=2, V=4)
    target = torch.tensor([[1, 0]])  # second position is padding (pad_id=0)
    smoothed, nll = label_smoothed_cross_entropy(logits, target, epsilon=0.1, pad_id=0)
    log_p = torch.log_softmax(logits[0, 0], dim=-1)
    q = torch.full((4,), 0.1 / 4)
    q[1] += 0.9  # (1 - eps) on the reference, eps spread over all 4 classes
    assert smoothed.item() == pytest.approx(-(q * log_p).sum().item(), rel=1e-6)
    assert nll.item() == pytest.approx(-log_p[1].item(), rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_label_smoothing_gradient_equals_autograd_of_the_formula(dtype, epsilon):
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, dtype=dtype, requires_grad=True)
    target = torch.randint(1, 11, (3, 5))
    target[0, 3:] = 0  # padding: no loss, no gradient
    log_p = logits.float().log_softmax(dim=-1)
    per_token = -(1 - epsilon) * log_p.gather(2, target[..., None])[..., 0] - epsilon * log_p.mean(dim=-1)
    expected = per_token.masked_fill(target == 0, 0.0).sum()
    (expected_grad,) = torch.autograd.grad(0.7 * expected, logits)
    smoothed, _ = label_smoothed_cross_entropy(logits, target, epsilon, pad_id=0)
    (grad,) = torch.autograd.grad(0.7 * smoothed, logits)
    assert smoothed.item() == pytest.approx(expected.item(), rel=1e-6)
    assert grad.dtype == dtype and torch.allclose(grad.float(), expected_grad.float(), atol=1e-6)
    assert not grad[0, 3:].any()
