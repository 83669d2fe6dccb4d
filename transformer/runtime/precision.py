"""Numeric precision: fp32, bf16 or fp16 compute (autocast), chosen by hardware (int8: `transformer.runtime.int8`)."""

from __future__ import annotations

import contextlib

import torch

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
