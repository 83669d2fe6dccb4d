"""A run's settings against each other and the device, before any work: what cannot work is a one-line error,
what works badly a warning."""

from __future__ import annotations

import logging

import torch

from transformer.checkpoint import BEST
from transformer.config import Config, ConfigError
from transformer.data.batch import round_up
from transformer.decoding.limits import length_limits

log = logging.getLogger(__name__)


def check_cuda_graphs(cfg: Config, device: torch.device, distributed: bool) -> None:
    """train.cuda_graphs needs a GPU, one process, batches in few shapes, and a positional table that never
    grows (the graphs read it where it was when they were recorded): a one-line error otherwise."""
    data = cfg.data
    longest = max(round_up(data.max_length + 1, data.pad_to_multiple),  # training batches
                  length_limits([data.max_length + 1], cfg.decode)[0] + 2)  # validation's outputs, bos and eos
    for needed, reason in ((device.type == "cuda", f"a GPU (the device is {device})"),
                           (not distributed, "one process (not torchrun's ranks)"),
                           (data.pad_rows, "data.pad_rows=true (batches in few shapes)"),
                           (cfg.model.max_positions >= longest,
                            f"model.max_positions >= {longest}, the longest training or validation sequence")):
        if not needed:
            raise ConfigError(f"train.cuda_graphs=true needs {reason}; train.cuda_graphs=false trains without "
                              "CUDA graphs (the GPU configs turn them on)")


def warn_about_settings(cfg: Config, device: torch.device, precision: str) -> list[str]:
    """Say which settings contradict each other, or the device, though each is valid (a run may be made longer on
    resume, so these are warnings, not errors); returns what was said."""
    train_cfg, said = cfg.train, []
    if train_cfg.warmup_steps > train_cfg.max_steps:
        said.append(f"train.warmup_steps={train_cfg.warmup_steps} exceeds train.max_steps={train_cfg.max_steps}: the "
                    f"learning rate rises for the whole run and never reaches its peak")
    if train_cfg.valid_every > train_cfg.max_steps:
        said.append(f"train.valid_every={train_cfg.valid_every} exceeds train.max_steps={train_cfg.max_steps}: the run "
                    f"never validates, so it has no validation scores and writes no {BEST}")
    if train_cfg.attention_row_length and cfg.data.rows_multiple % 2:
        said.append(f"train.attention_row_length={train_cfg.attention_row_length}: rows attend in groups only where a "
                    f"batch's row count is even; data.rows_multiple=8 makes it a multiple of 8")
    shortest_row = 2 * max(cfg.data.pad_to_multiple, 2)  # a token and eos, rounded up: two of them make a group
    if 0 < train_cfg.attention_row_length < shortest_row:
        said.append(f"train.attention_row_length={train_cfg.attention_row_length}: no two rows fit (a row has at "
                    f"least {shortest_row // 2} positions), so none attend in groups; the kernels' tiles hold 64")
    if train_cfg.attention_row_length and device.type == "cpu":
        said.append("train.attention_row_length groups rows for a GPU's fused attention kernels: on the CPU the "
                    "grouped rows' masked-out pairs are work of their own (and leave the attention formula of "
                    "train.fast_paths)")
    if not train_cfg.float32_residual and precision == "fp32":
        said.append("train.float32_residual=false changes nothing in fp32: it keeps bf16 or fp16 activations")
    for message in said:
        log.warning(message)
    return said
