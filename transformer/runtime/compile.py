"""torch.compile for training (``train.compile=true``): each repeated layer of the model, and the loss.

Measured layer by layer as here (docs/gpu.md, "Measured so far": one H200, torch 2.11, bf16, 25k-token
batches): +14% target tokens/s for the paper's base model, after 39 s of compiling; a plain
``torch.compile`` of the whole model gave +25% (issue 32's table) but compiled for minutes. On the CPU no
gain (docs/performance.md), hence off by default. Compiling the loss as well lets inductor fuse
its log-softmax, gather and mean over the (tokens, vocabulary) logits into a few kernels instead of one
per operation.

The layers are compiled one by one ("regional compilation", as PyTorch's recipes advise for stacks of
identical blocks): the layers of a stack share their code, so inductor compiles one graph per kind of
layer, not one for the whole model. Why: compiling the whole base-size models, ours and the baseline,
takes over 175 s (measured: it did not end in the 175 s a GPU benchmark run had left; docs/gpu.md, an
H200).

``train.compile_mode`` is torch.compile's mode, without the modes that record CUDA graphs
(``reduce-overhead``, ``max-autotune``): their CUDA-graph trees crash on a GPU (`runtime/cuda_graphs`,
which records the whole step instead, with or without compile: ``train.cuda_graphs=true``).

Only what runs the forward pass is compiled: the Trainer keeps the plain model for checkpoints
(their state_dict keys carry no ``_orig_mod.`` prefix, so a run resumes with or without compile),
for validation and for decoding, all on the same parameters.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import nn

Loss = TypeVar("Loss", bound=Callable)
BACKEND = "inductor"


def compile_training(model: nn.Module, loss: Loss, mode: str = "default") -> tuple[nn.Module, Loss]:
    """A view of ``model`` whose layers run compiled (`with_compiled_layers`), and ``loss`` compiled, in
    torch.compile's ``mode``.

    Token-budget batches vary in sentences and in length from one batch to the next: compiled for
    dynamic shapes at once, a run compiles once or twice (a few shape relations, such as source
    and target of equal length, are guarded), where static shapes would compile a first graph and
    then a dynamic one at the second batch anyway.
    """
    return with_compiled_layers(model, mode), torch.compile(loss, backend=BACKEND, dynamic=True, mode=mode)


def with_compiled_layers(model: nn.Module, mode: str = "default") -> nn.Module:
    """A copy of ``model``'s containers in which every module of an ``nn.ModuleList`` (a stack of layers) is
    wrapped by ``torch.compile``; every other module, and so every parameter and buffer, is ``model``'s own.

    ``model`` itself is left as it was: it still decodes and saves eagerly, while training goes through the view.
    """
    if isinstance(model, nn.ModuleList):
        view = copy.copy(model)
        view._modules = {name: torch.compile(layer, backend=BACKEND, dynamic=True, mode=mode)
                         for name, layer in model._modules.items()}
        return view
    if not any(isinstance(module, nn.ModuleList) for module in model.modules()):
        return model  # nothing to compile below: shared as it is
    view = copy.copy(model)
    view._modules = {name: None if child is None else with_compiled_layers(child, mode)
                     for name, child in model._modules.items()}
    return view
