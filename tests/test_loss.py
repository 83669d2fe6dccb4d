"""The label-smoothed loss (plain torch): its value worked out by hand, and blind to padding."""

import pytest
import torch
from conftest import BOS, EOS, PAD, VOCAB, make_model

from transformer import fast
from transformer.data.batch import make_batch
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


@pytest.mark.parametrize("fast_paths", [False, True], ids=["plain", "fast paths"])
def test_padding_a_batch_to_gpu_shapes_changes_neither_the_loss_nor_the_gradients(fast_paths):
    """data.pad_to_multiple and data.pad_rows pad the tensors and add empty rows: the masks and the loss's
    skipped padding must make that invisible (dropout off: its random draws follow the tensor's shape)."""
    model = make_model(seed=3).train()
    loss_function = fast.for_training(model) if fast_paths else label_smoothed_cross_entropy
    generator = torch.Generator().manual_seed(0)
    lengths = [(5, 5), (3, 2), (6, 4), (1, 3)]  # both sides get rounded up: 7 -> 8 and 6 -> 8
    src_ids, tgt_ids = ([torch.randint(4, VOCAB, (n,), generator=generator).tolist() for n in side]
                        for side in zip(*lengths))

    def loss_and_gradients(batch):
        model.zero_grad(set_to_none=True)
        loss, nll = loss_function(model(batch.src, batch.tgt_in), batch.tgt_out, 0.1, PAD)
        loss.backward()
        return loss.detach(), nll, [p.grad.clone() for p in model.parameters()]

    plain = make_batch(src_ids, tgt_ids, range(4), PAD, BOS, EOS)
    padded = make_batch(src_ids, tgt_ids, range(4), PAD, BOS, EOS, pad_to_multiple=8, fill_tokens=56)
    assert (plain.src.shape, plain.tgt_in.shape) == ((4, 7), (4, 6))
    assert padded.src.shape == padded.tgt_in.shape == (7, 8)
    for expected, actual in zip(loss_and_gradients(plain), loss_and_gradients(padded)):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
