"""Lexically constrained beam search with dynamic beam allocation (Post & Vilar, 2018).

Each sentence may come with positive constraints: phrases (target token ids) that its translation
must contain. A hypothesis tracks which phrases it has met and how far it is into the one it is
meeting (`ConstraintState`); its *bank* is the number of constraint tokens it has met. At every
step each sentence's candidates are its best 2K continuations (as in `beam_search`), every
beam's continuations that advance a constraint, and every beam's best continuation (its best two
once it has met all its constraints, so that one finishing does not empty its bank); the K
beams are then dealt out over the banks, best bank first, one candidate of each bank in turn, so
that hypotheses which paid for a constraint are not pushed out by likelier ones that have not.
End of sentence is blocked until all of a hypothesis' constraints are met (at the length limit,
which grows by the constraints' tokens, eos is forced anyway, and such a hypothesis ranks below
every one that meets them all). This is a selection (`DynamicBeamAllocation`) of the one
`beam_search` loop, whose finishing, stopping rule and length penalty it keeps: a sentence without
constraints gets exactly plain beam search's hypotheses.

A phrase being met must be continued token by token; any other token undoes its progress (the
phrase has to start again). Where two unmet phrases start with the same token, the first given
is the one pursued.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from transformer.decoding.selection import Choice, SearchSteps


@dataclass(frozen=True)
class ConstraintState:
    """How far a hypothesis is in meeting its sentence's ``phrases``: those ``met``, and ``progress``
    tokens into phrase ``current`` (-1: none under way)."""

    phrases: tuple[tuple[int, ...], ...]
    met: frozenset[int] = frozenset()
    current: int = -1
    progress: int = 0

    @property
    def bank(self) -> int:
        """Constraint tokens met so far: the phrases met and the progress into the current one."""
        return sum(len(self.phrases[i]) for i in self.met) + self.progress

    @property
    def done(self) -> bool:
        return len(self.met) == len(self.phrases)

    def next_tokens(self) -> list[int]:
        """The tokens that would advance a constraint: the current phrase's next one, or any unmet phrase's first."""
        if self.current >= 0:
            return [self.phrases[self.current][self.progress]]
        return [phrase[0] for i, phrase in enumerate(self.phrases) if i not in self.met]

    def advance(self, token: int) -> ConstraintState:
        """The state after the hypothesis emits ``token``."""
        if self.current >= 0 and self.phrases[self.current][self.progress] == token:
            return self._moved(self.current, self.progress + 1)
        for i, phrase in enumerate(self.phrases):  # a new phrase starts (the one under way, if any, is undone)
            if i not in self.met and phrase[0] == token:
                return self._moved(i, 1)
        return ConstraintState(self.phrases, self.met) if self.current >= 0 else self

    def _moved(self, phrase: int, progress: int) -> ConstraintState:
        if progress == len(self.phrases[phrase]):
            return ConstraintState(self.phrases, self.met | {phrase})
        return ConstraintState(self.phrases, self.met, phrase, progress)


def allocate(banks: list[int], k: int) -> list[int]:
    """Dynamic beam allocation: positions of the ``k`` candidates to keep, from candidates listed best
    first with their ``banks``: the best of the highest bank, then of the next bank down, and so on,
    round after round."""
    by_bank: dict[int, list[int]] = {}
    for position, bank in enumerate(banks):
        by_bank.setdefault(bank, []).append(position)
    order = sorted(by_bank, reverse=True)
    chosen: list[int] = []
    for round_ in range(max(map(len, by_bank.values()), default=0)):
        chosen += [by_bank[bank][round_] for bank in order if round_ < len(by_bank[bank])]
        if len(chosen) >= k:
            break
    return chosen[:k]


class DynamicBeamAllocation:
    """`beam_search`'s selection (`transformer.decoding.selection`) where sentence i's translations must
    contain each phrase of ``constraints[i]``.

    ``start`` holds the rows' first tokens (N*K, 1 + m): bos and the prefix tokens that every row
    has, which may already advance the constraints; the K beams of a sentence are adjacent rows.
    """

    def __init__(self, constraints: list[list[list[int]]], start: Tensor, k: int, eos_id: int,
                 steps: SearchSteps) -> None:
        self.k, self.eos_id, self.steps = k, eos_id, steps
        self.states: list[list[ConstraintState]] = []  # per sentence of the input, its K beams' states
        for i, phrases in enumerate(constraints):
            state = ConstraintState(tuple(map(tuple, phrases)))
            for token in start[i * k, 1:].tolist():
                state = state.advance(token)
            self.states.append([state] * k)

    def __call__(self, log_probs: Tensor, beam_log_probs: Tensor, force: Tensor, sentence: Tensor) -> Choice:
        k, sentences = self.k, sentence.tolist()
        waiting = torch.tensor([not state.done for i in sentences for state in self.states[i]], device=force.device)
        log_probs[waiting & (force != self.eos_id), self.eos_id] = float("-inf")  # except at the length limit
        scores = beam_log_probs.view(-1, 1) + log_probs  # (N*K, V)
        vocab = scores.size(1)
        top = self.steps.top_k(scores.view(len(sentences), -1), min(2 * k, k * vocab)).tolist()  # into K * V
        best = log_probs.topk(2, dim=1).indices.tolist()
        picks = []
        for n, i in enumerate(sentences):
            first, beams = n * k, self.states[i]
            candidates = {(first + index // vocab, index % vocab) for index in top[n]}
            for j, state in enumerate(beams):
                # a beam that has met its constraints offers two: if one is eos, the other keeps its bank filled
                candidates |= {(first + j, token) for token in best[first + j][: 2 if state.done else 1]}
                candidates |= {(first + j, token) for token in state.next_tokens()}
            *fields, self.states[i] = self._allocate(sorted(candidates), scores, beams, first)
            picks.append(fields)
        return Choice(*(torch.tensor(field, device=scores.device) for field in zip(*picks)))

    def _allocate(self, candidates: list[tuple[int, int]], scores: Tensor, beams: list[ConstraintState],
                  first: int) -> tuple[list, ...]:
        """One sentence's choice from its (row, token) ``candidates``: the `Choice` fields of its K beams
        dealt out over the banks (those of them ending in eos finish), and the next beams' states."""
        eos = self.eos_id
        values = scores[[row for row, _ in candidates], [token for _, token in candidates]].tolist()
        # the possible ones, best first; equal scores in (beam, token) order, as beam_search's candidates
        order = sorted((c for c in range(len(candidates)) if values[c] > float("-inf")), key=lambda c: -values[c])
        # and a last one that stands for none: where fewer than K are possible, the rest of the beam is empty
        candidates, values = [candidates[c] for c in order] + [(first, eos)], [values[c] for c in order] + [-math.inf]
        advanced = [beams[row - first].advance(token) for row, token in candidates]
        ranked = allocate([state.bank for state in advanced[:-1]], len(order))
        none = [len(order)] * self.k
        chosen = (ranked + none)[: self.k]  # those ending in eos finish
        live = ([c for c in ranked if candidates[c][1] != eos] + none)[: self.k]  # the next beams
        rows, tokens = [row for row, _ in candidates], [token for _, token in candidates]
        return ([values[c] for c in chosen], [rows[c] for c in chosen],
                [tokens[c] == eos and values[c] > -math.inf for c in chosen], [advanced[c].done for c in chosen],
                [rows[c] for c in live], [tokens[c] for c in live], [values[c] for c in live],
                [advanced[c] for c in live])
