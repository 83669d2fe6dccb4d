"""Which device a run uses: CUDA when there is one (the local rank's GPU under torchrun), else the CPU."""

from __future__ import annotations

import os

import torch

from transformer.config import ConfigError


def select_device(name: str = "auto") -> torch.device:
    """``auto`` picks CUDA when available, else the CPU; ``auto`` and ``cuda`` mean the local rank's GPU
    under torchrun (``cuda:N`` names one)."""
    if name == "auto" and not torch.cuda.is_available():
        return torch.device("cpu")
    if name in ("auto", "cuda") and torch.cuda.is_available():
        local_rank, gpus = int(os.environ.get("LOCAL_RANK", 0)), torch.cuda.device_count()
        if local_rank >= gpus:
            raise ConfigError(f"train.device={name}: local rank {local_rank} has no GPU of its own ({gpus} on this "
                              f"machine); start at most {gpus} processes per node, or set train.device=cpu")
        return torch.device("cuda", local_rank)
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"train.device: unknown device {name!r} (use auto, cpu, cuda or cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"train.device={name} but CUDA is not available on this machine")
    return device
