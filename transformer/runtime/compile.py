"""torch.compile for training (``train.compile=true``): the model's forward and the loss, each compiled.

Measured (issue 32, one H200, torch 2.11, bf16): a plain ``torch.compile`` of the model was worth
+25% target tokens/s for the paper's base model and +33% for the Multi30k recipe's size; on the
CPU it gave no gain (docs/performance.md), hence off by default. Compiling the loss as well lets
inductor fuse its log-softmax, gather and mean over the (tokens, vocabulary) logits into a few
kernels instead of one per operation.

Only what runs the forward pass is compiled: the Trainer keeps the plain model for checkpoints
(their state_dict keys carry no ``_orig_mod.`` prefix, so a run resumes with or without compile),
for validation and for decoding, all on the same parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
from torch import nn

Loss = TypeVar("Loss", bound=Callable)
BACKEND = "inductor"


def compile_training(model: nn.Module, loss: Loss) -> tuple[nn.Module, Loss]:
    """``model`` and ``loss`` compiled for training, with dynamic shapes from the first batch.

    Token-budget batches vary in sentences and in length from one batch to the next: compiled for
    dynamic shapes at once, a run compiles once or twice (a few shape relations, such as source
    and target of equal length, are guarded), where static shapes would compile a first graph and
    then a dynamic one at the second batch anyway.
    """
    return (torch.compile(model, backend=BACKEND, dynamic=True),
            torch.compile(loss, backend=BACKEND, dynamic=True))
