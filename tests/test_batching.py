import random

import pyarrow as pa
import pytest
import torch
from conftest import BOS, EOS, PAD
from datasets import Dataset

from transformer.config import ConfigError, DataConfig
from transformer.data.batch import Batch, make_batch, pad_sequences, rows_within
from transformer.data.batching import (
    StreamingTrainBatches,
    TrainBatches,
    eval_batches,
    padding_overhead,
    stream_batches,
    token_batches,
)
from transformer.data.cleaning import encode_dataset
from transformer.data.loading import load_split


def random_ids(n: int, seed: int = 0, longest: int = 30) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(4, 50) for _ in range(rng.randrange(1, longest))] for _ in range(n)]


def encoded(src_ids, tgt_ids) -> Dataset:
    """A dataset with the columns of `cleaning.encode_dataset` (text left out)."""
    return Dataset.from_dict({"src_ids": src_ids, "tgt_ids": tgt_ids, "src_len": [len(x) for x in src_ids],
                              "tgt_len": [len(y) for y in tgt_ids]})


def small_config(**overrides) -> DataConfig:
    return DataConfig(**{"batch_tokens": 64, "max_length": 30, "pool_batches": 4, **overrides})


@pytest.fixture
def corpus() -> Dataset:
    return encoded(random_ids(200, seed=1), random_ids(200, seed=2))


def test_batch_shifts_the_target_and_ends_the_source_with_eos():
    batch = make_batch([[5, 6, 7], [8]], [[9, 10], [11, 12, 13]], [4, 0], PAD, BOS, EOS)
    assert batch.src.tolist() == [[5, 6, 7, EOS], [8, EOS, PAD, PAD]]
    assert batch.tgt_in.tolist() == [[BOS, 9, 10, PAD], [BOS, 11, 12, 13]]
    assert batch.tgt_out.tolist() == [[9, 10, EOS, PAD], [11, 12, 13, EOS]]
    assert (batch.indices, batch.n_src_tokens, batch.n_tgt_tokens) == ([4, 0], 6, 7)
    assert batch.n_tgt_tokens == int((batch.tgt_out != PAD).sum())
    moved = batch.to("cpu")
    assert isinstance(moved, Batch) and moved.src.dtype == torch.long


def test_pad_sequences_right_pads_to_the_longest():
    assert pad_sequences([[1], [2, 3, 4], []], PAD).tolist() == [[1, PAD, PAD], [2, 3, 4], [PAD, PAD, PAD]]


def test_gpu_shapes_round_lengths_up_and_fill_rows_with_pairs_the_loss_skips():
    batch = make_batch([[5, 6, 7], [8]], [[9, 10], [11, 12, 13]], [4, 0], PAD, BOS, EOS, pad_to_multiple=8,
                       fill_tokens=24)  # three rows of eight
    assert batch.src.tolist() == [[5, 6, 7, EOS] + [PAD] * 4, [8, EOS] + [PAD] * 6, [EOS] + [PAD] * 7]
    assert batch.tgt_in.tolist() == [[BOS, 9, 10] + [PAD] * 5, [BOS, 11, 12, 13] + [PAD] * 4, [BOS] + [PAD] * 7]
    assert batch.tgt_out.tolist() == [[9, 10, EOS] + [PAD] * 5, [11, 12, 13, EOS] + [PAD] * 4, [PAD] * 8]
    assert (batch.indices, batch.n_src_tokens, batch.n_tgt_tokens) == ([4, 0], 6, 7)  # the real pairs only


def test_rows_come_in_a_multiple_where_the_budget_holds_one():
    """data.rows_multiple (fairseq's required_batch_size_multiple): the cut and the filling both stop at the rows the
    budget holds, rounded down to the multiple where it holds that many; a batch that a longer pair ends early
    ends at a multiple, the rows past it beginning the next; fewer rows than the multiple stay as many as fit,
    and the budget is kept."""
    assert [rows_within(1000, width, 8) for width in (8, 24, 100, 200)] == [120, 40, 8, 5]
    assert [rows_within(1000, width) for width in (8, 24, 100, 200)] == [125, 41, 10, 5]
    lengths = [5] * 30  # rows of 5 positions: 20 fit in 100 tokens, 16 in a multiple of 8
    assert [len(b) for b in token_batches(lengths, lengths, 100, seed=0, epoch=0, pool_batches=10,
                                          rows_multiple=8)] == [16, 14]
    lengths = [5] * 11 + [10]  # the longer pair comes last and holds the budget to 10 rows (8 in a multiple): the
    batches = token_batches(lengths, lengths, 100, seed=0, epoch=0, pool_batches=10, rows_multiple=8)  # batch
    assert sorted(len(b) for b in batches) == [4, 8]  # ends at 8 rows, and the 3 past them go on with it
    assert sorted(len(b) for b in token_batches(lengths, lengths, 100, seed=0, epoch=0, pool_batches=10)) == [1, 11]
    batch = make_batch([[5, 6, 7, 8]] * 3, [[9]] * 3, range(3), PAD, BOS, EOS, fill_tokens=100, rows_multiple=8)
    assert batch.src.shape == (16, 5) and batch.n_src_tokens == 15  # 3 pairs, filled to 16 rows (not 20)
    assert make_batch([[5] * 29] * 2, [[9]] * 2, range(2), PAD, BOS, EOS, fill_tokens=100,
                      rows_multiple=8).src.shape == (3, 30)  # 3 rows of 30 fit: no multiple of 8 does


def test_training_batches_in_gpu_shapes_keep_the_budget_and_take_few_shapes(corpus):
    plain = list(TrainBatches(corpus, small_config(batch_tokens=128), seed=3))
    shaped = list(TrainBatches(corpus, small_config(batch_tokens=128, pad_to_multiple=8, pad_rows=True), seed=3))
    assert sorted(i for b in shaped for i in b.indices) == list(range(len(corpus)))  # every pair, once
    for batch in shaped:
        rows, length = batch.src.shape
        assert length % 8 == 0 and batch.tgt_in.size(1) % 8 == 0
        assert rows == 128 // max(length, batch.tgt_in.size(1))  # filled to the budget at the longer side
        assert batch.n_tgt_tokens == int((batch.tgt_out != PAD).sum())
    shapes = {(b.src.shape, b.tgt_in.shape) for b in shaped}
    assert len(shapes) < len({(b.src.shape, b.tgt_in.shape) for b in plain}) / 2
    in_eights = list(TrainBatches(corpus, small_config(batch_tokens=128, pad_to_multiple=8, pad_rows=True,
                                                       rows_multiple=8), seed=3))
    assert sorted(i for b in in_eights for i in b.indices) == list(range(len(corpus)))
    for batch in in_eights:  # a multiple of 8 rows where 8 fit, else as many as fit
        width = max(batch.src.size(1), batch.tgt_in.size(1))
        assert batch.src.size(0) == rows_within(128, width, 8) and batch.src.size(0) * width <= 128
    assert 8 in {b.src.size(0) for b in in_eights}  # rows of 16: 8 of them
    with pytest.raises(ConfigError, match="data.pad_to_multiple must be positive"):
        small_config(pad_to_multiple=0)
    with pytest.raises(ConfigError, match="data.rows_multiple must be positive"):
        small_config(rows_multiple=0)


def test_token_batches_cover_every_pair_once_within_the_budget():
    src, tgt = [len(x) + 1 for x in random_ids(500, 1)], [len(y) + 1 for y in random_ids(500, 2)]
    src[7] = 200  # longer than the budget on its own: a batch of its own, not dropped
    batches = token_batches(src, tgt, batch_tokens=64, seed=1, epoch=0, pool_batches=4)
    assert sorted(i for batch in batches for i in batch) == list(range(500))
    assert [7] in batches
    for batch in batches:
        if batch != [7]:
            assert max(src[i] for i in batch) * len(batch) <= 64 and max(tgt[i] for i in batch) * len(batch) <= 64


def test_token_batches_are_reproducible_from_seed_and_epoch():
    src, tgt = [len(x) for x in random_ids(300, 1)], [len(y) for y in random_ids(300, 2)]
    first = token_batches(src, tgt, 64, seed=1, epoch=0, pool_batches=4)
    assert token_batches(src, tgt, 64, seed=1, epoch=0, pool_batches=4) == first
    assert token_batches(src, tgt, 64, seed=1, epoch=1, pool_batches=4) != first
    assert token_batches(src, tgt, 64, seed=2, epoch=0, pool_batches=4) != first


def test_padding_overhead_is_the_padded_fraction():
    assert padding_overhead([[0, 1], [2]], [2, 4, 3]) == pytest.approx(1 - 9 / 11)  # 8 + 3 cells, 9 tokens


def test_rows_from_arrow_give_the_batch_of_their_lists():
    """TrainBatches hands arrow's list arrays (a slice of one, as its take may return) to make_batch."""
    generator = torch.Generator().manual_seed(0)
    rows = [torch.randint(4, 50, (int(n),), generator=generator).tolist()
            for n in torch.randint(0, 12, (9,), generator=generator)]
    arrays = [pa.array([[7, 7]] + rows, type=pa.list_(pa.int32())).slice(1),
              pa.array(rows, type=pa.large_list(pa.int64())),
              pa.chunked_array([pa.array(rows[:4]), pa.array(rows[4:])])]
    for multiple, fill in ((1, 0), (8, 128)):
        from_lists = make_batch(rows, rows[::-1], range(9), PAD, BOS, EOS, multiple, fill)
        assert from_lists.src[0].tolist() == rows[0] + [EOS] + [PAD] * (from_lists.src.size(1) - len(rows[0]) - 1)
        for arrow in arrays:
            reversed_rows = pa.chunked_array([arrow]).combine_chunks().take(pa.array(range(8, -1, -1)))
            from_arrow = make_batch(arrow, reversed_rows, range(9), PAD, BOS, EOS, multiple, fill)
            for name in ("src", "tgt_in", "tgt_out", "n_src_tokens", "n_tgt_tokens"):
                got, expected = (torch.as_tensor(getattr(batch, name)) for batch in (from_arrow, from_lists))
                assert torch.equal(got, expected), (arrow.type, name)


def test_train_batches_cover_the_corpus_each_epoch_in_a_new_order(corpus):
    batches = TrainBatches(corpus, small_config(), seed=1)
    first = [batch.indices for batch in batches]
    assert sorted(i for indices in first for i in indices) == list(range(200))
    assert batches.epoch == 1 and batches.position == 0
    second = [batch.indices for batch in batches]
    assert second != first and sorted(sum(second, [])) == list(range(200))
    assert len(batches) == len(batches.epoch_batches(2))


def test_train_batches_carry_the_rows_of_their_indices(corpus):
    """Every batch of an epoch holds its indices' rows, also when the dataset is a selection of another's rows
    (an indices mapping, as filtering leaves it): TrainBatches takes the rows with arrow, not Dataset.__getitem__."""
    selected = corpus.select(range(199, -1, -2))
    for dataset in (corpus, selected):
        for batch in TrainBatches(dataset, small_config(), seed=1):
            rows = dataset[batch.indices]
            expected = make_batch(rows["src_ids"], rows["tgt_ids"], batch.indices, PAD, BOS, EOS)
            for name in ("src", "tgt_in", "tgt_out"):
                assert torch.equal(getattr(batch, name), getattr(expected, name)), name


def test_resuming_from_a_state_gives_the_same_remaining_batches(corpus):
    cfg = small_config()
    run = TrainBatches(corpus, cfg, seed=3)
    list(run)  # epoch 0
    stream = iter(run)
    for _ in range(4):  # 4 batches of epoch 1, then a checkpoint
        next(stream)
    state = run.state_dict()
    rest = [batch.tgt_out.tolist() for batch in stream]
    resumed = TrainBatches(corpus, cfg, seed=3)
    resumed.load_state_dict(state)
    assert (resumed.epoch, resumed.position) == (1, 4)
    assert [batch.tgt_out.tolist() for batch in resumed] == rest
    with pytest.raises(ConfigError, match="train.seed=4, but the checkpoint.s batch order comes from seed 3"):
        TrainBatches(corpus, cfg, seed=4).load_state_dict(state)


def test_ranks_take_disjoint_shares_of_the_same_order(corpus):
    cfg = small_config()
    everything = TrainBatches(corpus, cfg, seed=5).epoch_batches(0)
    ranks = [[batch.indices for batch in TrainBatches(corpus, cfg, seed=5, rank=r, world_size=3)] for r in range(3)]
    assert len({len(share) for share in ranks}) == 1  # same number of steps on every rank
    usable = len(everything) - len(everything) % 3
    assert sorted(sum(ranks, [])) == sorted(everything[:usable])
    assert ranks[1] == everything[1:usable:3]


def test_eval_batches_keep_every_sentence_and_restore_the_order():
    src_ids = random_ids(100, 4) + [[], list(range(4, 104))]  # an empty and an over-long sentence
    restored = [None] * len(src_ids)
    for indices, src in eval_batches([[*x, EOS] for x in src_ids], batch_tokens=64, pad_id=PAD):
        assert src.numel() <= 64 or len(indices) == 1
        for index, row in zip(indices, src.tolist()):
            restored[index] = row[: row.index(EOS)]
    assert restored == src_ids


def test_stream_batches_keep_every_pair_within_the_budget():
    src_ids, tgt_ids = random_ids(150, 5), random_ids(150, 6)
    examples = ({"src_ids": x, "tgt_ids": y} for x, y in zip(src_ids, tgt_ids))
    batches = list(stream_batches(examples, small_config(pool_batches=2), seed=0))
    assert sorted(i for batch in batches for i in batch.indices) == list(range(150))
    for batch in batches:
        assert batch.src.numel() <= 64 and batch.tgt_out.numel() <= 64
        assert batch.src[0, : len(src_ids[batch.indices[0]])].tolist() == src_ids[batch.indices[0]]


def test_streamed_batches_in_gpu_shapes_keep_the_budget_as_the_in_memory_ones_do():
    src_ids, tgt_ids = random_ids(150, 5), random_ids(150, 6)
    examples = ({"src_ids": x, "tgt_ids": y} for x, y in zip(src_ids, tgt_ids))
    batches = list(stream_batches(examples, small_config(batch_tokens=128, pool_batches=2, pad_to_multiple=8,
                                                         pad_rows=True), seed=0))
    assert sorted(i for batch in batches for i in batch.indices) == list(range(150))
    for batch in batches:
        rows, length = batch.src.shape
        assert length % 8 == 0 and batch.tgt_in.size(1) % 8 == 0
        assert rows == 128 // max(length, batch.tgt_in.size(1))  # rounded, then filled to the budget


def test_a_stream_knows_the_length_of_an_epoch_once_it_has_ended():
    examples = [{"src_ids": x, "tgt_ids": y} for x, y in zip(random_ids(150, 5), random_ids(150, 6))]
    batches = StreamingTrainBatches(lambda epoch: examples, small_config(pool_batches=2), seed=0)
    assert batches.last_epoch_length is None  # the progress bar cannot tell where max_epochs ends yet
    first_epoch = len(list(batches))
    assert batches.last_epoch_length == first_epoch and batches.epoch == 1


@pytest.mark.corpus
def test_multi30k_padding_overhead_at_4096_tokens(multi30k):
    cfg, tokenizer = multi30k
    train = encode_dataset(load_split(cfg, "train"), tokenizer, cfg.cache_dir)
    src, tgt = [n + 1 for n in train["src_len"]], [n + 1 for n in train["tgt_len"]]
    batches = token_batches(src, tgt, batch_tokens=4096, seed=1, epoch=0, pool_batches=cfg.pool_batches)
    assert padding_overhead(batches, src) <= 0.10 and padding_overhead(batches, tgt) <= 0.10
    # random batches of the same mean size pay far more
    order = random.Random(1).sample(range(len(src)), len(src))
    size = round(len(src) / len(batches))
    shuffled = [order[i:i + size] for i in range(0, len(order), size)]
    assert padding_overhead(shuffled, src) > 0.3 and padding_overhead(shuffled, tgt) > 0.3


@pytest.mark.corpus
def test_multi30k_batches_are_deterministic_for_a_seed(multi30k):
    cfg, tokenizer = multi30k
    train = encode_dataset(load_split(cfg, "train"), tokenizer, cfg.cache_dir)
    orders = [TrainBatches(train, cfg, seed=seed).epoch_batches(0) for seed in (1, 1, 2)]
    assert orders[0] == orders[1] and orders[0] != orders[2]
