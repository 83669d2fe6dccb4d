"""Which device a run uses: CUDA when there is one (the local rank's GPU under torchrun), else the CPU; and,
on a GPU, which attention kernels torch may choose (`avoid_cudnn_attention`)."""

from __future__ import annotations

import os

import torch

from transformer.config import ConfigError


def select_device(name: str = "auto", setting: str = "train.device") -> torch.device:
    """``auto`` picks CUDA when available, else the CPU; ``auto`` and ``cuda`` mean the local rank's GPU
    under torchrun (``cuda:N`` names one). A GPU turns cuDNN's attention off, process-wide (see below).
    Errors name the ``setting`` the device was given as (``device`` for the Python API's argument)."""
    if name == "auto" and not torch.cuda.is_available():
        return torch.device("cpu")
    if name in ("auto", "cuda") and torch.cuda.is_available():
        local_rank, gpus = int(os.environ.get("LOCAL_RANK", 0)), torch.cuda.device_count()
        if local_rank >= gpus:
            raise ConfigError(f"{setting}={name}: local rank {local_rank} has no GPU of its own ({gpus} on this "
                              f"machine); start at most {gpus} processes per node, or set train.device=cpu")
        device = torch.device("cuda", local_rank)
    else:
        try:
            device = torch.device(name)
        except RuntimeError:
            device = None
        if device is None or device.type not in ("cpu", "cuda"):  # mps, xpu, meta...: tracebacks deep in torch
            raise ConfigError(f"{setting}: unknown device {name!r} (use auto, cpu, cuda or cuda:N)")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"{setting}={name} but CUDA is not available on this machine")
        if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"{setting}={name}: this machine has {torch.cuda.device_count()} GPU(s), "
                              f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    if device.type == "cuda":
        avoid_cudnn_attention()
    return device


def avoid_cudnn_attention() -> None:
    """Keep `F.scaled_dot_product_attention` off cuDNN's kernels (flash, memory-efficient or math instead).

    Why: torch 2.11 tries cuDNN's attention first on Hopper and newer GPUs, and cuDNN builds an execution
    plan for every new shape (reported at 0.4 s forward and 0.55 s backward a shape on a B200, torch 2.11,
    modelscope/FunASR#3704). Token-budget batches bring new shapes all the time, and decoding one more
    key at every step: the 90-second recipe's first 100 steps took 22 s and its first validation 16 s on
    an H100 (11 s on an H200, 5 s for the second, whose shapes had been seen). The benchmark's
    ``attention_kernels`` part measures a new shape's cost on both kernels (and on the explicit formula).
    Process-wide, as torch's backend switches are; set once a CUDA device is chosen."""
    torch.backends.cuda.enable_cudnn_sdp(False)
