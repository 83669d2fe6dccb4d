"""CUDA graphs of the training step (``train.cuda_graphs=true``): forward, loss and backward of a batch
recorded once per batch shape, then replayed with one launch per batch.

Why: a model of the Multi30k recipe's size leaves the GPU waiting for Python and kernel launches. Measured
on one H100 (torch 2.11, bf16, 4,096-token batches; docs/gpu.md): a step took 32 ms, of which the GPU
computed for about 5; the recipe trained 1,449 steps in 90 s there. Replaying a recorded graph costs one
launch instead of ~1,500 operators' worth of Python, dispatch and launches.

Why recorded here and not by ``torch.compile(mode="reduce-overhead")``: that mode's CUDA-graph trees
crashed (segmentation fault) in the first steps of the recipe and in the GPU benchmark on that H100,
torch 2.11; a graph of the whole forward-and-backward, captured with ``torch.cuda.graph``, is the
older and simpler mechanism (PyTorch's "whole-network capture"), and works with the eager model or
the compiled one alike.

What a graph needs: inputs and outputs at fixed addresses (the batch is copied into the graph's own
tensors; the loss and NLL are read from the graph's), gradients that add up in place (the Trainer
keeps them in zeroed buffers instead of setting them to None), no synchronisation with the host inside
the step, and few shapes: ``data.pad_rows`` (with ``data.pad_to_multiple=8``) gives the recipe's
batches about ten. Dropout draws new numbers at every replay (the graph advances the generator's offset).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from transformer.config import Config, ConfigError

# (src, tgt_in, tgt_out, factor) -> (loss, nll): forward, loss, and backward of loss * factor
StepFunction = Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


def check_cuda_graphs(cfg: Config, device: torch.device, distributed: bool) -> None:
    """train.cuda_graphs needs a GPU, one process, and batches in few shapes: a one-line error otherwise."""
    for needed, reason in ((device.type == "cuda", f"a GPU (the device is {device})"),
                           (not distributed, "one process (not torchrun's ranks)"),
                           (cfg.data.pad_rows, "data.pad_rows=true (batches in few shapes)")):
        if not needed:
            raise ConfigError(f"train.cuda_graphs=true needs {reason}")


class Recorder(Protocol):
    """Runs a step once to warm it up, and records it to be replayed."""

    def warm_up(self, function: Callable[[], object]) -> None: ...

    def record(self, function: Callable[[], tuple[Tensor, Tensor]]) -> tuple[Callable[[], None], tuple[Tensor, Tensor]]:
        """(replay, outputs): ``replay()`` runs the recorded work again and leaves its results in ``outputs``."""
        ...


class CudaGraphRecorder:
    """`torch.cuda.graph` capture, every graph drawing on one memory pool (the graphs replay one at a time)."""

    def __init__(self) -> None:
        self.pool = torch.cuda.graph_pool_handle()

    def warm_up(self, function: Callable[[], object]) -> None:
        """One run on a side stream, as capture requires: cuBLAS, cuDNN and autograd set themselves up lazily."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            function()
        torch.cuda.current_stream().wait_stream(side)

    def record(self, function: Callable[[], tuple[Tensor, Tensor]]) -> tuple[Callable[[], None], tuple[Tensor, Tensor]]:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = function()
        return graph.replay, outputs


@dataclass
class _Graph:
    inputs: tuple[Tensor, Tensor, Tensor]  # src, tgt_in, tgt_out at the graph's addresses
    factor: Tensor  # what the loss is multiplied by before backward, 0-dim
    replay: Callable[[], None]
    outputs: tuple[Tensor, Tensor]  # loss, nll


class GraphedSteps:
    """``step`` (forward, loss, backward) replayed from one recorded graph per batch shape.

    ``gradients`` gives the parameters' gradient tensors: the warm-up before a recording runs the step
    once, and they are put back as they were, so that a new shape's batch adds to them once, by its replay.
    """

    def __init__(self, step: StepFunction, gradients: Callable[[], list[Tensor]], recorder: Recorder) -> None:
        self.step, self.gradients, self.recorder = step, gradients, recorder
        self.graphs: dict[tuple[torch.Size, ...], _Graph] = {}

    def __call__(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, factor: float) -> tuple[Tensor, Tensor]:
        """The step's (loss, nll) on this batch, its gradients added to the parameters'; the outputs are
        the graph's own tensors, overwritten by the next replay of the same shape."""
        key = (src.shape, tgt_in.shape, tgt_out.shape)
        graph = self.graphs.get(key)
        if graph is None:
            graph = self.graphs[key] = self._record(src, tgt_in, tgt_out, factor)
        for static, value in zip(graph.inputs, (src, tgt_in, tgt_out)):
            static.copy_(value, non_blocking=True)
        graph.factor.fill_(factor)
        graph.replay()
        return graph.outputs

    def _record(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, factor: float) -> _Graph:
        inputs = (src.clone(), tgt_in.clone(), tgt_out.clone())
        factor_tensor = torch.tensor(factor, dtype=torch.float32, device=src.device)

        def run() -> tuple[Tensor, Tensor]:
            return self.step(*inputs, factor_tensor)

        gradients = self.gradients()
        kept = [gradient.clone() for gradient in gradients]
        self.recorder.warm_up(run)
        for gradient, before in zip(gradients, kept):
            gradient.copy_(before)
        replay, outputs = self.recorder.record(run)
        return _Graph(inputs, factor_tensor, replay, outputs)
