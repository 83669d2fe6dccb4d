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
every one that meets them all). Finished hypotheses, the stopping rule and the length penalty
are `beam_search`'s: without constraints this search returns exactly what `beam_search` returns.

A phrase being met must be continued token by token; any other token undoes its progress (the
phrase has to start again). Where two unmet phrases start with the same token, the first given
is the one pursued.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from transformer.config import DecodeConfig
from transformer.decoding.search import (
    PLAIN_STEPS,
    Hypothesis,
    SearchSteps,
    force_at,
    forced_tokens,
    max_output_lengths,
    next_log_probs,
    normalized_score,
    nth_score,
    start_decoding,
)
from transformer.model.attention import padding_mask
from transformer.model.transformer import Transformer


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


@torch.no_grad()
def constrained_beam_search(model: Transformer, src: Tensor, decode: DecodeConfig,
                            constraints: list[list[list[int]]], use_cache: bool = True,
                            steps: SearchSteps = PLAIN_STEPS,
                            prefixes: list[list[int]] | None = None) -> list[list[Hypothesis]]:
    """`beam_search` where sentence i's translations must contain each phrase of ``constraints[i]``.

    Shapes: src (B, S), right-padded, each sentence ending with eos; constraints: B lists of
    token-id phrases. Returns for every sentence its ``decode.nbest`` best hypotheses, those that
    meet all their constraints first.
    """
    k, nbest, device, eos = decode.beam_size, decode.nbest, src.device, model.eos_id
    src_mask = padding_mask(src, model.pad_id)  # (B, 1, 1, S)
    memory = model.encode(src, src_mask)
    cache = model.new_cache(incremental=use_cache)
    forced = forced_tokens(prefixes, src.size(0), device)
    constraint_tokens = torch.tensor([sum(map(len, phrases)) for phrases in constraints], device=device)
    max_lens = ((forced >= 0).sum(dim=1) + constraint_tokens
                + max_output_lengths(src, model.pad_id, decode.max_len_a, decode.max_len_b))
    prefix, start_log_prob = start_decoding(model, forced.repeat_interleave(k, dim=0), memory, src_mask, cache)
    beam_log_probs = torch.full((src.size(0), k), float("-inf"), device=device)  # (N, K)
    beam_log_probs[:, 0] = start_log_prob[::k]
    states = []  # one per row: the start's tokens may already advance the constraints
    for i, phrases in enumerate(constraints):
        state = ConstraintState(tuple(map(tuple, phrases)))
        for token in prefix[i * k, 1:].tolist():
            state = state.advance(token)
        states += [state] * k
    sentence = torch.arange(src.size(0), device=device)
    finished: list[list[tuple[bool, Hypothesis]]] = [[] for _ in range(src.size(0))]
    for step in range(prefix.size(1) - 1, int(max_lens.max()) + 1):
        force = force_at(step, forced, max_lens, eos).repeat_interleave(k)
        log_probs = next_log_probs(model, prefix, memory, src_mask, cache, force)  # (N*K, V)
        waiting = torch.tensor([not state.done for state in states], device=device) & (force != eos)
        log_probs[waiting, eos] = float("-inf")  # eos waits for the constraints, except at the length limit
        scores = beam_log_probs.view(-1, 1) + log_probs  # (N*K, V)
        vocab = scores.size(1)
        top = steps.top_k(scores.view(len(sentence), -1), min(2 * k, k * vocab))  # (N, 2K) into K * V
        best = log_probs.topk(2, dim=1).indices.tolist()
        rows, tokens, done_sentences = [], [], []
        for n in range(len(sentence)):
            first = n * k
            candidates = {(first + index // vocab, index % vocab) for index in top[n].tolist()}
            for row in range(first, first + k):
                # a beam that has met its constraints offers two: if one is eos, the other keeps its bank filled
                candidates |= {(row, token) for token in best[row][: 2 if states[row].done else 1]}
                candidates |= {(row, token) for token in states[row].next_tokens()}
            candidates = sorted(candidates)
            values = scores[[row for row, _ in candidates], [token for _, token in candidates]].tolist()
            # the possible ones, best first; equal scores in (beam, token) order, as beam_search's candidates
            order = sorted((c for c in range(len(candidates)) if values[c] > float("-inf")), key=lambda c: -values[c])
            candidates, values = [candidates[c] for c in order], [values[c] for c in order]
            advanced = [states[row].advance(token) for row, token in candidates]
            ranked = allocate([state.bank for state in advanced], len(candidates))
            for c in ranked[:k]:
                row, token = candidates[c]
                if token == eos:
                    tokens_so_far = prefix[row, 1:].tolist()
                    finished[int(sentence[n])].append((advanced[c].done, Hypothesis(
                        tokens_so_far, normalized_score(values[c], len(tokens_so_far) + 1, decode.length_penalty),
                        values[c])))
            live = [c for c in ranked if candidates[c][1] != eos][:k]
            kept = nth_score([h for met, h in finished[int(sentence[n])] if met], nbest)
            if not live or step >= max_lens[n] or kept >= normalized_score(
                    max(values[c] for c in live), int(max_lens[n]) + 1, decode.length_penalty):
                done_sentences.append(n)
                continue
            live += live[-1:] * (k - len(live))  # too few candidates: repeat the last one, never chosen again
            rows.append([candidates[c][0] for c in live])
            tokens.append([candidates[c][1] for c in live])
            beam_log_probs[n] = torch.tensor([values[c] if j == live.index(c) else float("-inf")
                                              for j, c in enumerate(live)], device=device)
            states[first: first + k] = [advanced[c] for c in live]
        if len(done_sentences) == len(sentence):
            break
        keep = torch.tensor([n for n in range(len(sentence)) if n not in done_sentences], device=device)
        row_index = torch.tensor(rows, device=device).flatten()  # (N'*K,)
        prefix = torch.cat([prefix[row_index], torch.tensor(tokens, device=device).view(-1, 1)], dim=1)
        states = [states[n * k + j] for n in keep.tolist() for j in range(k)]
        beam_log_probs = beam_log_probs[keep]
        sentences_left = keep.numel() < len(sentence)
        sentence, max_lens, forced = sentence[keep], max_lens[keep], forced[keep]
        if sentences_left:
            memory, src_mask = memory[keep], src_mask[keep]
        cache.reorder(row_index, keep if sentences_left else None)
    return [[h for _, h in sorted(found, key=lambda pair: (pair[0], pair[1].score), reverse=True)[:nbest]]
            for found in finished]
