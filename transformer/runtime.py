"""Where and how the model runs: device, precision (autocast), threads, seeds, RNG state and
torch.distributed (DDP launched by torchrun)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from transformer.config import ConfigError

T, R = TypeVar("T"), TypeVar("R")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def select_device(name: str = "auto") -> torch.device:
    """``auto`` picks CUDA when available (the local rank's GPU under torchrun), else the CPU."""
    if name == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        local_rank, gpus = int(os.environ.get("LOCAL_RANK", 0)), torch.cuda.device_count()
        if local_rank >= gpus:
            raise ConfigError(f"train.device=auto: local rank {local_rank} has no GPU of its own ({gpus} on this "
                              f"machine); start at most {gpus} processes per node, or set train.device=cpu")
        return torch.device("cuda", local_rank)
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"train.device: unknown device {name!r} (use auto, cpu, cuda or cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"train.device={name} but CUDA is not available on this machine")
    return device


def cpu_has_fast_bf16() -> bool:
    """True when the CPU multiplies bf16 matrices natively (AVX512-BF16 or AMX); emulated bf16 is slower than fp32."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def select_precision(name: str, device: torch.device) -> str:
    """Resolve ``auto`` to bf16 where the hardware supports it (CUDA compute capability >= 8, CPU
    AVX512-BF16/AMX), else fp32; reject fp16 on CPU (it needs a GradScaler and CUDA)."""
    if name == "auto":
        if device.type == "cuda":
            return "bf16" if torch.cuda.get_device_capability(device)[0] >= 8 else "fp32"
        return "bf16" if cpu_has_fast_bf16() else "fp32"
    if name == "fp16" and device.type != "cuda":
        raise ConfigError("train.precision=fp16 needs a CUDA device; use bf16 or fp32 on the CPU")
    return name


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """Mixed-precision context for the forward pass; a no-op for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[precision])


def keep_freed_memory() -> None:
    """Have glibc's malloc keep freed memory for reuse instead of handing it back to the system.

    By default every tensor over 32 MB (the (tokens, vocabulary) logits and their gradient) is
    a fresh mmap, and each of its pages faults on first touch: about a quarter of a CPU training
    step. Same effect as MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=1073741824; without glibc,
    nothing happens.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_max = -1, -4  # <malloc.h>
    libc.mallopt(m_mmap_max, 0)
    libc.mallopt(m_trim_threshold, 1 << 30)  # still return free memory above 1 GB


def set_threads(threads: int) -> None:
    """Use ``threads`` CPU threads for intra-op parallelism (0 keeps torch's default)."""
    if threads > 0:
        torch.set_num_threads(threads)


def parallel_map(function: Callable[[T], R], items: Iterable[T], workers: int = 1) -> Iterator[R]:
    """``map(function, items)`` on ``workers`` threads sharing the CPU threads, results in order.

    Decoding a sentence batch is a long chain of small operations that two CPU threads speed up
    only 1.3-1.5x; two batches at once, on one thread each, come closer to 2x (the
    inter_threads / intra_threads split of CTranslate2). torch releases the GIL inside its ops.
    Each worker gets ``max(1, threads // workers)`` threads while the results are read; with a
    single item, that item gets them all.
    """
    items = list(items)
    workers = min(workers, len(items))
    if workers <= 1:
        yield from map(function, items)
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads // workers))
    try:
        with ThreadPoolExecutor(workers) as pool:
            yield from pool.map(function, items)
    finally:
        torch.set_num_threads(threads)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """Every random generator's state, in types that `torch.load(weights_only=True)` accepts."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": pos,
                  "has_gauss": has_gauss, "cached_gaussian": cached},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict) -> None:
    """Restore the generators saved by `rng_state`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclass
class DistributedContext:
    """This process's place in a torchrun job (rank 0 of 1 when not distributed)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def all_reduce_sum(self, values: list[float], device: torch.device) -> list[float]:
        """Sum numbers over all ranks (token counts, loss sums) so every rank sees the totals."""
        if not self.enabled:
            return values
        tensor = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(tensor)
        return tensor.tolist()

    def all_gather_object(self, value: T) -> list[T]:
        """Every rank's ``value``, in rank order, on every rank (what differs between ranks, for checkpoints)."""
        if not self.enabled:
            return [value]
        values: list = [None] * self.world_size
        dist.all_gather_object(values, value)
        return values


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
    return DistributedContext(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))


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


class PackedLinear(torch.nn.Module):
    """A Linear layer for bf16 inference on the CPU, its weight reordered once into oneDNN's blocked
    layout (as torch.compile's CPU backend does): 1.3-1.8x faster than ``F.linear`` on the plain
    weight for decoding's 64-320 rows; a bf16 beam search ran ~10% faster."""

    def __init__(self, linear: torch.nn.Linear, rows: int = 320) -> None:  # rows: the layout's batch hint
        super().__init__()
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), rows)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


def can_pack_linear_weights() -> bool:
    """Whether this torch has oneDNN's linear ops and this CPU runs them in bf16."""
    mkldnn = torch.ops.mkldnn
    ops = ("_reorder_linear_weight", "_linear_pointwise", "_is_mkldnn_bf16_supported")
    return torch.backends.mkldnn.is_available() and all(hasattr(mkldnn, op) for op in ops) and bool(
        mkldnn._is_mkldnn_bf16_supported())


def pack_linear_weights(model: torch.nn.Module) -> torch.nn.Module:
    """Replace the Linear layers of a bf16 model on the CPU by `PackedLinear`s, for inference.

    The one place that uses torch's private oneDNN linear ops (torch.compile's CPU backend uses
    them too); where this torch lacks them, the model stays as it is.
    """
    if not can_pack_linear_weights():
        return model
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(module, name, PackedLinear(child))
    return model


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """Dynamic int8 quantization of the Linear layers for CPU inference.

    The one place that calls the quantization API: PyTorch is moving it from
    ``torch.ao.quantization`` to torchao, and only this function should need to follow.
    """
    import warnings

    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", "torch.quantize_per_tensor", UserWarning)  # the same deprecation
        return quantize_dynamic(model.cpu(), {torch.nn.Linear}, dtype=torch.qint8)
