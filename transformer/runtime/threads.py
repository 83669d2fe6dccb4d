"""CPU threads: how many each operation uses, and batches decoded side by side on worker threads."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

T, R = TypeVar("T"), TypeVar("R")


def set_threads(threads: int) -> None:
    """Use ``threads`` CPU threads for intra-op parallelism (0 keeps torch's default)."""
    if threads > 0:
        torch.set_num_threads(threads)


def parallel_map(function: Callable[[T], R], items: Iterable[T], workers: int = 1) -> Iterator[R]:
    """``map(function, items)`` on ``workers`` threads sharing the CPU threads, results in order.

    Decoding a sentence batch is a long chain of small operations that two CPU threads speed up
    only 1.3-1.5x; two batches at once, on one thread each, come closer to 2x (the
    inter_threads / intra_threads split of CTranslate2). torch releases the GIL inside its ops,
    but the threads hand it over at every Python call: on a 2-core Xeon each ran 10% (fp32) to 25%
    (int8) slower than alone, where two processes did not (docs/performance.md).
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
