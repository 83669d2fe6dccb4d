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

from transformer.dropout import dropout


def scaled_dot_product_attention(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None, dropout_p: float = 0.0
) -> tuple[Tensor, Tensor]:
    """Attention(Q, K, V) = softmax(QKᵀ / sqrt(d_k)) V (§3.2.1, Eq. 1); returns (context, weights).

    The explicit formula: used when the weights themselves are wanted (plots, tests) and to train
    on the CPU, where it beats `F.scaled_dot_product_attention` (see `MultiHeadAttention._attend`).
    Shapes: query (..., Tq, Dk); key (..., Tk, Dk); value (..., Tk, Dv); mask broadcasts to
    (..., Tq, Tk). A query whose keys are all masked gets zero weights and a zero context.
    """
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))  # (..., Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = dropout(scores.softmax(dim=-1).nan_to_num(0.0), dropout_p)  # a fully masked row -> zeros, not NaN
    return weights @ value, weights  # (..., Tq, Dv), (..., Tq, Tk)


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

    def reorder(self, index: Tensor, cross_attn: bool = True) -> None:
        """Select/reorder batch rows of every entry (for beam search and finished sentences).

        ``cross_attn=False`` leaves the cross-attention entries as they are, for a reordering that
        only swaps rows holding the same source (the beams of one sentence).
        """
        for entry in self.self_attn + (self.cross_attn if cross_attn else []):
            entry.reorder(index)


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
        """Attend from ``query`` (B, Tq, D) to itself, or to ``memory`` (B, S, D) for cross-attention.

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
            q = self._split_heads(self.q_proj(query))
            if cache is not None and cache.key is not None:
                k, v = cache.key, cache.value
            else:
                k, v = (self._split_heads(t) for t in self.kv_proj(memory).chunk(2, dim=-1))
                if cache is not None:
                    cache.key, cache.value = k, v
        context, weights = self._attend(q, k, v, mask, causal, need_weights)
        batch, _, length, _ = context.shape
        context = context.transpose(1, 2).reshape(batch, length, self.d_model)  # concat heads
        return self.out_proj(context), weights

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool,
                need_weights: bool) -> tuple[Tensor, Tensor | None]:
        query_len, key_len = q.size(2), k.size(2)
        dropout_p = self.dropout if self.training else 0.0
        # Training on the CPU takes the explicit formula: torch's fused CPU kernel has a slow
        # backward for sentence-length inputs, and its fallback (taken for any dropout) computes
        # bf16 in fp32; the formula with bf16 matrix products and byte dropout ran 1.3-3x faster.
        explicit = need_weights or (self.training and q.device.type == "cpu")
        if not explicit and mask is None and causal and query_len == key_len:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True), None
        if causal and query_len > 1:  # one new query may see every cached key: no mask needed
            look_ahead = causal_mask(query_len, key_len, q.device)
            mask = look_ahead if mask is None else mask & look_ahead
        if explicit:
            context, weights = scaled_dot_product_attention(q, k, v, mask, dropout_p)
            return context, weights if need_weights else None
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p), None
