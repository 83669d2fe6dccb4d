"""Int8 inference on the CPU: Linear layers whose weights and inputs are int8, as CTranslate2 runs them.

Weights are quantized once per output channel, activations at every call per row, both symmetric;
fbgemm, or oneDNN where it is faster (`kernel_for`: with AMX, or for the wide output projection), multiplies them
with exact int32 sums. A row's output depends only on that row, where torch's
dynamic quantization (``quantize_dynamic``) scales a whole batch by one factor: with it, 76 of 400
test2016 translations (en→de, beam 5) changed between two decoding batch sizes; row by row, 2 do
(the attention over a batch's padding differs from a lone sentence's in the last bits, which int8
rounding can amplify; fp32 changed none), and 371 instead of 325 equal fp32's translations.
"""

from __future__ import annotations

import os
import warnings

import torch
from torch import Tensor, nn

from transformer.config import ConfigError
from transformer.runtime.cpuinfo import cpu_flags

ONEDNN_MIN_OUT_FEATURES = 4096  # a cut between the shapes measured below: 1024 (fbgemm faster), 8000 (oneDNN)
ONEDNN_ROWS_HINT = 320  # the rows a decoding step multiplies, for which oneDNN lays out the packed weight


def int8_kernels() -> list[str]:
    """The int8 matrix products that sum exactly on this CPU: fbgemm's (x86 with AVX2), and oneDNN's
    u8 x s8 linear (torch's ``onednn::qlinear_pointwise``), which needs AVX512-VNNI not to saturate
    (so not where oneDNN is capped below it by ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA)."""
    capped = any(os.environ.get(name) for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"))
    vnni = "avx512_vnni" in cpu_flags() and not capped and hasattr(torch.ops.onednn, "qlinear_pointwise")
    return ["fbgemm", "onednn"] if vnni else ["fbgemm"]


def kernel_for(out_features: int) -> str:
    """The faster int8 kernel for a layer of ``out_features`` outputs.

    Measured on one thread (``python -m scripts.benchmarks.int8_layers``), 320 rows. A Zen 4 EPYC
    (AVX512-VNNI, no AMX): 256 -> 8000 (the output projection) oneDNN 4.4 ms, fbgemm 6.0 ms; 256 -> 768,
    256 -> 1024 and 1024 -> 256 fbgemm 1.0-1.3x faster. A Xeon with AMX-INT8, where oneDNN multiplies
    in AMX tiles: oneDNN faster in every shape, 256 -> 8000 1.6 ms against 3.8 ms, the narrow ones 1.2-1.8x.
    """
    if "onednn" not in int8_kernels():
        return "fbgemm"
    return "onednn" if "amx_int8" in cpu_flags() or out_features >= ONEDNN_MIN_OUT_FEATURES else "fbgemm"


def activation_levels() -> int:
    """The largest int8 activation: 127 with AVX512-VNNI; 63 elsewhere, where fbgemm's instruction
    (vpmaddubsw) adds two products in saturating int16 (its own ``reduce_range`` for the same reason)."""
    return 127 if "avx512_vnni" in cpu_flags() else 63


class Int8Linear(nn.Module):
    """y = x Wᵀ + b with W quantized per output channel and x per row to int8 (CPU inference only).

    Both kernels give the same bits: the same exact int32 sums, scaled per channel, then per row.
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
        zero = torch.zeros(self.out_features, dtype=torch.long)
        with warnings.catch_warnings():  # torch deprecates quantized tensors for torchao; fbgemm's ops remain
            warnings.simplefilter("ignore", UserWarning)
            quantized = torch.quantize_per_channel(weight, weight_scale.double(), zero, 0, torch.qint8)
        if kernel == "onednn":
            self.packed_weight = torch.ops.onednn.qlinear_prepack(quantized.int_repr(),
                                                                  [ONEDNN_ROWS_HINT, self.in_features])
            self.weight_scale, self.weight_zero = weight_scale, zero  # the op's signature asks for zero points
            self.amx_input = "amx_int8" in cpu_flags()
        else:
            self.packed_weight = torch.ops.quantized.linear_prepack(quantized, None)
        self.bias = None if linear.bias is None else linear.bias.detach().float()

    @torch.no_grad()  # inference only: the in-place scaling below takes no gradients
    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features).float()
        largest = torch.maximum(rows.amax(dim=1, keepdim=True), rows.amin(dim=1, keepdim=True).neg_())  # |x| max
        scale = largest.clamp_min_(1e-12).div_(self.levels)  # (M, 1)
        whole = (rows / scale).round_()  # whole numbers in [-levels, levels]
        if self.kernel == "onednn":  # the output comes scaled per channel
            # AMX multiplies int8 by int8: one pass less, ~4% of a decode on the Xeon; elsewhere uint8
            # around 128, the form of VNNI's instruction (int8 inputs were not measured there)
            quantized, zero = ((whole.to(torch.int8), 0) if self.amx_input else
                               (whole.add_(128).to(torch.uint8), 128))
            y = torch.ops.onednn.qlinear_pointwise(quantized, 1.0, zero, self.packed_weight,
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
