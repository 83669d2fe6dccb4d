"""Sampling instead of searching: temperature, top-k and top-p (nucleus) samples, for back-translation.

A sample is a sequence of draws from the model's next-token distribution, reshaped by the
temperature and cut to the k most likely tokens (top-k) or to the fewest whose probabilities add up
to p (top-p; Holtzman et al., 2020). Each sample draws from a generator of its own, seeded by
``decode.seed``, its source tokens and its number: a sample does not depend on the batch it was
drawn in nor on the order of the input, and the same seed gives the same samples.
"""

from __future__ import annotations

import zlib

import torch
from torch import Tensor

from transformer.config import DecodeConfig


def sample_seeds(seed: int, sources: list[list[int]], samples: int) -> list[int]:
    """One seed per sample, ``samples`` consecutive ones per source: a hash of (seed, source ids, sample number)."""
    return [zlib.crc32(f"{seed} {number} {ids}".encode()) for ids in sources for number in range(samples)]


def restrict(log_probs: Tensor, decode: DecodeConfig) -> Tensor:
    """The distribution to draw from, as log-probabilities (N, V): divided by the temperature, cut to
    the top-k tokens and to the top-p nucleus (the most likely token always stays)."""
    scores = log_probs / decode.sampling_temperature
    if 0 < decode.sampling_topk < scores.size(-1):
        kth = scores.topk(decode.sampling_topk, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    scores = scores.log_softmax(dim=-1)
    if decode.sampling_topp < 1.0:
        sorted_scores, order = scores.sort(dim=-1, descending=True)
        before = sorted_scores.exp().cumsum(dim=-1) - sorted_scores.exp()  # probability of the better tokens
        cut = (before >= decode.sampling_topp).scatter(-1, order, before >= decode.sampling_topp)
        scores = scores.masked_fill(cut, float("-inf")).log_softmax(dim=-1)
    return scores


class Sampler:
    """Greedy search's `ChooseNext` for sampling: row i draws from ``generators[sentence[i]]``."""

    def __init__(self, decode: DecodeConfig, seeds: list[int]) -> None:
        self.decode = decode
        self.generators = [torch.Generator().manual_seed(seed) for seed in seeds]

    def __call__(self, log_prob: Tensor, log_probs: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
        """log P(prefix + token) under the model itself, and the drawn token.

        Shapes: log_prob (N,), log_probs (N, V), rows (N,) -> (N,), (N,)."""
        cumulative = restrict(log_probs, self.decode).exp().cumsum(dim=-1)  # (N, V)
        uniform = torch.stack([torch.rand((), generator=self.generators[row]) for row in rows.tolist()])
        uniform = uniform.to(cumulative.device, cumulative.dtype) * cumulative[:, -1]
        # the first token whose cumulative probability passes the draw, never one of probability 0
        token = torch.searchsorted(cumulative, uniform[:, None], right=True)[:, 0]
        token = torch.minimum(token, (cumulative < cumulative[:, -1:]).sum(dim=-1))
        return log_prob + log_probs.gather(1, token[:, None])[:, 0], token
