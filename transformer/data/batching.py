"""Encoded sentence pairs -> padded tensors: `Batch` and token-budget batches.

A batch holds at most ``batch_tokens`` padded tokens on each side, as the paper batches "by
approximate sequence length" with about 25000 source and 25000 target tokens per batch (§5.1).
Sentences of similar length go together (shuffle, sort within large pools, cut, shuffle the batches),
so little of a batch is padding; `padding_overhead` measures how much. Padding is made in one place,
`pad_sequences`; the model builds its masks from it with `attention.padding_mask`.

Lengths given to the batching functions are row lengths as they will be in the tensors: a source
gets eos appended and each target row gets bos or eos, so both are one longer than the ids.

Batch shapes for GPUs: ``data.pad_to_multiple`` rounds a batch's lengths up (8 suits tensor cores and the
fused attention kernels' alignment), and ``data.pad_rows`` adds empty rows up to the rows the budget
allows at that length, so that training batches take a handful of shapes, as CUDA graphs need
(``train.cuda_graphs=true``). Neither changes the loss: the loss skips padding (tested).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch
from datasets import Dataset
from torch import Tensor

from transformer.config import ConfigError, DataConfig


@dataclass
class Batch:
    """Padded sentence pairs for teacher forcing.

    Shapes: src (B, S) = x + [eos]; tgt_in (B, T) = [bos] + y; tgt_out (B, T) = y + [eos].
    """

    src: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    indices: list[int]  # positions of the pairs in the dataset (or the stream)
    n_src_tokens: int  # real, non-pad tokens of src
    n_tgt_tokens: int  # real tokens of tgt_out: the tokens the loss is averaged over

    def to(self, device: torch.device | str) -> Batch:
        """The same batch on ``device``. To a GPU through pinned memory: a copy from ordinary (pageable)
        memory first waits for all the work the GPU has queued, which would stall a launch-bound step."""
        pin = torch.device(device).type == "cuda"

        def move(tensor: Tensor) -> Tensor:
            if pin and tensor.device.type == "cpu":
                tensor = tensor.pin_memory()
            return tensor.to(device, non_blocking=True)

        return dataclasses.replace(self, src=move(self.src), tgt_in=move(self.tgt_in), tgt_out=move(self.tgt_out))


def round_up(length: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is at least ``length``."""
    return -(-length // multiple) * multiple


Rows = Sequence[Sequence[int]] | pa.ListArray  # id lists, or arrow's list array (`TrainBatches` takes rows with it)


def pad_sequences(seqs: Rows, pad_id: int, multiple: int = 1) -> Tensor:
    """Right-pad id lists into one long tensor of shape (B, longest rounded up to ``multiple``)."""
    ids, lengths = _flat(seqs)
    return _padded(ids, lengths, len(lengths), round_up(int(lengths.max(initial=0)), multiple), pad_id)


def make_batch(src_ids: Rows, tgt_ids: Rows, indices: Sequence[int], pad_id: int, bos_id: int, eos_id: int,
               pad_to_multiple: int = 1, fill_tokens: int = 0) -> Batch:
    """Build a `Batch` from ids without specials: eos ends the source, bos/eos shift the target.

    Lengths are rounded up to ``pad_to_multiple``. With ``fill_tokens``, empty pairs fill the batch to
    as many rows as ``fill_tokens`` allows at the longer side's length: a source of eos alone and a
    target whose output is all padding, which the loss skips (an all-padding source would leave its
    attention nothing to see).
    """
    (src, src_lengths), (tgt, tgt_lengths) = _flat(src_ids), _flat(tgt_ids)
    src_width, tgt_width = (round_up(int(lengths.max(initial=0)) + 1, pad_to_multiple)  # + eos, bos
                            for lengths in (src_lengths, tgt_lengths))
    rows = max(fill_tokens // max(src_width, tgt_width), len(src_lengths))
    batch = Batch(_padded(src, src_lengths, rows, src_width, pad_id, end=eos_id),
                  _padded(tgt, tgt_lengths, rows, tgt_width, pad_id, start=bos_id),
                  _padded(tgt, tgt_lengths, rows, tgt_width, pad_id, end=eos_id), list(indices),
                  n_src_tokens=int(src_lengths.sum()) + len(src_lengths),
                  n_tgt_tokens=int(tgt_lengths.sum()) + len(tgt_lengths))
    batch.src[len(src_lengths):, 0] = eos_id  # the filling pairs
    batch.tgt_in[len(tgt_lengths):, 0] = bos_id
    return batch


def _flat(rows: Rows) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ids as (their ids end to end, each row's length), from arrow's list array without Python lists."""
    if isinstance(rows, pa.ListArray):
        return rows.flatten().to_numpy(), rows.value_lengths().to_numpy()
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    return np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(lengths.sum())), lengths


def _padded(ids: np.ndarray, lengths: np.ndarray, rows: int, width: int, pad_id: int, start: int | None = None,
            end: int | None = None) -> Tensor:
    """A (rows, width) tensor of ``pad_id`` whose first rows hold [start] + each row's ids + [end] (either
    left out when None), in one scatter: a training batch of 4,096 tokens in GPU shapes is built in 0.15 ms
    instead of 0.83 with Python lists (2-core EPYC Zen 5; `python scripts/benchmark.py --parts batching`),
    host time that a GPU step replayed from a CUDA graph would wait for."""
    out = np.full((rows, width), pad_id, dtype=np.int64)
    shift = int(start is not None)
    row = np.repeat(np.arange(len(lengths)), lengths)
    out[row, np.arange(len(ids)) - np.repeat(np.cumsum(lengths) - lengths, lengths) + shift] = ids
    if start is not None:
        out[:len(lengths), 0] = start
    if end is not None:
        out[np.arange(len(lengths)), lengths + shift] = end
    return torch.from_numpy(out)


def training_batch(src_ids: Rows, tgt_ids: Rows, indices: Sequence[int], cfg: DataConfig) -> Batch:
    """`make_batch` in the shapes ``cfg`` asks for: lengths rounded up to ``data.pad_to_multiple``, and with
    ``data.pad_rows`` as many rows as ``data.batch_tokens`` allows."""
    return make_batch(src_ids, tgt_ids, indices, cfg.pad_id, cfg.bos_id, cfg.eos_id, cfg.pad_to_multiple,
                      cfg.batch_tokens if cfg.pad_rows else 0)


def _cut(order: Iterable[int], src_lengths: Sequence[int], tgt_lengths: Sequence[int],
         batch_tokens: int, multiple: int = 1) -> list[list[int]]:
    """Cut ``order`` into consecutive batches with longest row * rows <= batch_tokens on each side, the
    longest row rounded up to ``multiple`` as the tensors will be.

    A sentence longer than the budget on its own gets a batch of its own rather than being lost.
    """
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        length = round_up(max(src_lengths[i], tgt_lengths[i]), multiple)
        candidate = max(longest, length)
        if current and candidate * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current, candidate = [], length
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
                  epoch: int, pool_batches: int, pad_to_multiple: int = 1) -> list[list[int]]:
    """Index batches of similar-length pairs in a random order that (seed, epoch) reproduces.

    Shuffle, sort pools of about ``pool_batches`` batches by length, cut each pool into batches
    within the token budget (lengths rounded up to ``pad_to_multiple``), then shuffle the batches:
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
        batches += _cut(pool.tolist(), src_list, tgt_list, batch_tokens, pad_to_multiple)
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

    ``dataset`` has the columns of `data.encode_dataset` (``src_ids``, ``tgt_ids``, ``src_len``,
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
                                    self.cfg.pool_batches, self.cfg.pad_to_multiple)
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


def eval_batches(src_ids: Sequence[Sequence[int]], batch_tokens: int, pad_id: int,
                 eos_id: int | None = None) -> Iterator[tuple[list[int], Tensor]]:
    """Batches of every source sentence, longest first, as (positions in ``src_ids``, src (B, S)).

    Nothing is dropped: a sentence over the budget gets a batch of its own. Callers put outputs
    back in input order with the positions. ``eos_id`` is appended when given; leave it out when
    the ids already end with eos.
    """
    rows = [[*x, eos_id] for x in src_ids] if eos_id is not None else [list(x) for x in src_ids]
    lengths = [len(row) for row in rows]
    order = sorted(range(len(rows)), key=lambda i: -lengths[i])  # longest first: memory peaks show up at once
    for indices in _cut(order, lengths, lengths, batch_tokens):
        yield indices, pad_sequences([rows[i] for i in indices], pad_id)


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
    batches = _cut(order, src_lengths.tolist(), tgt_lengths.tolist(), cfg.batch_tokens, cfg.pad_to_multiple)
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
