"""Encoded sentence pairs -> padded tensors: `Batch`, built by `make_batch` (and `training_batch`, in the
shapes a run's config asks for).

Padding is made in one place, `pad_sequences` and `make_batch`'s scatter; the model builds its masks from
it with `attention.padding_mask`. A source gets eos appended and each target row gets bos or eos, so
rows are one longer than the ids.

Batch shapes for GPUs: ``data.pad_to_multiple`` rounds a batch's lengths up (8 suits tensor cores and the
fused attention kernels' alignment), and ``data.pad_rows`` adds empty rows up to the rows the budget
allows at that length, so that training batches take a handful of shapes, as CUDA graphs need
(``train.cuda_graphs=true``); ``data.rows_multiple`` makes a batch's rows a multiple (8: rows attend in groups
of up to 8, ``train.attention_row_length``). None of them changes the loss: the loss skips padding (tested).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch
from torch import Tensor

from transformer.config import DataConfig


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


def round_down_where_whole(count: int, multiple: int) -> int:
    """``count`` rounded down to a multiple of ``multiple`` where it holds one, else ``count`` itself."""
    return count - count % multiple if count >= multiple else count


def rows_within(batch_tokens: int, width: int, multiple: int = 1) -> int:
    """The most rows of ``width`` positions in ``batch_tokens``, rounded down to a multiple of ``multiple`` where
    there are that many (``data.rows_multiple``, fairseq's required_batch_size_multiple)."""
    return round_down_where_whole(batch_tokens // width, multiple)


Rows = Sequence[Sequence[int]] | pa.ListArray | pa.LargeListArray | pa.ChunkedArray  # arrow's: `TrainBatches`' take


def pad_sequences(seqs: Rows, pad_id: int, multiple: int = 1) -> Tensor:
    """Right-pad id lists into one long tensor of shape (B, longest rounded up to ``multiple``)."""
    ids, lengths = _flat(seqs)
    return _padded(ids, lengths, len(lengths), round_up(int(lengths.max(initial=0)), multiple), pad_id)


def make_batch(src_ids: Rows, tgt_ids: Rows, indices: Sequence[int], pad_id: int, bos_id: int, eos_id: int,
               pad_to_multiple: int = 1, fill_tokens: int = 0, rows_multiple: int = 1) -> Batch:
    """Build a `Batch` from ids without specials: eos ends the source, bos/eos shift the target.

    Lengths are rounded up to ``pad_to_multiple``. With ``fill_tokens``, empty pairs fill the batch to
    as many rows as `rows_within` ``fill_tokens`` at the longer side's length (a multiple of ``rows_multiple``
    where the budget holds that many): a source of eos alone and a target whose output is all padding, which the
    loss skips (an all-padding source would leave its attention nothing to see).
    """
    (src, src_lengths), (tgt, tgt_lengths) = _flat(src_ids), _flat(tgt_ids)
    src_width, tgt_width = (round_up(int(lengths.max(initial=0)) + 1, pad_to_multiple)  # + eos, bos
                            for lengths in (src_lengths, tgt_lengths))
    rows = max(rows_within(fill_tokens, max(src_width, tgt_width), rows_multiple), len(src_lengths))
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
    if isinstance(rows, pa.ChunkedArray):
        rows = rows.combine_chunks()
    if isinstance(rows, (pa.ListArray, pa.LargeListArray)):
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
                      cfg.batch_tokens if cfg.pad_rows else 0, cfg.rows_multiple)
