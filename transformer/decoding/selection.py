"""What a beam search step selects: which continuations finish, and which become the next beams.

`beam_search` keeps one loop (finishing, the stopping rule, the batch's rows) and asks a *selection*
for the choice of every step: `BestContinuations`, the plain one, or the lexically constrained one
(`transformer.decoding.constraints`), as fairseq plugs its search strategies into one generator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor


@dataclass(frozen=True)
class SearchSteps:
    """The two selections a search makes at every step; `transformer.fast.search` has faster ones."""

    top_k: Callable[[Tensor, int], Tensor]  # scores (N, M), k -> columns of the k highest (N, k)
    rows_to_keep: Callable[[Tensor], Tensor]  # searching (N,) bool -> the rows that stay in the batch


PLAIN_STEPS = SearchSteps(top_k=lambda scores, k: scores.topk(k, dim=1).indices,
                          rows_to_keep=lambda searching: searching.nonzero().flatten())


@dataclass
class Choice:
    """One step's choice for N sentences of K beams, from C candidates per sentence.

    Candidate j of sentence n extends batch row ``parent[n, j]`` to log P ``log_prob[n, j]``; those
    where ``ends`` is True end with eos and become finished hypotheses (``meets``: those that met all
    their constraints; None: all). The next beams extend rows ``beam_rows`` (N, K) by ``beam_tokens``
    to ``beam_log_probs``: -inf marks a beam that stands empty.
    """

    log_prob: Tensor  # (N, C)
    parent: Tensor  # (N, C)
    ends: Tensor  # (N, C) bool
    meets: Tensor | None  # (N, C) bool
    beam_rows: Tensor  # (N, K)
    beam_tokens: Tensor  # (N, K)
    beam_log_probs: Tensor  # (N, K)


class Selection(Protocol):
    def __call__(self, log_probs: Tensor, beam_log_probs: Tensor, force: Tensor, sentence: Tensor) -> Choice:
        """The choice from log P(next token) of each row (N*K, V), log P of each beam (N, K), the
        token forced in each row (N*K,; -1: none) and each sentence's index in the input (N,)."""


def best_candidates(scores: Tensor, k: int, steps: SearchSteps) -> tuple[Tensor, Tensor]:
    """The k highest scores of each row, best first, equal scores by lower index (as argmax).

    topk orders ties arbitrarily; ordering them by index makes beam_size=1 pick greedy search's
    token. Shapes: scores (N, M) -> values (N, k), indices (N, k).
    """
    index = steps.top_k(scores, k).sort(dim=1).values
    values, order = scores.gather(1, index).sort(dim=1, descending=True, stable=True)
    return values, index.gather(1, order)


@dataclass(frozen=True)
class BestContinuations:
    """Plain beam search's selection: of the K * V continuations of a sentence, the best 2K (as
    fairseq); those ending in eos among the first K finish, and the K best others are the next beams."""

    k: int
    eos_id: int
    steps: SearchSteps

    def __call__(self, log_probs: Tensor, beam_log_probs: Tensor, force: Tensor, sentence: Tensor) -> Choice:
        k, sentences = self.k, beam_log_probs.size(0)
        # a sentence's best 2K continuations are among the best 2K of each of its beams; kept in
        # (beam, token) order, their positions break ties as indices into the K * V scores would
        per_beam = min(2 * k, log_probs.size(-1))
        beam_tokens = self.steps.top_k(log_probs, per_beam).sort(dim=1).values  # (N*K, per_beam)
        scores = (beam_log_probs.view(-1, 1) + log_probs.gather(1, beam_tokens)).view(sentences, -1)
        log_prob, index = best_candidates(scores, 2 * k, self.steps)  # (N, 2K)
        first_row = k * torch.arange(sentences, device=scores.device)[:, None]
        parent = first_row + torch.div(index, per_beam, rounding_mode="floor")  # row of the beam it extends
        token = beam_tokens.view(sentences, -1).gather(1, index)
        is_eos = token == self.eos_id
        ends = is_eos[:, :k] & log_prob[:, :k].isfinite()
        # each beam has one eos continuation, so at least K of the 2K candidates are not eos
        live = is_eos.to(torch.uint8).argsort(dim=1, stable=True)[:, :k]  # (N, K)
        return Choice(log_prob[:, :k], parent[:, :k], ends, None, parent.gather(1, live), token.gather(1, live),
                      log_prob.gather(1, live))
