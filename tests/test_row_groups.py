"""Rows attending in groups (train.attention_row_length, `model.row_groups`): the same loss and gradients as
rows attending alone, in groups as large as the rows allow."""

import pytest
import torch
from conftest import BOS, EOS, PAD, VOCAB, make_model, metric_records, run_config

from transformer import fast
from transformer.checkpoint import load_checkpoint
from transformer.config import ConfigError
from transformer.data.batch import make_batch
from transformer.model import attention
from transformer.model.row_groups import attend_in_groups, group_size
from transformer.training import train
from transformer.training.loss import label_smoothed_cross_entropy


def test_a_group_is_the_most_rows_a_power_of_two_divides_and_the_row_length_holds():
    assert group_size(rows=16, length=16, row_length=64) == 4
    assert group_size(rows=16, length=16, row_length=63) == 2  # 4 rows of 16 would be 64 positions
    assert group_size(rows=16, length=24, row_length=64) == 2
    assert group_size(rows=6, length=8, row_length=64) == 2  # 6 rows: a group of 4 would not divide them
    assert group_size(rows=7, length=8, row_length=64) == 1
    assert group_size(rows=16, length=40, row_length=64) == 1  # longer rows attend alone
    assert group_size(rows=64, length=1, row_length=1024) == 64


def recorded_groups(monkeypatch) -> list[int]:
    """The group size of every attention call that groups rows, from now on (the list fills as they run)."""
    group_sizes = []

    def recorded(query, key, value, groups, dropout_p):
        group_sizes.append(groups.mask.size(-2) // query.size(-2))
        return attend_in_groups(query, key, value, groups, dropout_p)

    monkeypatch.setattr(attention, "attend_in_groups", recorded)
    return group_sizes


def batch_of(lengths, fill_tokens=0):
    generator = torch.Generator().manual_seed(0)
    src_ids, tgt_ids = ([torch.randint(4, VOCAB, (n,), generator=generator).tolist() for n in side]
                        for side in zip(*lengths))
    return make_batch(src_ids, tgt_ids, range(len(lengths)), PAD, BOS, EOS, pad_to_multiple=8, fill_tokens=fill_tokens)


@pytest.mark.parametrize("fast_paths", [False, True], ids=["plain", "fast paths"])
@pytest.mark.parametrize("row_length, filled, groups", [(16, False, 2), (32, False, 4), (64, True, 8), (8, True, 1)],
                         ids=["groups of 2", "groups of 4", "filled batch, groups of 8", "rows alone"])
def test_rows_in_groups_give_the_loss_and_gradients_of_rows_alone(fast_paths, row_length, filled, groups, monkeypatch):
    """Padded rows of several lengths (0 to 7 pads a row), a batch filled with empty pairs (data.pad_rows): each
    query attends to what it did alone, through one attention call a group of rows; where one row alone fits,
    rows attend as without groups (dropout off: its random draws follow the tensors' shapes)."""
    model = make_model(seed=3).train()
    loss_function = fast.for_training(model) if fast_paths else label_smoothed_cross_entropy
    lengths = [(5, 5), (3, 2), (6, 4), (1, 3), (7, 7), (2, 6), (4, 1), (6, 6)]  # rows of 8 positions
    batch = batch_of(lengths[:3], fill_tokens=64) if filled else batch_of(lengths)
    assert batch.src.shape == batch.tgt_in.shape == (8, 8)

    def loss_and_gradients(row_length):
        model.zero_grad(set_to_none=True)
        loss, nll = loss_function(model(batch.src, batch.tgt_in, row_length), batch.tgt_out, 0.1, PAD)
        loss.backward()
        return loss.detach(), nll, [p.grad.clone() for p in model.parameters()]

    alone = loss_and_gradients(0)
    group_sizes = recorded_groups(monkeypatch)
    grouped = loss_and_gradients(row_length)
    # the encoder's self-attention, the decoder's self- and cross-attention, in groups (or none where rows are alone)
    assert group_sizes == ([groups] * (2 + 2 * 2) if groups > 1 else [])
    for expected, actual in zip(alone, grouped):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_a_source_longer_than_its_target_and_a_target_longer_than_its_source_in_groups(monkeypatch):
    """Cross-attention groups rows of target and source length alike: a query's keys stay its own row's."""
    model = make_model(seed=4)
    group_sizes = recorded_groups(monkeypatch)
    for lengths in ([(12, 3)] * 4, [(2, 13)] * 4):
        batch = batch_of(lengths)
        alone = model(batch.src, batch.tgt_in)
        torch.testing.assert_close(model(batch.src, batch.tgt_in, 64), alone, rtol=1e-5, atol=1e-6)
    assert group_sizes == [4] * 6 * 2  # rows of 16 positions, 4 a group; 6 attention calls a batch, 2 batches


def test_a_run_with_rows_in_groups_trains_as_one_without(copy_corpus, tmp_path, monkeypatch):
    """Batches filled to GPU shapes (data.pad_rows: 8 rows a batch at least), fp32; Adam's epsilon large, as in
    test_compile.py: the keys' bias has no gradient but rounding's, which Adam's steps would make lr-sized."""
    settings = dict(max_steps=4, save_every=2, log_every=1, precision="fp32", adam_eps=1e-3,
                    **{"data.pad_rows": "true", "data.pad_to_multiple": 8, "data.rows_multiple": 8})
    train(run_config(copy_corpus, tmp_path / "alone", **settings))
    group_sizes = recorded_groups(monkeypatch)
    train(run_config(copy_corpus, tmp_path / "grouped", attention_row_length=64, **settings))
    assert max(group_sizes) >= 4  # rows of 8 and 16 positions, in groups of up to 64 positions
    alone, grouped = (metric_records(tmp_path / name, "train") for name in ("alone", "grouped"))
    assert [r["loss"] for r in grouped] == pytest.approx([r["loss"] for r in alone], rel=1e-5)
    weights = load_checkpoint(tmp_path / "grouped" / "checkpoint_last.pt")["model"]
    for name, tensor in load_checkpoint(tmp_path / "alone" / "checkpoint_last.pt")["model"].items():
        torch.testing.assert_close(weights[name], tensor, rtol=0, atol=1e-5)
    with pytest.raises(ConfigError, match="train.attention_row_length must be >= 0"):
        run_config(copy_corpus, tmp_path / "bad", attention_row_length=-1)
