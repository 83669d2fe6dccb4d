"""Attention (§3.2): scaled dot-product attention, and multi-head attention in its two uses: self-attention
(the encoder's, and the decoder's masked one) and encoder-decoder attention (§3.2.3).

Masks are boolean with ``True`` = "may attend", the convention of
`torch.nn.functional.scaled_dot_product_attention`: padding ``(B, 1, 1, S)``, causal ``(T, T)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer.model.cache import CrossAttentionCache, KeyValueCache
from transformer.model.row_groups import RowGroups, attend_in_groups


def scaled_dot_product_attention(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None,
    dropout: Callable[[Tensor], Tensor] | None = None, scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Attention(Q, K, V) = softmax(QKᵀ / sqrt(d_k)) V (§3.2.1, Eq. 1); returns (context, weights).

    ``scale`` replaces 1 / sqrt(d_k): with ``scale=1`` and Q = K = V = X this is the weight-free
    self-attention softmax(XXᵀ)X that introductions to the paper start from.
    Shapes: query (..., Tq, Dk); key (..., Tk, Dk); value (..., Tk, Dv); mask broadcasts to
    (..., Tq, Tk). A query whose keys are all masked gets zero weights and a zero context.
    """
    scale = 1.0 / math.sqrt(query.size(-1)) if scale is None else scale
    scores = query @ key.transpose(-2, -1) * scale  # (..., Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    # the softmax in float32, as fairseq computes it, so that bf16 and fp16 weights still sum to one
    weights = scores.softmax(dim=-1, dtype=torch.float32).nan_to_num(0.0).to(value.dtype)  # fully masked: zeros
    if dropout is not None:
        weights = dropout(weights)
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


def with_look_ahead(mask: Tensor | None, query: Tensor, key: Tensor) -> Tensor | None:
    """``mask`` and the causal mask of the decoder's self-attention (§3.2.3).

    A single new query (cached decoding) may see every key: it needs no look-ahead mask.
    """
    query_len, key_len = query.size(-2), key.size(-2)
    if query_len == 1:
        return mask
    look_ahead = causal_mask(query_len, key_len, query.device)
    return look_ahead if mask is None else mask & look_ahead


class ScaledDotProductAttention(nn.Module):
    """Figure 2 (left) as a module, with dropout on the attention weights (as tensor2tensor and fairseq).

    When the weights are not wanted, torch's fused kernel computes the same formula in one operation.
    """

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | RowGroups | None = None,
                causal: bool = False, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """Shapes as in `scaled_dot_product_attention`; ``causal`` adds the decoder's look-ahead mask (which
        `RowGroups`, rows attending in groups in `Transformer.forward`, hold already)."""
        if isinstance(mask, RowGroups):  # training's forward: no weights wanted
            return attend_in_groups(query, key, value, mask, self.dropout.p if self.training else 0.0), None
        if need_weights:
            mask = with_look_ahead(mask, query, key) if causal else mask
            return scaled_dot_product_attention(query, key, value, mask, self.dropout)
        dropout_p = self.dropout.p if self.training else 0.0
        if causal and mask is None and query.size(-2) == key.size(-2):  # lets CUDA use flash attention
            return F.scaled_dot_product_attention(query, key, value, dropout_p=dropout_p, is_causal=True), None
        mask = with_look_ahead(mask, query, key) if causal else mask
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout_p), None


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O with head_i = Attention(QW_i^Q, KW_i^K, VW_i^V) (§3.2.2).

    The base of `SelfAttention` and `CrossAttention`, which differ in where Q, K and V come from;
    each has its input projections and ``out_proj`` = W^O. The projections are full d_model x d_model
    matrices; head i uses rows ``i*d_head:(i+1)*d_head`` of each.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        assert d_model % n_heads == 0, "d_model must be divisible by n_heads"
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.attention = ScaledDotProductAttention(dropout)

    def reset_parameters(self) -> None:
        """Xavier-uniform on each d_model x d_model matrix W^Q, W^K, W^V, W^O separately; zero biases."""
        for linear in (child for child in self.children() if isinstance(child, nn.Linear)):
            for weight in linear.weight.split(self.d_model, dim=0):
                nn.init.xavier_uniform_(weight)
            nn.init.zeros_(linear.bias)

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, T, D) -> (B, H, T, d_head)."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.n_heads, self.d_head).transpose(1, 2)

    def merge_heads(self, x: Tensor) -> Tensor:
        """Concat(head_1, ..., head_h): (B, H, T, d_head) -> (B, T, D)."""
        batch, _, length, _ = x.shape
        return x.transpose(1, 2).reshape(batch, length, self.d_model)


class SelfAttention(MultiHeadAttention):
    """Queries, keys and values all come from the same sequence (§3.2.3).

    The three projections are stacked into one ``qkv_proj`` = [W^Q; W^K; W^V]: one matrix product.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__(d_model, n_heads, dropout)
        self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)  # W^O
        self.reset_parameters()

    def forward(self, x: Tensor, mask: Tensor | RowGroups | None = None, causal: bool = False,
                cache: KeyValueCache | None = None) -> Tensor:
        """x (B, T, D) attends to itself -> (B, T, D); ``causal`` hides later positions (the decoder).

        With a ``cache``, x holds the new positions only and attends to the earlier ones through it.
        """
        q, k, v = (self.split_heads(t) for t in self.qkv_proj(x).chunk(3, dim=-1))  # (B, H, T, d_head)
        if cache is not None:
            k, v = cache.append(k, v)
        context, _ = self.attention(q, k, v, mask, causal)
        return self.out_proj(self.merge_heads(context))


class CrossAttention(MultiHeadAttention):
    """Encoder-decoder attention: queries from the decoder, keys and values from the encoder output,
    the ``memory`` (§3.2.3). ``kv_proj`` = [W^K; W^V] is applied to the memory in one matrix product."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__(d_model, n_heads, dropout)
        self.q_proj = nn.Linear(d_model, d_model)
        self.kv_proj = nn.Linear(d_model, 2 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)  # W^O
        self.reset_parameters()

    def project_memory(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of the encoder output: (B, S, D) -> two (B, H, S, d_head)."""
        k, v = self.kv_proj(memory).chunk(2, dim=-1)
        return self.split_heads(k), self.split_heads(v)

    def forward(self, x: Tensor, memory: Tensor, memory_mask: Tensor | RowGroups | None,
                cache: CrossAttentionCache | None = None, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """x (B, T, D) attends to ``memory`` (B, S, D) -> (B, T, D) and, if asked, the weights (B, H, T, S).

        A ``cache`` keeps the memory's keys and values from the first call on (see `CrossAttentionCache`).
        """
        rows = x.size(0)
        if cache is None:
            k, v = self.project_memory(memory)
        else:
            k, v = cache.keys_values(self.project_memory, memory)
            x = cache.group_queries(x)
        context, weights = self.attention(self.split_heads(self.q_proj(x)), k, v, memory_mask,
                                          need_weights=need_weights)
        output = self.out_proj(self.merge_heads(context))
        return (output, weights) if cache is None else cache.ungroup(output, weights, rows)
