"""The byte-threshold dropout: rate, scaling, gradient, uniform bytes, seeding, fallbacks."""

import pytest
import torch

from transformer.fast.dropout import ByteDropout, dropout, random_bytes


def test_drops_round_p_times_256_out_of_256_and_scales_the_rest():
    x = torch.ones(1000, 1000)
    y = dropout(x, 0.1)
    assert (y == 0).float().mean().item() == pytest.approx(26 / 256, abs=2e-3)
    assert torch.all((y == 0) | (y == 256 / 230))
    assert y.mean().item() == pytest.approx(1.0, abs=5e-3)  # the expectation is kept


def test_every_byte_of_the_random_words_is_uniform():
    # a byte position with fewer random bits (as in random_() without a range) would be caught here
    columns = random_bytes(torch.Size([200_000, 8]), torch.device("cpu")).float()
    assert torch.allclose(columns.mean(dim=0), torch.full((8,), 127.5), atol=1.0)
    assert torch.allclose((columns < 26).float().mean(dim=0), torch.full((8,), 26 / 256), atol=3e-3)


def test_gradient_flows_through_kept_elements_only():
    x = torch.randn(64, 33, requires_grad=True)  # an odd size: the words are cut to the element count
    y = dropout(x, 0.3)
    y.sum().backward()
    kept = y != 0
    scale = 256 / (256 - round(0.3 * 256))
    assert torch.equal(x.grad, kept.float() * scale)
    assert torch.allclose(y[kept], x[kept] * scale)


def test_the_same_seed_drops_the_same_elements():
    x = torch.ones(50, 50)
    torch.manual_seed(3)
    first = dropout(x, 0.2)
    torch.manual_seed(3)
    assert torch.equal(first, dropout(x, 0.2))
    assert not torch.equal(first, dropout(x, 0.2))


def test_identity_in_eval_mode_or_without_dropout_and_torch_dropout_for_tiny_p():
    x = torch.randn(10, 10)
    module = ByteDropout(0.5).eval()
    assert module(x) is x and dropout(x, 0.0) is x and dropout(x, 0.5, training=False) is x
    torch.manual_seed(0)
    tiny = dropout(torch.ones(100_000), 0.001)  # rounds to 0/256: torch's exact dropout instead
    assert 0 < (tiny == 0).sum().item() < 300
