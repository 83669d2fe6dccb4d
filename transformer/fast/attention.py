"""Attention for training through the explicit formula instead of torch's fused kernel.

Measured on the CPU (torch 2.13, 2-core Xeon and EPYC): the fused CPU kernel's backward is slow at
sentence lengths, and its fallback when attention dropout is on computes bf16 in fp32; the formula,
with bf16 matrix products and byte dropout (`transformer.fast.dropout`), ran 1.3-3x faster forward +
backward. Decoding keeps the fused kernel: in bf16 the formula's matrix products go through oneDNN,
which builds a new kernel (~0.8 ms) for every new shape, and each decoding step brings new ones.

On a GPU the fused kernels work in tiles of 64 or 128 positions, mostly padding at Multi30k's sentence
lengths, and still won: on an H200 (2026-11-27, the GPU benchmark; docs/gpu.md) the base size trained
through the formula at 1.20 times the `nn.Transformer` baseline's target tokens/s, through the fused
kernels at 1.24, and masked attention alone took 1.8 ms forward and backward against the memory-efficient
kernel's 0.92. GPUs train through the fused kernels.
"""

from __future__ import annotations

from torch import Tensor

from transformer.model.attention import ScaledDotProductAttention, scaled_dot_product_attention, with_look_ahead
from transformer.model.row_groups import RowGroups


class FormulaTrainingAttention(ScaledDotProductAttention):
    """`ScaledDotProductAttention` that trains through the explicit formula on the CPU."""

    def forward(self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | RowGroups | None = None,
                causal: bool = False, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        if not self.training or query.device.type != "cpu" or isinstance(mask, RowGroups):  # groups: a GPU's path
            return super().forward(query, key, value, mask, causal, need_weights)
        mask = with_look_ahead(mask, query, key) if causal else mask
        context, weights = scaled_dot_product_attention(query, key, value, mask, self.dropout)
        return context, weights if need_weights else None
