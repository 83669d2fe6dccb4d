"""The boxes of the paper's Figure 1 below the model level: embeddings, positional encoding,
feed-forward network, and the encoder and decoder layers with their residual connections."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from transformer.model.attention import CrossAttention, SelfAttention
from transformer.model.cache import CrossAttentionCache, KeyValueCache
from transformer.model.row_groups import RowGroups


def sinusoidal_positional_encoding(length: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(same) (§3.5); shape (length, d_model)."""
    position = torch.arange(length, dtype=torch.float64)[:, None]  # (L, 1)
    frequency = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
    table = torch.zeros(length, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency)
    return table.float()


class TokenEmbedding(nn.Module):
    """Learned embeddings multiplied by sqrt(d_model) (§3.4).

    Initialised from N(0, d_model^-0.5) so that the scaled embeddings have unit variance, like the
    positional encoding they are added to (the tensor2tensor/fairseq convention); the padding
    row is zero.
    """

    def __init__(self, vocab_size: int, d_model: int, pad_id: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        self.scale = math.sqrt(d_model)
        nn.init.normal_(self.embedding.weight, mean=0.0, std=d_model**-0.5)
        with torch.no_grad():
            self.embedding.weight[pad_id].zero_()

    @property
    def weight(self) -> nn.Parameter:
        return self.embedding.weight

    def forward(self, tokens: Tensor) -> Tensor:
        return self.embedding(tokens) * self.scale  # (B, T) -> (B, T, D)


class PositionalEncoding(nn.Module):
    """Add the sinusoidal positions to the embeddings, then dropout (§3.5, §5.4).

    The table is a non-persistent buffer (not a parameter, not in checkpoints) and grows on
    demand, so an input longer than ``max_positions`` works instead of crashing.
    """

    def __init__(self, d_model: int, dropout: float, max_positions: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("table", sinusoidal_positional_encoding(max_positions, d_model), persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """x: (B, T, D) embeddings of positions ``offset .. offset + T - 1``."""
        end = offset + x.size(1)
        table = self.table  # one read: decoding workers may grow it from other threads
        if end > table.size(0):
            table = sinusoidal_positional_encoding(max(end, 2 * table.size(0)), self.d_model).to(table.device)
            if table.size(0) > self.table.size(0):
                self.table = table
        return self.dropout(x + table[offset:end].to(x.dtype))


class FeedForward(nn.Module):
    """FFN(x) = max(0, xW1 + b1) W2 + b2, applied to each position separately (§3.3, Eq. 2)."""

    def __init__(self, d_model: int, d_ff: int, activation_dropout: float = 0.0) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(activation_dropout)
        for linear in (self.linear1, self.linear2):
            nn.init.xavier_uniform_(linear.weight)
            nn.init.zeros_(linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))


class ResidualNorm(nn.Module):
    """Residual connection around a sublayer, with LayerNorm and dropout (§3.1, §5.4).

    Post-norm, as in the paper: LayerNorm(x + Dropout(Sublayer(x))). Pre-norm, which trains
    more stably for deep stacks: x + Dropout(Sublayer(LayerNorm(x))).
    """

    def __init__(self, d_model: int, dropout: float, norm_first: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    """Self-attention, then feed-forward, each wrapped in a residual connection (§3.1)."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float, attention_dropout: float,
                 activation_dropout: float, norm_first: bool) -> None:
        super().__init__()
        self.self_attn = SelfAttention(d_model, n_heads, attention_dropout)
        self.ff = FeedForward(d_model, d_ff, activation_dropout)
        self.residual1 = ResidualNorm(d_model, dropout, norm_first)
        self.residual2 = ResidualNorm(d_model, dropout, norm_first)

    def forward(self, x: Tensor, src_mask: Tensor | RowGroups | None) -> Tensor:
        x = self.residual1(x, lambda h: self.self_attn(h, src_mask))
        return self.residual2(x, self.ff)


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, then feed-forward (§3.1).

    Target padding needs no mask here: padding sits after the real tokens, and the causal mask
    already hides later positions from every real one.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float, attention_dropout: float,
                 activation_dropout: float, norm_first: bool) -> None:
        super().__init__()
        self.self_attn = SelfAttention(d_model, n_heads, attention_dropout)
        self.cross_attn = CrossAttention(d_model, n_heads, attention_dropout)
        self.ff = FeedForward(d_model, d_ff, activation_dropout)
        self.residual1 = ResidualNorm(d_model, dropout, norm_first)
        self.residual2 = ResidualNorm(d_model, dropout, norm_first)
        self.residual3 = ResidualNorm(d_model, dropout, norm_first)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        src_mask: Tensor | RowGroups | None,
        self_cache: KeyValueCache | None = None,
        cross_cache: CrossAttentionCache | None = None,
        need_weights: bool = False,
        self_mask: RowGroups | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Returns the new states (B, T, D) and, if asked, the cross-attention weights (B, H, T, S).

        ``self_mask`` is given where rows attend in groups (`row_groups`): their look-ahead mask.
        """
        x = self.residual1(x, lambda h: self.self_attn(h, self_mask, causal=True, cache=self_cache))
        weights = None

        def cross_attention(h: Tensor) -> Tensor:
            nonlocal weights
            out, weights = self.cross_attn(h, memory, src_mask, cross_cache, need_weights)
            return out

        x = self.residual2(x, cross_attention)
        return self.residual3(x, self.ff), weights
