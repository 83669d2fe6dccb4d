"""Checkpoints written on a thread of their own while training goes on.

Writing a checkpoint (serialising, checksumming, flushing to disk, a copy for each further name) held the GPU recipe's
training for about 0.5 s a save on an H200 and 0.6 s on an H100: the hundreds of steps with a save ran at 59-74 steps/s
against 91-116 without, 15 saves in its 90 seconds (docs/gpu.md). The writer copies the state's tensors into host
buffers kept from one save to the next (page-locked for a GPU's tensors: one copy the GPU makes by itself), and the
thread writes from them while the next steps train. Measured on the CPU (2-core AMD EPYC Zen 5, the CPU recipe's
model, 107 MB checkpoints, a save every 10 steps): a save held training 16-97 ms, of which the copy 6-34 ms, where
writing in place had held it 230-500 ms (serialising 190-500 ms, each further name 70-120 ms). The buffers cost host
memory of one checkpoint's size for the whole run.

One write at a time: a save first waits for the previous write to end, and so does the end of the run, so that a
finished run's files are all there. A write that failed raises its error at the next save or at the end of the run.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from torch import Tensor

log = logging.getLogger(__name__)


class CheckpointWriter:
    """Runs a checkpoint's writing on one background thread, from a copy of its tensors in host memory."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
        self._pending: Future | None = None
        self._buffers: list[Tensor] = []  # the host copies of the last save's tensors, in the order met

    def write(self, state: dict[str, Any], job: Callable[[dict[str, Any]], None]) -> None:
        """Copy ``state`` (its tensors to host memory, its containers and values as they are now) and run
        ``job(copy)`` on the writer's thread; first wait for the previous job, raising its error."""
        self.wait()  # its buffers are the ones filled below
        self._pending = self._executor.submit(job, self._host_copy(state))

    def wait(self) -> None:
        """Return once the last job has ended; raise its error, if it failed."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self, raise_errors: bool = True) -> None:
        """Wait for the last job and end the thread; the job's error is raised, or only logged if not
        ``raise_errors``."""
        try:
            self.wait()
        except Exception as error:
            if raise_errors:
                raise
            log.error("%s", error)
        finally:
            self._executor.shutdown()

    def _host_copy(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` with each tensor copied into a host buffer of its own (one buffer for tensors that are one, such
        as tied embeddings: torch.save then stores them once, as it would have)."""
        copies: dict[tuple, Tensor] = {}
        from_gpu = False

        def copied(value: Any) -> Any:
            nonlocal from_gpu
            if isinstance(value, Tensor):
                key = (value.data_ptr(), value.device, value.dtype, tuple(value.shape), value.stride())
                if key not in copies:
                    copies[key] = self._buffer(len(copies), value)
                    copies[key].copy_(value.detach(), non_blocking=True)
                    from_gpu |= value.is_cuda
                return copies[key]
            if isinstance(value, dict):
                return {key: copied(item) for key, item in value.items()}
            if isinstance(value, (list, tuple)):
                return type(value)(copied(item) for item in value)
            return copy.deepcopy(value)

        state = copied(state)
        if from_gpu:  # the copies above were queued on the GPU: done before the thread reads them
            torch.cuda.synchronize()
        return state

    def _buffer(self, index: int, tensor: Tensor) -> Tensor:
        """The host buffer for the ``index``-th tensor of a save, kept while its shape and dtype stay the same."""
        if index == len(self._buffers):
            self._buffers.append(torch.empty(0))
        buffer = self._buffers[index]
        if buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=tensor.is_cuda)
            self._buffers[index] = buffer
        return buffer
