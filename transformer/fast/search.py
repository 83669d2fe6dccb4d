"""Faster selections for the search loops: the beam's top-k over the vocabulary, and which rows stay in the batch.

Both give the searches' results unchanged (tests/test_fast.py decodes with and without them).
"""

from __future__ import annotations

import torch
from torch import Tensor

from transformer.data.batch import round_up
from transformer.decoding.selection import SearchSteps

ROW_GROUP = 4


def top_k_in_blocks(scores: Tensor, k: int, block: int = 64) -> Tensor:
    """Columns of the k highest scores of each row (N, k), as ``scores.topk(k).indices``.

    The k best of a row lie in the k blocks of ``block`` columns with the highest maxima, so topk
    only searches those. Measured (2-core CPU, torch 2.13): over an 8k vocabulary ~1.6x faster
    than topk over the whole row.
    """
    rows, width = scores.shape
    if width % block or width < 4 * k * block:  # few blocks per wanted column: no gain
        return scores.topk(k, dim=1).indices
    maxima = scores.reshape(rows, width // block, block).amax(dim=2)  # (N, blocks)
    columns = maxima.topk(k, dim=1).indices[:, :, None] * block + torch.arange(block, device=scores.device)
    columns = columns.flatten(1)  # (N, k * block)
    return columns.gather(1, scores.gather(1, columns).topk(k, dim=1).indices)


def rows_in_groups(searching: Tensor) -> Tensor:
    """The rows still searching, plus the first finished ones up to a multiple of 4 (capped at all rows).

    Finished sentences leave the batch to stop costing compute, but each new number of rows costs
    a bf16 model on the CPU a new oneDNN kernel per matrix shape (~0.8 ms each): rounding the rows
    up keeps the shapes few. Measured (Xeon with AMX, Multi30k test2016, batch 64): bf16 beam 5 ~3%
    and greedy ~7% faster. Shapes: (N,) bool -> (N',).
    """
    rows = min(len(searching), round_up(int(searching.sum()), ROW_GROUP))
    return searching.to(torch.uint8).argsort(descending=True, stable=True)[:rows].sort().values


FAST_STEPS = SearchSteps(top_k=top_k_in_blocks, rows_to_keep=rows_in_groups)
