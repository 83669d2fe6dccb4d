"""torch.distributed for runs launched by torchrun: this process's rank, collectives, elastic restarts."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from transformer.errors import first_line

T = TypeVar("T")
# how long ranks wait for what rank 0 does alone: train the tokenizer, encode the corpus, validate. The default process
# group's timeout (10 minutes over nccl, 30 over gloo) ended the waiting ranks of a large corpus's first start.
WAIT_TIMEOUT = timedelta(hours=2)


class RankLost(ConnectionError):
    """A collective failed because another rank of the job is gone (it stopped with an error, was killed, or did not
    answer in the process group's timeout). One line naming the collective (the command line adds the rank): gloo's
    or nccl's traceback would bury the error of the rank that failed. A ConnectionError, so the command line prints
    it without a traceback."""


@dataclass
class DistributedContext:
    """This process's place in a torchrun job (rank 0 of 1 when not distributed)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    waits: dist.ProcessGroup | None = None  # of `barrier` and `all_gather_object` (gloo, WAIT_TIMEOUT); None: default

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.enabled:
            with self._collective("barrier"):
                dist.barrier(group=self.waits)

    def all_reduce_sum(self, values: list[float], device: torch.device) -> list[float]:
        """Sum numbers over all ranks (token counts, loss sums) so every rank sees the totals."""
        if not self.enabled:
            return values
        tensor = torch.tensor(values, dtype=torch.float64, device=device)
        with self._collective("all_reduce"):
            dist.all_reduce(tensor)
            return tensor.tolist()  # inside: over nccl the reduction runs on, and fails while it is read

    def all_gather_object(self, value: T) -> list[T]:
        """Every rank's ``value``, in rank order, on every rank (what differs between ranks, for checkpoints)."""
        if not self.enabled:
            return [value]
        values: list = [None] * self.world_size
        with self._collective("all_gather"):
            dist.all_gather_object(values, value, group=self.waits)
        return values

    @contextmanager
    def _collective(self, name: str) -> Iterator[None]:
        """Turn the backend's error when a peer is gone into `RankLost`: a rank that waited for rank 0's tokenizer,
        validation or checkpoint while rank 0 stopped with a one-line error would print a 30-line traceback of its
        own."""
        try:
            yield
        except RuntimeError as error:  # gloo's, nccl's (DistBackendError) and the store's (DistNetworkError)
            if not _peer_gone(error):  # a fault of this rank (out of memory, a CUDA error, a bug): as it is
                raise
            cause = first_line(error)
            if cause.startswith("[") and "] " in cause:  # gloo's "[.../pair.cc:561] Connection closed by peer ..."
                cause = cause.split("] ", 1)[1]
            raise RankLost(f"stopped: lost another of the {self.world_size} ranks ({name} failed: "
                           f"{cause.split('. ')[0]}); that rank's own error, or torchrun's report, says why") from error


PEER_GONE = ("closed by peer", "reset by peer", "timed out", "timeout", "connection refused", "broken pipe")


def _peer_gone(error: RuntimeError) -> bool:
    """Whether a collective's error says another rank is gone (it stopped, was killed, or did not answer in time):
    torch's distributed errors, and gloo's, which are plain RuntimeErrors naming the lost connection."""
    if isinstance(error, torch.OutOfMemoryError) or str(error).startswith("CUDA error"):  # "the launch timed out"
        return False
    return isinstance(error, dist.DistError) or any(words in str(error).lower() for words in PEER_GONE)


def init_distributed(device: torch.device) -> DistributedContext:
    """Join the process group torchrun describes in the environment (nccl on GPU, gloo on CPU)."""
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    if world_size == 1:
        return DistributedContext()
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        store = restart_store(world_size)
        if store is None:
            dist.init_process_group(backend)
        else:
            dist.init_process_group(backend, store=store, rank=int(os.environ["RANK"]), world_size=world_size)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    waits = dist.new_group(backend="gloo", timeout=WAIT_TIMEOUT)  # on the host, whatever the device's backend
    return DistributedContext(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)), waits)


def restart_store(world_size: int) -> dist.Store | None:
    """The key-value store of this torchrun attempt, for a one-node job; None: torch's default (``env://``).

    torchrun shares its own TCPStore with the workers and keeps it across restarts, and
    `init_process_group` writes the same keys in every attempt: restarted workers can read the
    addresses of the killed ones, and gloo then fails to connect or hangs (torch 2.13, CPU: 3 of 4
    two-rank jobs with a rank killed did not recover; 6 of 6 did with this store). Prefixing the
    keys with the restart count keeps the attempts apart; under one agent (one node) every worker
    has the same count, across nodes it can differ, so jobs over several nodes keep torch's default
    (there TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 gives each attempt a store of its own).
    """
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or env.get("GROUP_WORLD_SIZE", "1") != "1":
        return None
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), world_size, is_master=False,
                          timeout=default_pg_timeout)
    return dist.PrefixStore(f"transformer/attempt{env.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
