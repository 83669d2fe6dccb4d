"""Numeric precision: fp32, bf16 or fp16 compute (autocast), chosen by hardware (int8: `transformer.runtime.int8`)."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer.config import ConfigError
from transformer.runtime.cpuinfo import cpu_flags

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def cpu_has_fast_bf16() -> bool:
    """True when the CPU multiplies bf16 matrices natively (AVX512-BF16 or AMX); emulated bf16 is slower than fp32."""
    return not cpu_flags().isdisjoint({"avx512_bf16", "amx_bf16"})


def select_precision(name: str, device: torch.device) -> str:
    """Resolve ``auto`` to bf16 where the hardware supports it (CUDA compute capability >= 8, CPU
    AVX512-BF16/AMX), else fp32; reject fp16 on CPU (it needs a GradScaler and CUDA)."""
    if name == "auto":
        if device.type == "cuda":
            return "bf16" if torch.cuda.get_device_capability(device)[0] >= 8 else "fp32"
        return "bf16" if cpu_has_fast_bf16() else "fp32"
    if name == "fp16" and device.type != "cuda":
        raise ConfigError("train.precision=fp16 needs a CUDA device; use bf16 or fp32 on the CPU")
    return name


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """Mixed-precision context for the forward pass; a no-op for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[precision])


class AutocastLayerNorm(nn.LayerNorm):
    """`nn.LayerNorm` that returns autocast's dtype, not float32 (``train.float32_residual=false``).

    Why: autocast computes layer norm in float32 and returns float32, so under bf16 or fp16 training the residual
    stream between the layers is float32: each residual add, dropout and norm reads and writes twice the bytes,
    and each matrix product casts its input again. On an H200 layer norm, dropout and the elementwise work took
    14.3 ms of the base size's 51-ms compiled and graphed step (docs/gpu.md). Here the norm still accumulates in
    float32 inside its kernel, but takes and returns bf16 (fp16): the residual stream in the autocast dtype, as
    fairseq's --bf16 and Megatron (unless fp32_residual_connection) train. That stream is the norms' output in
    the paper's post-norm layers; a pre-norm stack's residual path meets no norm and stays float32. Measured: not
    yet. Without autocast it is `nn.LayerNorm`.
    """

    @classmethod
    def sharing(cls, norm: nn.LayerNorm) -> AutocastLayerNorm:
        """A norm on ``norm``'s own parameters (the optimizer's and the checkpoints' keys stay as they were)."""
        shared = cls(norm.normalized_shape, norm.eps, device=norm.weight.device)
        shared.weight, shared.bias = norm.weight, norm.bias
        return shared

    def forward(self, x: Tensor) -> Tensor:
        if not torch.is_autocast_enabled(x.device.type):
            return super().forward(x)
        dtype = torch.get_autocast_dtype(x.device.type)
        with torch.autocast(x.device.type, enabled=False):
            return F.layer_norm(x.to(dtype), self.normalized_shape, self.weight.to(dtype), self.bias.to(dtype),
                                self.eps)
