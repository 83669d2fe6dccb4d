"""Masked attention alone on a GPU (the GPU benchmark's `attention_kernels` part, docs/gpu.md): which kernel
to train through at sentence lengths, and what a new shape costs each."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer.data.batch import rows_within
from transformer.errors import first_line
from transformer.model.attention import scaled_dot_product_attention
from transformer.model.row_groups import attend_in_groups, group_size, grouped_masks

from .training import wait


def attention_kernels(device: torch.device, shapes: int, tiny: bool) -> dict:
    """Milliseconds of masked attention, forward and backward, at the first call of a new shape and at the next
    call of the same shape, on rows of 0 to 4 pads: with dropout 0.1, the memory-efficient kernel (what
    `avoid_cudnn_attention` leaves torch to choose for a padding mask: cuDNN's built a plan per shape, 881 ms at a
    new shape on an H200, 2026-11-27; its row went to keep the benchmark within 3 minutes) and the explicit
    formula (`scaled_dot_product_attention`, as the CPU trains: at sentence lengths a fused kernel's tiles are
    mostly padding); without dropout (which the paper does not put on attention weights), the
    memory-efficient kernel again, flash attention over the padded rows without a mask (computing the pads too:
    the time of the kernel alone), and flash attention over the real tokens alone, packed with their rows'
    cumulative lengths (`varlen_attn`, the gather of the real tokens counted). Each pair differs in one thing:
    dropout, kernel and mask, packing. Then the decoder's self-attention as it trains (``is_causal``, no mask,
    dropout 0.1) through flash attention, which torch chooses for it, and through the memory-efficient kernel:
    an H200's profile of the base size (2026-11-27) put flash's backward at 0.8 ms a layer against 0.38 on
    average for the memory-efficient backward of the encoder's self-attention and the cross-attention. Last,
    rows attending in groups of up to 64 and 128 positions (train.attention_row_length, `model.row_groups`),
    padded and causal, dropout 0.1: the memory-efficient kernel on fewer, fuller tiles. Shapes as the base
    size's batches have them: 8 heads of 64, 25,000 tokens in rows of the length of Multi30k's sentences, a
    multiple of 8 rows (as data.rows_multiple=8 makes them, so that groups divide them)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(8, 40 if tiny else 64, (shapes,), generator=generator).tolist()
    dropout = torch.nn.Dropout(0.1)

    def formula(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        return scaled_dot_product_attention(q, k, v, mask, dropout)[0]

    def fused(backend: SDPBackend, dropout_p: float, masked: bool = True,
              causal: bool = False) -> Callable[..., Tensor]:
        def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask if masked else None, dropout_p=dropout_p,
                                                      is_causal=causal)
        return attend

    def flash_varlen(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        from torch.nn.attention.varlen import varlen_attn

        rows, heads, length, size = q.shape
        real = mask.view(rows, length)
        lengths = real.sum(dim=1)
        starts = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)  # where each row's tokens start, and the end
        longest = int(lengths.max())
        q, k, v = (t.transpose(1, 2)[real] for t in (q, k, v))  # (real tokens, H, d)
        return varlen_attn(q, k, v, starts, starts, longest, longest)

    def in_groups(row_length: int, causal: bool = False) -> Callable[..., Tensor]:
        built: dict = {}  # training builds a batch's masks once for all its layers: not timed at the next call

        def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
            if mask.shape not in built:
                size = group_size(q.size(0), q.size(2), row_length)  # 1: rows alone, as the model attends them
                built[mask.shape] = grouped_masks(mask.view(q.size(0), -1), q.size(2), size) if size > 1 else None
            masks = built[mask.shape]
            with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
                if masks is None:
                    return F.scaled_dot_product_attention(q, k, v, attn_mask=None if causal else mask,
                                                          dropout_p=dropout.p, is_causal=causal)
                return attend_in_groups(q, k, v, masks.decoder if causal else masks.encoder, dropout.p)
        return attend

    result: dict = {}
    for name, attend in (("memory-efficient", fused(SDPBackend.EFFICIENT_ATTENTION, dropout.p)), ("formula", formula),
                         ("memory-efficient, no dropout", fused(SDPBackend.EFFICIENT_ATTENTION, 0.0)),
                         ("flash, padded, no mask", fused(SDPBackend.FLASH_ATTENTION, 0.0, masked=False)),
                         ("flash-varlen", flash_varlen),
                         ("flash, causal", fused(SDPBackend.FLASH_ATTENTION, dropout.p, masked=False, causal=True)),
                         ("memory-efficient, causal",
                          fused(SDPBackend.EFFICIENT_ATTENTION, dropout.p, masked=False, causal=True)),
                         ("memory-efficient, rows by 64", in_groups(64)),
                         ("memory-efficient, rows by 128", in_groups(128)),
                         ("memory-efficient, causal, rows by 64", in_groups(64, causal=True))):
        first, again = [], []
        try:
            for index, length in enumerate(lengths):
                rows = rows_within(2000 if tiny else 25000, length, 8) - 8 * index  # a new (rows, length) a shape
                q, k, v = (torch.randn(rows, 8, length, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
                           for _ in range(3))
                real = length - torch.arange(rows, device=device) % min(5, length - 1)  # 0 to 4 pads a row
                mask = (torch.arange(length, device=device) < real[:, None])[:, None, None, :]
                for times in (first, again):
                    start = wait(device)
                    attend(q, k, v, mask).sum().backward()
                    times.append(1e3 * (wait(device) - start))
        except (RuntimeError, ImportError, ValueError) as error:  # a kernel not available here or for these shapes
            result[name] = {"unavailable": first_line(error)[:200]}
            continue
        result[name] = {"first_call_ms": statistics.mean(first), "next_call_ms": statistics.mean(again)}
    return result
