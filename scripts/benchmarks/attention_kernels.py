"""Masked attention alone on a GPU (the GPU benchmark's `attention_kernels` part, docs/gpu.md): which kernel
to train through at sentence lengths, and what a new shape costs each."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer.model.attention import scaled_dot_product_attention

from .training import wait


def attention_kernels(device: torch.device, shapes: int, tiny: bool) -> dict:
    """Milliseconds of masked attention with dropout, forward and backward, at the first call of a new shape and
    at the next call of the same shape: cuDNN's kernel, the memory-efficient one (what `avoid_cudnn_attention`
    leaves torch to choose for a padding mask; cuDNN builds a plan per shape), and the explicit formula
    (`scaled_dot_product_attention`, as the CPU trains: at sentence lengths a fused kernel's tiles are mostly
    padding); and flash attention over the real tokens only, packed with their rows' cumulative lengths
    (`varlen_attn`; it has no attention dropout, which the paper does not use: the lever if it wins, with the
    gather of the real tokens counted). Shapes as the base size's batches have them: 8 heads of 64, 25,000
    tokens in rows of the length of Multi30k's sentences."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(8, 40 if tiny else 64, (shapes,), generator=generator).tolist()
    dropout = torch.nn.Dropout(0.1)

    def formula(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        return scaled_dot_product_attention(q, k, v, mask, dropout)[0]

    def fused(backend: SDPBackend) -> Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]:
        def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout.p)
        return attend

    def flash_varlen(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        from torch.nn.attention.varlen import varlen_attn

        rows, heads, length, size = q.shape
        real = mask.view(rows, length)  # every row has as many real tokens here
        per_row = int(real[0].sum())
        starts = torch.arange(0, (rows + 1) * per_row, per_row, device=q.device, dtype=torch.int32)
        q, k, v = (t.transpose(1, 2)[real].view(-1, heads, size) for t in (q, k, v))  # (real tokens, H, d)
        return varlen_attn(q, k, v, starts, starts, per_row, per_row)

    result: dict = {}
    for name, attend in (("cudnn", fused(SDPBackend.CUDNN_ATTENTION)),
                         ("memory-efficient", fused(SDPBackend.EFFICIENT_ATTENTION)), ("formula", formula),
                         ("flash-varlen", flash_varlen)):
        first, again = [], []
        try:
            for index, length in enumerate(lengths):
                rows = (2000 if tiny else 25000) // length + index  # a new (rows, length) for every shape
                q, k, v = (torch.randn(rows, 8, length, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
                           for _ in range(3))
                mask = (torch.arange(length, device=device) < length - 1).expand(rows, 1, 1, length)  # a pad a row
                for times in (first, again):
                    start = wait(device)
                    attend(q, k, v, mask).sum().backward()
                    times.append(1e3 * (wait(device) - start))
        except (RuntimeError, ImportError) as error:  # this kernel is not available here or for these shapes
            result[name] = {"unavailable": str(error).splitlines()[0][:200]}
            continue
        result[name] = {"first_call_ms": statistics.mean(first), "next_call_ms": statistics.mean(again)}
    return result
