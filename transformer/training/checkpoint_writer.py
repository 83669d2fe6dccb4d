"""Checkpoints written on a thread of their own while training goes on.

Writing a checkpoint (serialising, checksumming, flushing to disk, a copy for each further name) held the GPU recipe's
training for about 0.5 s a save on an H200 and 0.6 s on an H100: the hundreds of steps with a save ran at 59-74 steps/s
against 91-116 without, 15 saves in its 90 seconds (docs/gpu.md). The writer copies the state's tensors into host
buffers kept from one save to the next (page-locked for a GPU's tensors: one copy the GPU makes by itself), and the
thread writes from them while the next steps train. Measured on the CPU (2-core AMD EPYC Zen 5, the CPU recipe's
model, 107 MB checkpoints, a save every 10 steps): a save held training 16-97 ms, of which the copy 6-34 ms, where
writing in place had held it 230-500 ms (serialising 190-500 ms, each further name 70-120 ms). The buffers cost host
memory of one checkpoint's size for the whole run.

One write at a time: a save first waits for the previous write to end, and the run's last save is written in place
(nothing trains then), so that a finished run's files are all there. The training loop checks between steps: a write
that failed stops the run at the next step, with its error.
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
        self._pending: Future[None] | None = None
        self._buffers: list[Tensor] = []  # host copies of the last save's storages, in the order met (bytes)

    def write(self, state: dict[str, Any], job: Callable[[dict[str, Any]], None], in_background: bool = True) -> None:
        """Copy ``state`` (its tensors to host memory, its containers and values as they are now) and run
        ``job(copy)`` on the writer's thread; first wait for the previous job, raising its error. Not
        ``in_background`` (the run's last save: nothing trains meanwhile), ``job(state)`` here, without a copy."""
        self.wait()  # its buffers are the ones filled below
        if not in_background:
            job(state)
            return
        self._pending = self._executor.submit(job, self._host_copy(state))

    def raise_if_failed(self) -> None:
        """Raise the last job's error if it has ended in one (a check between steps: it does not wait)."""
        if self._pending is not None and self._pending.done():
            self.wait()

    def wait(self) -> None:
        """Return once the last job has ended; raise its error, if it failed. Interrupted (Ctrl-C), the job stays
        pending: `close` still waits for it."""
        if self._pending is None:
            return
        try:
            self._pending.result()
        finally:
            if self._pending.done():
                self._pending = None

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

    def _host_copy(self, state: Any) -> Any:
        """``state`` with each tensor's storage copied to host memory once, and the tensor rebuilt on the copy with
        its offset, shape and strides: tensors that share memory (tied embeddings) still do, and torch.save stores
        what it would have stored from the originals. Containers keep their type and a state_dict's ``_metadata``."""
        storages: dict[tuple, Tensor] = {}  # (device, address) of a storage -> its host copy, as bytes
        from_gpu = False

        def copied(value: Any) -> Any:
            nonlocal from_gpu
            if isinstance(value, Tensor):
                storage = value.untyped_storage()
                key = (value.device, storage.data_ptr(), storage.nbytes())
                if key not in storages:
                    whole = torch.empty(0, dtype=torch.uint8, device=value.device).set_(storage)
                    storages[key] = self._buffer(len(storages), whole).copy_(whole, non_blocking=True)
                    from_gpu |= value.is_cuda
                return torch.empty(0, dtype=value.dtype).set_(storages[key].untyped_storage(), value.storage_offset(),
                                                              value.shape, value.stride())
            if isinstance(value, dict):
                result = type(value)((key, copied(item)) for key, item in value.items())
                if hasattr(value, "_metadata"):  # a module's state_dict: the versions its load_state_dict reads
                    result._metadata = copy.deepcopy(value._metadata)
                return result
            if isinstance(value, (list, tuple)):
                return type(value)(copied(item) for item in value)
            return copy.deepcopy(value)

        state = copied(state)
        if from_gpu:  # the copies above were queued on the GPU: done before the thread reads them
            torch.cuda.synchronize()
        return state

    def _buffer(self, index: int, storage_bytes: Tensor) -> Tensor:
        """The host buffer for the ``index``-th storage of a save, kept while its size stays the same (page-locked
        for a GPU's storage, so that the copy is the GPU's alone)."""
        if index < len(self._buffers) and self._buffers[index].numel() == storage_bytes.numel():
            return self._buffers[index]
        buffer = torch.empty(storage_bytes.numel(), dtype=torch.uint8, pin_memory=storage_bytes.is_cuda)
        if index < len(self._buffers):
            self._buffers[index] = buffer
        else:
            self._buffers.append(buffer)
        return buffer
