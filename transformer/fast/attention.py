"""Attention for training on the CPU: the explicit formula instead of torch's fused kernel.

Measured (torch 2.13, 2-core Xeon and EPYC): the fused CPU kernel's backward is slow at sentence
lengths, and its fallback when attention dropout is on computes bf16 in fp32; the formula, with
bf16 matrix products and byte dropout (`transformer.fast.dropout`), ran 1.3-3x faster forward +
backward. Decoding keeps the fused kernel: in bf16 the formula's matrix products go through
oneDNN, which builds a new kernel (~0.8 ms) for every new shape, and each decoding step brings new ones.
"""

from __future__ import annotations

from torch import Tensor

from transformer.model.attention import ScaledDotProductAttention, scaled_dot_product_attention, with_look_ahead


class CpuTrainingAttention(ScaledDotProductAttention):
    """`ScaledDotProductAttention` that trains on the CPU through the explicit formula."""

    def forward(self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None, causal: bool = False,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        if not self.training or query.device.type != "cpu":
            return super().forward(query, key, value, mask, causal, need_weights)
        mask = with_look_ahead(mask, query, key) if causal else mask
        context, weights = scaled_dot_product_attention(query, key, value, mask, self.dropout)
        return context, weights if need_weights else None
