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
batches about ten; past `MAX_GRAPHS` shapes, batches run eagerly. Dropout draws new numbers at every
replay (the graph advances the generator's offset). Memory: the graphs' pool keeps a step's
activations reserved, and a new shape's warm-up runs beside them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

log = logging.getLogger(__name__)
MAX_GRAPHS = 64  # batch shapes with a graph of their own; the recipe's batches take about ten

# (src, tgt_in, tgt_out, factor) -> (loss, nll): forward, loss, and backward of loss * factor
StepFunction = Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


class Recorder(Protocol):
    """Runs a step once to warm it up, and records it to be replayed."""

    def warm_up(self, function: Callable[[], object]) -> None: ...

    def record(self, function: Callable[[], tuple[Tensor, Tensor]]) -> tuple[Callable[[], None], tuple[Tensor, Tensor]]:
        """(replay, outputs): ``replay()`` runs the recorded work again and leaves its results in ``outputs``."""
        ...


class CudaGraphRecorder:
    """`torch.cuda.graph` capture on ``device``, every graph drawing on one memory pool (they replay one at a time)."""

    def __init__(self, device: torch.device) -> None:
        if device.index is None:  # plain "cuda" is the current GPU, which set_device needs named by its index
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        torch.cuda.set_device(device)  # streams and captures are the current device's: the run's GPU
        self.pool = torch.cuda.graph_pool_handle()
        self.side = torch.cuda.Stream(device)  # one for every warm-up: the memory it caches serves them all

    def warm_up(self, function: Callable[[], object]) -> None:
        """One run on a side stream, as capture requires (cuBLAS and autograd set themselves up lazily), with the
        random numbers it draws given back: a resumed run's dropout stays that of an uninterrupted one."""
        random_state = torch.cuda.get_rng_state(self.device)
        self.side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.side):
            function()
        torch.cuda.current_stream(self.device).wait_stream(self.side)
        torch.cuda.set_rng_state(random_state, self.device)

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

    def __init__(self, step: StepFunction, gradients: Callable[[], list[Tensor]], recorder: Recorder,
                 max_graphs: int = MAX_GRAPHS) -> None:
        self.step, self.gradients, self.recorder, self.max_graphs = step, gradients, recorder, max_graphs
        self.graphs: dict[tuple[torch.Size, ...], _Graph] = {}
        self.eager_shapes: set[tuple[torch.Size, ...]] = set()  # beyond max_graphs

    def __call__(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, factor: float) -> tuple[Tensor, Tensor]:
        """The step's (loss, nll) on this batch, its gradients added to the parameters'. The outputs are a
        graph's own tensors, valid until the next replay of any graph (they share one memory pool).
        Shapes beyond ``max_graphs`` run eagerly, into the same gradients."""
        key = (src.shape, tgt_in.shape, tgt_out.shape)
        graph = self.graphs.get(key)
        if graph is None and len(self.graphs) >= self.max_graphs:
            if not self.eager_shapes:
                log.warning("%d batch shapes have CUDA graphs; new shapes run without (data.pad_to_multiple=8 "
                            "makes fewer)", self.max_graphs)
            self.eager_shapes.add(key)
            return self.step(src, tgt_in, tgt_out, torch.tensor(factor, device=src.device))
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
        if any(gradient is None for gradient in gradients):  # the capture would put it in the graphs' pool
            raise RuntimeError("CUDA graphs need every parameter's gradient allocated before recording")
        kept = [gradient.clone() for gradient in gradients]
        self.recorder.warm_up(run)
        for gradient, before in zip(gradients, kept):
            gradient.copy_(before)
        replay, outputs = self.recorder.record(run)
        return _Graph(inputs, factor_tensor, replay, outputs)
