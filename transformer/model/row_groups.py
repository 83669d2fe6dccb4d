"""Attention over short rows in groups (``train.attention_row_length``): a few consecutive rows of a batch
attend as one longer row, under a block-diagonal mask, so that a fused kernel's tile holds several sentences.

Why: the fused attention kernels of a GPU work in tiles of 64 or 128 positions, one row and head a tile; at
Multi30k's sentence lengths (rows of 16 to 32 positions) a tile is mostly padding, and there are as many
tiles as rows times heads. On an H200 the paper's base size spent 14.3 ms of a 51-ms compiled and graphed
training step in attention, more than in its matrix products (docs/gpu.md). Grouping g rows gives g times
fewer, fuller tiles, without touching the data or the other layers: a (B, T, H, d) tensor's rows lie end to
end, so (B / g, g T, H, d) is a view of it. A key outside its query's own row is masked; within the row the
mask is the row's own (padding, look-ahead), so each query attends to what it attended to before: the same
context up to rounding (tests/test_row_groups.py); where only one row fits, rows attend alone as before.
Measured: not yet (the GPU benchmark's grouped rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class RowGroups:
    """The mask of rows attending g at a time: (B / g or 1, 1, g Tq, g Tk), True = may attend; g is its
    size(-2) // Tq."""

    mask: Tensor


@dataclass(frozen=True)
class GroupedMasks:
    """A batch's three attentions in groups of rows: the encoder's self-attention, the decoder's masked
    self-attention and the encoder-decoder attention."""

    encoder: RowGroups
    decoder: RowGroups
    cross: RowGroups


def group_size(rows: int, length: int, row_length: int) -> int:
    """The most rows, a power of two that divides ``rows``, whose ``length`` positions fit in ``row_length``."""
    size = 1
    while rows % (2 * size) == 0 and 2 * size * length <= row_length:
        size *= 2
    return size


def grouped_masks(src_real: Tensor, tgt_length: int, size: int) -> GroupedMasks:
    """The masks of a padded batch in groups of ``size`` rows (`group_size`). ``src_real`` (B, S) is True on
    the source's real tokens; the target needs only the look-ahead mask (its padding comes after its tokens,
    as `layers.DecoderLayer` says)."""
    rows, src_length = src_real.shape
    keys = src_real.reshape(rows // size, 1, 1, size * src_length)
    target = torch.arange(size * tgt_length, device=src_real.device)

    def same_row(query_length: int, key_length: int) -> Tensor:  # (g Tq, g Tk)
        queries = torch.arange(size * query_length, device=src_real.device) // query_length
        return queries[:, None] == torch.arange(size * key_length, device=src_real.device)[None, :] // key_length

    look_ahead = same_row(tgt_length, tgt_length) & (target[:, None] >= target[None, :])
    return GroupedMasks(RowGroups(same_row(src_length, src_length) & keys), RowGroups(look_ahead[None, None]),
                        RowGroups(same_row(tgt_length, src_length) & keys))


def attend_in_groups(query: Tensor, key: Tensor, value: Tensor, groups: RowGroups, dropout_p: float) -> Tensor:
    """torch's fused attention over groups of rows: query (B, H, Tq, d), key and value (B, H, Tk, d) -> the
    context (B, H, Tq, d)."""
    rows, heads, query_length, _ = query.shape
    size = groups.mask.size(-2) // query_length

    def grouped(x: Tensor) -> Tensor:  # (B, H, T, d) -> (B / g, H, g T, d), a view where x is one of heads
        return x.transpose(1, 2).reshape(rows // size, size * x.size(2), heads, x.size(3)).transpose(1, 2)

    context = F.scaled_dot_product_attention(grouped(query), grouped(key), grouped(value), attn_mask=groups.mask,
                                             dropout_p=dropout_p)
    return context.transpose(1, 2).reshape(rows, query_length, heads, value.size(3)).transpose(1, 2)
