"""Int8 inference on the CPU: Linear layers whose weights and inputs are int8, as CTranslate2 runs them.

Weights are quantized once per output channel, activations at every call per row, both symmetric;
fbgemm multiplies them with exact int32 sums. A row's output depends only on that row, where torch's
dynamic quantization (``quantize_dynamic``) scales a whole batch by one factor: with it, 76 of 400
test2016 translations (en→de, beam 5) changed between two decoding batch sizes; row by row, 2 do
(the attention over a batch's padding differs from a lone sentence's in the last bits, which int8
rounding can amplify; fp32 changed none), and 371 instead of 325 equal fp32's translations.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn

from transformer.config import ConfigError
from transformer.runtime.precision import cpu_flags


def activation_levels() -> int:
    """The largest int8 activation: 127 with AVX512-VNNI; 63 elsewhere, where fbgemm's instruction
    (vpmaddubsw) adds two products in saturating int16 (its own ``reduce_range`` for the same reason)."""
    return 127 if "avx512_vnni" in cpu_flags() else 63


class Int8Linear(nn.Module):
    """y = x Wᵀ + b with W quantized per output channel and x per row to int8 (CPU inference only)."""

    def __init__(self, linear: nn.Linear, levels: int) -> None:
        super().__init__()
        self.in_features, self.out_features, self.levels = linear.in_features, linear.out_features, levels
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1).clamp_min(1e-12) / 127
        zero = torch.zeros(len(scale), dtype=torch.long)
        with warnings.catch_warnings():  # torch deprecates quantized tensors for torchao; fbgemm's ops remain
            warnings.simplefilter("ignore", UserWarning)
            int8_weight = torch.quantize_per_channel(weight, scale.double(), zero, 0, torch.qint8)
        self.packed_weight = torch.ops.quantized.linear_prepack(int8_weight, None)
        self.bias = None if linear.bias is None else linear.bias.detach().float()

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features).float()
        scale = rows.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / self.levels  # (M, 1)
        # rows / scale are whole numbers in [-levels, levels]: quantizing them with scale 1 is exact
        y = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
            (rows / scale).round_(), 1.0, self.levels + 1, self.packed_weight).mul_(scale)
        if self.bias is not None:
            y.add_(self.bias)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, levels={self.levels}"


def quantized_engines() -> list[str]:
    """torch's int8 back-ends here: fbgemm on x86 CPUs."""
    return list(torch.backends.quantized.supported_engines)


def quantize_int8(model: nn.Module) -> nn.Module:
    """``model`` (moved to the CPU) with every Linear layer replaced by an `Int8Linear`."""
    if "fbgemm" not in quantized_engines():
        raise ConfigError(f"--quantize int8 needs fbgemm (an x86 CPU); this torch has "
                          f"{', '.join(quantized_engines())}: use fp32 or bf16")
    levels = activation_levels()
    model = model.cpu()
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, Int8Linear(child, levels))
    return model
