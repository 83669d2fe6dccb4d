"""The decoder's cache for incremental decoding: what each attention module keeps between steps, so
that producing token t costs O(t) instead of recomputing the whole prefix (O(t²)).

Kept apart from the attention modules, as fairseq keeps its incremental state: a module given no
cache computes everything from its inputs, as in training.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class KeyValueCache:
    """The keys and values of the positions decoded so far, for one self-attention module: (B, H, T, d_head)."""

    key: Tensor | None = None
    value: Tensor | None = None

    def append(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Add the new positions' keys and values; returns those of every position so far."""
        if self.key is not None and self.value is not None:
            key, value = torch.cat([self.key, key], dim=2), torch.cat([self.value, value], dim=2)
        self.key, self.value = key, value
        return key, value

    def reorder(self, index: Tensor) -> None:
        """Keep the batch rows in ``index`` (in that order); beam search reorders hypotheses."""
        if self.key is not None and self.value is not None:
            self.key, self.value = self.key.index_select(0, index), self.value.index_select(0, index)


@dataclass
class CrossAttentionCache(KeyValueCache):
    """The keys and values of the encoder output, projected once: they do not change while decoding.

    They hold one row per source sentence. Beam search decodes K hypotheses of each sentence in K
    consecutive rows: those K query rows are folded into their sentence's row, so they read its
    keys and values together in one matrix product instead of from K copies of the memory.
    """

    def keys_values(self, project: Callable[[Tensor], tuple[Tensor, Tensor]],
                    memory: Tensor) -> tuple[Tensor, Tensor]:
        """``project(memory)`` on the first call, the stored keys and values after it."""
        if self.key is None or self.value is None:
            self.key, self.value = project(memory)
        return self.key, self.value

    def group_queries(self, x: Tensor) -> Tensor:
        """Fold the G consecutive query rows of each source into one row: (B * G, T, D) -> (B, G * T, D)."""
        sources = self.key.size(0)
        if x.size(0) % sources:
            raise ValueError(f"cross-attention: {x.size(0)} query rows cannot share {sources} source rows")
        return x if x.size(0) == sources else x.reshape(sources, -1, x.size(-1))

    def ungroup(self, output: Tensor, weights: Tensor | None, rows: int) -> tuple[Tensor, Tensor | None]:
        """Undo `group_queries`: output (B, G * T, D) -> (B * G, T, D), weights (B, H, G*T, S) -> (B * G, H, T, S)."""
        if output.size(0) == rows:
            return output, weights
        output = output.reshape(rows, -1, output.size(-1))
        if weights is not None:
            sources, heads, _, key_len = weights.shape
            weights = weights.view(sources, heads, rows // sources, -1, key_len).transpose(1, 2)
            weights = weights.reshape(rows, heads, -1, key_len)
        return output, weights


@dataclass
class DecoderCache:
    """The caches of every decoder layer.

    ``self_attn`` entries are None when the prefix is recomputed at every step (``incremental=False``:
    what the benchmark compares the cache against); the encoder output's keys and values are kept either way.
    """

    self_attn: list[KeyValueCache | None] = field(default_factory=list)
    cross_attn: list[CrossAttentionCache] = field(default_factory=list)

    @classmethod
    def empty(cls, n_layers: int, incremental: bool = True) -> DecoderCache:
        return cls([KeyValueCache() if incremental else None for _ in range(n_layers)],
                   [CrossAttentionCache() for _ in range(n_layers)])

    @property
    def length(self) -> int:
        """Number of target positions already decoded (0 when the prefix is recomputed)."""
        first = self.self_attn[0] if self.self_attn else None
        return 0 if first is None or first.key is None else first.key.size(2)

    def reorder(self, index: Tensor, source_index: Tensor | None = None) -> None:
        """Select/reorder rows: self-attention entries by ``index``, cross-attention ones by ``source_index``.

        The cross-attention entries hold one row per source; None leaves them as they are.
        """
        for entry in self.self_attn:
            if entry is not None:
                entry.reorder(index)
        for entry in self.cross_attn if source_index is not None else []:
            entry.reorder(source_index)
