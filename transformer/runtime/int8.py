"""Int8 inference on the CPU: Linear layers whose weights and inputs are int8, as CTranslate2 runs them.

Weights are quantized once per output channel, activations at every call per row, both symmetric;
fbgemm, or oneDNN for the wide output projection where it is faster (`kernel_for`), multiplies them
with exact int32 sums. A row's output depends only on that row, where torch's
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

WIDE = 4096  # output features from which oneDNN's kernel beats fbgemm's: the vocabulary projection


def int8_kernels() -> list[str]:
    """The int8 matrix products that sum exactly on this CPU: fbgemm's on any x86 CPU, and oneDNN's
    u8 x s8 linear (torch's ``onednn::qlinear_pointwise``), which needs AVX512-VNNI not to saturate."""
    vnni = "avx512_vnni" in cpu_flags() and hasattr(torch.ops.onednn, "qlinear_pointwise")
    return ["fbgemm", "onednn"] if vnni else ["fbgemm"]


def kernel_for(out_features: int) -> str:
    """The faster int8 kernel for a layer of ``out_features`` outputs.

    oneDNN scales its output per channel in the same pass, which pays off on the 8000-wide output
    projection; fbgemm's op has less fixed cost on the narrow layers. Measured on a Zen 4 EPYC, one
    thread (scripts/benchmarks/int8_layers.py): 320 rows x 256 -> 8000 oneDNN 4.4 ms, fbgemm 6.0 ms;
    256 -> 768, 256 -> 1024 and 1024 -> 256 fbgemm 1.0-1.3x faster.
    """
    return "onednn" if "onednn" in int8_kernels() and out_features >= WIDE else "fbgemm"


def activation_levels() -> int:
    """The largest int8 activation: 127 with AVX512-VNNI; 63 elsewhere, where fbgemm's instruction
    (vpmaddubsw) adds two products in saturating int16 (its own ``reduce_range`` for the same reason)."""
    return 127 if "avx512_vnni" in cpu_flags() else 63


class Int8Linear(nn.Module):
    """y = x Wᵀ + b with W quantized per output channel and x per row to int8 (CPU inference only).

    Both kernels sum the same int8 products exactly in int32; only the float scaling after differs.
    """

    def __init__(self, linear: nn.Linear, kernel: str | None = None, levels: int | None = None) -> None:
        super().__init__()
        kernel = kernel or kernel_for(linear.out_features)
        if kernel not in int8_kernels():
            raise ValueError(f"int8 kernel {kernel!r} does not sum exactly on this CPU; here: {int8_kernels()}")
        levels = activation_levels() if levels is None else levels
        if not 0 < levels <= activation_levels():  # more would saturate: sums no longer exact
            raise ValueError(f"int8 sums are exact here for activations up to {activation_levels()}, not {levels}")
        self.in_features, self.out_features, self.kernel, self.levels = (
            linear.in_features, linear.out_features, kernel, levels)
        weight = linear.weight.detach().float()
        weight_scale = weight.abs().amax(dim=1).clamp_min(1e-12) / 127  # (N,)
        int8_weight = (weight / weight_scale[:, None]).round_().to(torch.int8)  # (N, K)
        if kernel == "onednn":
            self.packed_weight = torch.ops.onednn.qlinear_prepack(int8_weight, [320, self.in_features])
            self.weight_scale, self.weight_zero = weight_scale, torch.zeros(self.out_features, dtype=torch.long)
        else:
            zero = torch.zeros(self.out_features, dtype=torch.long)
            with warnings.catch_warnings():  # torch deprecates quantized tensors for torchao; fbgemm's ops remain
                warnings.simplefilter("ignore", UserWarning)
                quantized = torch._make_per_channel_quantized_tensor(int8_weight, weight_scale.double(), zero, 0)
            self.packed_weight = torch.ops.quantized.linear_prepack(quantized, None)
        self.bias = None if linear.bias is None else linear.bias.detach().float()

    @torch.no_grad()  # inference only: the in-place scaling below takes no gradients
    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features).float()
        scale = rows.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / self.levels  # (M, 1)
        whole = (rows / scale).round_()  # whole numbers in [-levels, levels]
        if self.kernel == "onednn":  # as uint8 around 128; the output comes scaled per channel
            y = torch.ops.onednn.qlinear_pointwise(whole.add_(128).to(torch.uint8), 1.0, 128, self.packed_weight,
                                                   self.weight_scale, self.weight_zero, None, 1.0, 0,
                                                   torch.float32, "none", [], "")
        else:  # quantizing ``whole`` with scale 1 is exact
            y = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
                whole, 1.0, self.levels + 1, self.packed_weight)
        return (y.mul_(scale) if self.bias is None else torch.addcmul(self.bias, y, scale, out=y)).view(
            *x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, kernel={self.kernel}, "
                f"levels={self.levels}")


def quantized_engines() -> list[str]:
    """torch's int8 back-ends here: fbgemm on x86 CPUs."""
    return list(torch.backends.quantized.supported_engines)


def quantize_int8(model: nn.Module) -> nn.Module:
    """``model`` (moved to the CPU) with every Linear layer replaced by an `Int8Linear`."""
    if "fbgemm" not in quantized_engines():
        raise ConfigError(f"--quantize int8 needs fbgemm (an x86 CPU); this torch has "
                          f"{', '.join(quantized_engines())}: use fp32 or bf16")
    model = model.cpu()
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, Int8Linear(child))
    return model
