"""Attention (paper §3.2): scaled dot-product attention, multi-head attention, masks and the
key/value cache used for incremental decoding.

Masks are boolean with ``True`` = "may attend", the convention of
`torch.nn.functional.scaled_dot_product_attention`: padding ``(B, 1, 1, S)``, causal ``(T, T)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer.fast.dropout import dropout


def scaled_dot_product_attention(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None, dropout_p: float = 0.0
) -> tuple[Tensor, Tensor]:
    """Attention(Q, K, V) = softmax(QKᵀ / sqrt(d_k)) V (§3.2.1, Eq. 1); returns (context, weights).

    The explicit formula: used when the weights themselves are wanted (plots, tests) and to train
    on the CPU, where it beats `F.scaled_dot_product_attention` (see `fused_attention_pays`).
    Shapes: query (..., Tq, Dk); key (..., Tk, Dk); value (..., Tk, Dv); mask broadcasts to
    (..., Tq, Tk). A query whose keys are all masked gets zero weights and a zero context.
    """
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))  # (..., Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    # the softmax runs in float32: torch's bf16 CPU softmax over short rows ran 4x slower (and is less exact)
    weights = scores.softmax(dim=-1, dtype=torch.float32).nan_to_num(0.0).to(value.dtype)  # fully masked: zeros
    weights = dropout(weights, dropout_p)
    return weights @ value, weights  # (..., Tq, Dv), (..., Tq, Tk)


def fused_attention_pays(device: torch.device, training: bool) -> bool:
    """Whether `F.scaled_dot_product_attention` should replace the explicit formula.

    Everywhere but in training on the CPU (torch 2.13, measured on 2 cores): there the fused
    kernel's backward is slow at sentence lengths and its fallback for dropout computes bf16 in
    fp32, while the formula with bf16 matrix products and byte dropout ran 1.3-3x faster. For
    decoding on the CPU the fused kernel wins: in bf16 the formula's matrix products go through
    oneDNN, which builds a new kernel (~0.8 ms) for every new shape, and each step brings new ones.
    """
    return device.type != "cpu" or not training


def padding_mask(tokens: Tensor, pad_id: int) -> Tensor:
    """Key-padding mask of a padded batch: True on real tokens. Shapes: (B, S) -> (B, 1, 1, S)."""
    return (tokens != pad_id)[:, None, None, :]


def causal_mask(query_len: int, key_len: int, device: torch.device | None = None) -> Tensor:
    """Mask that lets query i see keys up to its own position (§3.2.3), shape (Tq, Tk).

    With a cache the queries are the last ``query_len`` of ``key_len`` positions, so the
    diagonal is shifted by ``key_len - query_len``.
    """
    ones = torch.ones(query_len, key_len, dtype=torch.bool, device=device)
    return ones.tril(diagonal=key_len - query_len)


@dataclass
class KeyValueCache:
    """Projected keys and values of one attention module kept between decoding steps.

    Self-attention appends the new positions each step; cross-attention fills it once per
    sentence from the encoder output. Shapes: (B, H, T, d_head).
    """

    key: Tensor | None = None
    value: Tensor | None = None

    def reorder(self, index: Tensor) -> None:
        """Keep the batch rows in ``index`` (in that order); beam search reorders hypotheses."""
        if self.key is not None and self.value is not None:
            self.key = self.key.index_select(0, index)
            self.value = self.value.index_select(0, index)


@dataclass
class DecoderCache:
    """The caches of every decoder layer: producing token t then costs O(t), not O(t²)."""

    self_attn: list[KeyValueCache] = field(default_factory=list)
    cross_attn: list[KeyValueCache] = field(default_factory=list)

    @classmethod
    def empty(cls, n_layers: int) -> DecoderCache:
        return cls([KeyValueCache() for _ in range(n_layers)], [KeyValueCache() for _ in range(n_layers)])

    @property
    def length(self) -> int:
        """Number of target positions already decoded."""
        first = self.self_attn[0].key if self.self_attn else None
        return 0 if first is None else first.size(2)

    def reorder(self, index: Tensor, source_index: Tensor | None = None) -> None:
        """Select/reorder batch rows: self-attention entries by ``index``, cross-attention by ``source_index``.

        The cross-attention entries hold one row per source; None leaves them as they are.
        """
        for entry in self.self_attn:
            entry.reorder(index)
        for entry in self.cross_attn if source_index is not None else []:
            entry.reorder(source_index)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O with head_i = Attention(QW_i^Q, KW_i^K, VW_i^V) (§3.2.2).

    One module serves the three uses of §3.2.3: self-attention (encoder, and causal in the decoder)
    and encoder-decoder attention (queries from the decoder, keys and values from ``memory``). The
    Q, K and V projections are full d_model x d_model matrices; head i uses rows
    ``i*d_head:(i+1)*d_head`` of each. Self-attention stacks the three into one ``qkv_proj`` (one
    matrix product); cross-attention stacks K and V into ``kv_proj``, applied to the memory once.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, cross_attention: bool = False) -> None:
        super().__init__()
        assert d_model % n_heads == 0, "d_model must be divisible by n_heads"
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.dropout = dropout
        self.cross_attention = cross_attention
        if cross_attention:
            self.q_proj = nn.Linear(d_model, d_model)  # W^Q
            self.kv_proj = nn.Linear(d_model, 2 * d_model)  # [W^K; W^V]
        else:
            self.qkv_proj = nn.Linear(d_model, 3 * d_model)  # [W^Q; W^K; W^V]
        self.out_proj = nn.Linear(d_model, d_model)  # W^O
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform on each d_model x d_model matrix W^Q, W^K, W^V, W^O separately; zero biases."""
        for linear in self.children():
            for weight in linear.weight.split(self.d_model, dim=0):
                nn.init.xavier_uniform_(weight)
            nn.init.zeros_(linear.bias)

    def _split_heads(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, T, d_head)

    def forward(
        self,
        query: Tensor,
        memory: Tensor | None = None,
        mask: Tensor | None = None,
        causal: bool = False,
        cache: KeyValueCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` (B, Tq, D) to itself, or to ``memory`` (B / G, S, D) for cross-attention.

        Cross-attention lets G consecutive query rows share one memory row (beam search's beams of
        a sentence), with ``mask`` then (B / G, 1, 1, S).

        ``mask`` broadcasts to (B, H, Tq, Tk); ``causal`` adds the decoder's look-ahead mask.
        With a ``cache``, self-attention appends this call's keys/values to it and cross-attention
        projects ``memory`` only on the first call. Returns (output (B, Tq, D), weights
        (B, H, Tq, Tk) if ``need_weights`` else None).
        """
        if not self.cross_attention:
            q, k, v = (self._split_heads(t) for t in self.qkv_proj(query).chunk(3, dim=-1))
            if cache is not None:
                if cache.key is not None:
                    k, v = torch.cat([cache.key, k], dim=2), torch.cat([cache.value, v], dim=2)
                cache.key, cache.value = k, v
        else:
            if cache is not None and cache.key is not None:
                k, v = cache.key, cache.value
            else:
                k, v = (self._split_heads(t) for t in self.kv_proj(memory).chunk(2, dim=-1))
                if cache is not None:
                    cache.key, cache.value = k, v
            q = self._split_heads(self._group_by_source(self.q_proj(query), k.size(0), mask))
        context, weights = self._attend(q, k, v, mask, causal, need_weights)
        context = context.transpose(1, 2).reshape(query.shape)  # concat heads, ungroup
        if weights is not None and weights.size(0) != query.size(0):  # ungroup: (B, H, Tq, Tk)
            sources, heads, _, key_len = weights.shape
            weights = weights.view(sources, heads, -1, query.size(1), key_len).transpose(1, 2)
            weights = weights.reshape(query.size(0), heads, query.size(1), key_len)
        return self.out_proj(context), weights

    def _group_by_source(self, q: Tensor, sources: int, mask: Tensor | None) -> Tensor:
        """Fold the G consecutive query rows that share a source into one row: (B, Tq, D) -> (B / G, G * Tq, D).

        Beam search's beams then read their sentence's keys and values once, in one matrix product.
        """
        if q.size(0) == sources:
            return q
        if q.size(0) % sources or (mask is not None and mask.size(-2) != 1):
            raise ValueError(f"cross-attention: {q.size(0)} query rows cannot share {sources} sources"
                             + ("" if mask is None else f" under a mask of shape {tuple(mask.shape)}"))
        return q.reshape(sources, -1, self.d_model)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool,
                need_weights: bool) -> tuple[Tensor, Tensor | None]:
        query_len, key_len = q.size(2), k.size(2)
        dropout_p = self.dropout if self.training else 0.0
        fused = not need_weights and fused_attention_pays(q.device, self.training)
        if fused and mask is None and causal and query_len == key_len:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True), None
        if causal and query_len > 1:  # one new query may see every cached key: no mask needed
            look_ahead = causal_mask(query_len, key_len, q.device)
            mask = look_ahead if mask is None else mask & look_ahead
        if fused:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p), None
        context, weights = scaled_dot_product_attention(q, k, v, mask, dropout_p)
        return context, weights if need_weights else None
