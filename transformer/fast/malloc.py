"""glibc malloc tuning for the commands: keep freed memory instead of returning it to the system.

Measured (2-core CPU, torch 2.13): about 30% more training tokens/s, for our model and for the
nn.Transformer baseline alike, because large tensors reuse freed memory instead of fresh mmaps
faulting on every page.
"""

from __future__ import annotations

import ctypes


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
