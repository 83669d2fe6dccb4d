"""Token-budget batches: which sentence pairs go together, epoch after epoch (`TrainBatches`), from a
stream (`StreamingTrainBatches`), or for evaluation (`eval_batches`).

A batch holds at most ``batch_tokens`` padded tokens on each side, as the paper batches "by
approximate sequence length" with about 25000 source and 25000 target tokens per batch (§5.1).
Sentences of similar length go together (shuffle, sort within large pools, cut, shuffle the batches),
so little of a batch is padding; `padding_overhead` measures how much. The tensors are made in
`data.batch`.

Lengths given to the batching functions are row lengths as they will be in the tensors: a source
gets eos appended and each target row gets bos or eos, so both are one longer than the ids.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import groupby
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from torch import Tensor

from transformer.config import ConfigError, DataConfig
from transformer.data.batch import Batch, pad_sequences, round_down_where_whole, round_up, rows_within, training_batch

if TYPE_CHECKING:  # a training corpus: translating, which batches too, needs no datasets (0.8 s to import)
    from datasets import Dataset


def _cut(order: Iterable[int], src_lengths: Sequence[int], tgt_lengths: Sequence[int],
         batch_tokens: int, multiple: int = 1, rows_multiple: int = 1) -> list[list[int]]:
    """Cut ``order`` into consecutive batches with longest row * rows <= batch_tokens on each side, the
    longest row rounded up to ``multiple`` as the tensors will be, and the rows at most `rows_within` the budget.

    With ``rows_multiple``, a full batch ends at its largest multiple of that many rows, and the rows past it
    begin the next batch (as fairseq's batch_by_size): a longer pair that lowers the rows the budget holds
    would otherwise end a batch at any count. A sentence longer than the budget on its own gets a batch of its
    own rather than being lost.
    """
    def width(i: int) -> int:
        return round_up(max(src_lengths[i], tgt_lengths[i]), multiple)

    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        candidate = max(longest, width(i))
        if current and len(current) + 1 > rows_within(batch_tokens, candidate, rows_multiple):
            kept = round_down_where_whole(len(current), rows_multiple)
            batches.append(current[:kept])
            current = current[kept:]  # fewer than rows_multiple rows: with i, if the budget holds them
            candidate = max([width(j) for j in current] + [width(i)])
            if current and len(current) + 1 > rows_within(batch_tokens, candidate, rows_multiple):
                batches.append(current)
                current, candidate = [], width(i)
        current.append(i)
        longest = candidate
    if current:
        batches.append(current)
    return batches


def _by_length(src_lengths: np.ndarray, tgt_lengths: np.ndarray) -> np.ndarray:
    """Stable order by the longer side, then by source minus target length.

    The budget is set by the longer side, and within one longer-side length the order runs from
    (short source, target at full length) to (source at full length, short target), so neighbours
    share one full-length side and the other side changes slowly.
    """
    return np.lexsort((src_lengths - tgt_lengths, np.maximum(src_lengths, tgt_lengths)))


def token_batches(src_lengths: Sequence[int], tgt_lengths: Sequence[int], batch_tokens: int, seed: int,
                  epoch: int, pool_batches: int, pad_to_multiple: int = 1, rows_multiple: int = 1) -> list[list[int]]:
    """Index batches of similar-length pairs in a random order that (seed, epoch) reproduces.

    Shuffle, sort pools of about ``pool_batches`` batches by length, cut each pool into batches
    within the token budget (lengths rounded up to ``pad_to_multiple``, rows a multiple of ``rows_multiple``
    where the budget holds that many), then shuffle the batches:
    large pools keep padding low, the shuffles vary the batches and their order from epoch to epoch.
    """
    src, tgt = np.asarray(src_lengths, dtype=np.int64), np.asarray(tgt_lengths, dtype=np.int64)
    if len(src) == 0:
        return []
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(src))
    rows_per_batch = batch_tokens / max(1.0, float(np.maximum(src, tgt).mean()))
    n_pools = max(1, round(len(src) / (rows_per_batch * pool_batches)))
    src_list, tgt_list = src.tolist(), tgt.tolist()
    batches = []
    for pool in np.array_split(order, n_pools):  # equal pools: no small, badly padded last pool
        pool = pool[_by_length(src[pool], tgt[pool])]
        batches += _cut(pool.tolist(), src_list, tgt_list, batch_tokens, pad_to_multiple, rows_multiple)
    return [batches[i] for i in rng.permutation(len(batches))]


def padding_overhead(batches: Sequence[Sequence[int]], lengths: Sequence[int]) -> float:
    """Fraction of a side's padded tensor cells that are padding: 1 - real tokens / padded tokens."""
    padded = sum(len(batch) * max(lengths[i] for i in batch) for batch in batches if batch)
    real = sum(lengths[i] for batch in batches for i in batch)
    return 1.0 - real / padded if padded else 0.0


class _Resumable:
    """Position of a training batch stream: the epoch and the batches of it already handed out."""

    seed: int
    epoch: int
    position: int

    def state_dict(self) -> dict[str, int]:
        """Where the batch stream stands (for checkpoints)."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a `state_dict`; the order depends on the seed, so it must match."""
        if state["seed"] != self.seed:  # a ConfigError: one line, not a traceback
            raise ConfigError(f"train.seed={self.seed}, but the checkpoint's batch order comes from seed "
                              f"{state['seed']}: resume with train.seed={state['seed']}")
        self.epoch, self.position = state["epoch"], state["position"]


class TrainBatches(_Resumable):
    """Token-budget training batches of an encoded corpus, reshuffled every epoch and resumable.

    ``dataset`` has the columns of `cleaning.encode_dataset` (``src_ids``, ``tgt_ids``, ``src_len``,
    ``tgt_len``). Iterating yields the rest of the current epoch, then moves to the next one;
    ``state_dict()`` after any batch lets a restarted run continue with the very next batch. With
    several ranks, every rank computes the same order and takes every ``world_size``-th batch,
    dropping the tail so that all ranks take the same number of steps.
    """

    def __init__(self, dataset: Dataset, cfg: DataConfig, seed: int, rank: int = 0, world_size: int = 1) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        table = dataset.with_format("arrow", columns=["src_len", "tgt_len", "src_ids", "tgt_ids"])[:]
        self._src_lengths = [n + 1 for n in table["src_len"].to_pylist()]  # + eos
        self._tgt_lengths = [n + 1 for n in table["tgt_len"].to_pylist()]  # + bos (tgt_in) or eos (tgt_out)
        # a batch's rows by arrow's take, padded from arrow's arrays (`make_batch`): 0.2 ms a batch of 8,192
        # tokens, where Dataset.__getitem__ and Python lists took 5 (2-core EPYC Zen 5), as long as a step of the
        # recipe's model on a GPU
        self._src_ids, self._tgt_ids = table["src_ids"].combine_chunks(), table["tgt_ids"].combine_chunks()
        self.cfg, self.seed = cfg, seed
        self.rank, self.world_size = rank, world_size
        self.epoch, self.position = 0, 0  # position: batches of this epoch already handed out
        self._cached: tuple[int, list[list[int]]] | None = None

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """This rank's index batches for ``epoch``, in order."""
        if self._cached is None or self._cached[0] != epoch:
            batches = token_batches(self._src_lengths, self._tgt_lengths, self.cfg.batch_tokens, self.seed, epoch,
                                    self.cfg.pool_batches, self.cfg.pad_to_multiple, self.cfg.rows_multiple)
            usable = len(batches) - len(batches) % self.world_size
            self._cached = (epoch, batches[self.rank:usable:self.world_size])
        return self._cached[1]

    def __len__(self) -> int:
        """Batches in the current epoch for this rank."""
        return len(self.epoch_batches(self.epoch))

    def __iter__(self) -> Iterator[Batch]:
        batches = self.epoch_batches(self.epoch)
        while self.position < len(batches):
            indices = batches[self.position]
            rows = pa.array(indices, type=pa.int64())
            self.position += 1  # counted before the yield: a checkpoint taken after this step resumes after it
            yield training_batch(self._src_ids.take(rows), self._tgt_ids.take(rows), indices, self.cfg)
        self.epoch, self.position = self.epoch + 1, 0

    @property
    def epoch_finished(self) -> bool:
        """True once the last batch of the current epoch has been handed out."""
        return self.position >= len(self)


def eval_batches(src_ids: Sequence[Sequence[int]], batch_tokens: int, pad_id: int, multiple: int = 1,
                 longest: int | None = None) -> Iterator[tuple[list[int], Tensor]]:
    """Batches of every source sentence (its ids ending in eos), longest first, as (positions in ``src_ids``,
    src (B, S)).

    Nothing is dropped: a sentence over the budget gets a batch of its own. Callers put outputs
    back in input order with the positions. Each sentence is padded to its own length rounded up to ``multiple``
    (at most ``longest`` positions), and batched only with sentences of that width: so its width never
    depends on the other sentences (`transformer.decoding.inputs.SOURCE_LENGTH_MULTIPLE` says why).
    """
    rows = [list(x) for x in src_ids]
    lengths = [len(row) for row in rows]
    order = sorted(range(len(rows)), key=lambda i: -lengths[i])  # longest first: memory peaks show up at once

    def width(i: int) -> int:
        rounded = round_up(lengths[i], multiple)
        return rounded if longest is None else min(rounded, max(longest, lengths[i]))

    for size, same_width in groupby(order, key=width):  # widths fall with the lengths: each width is one run
        for indices in _cut(list(same_width), lengths, lengths, batch_tokens, multiple):
            yield indices, pad_sequences([rows[i] for i in indices], pad_id, multiple)[:, :size]


def stream_batches(examples: Iterable[dict], cfg: DataConfig, seed: int) -> Iterator[Batch]:
    """Token-budget batches built on the fly from a stream of encoded pairs (corpora larger than RAM).

    Reads pools of about ``cfg.pool_batches`` batches' worth of tokens, then sorts, cuts and shuffles
    each pool like `token_batches`. ``Batch.indices`` count the pairs read from the stream.
    """
    rng = np.random.default_rng(seed)
    pool_tokens = cfg.pool_batches * cfg.batch_tokens
    pool: list[tuple[int, list[int], list[int]]] = []
    filled = 0
    for position, example in enumerate(examples):
        pool.append((position, example["src_ids"], example["tgt_ids"]))
        filled += max(len(example["src_ids"]), len(example["tgt_ids"])) + 1
        if filled >= pool_tokens:
            yield from _pool_batches(pool, cfg, rng)
            pool, filled = [], 0
    yield from _pool_batches(pool, cfg, rng)


def _pool_batches(pool: list[tuple[int, list[int], list[int]]], cfg: DataConfig,
                  rng: np.random.Generator) -> Iterator[Batch]:
    """Sort one pool of (position, src ids, tgt ids) by length, cut it and yield its batches shuffled."""
    src_lengths = np.array([len(src) + 1 for _, src, _ in pool], dtype=np.int64)
    tgt_lengths = np.array([len(tgt) + 1 for _, _, tgt in pool], dtype=np.int64)
    order = _by_length(src_lengths, tgt_lengths).tolist()
    batches = _cut(order, src_lengths.tolist(), tgt_lengths.tolist(), cfg.batch_tokens, cfg.pad_to_multiple,
                   cfg.rows_multiple)
    for b in rng.permutation(len(batches)):
        rows = [pool[i] for i in batches[b]]
        yield training_batch([src for _, src, _ in rows], [tgt for _, _, tgt in rows], [p for p, _, _ in rows], cfg)


class StreamingTrainBatches(_Resumable):
    """`TrainBatches` for a corpus read as a stream: batches built on the fly, one epoch at a time.

    ``epoch_stream(epoch)`` returns that epoch's encoded pairs (shuffled for the epoch, this rank's
    share). Resuming replays the epoch's stream and skips the batches already used, so it costs
    reading, not training. One batch is read ahead to know when an epoch ends.
    """

    def __init__(self, epoch_stream: Callable[[int], Iterable[dict]], cfg: DataConfig, seed: int) -> None:
        self.epoch_stream, self.cfg, self.seed = epoch_stream, cfg, seed
        self.epoch, self.position = 0, 0
        self.epoch_finished = False
        self.last_epoch_length: int | None = None  # batches; a stream's epoch is counted only at its end

    def __iter__(self) -> Iterator[Batch]:
        batches = stream_batches(self.epoch_stream(self.epoch), self.cfg, self.seed + self.epoch)
        for _ in range(self.position):
            next(batches, None)
        current = next(batches, None)
        while current is not None:
            following = next(batches, None)
            self.position += 1
            self.epoch_finished = following is None
            yield current
            current = following
        self.last_epoch_length = self.position
        self.epoch, self.position, self.epoch_finished = self.epoch + 1, 0, False
