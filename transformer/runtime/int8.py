"""Int8 inference on the CPU: Linear layers whose weights and inputs are int8, as CTranslate2 runs them.

Weights are quantized once per output channel, activations at every call per row, both symmetric,
and their product accumulates exactly in int32 (`torch._int_mm`, oneDNN's VNNI kernels). A row's
output depends only on that row, so a translation does not change with the sentences decoded beside
it. torch's dynamic quantization (``quantize_dynamic``) scales a whole batch by one factor: with it,
76 of 400 test2016 translations (en→de, beam 5) changed between two decoding batch sizes.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from transformer.fast import replace_modules
from transformer.runtime.precision import cpu_flags


def weight_levels() -> int:
    """The largest int8 weight: 127, or 63 on CPUs without VNNI, whose int8 instruction (vpmaddubsw)
    adds two products in saturating int16: 7-bit weights keep that sum in range (oneDNN's advice)."""
    return 127 if not cpu_flags().isdisjoint({"avx512_vnni", "avx_vnni", "amx_int8"}) else 63


class Int8Linear(nn.Module):
    """y = x Wᵀ + b with W quantized per output channel and x per row to int8 (CPU inference only)."""

    def __init__(self, linear: nn.Linear, levels: int | None = None) -> None:
        super().__init__()
        weight = linear.weight.detach().float()
        levels = levels or weight_levels()
        self.weight_scale = weight.abs().amax(dim=1).clamp_min(1e-12) / levels  # (N,)
        int8_weight = (weight / self.weight_scale[:, None]).round().clamp(-levels, levels).to(torch.int8)
        self.int8_weight_t = int8_weight.t()  # (K, N), as _int_mm takes it
        # b / scale: the bias joins the int32 sums before one multiplication by the weight scale
        self.scaled_bias = None if linear.bias is None else linear.bias.detach().float() / self.weight_scale

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, x.size(-1)).float()
        scale = rows.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127  # (M, 1)
        int32_sums = torch._int_mm((rows / scale).round_().to(torch.int8), self.int8_weight_t)  # (M, N)
        if self.scaled_bias is None:
            y = int32_sums * scale
        else:
            y = torch.addcmul(self.scaled_bias, int32_sums, scale)
        return y.mul_(self.weight_scale).view(*x.shape[:-1], len(self.weight_scale))


def quantize_int8(model: nn.Module) -> nn.Module:
    """``model`` (moved to the CPU) with every Linear layer replaced by an `Int8Linear`."""
    model = model.cpu()
    replace_modules(model, nn.Linear, Int8Linear)
    return model
