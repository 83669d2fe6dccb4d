"""Greedy and beam search over a batch of sentences, with incremental decoding (§6.1: beam 4, alpha 0.6).

Both searches keep one batch row per hypothesis (beam search flattens the K beams of the B
sentences into B * K rows), pass the decoder cache so that each step computes the newest
position only, and drop the rows of finished sentences so that they stop costing compute.

A translation may have to start with a given target prefix (``prefixes``): the prefix's tokens
are forced one step at a time, through the same steps as free tokens (`bos_start`), and they
count in the translation: in its log-probability, its length and its length limit. Beam search's
translations may also have to contain given phrases (``constraints``): `DynamicBeamAllocation`
then selects each step's beams in its loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from transformer.config import DecodeConfig
from transformer.decoding.constraints import DynamicBeamAllocation
from transformer.decoding.limits import length_limits
from transformer.decoding.selection import PLAIN_STEPS, BestContinuations, SearchSteps, Selection
from transformer.model.attention import padding_mask
from transformer.model.cache import DecoderCache


class DecodingModel(Protocol):
    """An encoder-decoder the searches can run: encode once, then decode step by step with a cache that
    they reorder with the beams (``cache.reorder(rows)``) and memory they index by rows (``memory[rows]``)."""

    pad_id: int
    bos_id: int
    eos_id: int

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Any:
        """The memory of src (B, S)."""

    def new_cache(self, incremental: bool = True) -> Any:
        """An empty decoder cache."""

    def decode(self, tgt_in: Tensor, memory: Any, src_mask: Tensor | None, cache: Any = None) -> Tensor:
        """Scores (log-probabilities or logits) of the next token after each position of tgt_in (N, T) that
        the cache has not seen."""


@dataclass
class Hypothesis:
    """A finished translation: token ids without bos/eos, the length-normalised score that ranks
    hypotheses, and log P(tokens + eos | source)."""

    tokens: list[int]
    score: float
    log_prob: float


def normalized_score(log_prob: float | Tensor, length: int | Tensor, alpha: float) -> float | Tensor:
    """log P(Y) / lp(Y) with the GNMT length penalty lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al., 2016).

    Raw log-probabilities favour short outputs; alpha = 0 keeps them raw. |Y| counts eos.
    """
    return log_prob / ((5 + length) / 6) ** alpha


def nth_score(hypotheses: list[Hypothesis], n: int) -> float:
    """The n-th best score among ``hypotheses``; -inf while there are fewer than n."""
    return sorted((h.score for h in hypotheses), reverse=True)[n - 1] if len(hypotheses) >= n else float("-inf")


def output_limits(src: Tensor, pad_id: int, decode: DecodeConfig, prefixes: list[list[int]] | None,
                  constraints: list[list[list[int]]] | None = None) -> Tensor:
    """`length_limits` of the sentences of src (B, S), whose non-padding tokens are their sources -> (B,)."""
    source_lengths = (src != pad_id).sum(dim=1).tolist()
    return torch.tensor(length_limits(source_lengths, decode, prefixes, constraints), device=src.device)


def forced_tokens(prefixes: list[list[int]] | None, rows: int, device: torch.device) -> Tensor:
    """The target prefixes as a table (rows, P): row i must emit prefixes[i] first; -1 pads the
    shorter ones (P = the longest prefix; 0 columns without prefixes)."""
    prefixes = prefixes or [[]] * rows
    table = torch.full((rows, max(map(len, prefixes), default=0)), -1, dtype=torch.long)
    for row, tokens in enumerate(prefixes):
        table[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
    return table.to(device)


def force_at(step: int, forced: Tensor, max_lens: Tensor, eos_id: int) -> Tensor:
    """The token each row must emit at ``step`` (-1: free): its prefix's, or eos at its length limit."""
    prefix_token = forced[:, step] if step < forced.size(1) else -1
    return torch.where(step >= max_lens, eos_id, prefix_token)


def bos_start(rows: int, bos_id: int, device: torch.device) -> Tensor:
    """Every row's start, bos -> (rows, 1); a target prefix is then forced one step at a time, as free tokens
    are chosen.

    Why not decode a batch's common prefix in one call: that call attends in other sums than the steps do, so a
    sentence's scores would depend on the prefixes beside it (they did for 33 of 60 fp32 Multi30k sentences;
    tests/test_translate.py). Measured cost of the steps against that call: nothing measurable with prefixes of up
    to 4 words, 5-20 % with each sentence's reference but its last two words as its prefix (200 sentences, 3.9-4.6 s
    against 3.7 s; Zen 5, a shared machine).
    """
    return torch.full((rows, 1), bos_id, dtype=torch.long, device=device)


def next_log_probs(model: DecodingModel, prefix: Tensor, memory: Tensor, src_mask: Tensor, cache: DecoderCache,
                   force: Tensor) -> Tensor:
    """log P(next token | prefix, source) in float32; only token ``force[i]`` is possible in row i where
    it is not -1 (eos at the length limit, the token of a target prefix).

    The log-softmax runs in float32 even for a bf16 model: beam scores are sums of many terms.
    Shapes: prefix (N, T); memory (N / G, S, D) and src_mask (N / G, 1, 1, S), each row shared by G
    consecutive prefixes (the beams of a sentence); force (N,) -> (N, V).
    """
    logits = model.decode(prefix, memory, src_mask, cache)[:, -1].float()  # (N, V)
    log_probs = torch.log_softmax(logits, dim=-1, out=logits)  # in place: one (N, V) tensor less to fill
    rows = (force >= 0).nonzero().flatten()
    if rows.numel() > 0:  # rarely: a prefix, or the longest allowed outputs
        tokens = force[rows]
        kept = log_probs[rows, tokens]
        log_probs[rows] = float("-inf")
        log_probs[rows, tokens] = kept
    return log_probs


def most_likely(log_prob: Tensor, log_probs: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
    """Greedy search's choice: log P(prefix + token) and the token of the most likely continuation.

    It ranks by log P(prefix + token), the float sums that beam search ranks, so that rounding ties
    break alike (ties: lowest id). Shapes: log_prob (N,), log_probs (N, V), rows (N,) -> (N,), (N,).
    """
    return (log_prob[:, None] + log_probs).max(dim=-1)


ChooseNext = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


@torch.no_grad()
def greedy_search(model: DecodingModel, src: Tensor, decode: DecodeConfig, use_cache: bool = True,
                  steps: SearchSteps = PLAIN_STEPS, prefixes: list[list[int]] | None = None,
                  choose: ChooseNext = most_likely) -> list[Hypothesis]:
    """Translate a batch by always taking the most likely next token (``choose``: another rule, as sampling's).

    A sentence is done when it emits eos (forced once it has its `length_limits` tokens), and then
    leaves the batch. ``use_cache=False`` recomputes the whole prefix at every step. Shapes: src
    (B, S), right-padded, each sentence ending with eos. Returns B hypotheses (token ids without bos
    and eos, log P and its `normalized_score`).
    """
    src_mask = padding_mask(src, model.pad_id)  # (B, 1, 1, S)
    memory = model.encode(src, src_mask)  # (B, S, D)
    cache = model.new_cache(incremental=use_cache)
    forced = forced_tokens(prefixes, src.size(0), src.device)  # (B, P)
    max_lens = output_limits(src, model.pad_id, decode, prefixes)
    prefix, log_prob = bos_start(src.size(0), model.bos_id, src.device), torch.zeros(src.size(0), device=src.device)
    sentence = torch.arange(src.size(0), device=src.device)  # original index of each row
    searching = torch.ones(src.size(0), dtype=torch.bool, device=src.device)  # (N,) no eos yet
    outputs = [Hypothesis([], 0.0, 0.0) for _ in range(src.size(0))]
    for step in range(int(max_lens.max()) + 1):
        force = force_at(step, forced, max_lens, model.eos_id)
        log_probs = next_log_probs(model, prefix, memory, src_mask, cache, force)
        log_prob, next_id = choose(log_prob, log_probs, sentence)
        prefix = torch.cat([prefix, next_id[:, None]], dim=1)  # (N, step + 2)
        done = (next_id == model.eos_id) & searching
        if not done.any():
            continue
        for row in done.nonzero().flatten().tolist():
            value = log_prob[row].item()
            outputs[int(sentence[row])] = Hypothesis(
                prefix[row, 1:-1].tolist(), normalized_score(value, step + 1, decode.length_penalty), value)
        searching &= ~done
        if not searching.any():
            break
        keep = steps.rows_to_keep(searching)
        if keep.numel() == len(searching):
            continue
        sentence, prefix, log_prob, max_lens = sentence[keep], prefix[keep], log_prob[keep], max_lens[keep]
        searching, memory, src_mask, forced = searching[keep], memory[keep], src_mask[keep], forced[keep]
        cache.reorder(keep, keep)
    return outputs


@torch.no_grad()
def beam_search(model: DecodingModel, src: Tensor, decode: DecodeConfig, use_cache: bool = True,
                steps: SearchSteps = PLAIN_STEPS, prefixes: list[list[int]] | None = None,
                constraints: list[list[list[int]]] | None = None) -> list[list[Hypothesis]]:
    """Translate a batch keeping the ``decode.beam_size`` most probable prefixes of every sentence.

    Each step ranks the K * V continuations of a sentence by log-probability and takes the best
    2K (as fairseq does): those ending in eos among the first K become finished hypotheses, and
    the K best others stay in the beam (`BestContinuations`; with ``constraints``, phrases that
    sentence i's translations must contain, `DynamicBeamAllocation` chooses instead, and hypotheses
    that meet them all rank first). Hypotheses are ranked by `normalized_score`. A sentence
    stops when no live beam can beat its ``decode.nbest``-th finished hypothesis, even if it grew to
    the maximum length (log-probabilities only fall as a prefix grows, and the penalty divides by
    at most lp(limit)), or at its maximum length (`length_limits`), where eos is forced; its rows
    then leave the batch.
    So the length penalty can prefer a longer hypothesis still in the beam: stopping when the best
    continuation is eos (OpenNMT) or when K hypotheses have finished (fairseq, CTranslate2) cannot
    see it, and both scored lower on validation (docs/decoding.md). With alpha = 0 the bound is the
    best live log-probability: the search stops once the best continuation is eos, and beam_size=1
    is greedy search.

    Shapes: src (B, S), right-padded, each sentence ending with eos. Returns for every sentence
    its ``decode.nbest`` best hypotheses, best first.
    """
    k, nbest, alpha, device = decode.beam_size, decode.nbest, decode.length_penalty, src.device
    src_mask = padding_mask(src, model.pad_id)  # (B, 1, 1, S), shared by the K beams of a sentence
    memory = model.encode(src, src_mask)  # (B, S, D)
    cache = model.new_cache(incremental=use_cache)
    forced = forced_tokens(prefixes, src.size(0), device)  # (N, P)
    max_lens = output_limits(src, model.pad_id, decode, prefixes, constraints)
    # (N*K, 1), beams of a sentence adjacent; the K beams start out identical: expand only the first
    prefix = bos_start(src.size(0) * k, model.bos_id, device)
    select: Selection = (DynamicBeamAllocation(constraints, prefix, k, model.eos_id, steps)
                         if constraints is not None and any(constraints) else BestContinuations(k, model.eos_id, steps))
    beam_log_probs = torch.full((src.size(0), k), float("-inf"), device=device)  # (N, K)
    beam_log_probs[:, 0] = 0.0
    sentence = torch.arange(src.size(0), device=device)  # original index of each active sentence
    searching = torch.ones(src.size(0), dtype=torch.bool, device=device)  # (N,) sentences not done
    finished: list[list[Hypothesis]] = [[] for _ in range(src.size(0))]
    unmet: list[list[Hypothesis]] = [[] for _ in range(src.size(0))]  # finished without all their constraints
    for step in range(int(max_lens.max()) + 1):
        force = force_at(step, forced, max_lens, model.eos_id).repeat_interleave(k)
        log_probs = next_log_probs(model, prefix, memory, src_mask, cache, force)  # (N*K, V)
        choice = select(log_probs, beam_log_probs, force, sentence)
        for n, j in (choice.ends & searching[:, None]).nonzero().tolist():
            tokens, log_prob = prefix[choice.parent[n, j], 1:].tolist(), choice.log_prob[n, j].item()
            found = finished if choice.meets is None or choice.meets[n, j] else unmet
            found[int(sentence[n])].append(
                Hypothesis(tokens, normalized_score(log_prob, len(tokens) + 1, alpha), log_prob))
        # done when no live beam can beat the nbest-th finished hypothesis even at its longest: the
        # length penalty rewards length, so the bound is the live log-probability normalised at the limit
        kept = torch.tensor([nth_score(finished[i], nbest) for i in sentence.tolist()], device=device)
        live = choice.beam_log_probs.amax(dim=1)  # (N,) the best live beam
        searching &= ~((kept >= normalized_score(live, max_lens + 1, alpha)) | (step >= max_lens))
        if not searching.any():
            break
        keep = steps.rows_to_keep(searching)
        rows = choice.beam_rows[keep].flatten()  # (N'*K,)
        prefix = torch.cat([prefix[rows], choice.beam_tokens[keep].view(-1, 1)], dim=1)
        beam_log_probs = choice.beam_log_probs[keep]
        # memory, mask and cross-attention cache hold one row per sentence: they only change when
        # sentences leave the batch (beams are reordered within their sentence's K rows)
        sentences_left = keep.numel() < len(sentence)
        sentence, max_lens, searching, forced = sentence[keep], max_lens[keep], searching[keep], forced[keep]
        if sentences_left:
            memory, src_mask = memory[keep], src_mask[keep]
        cache.reorder(rows, keep if sentences_left else None)
    return [(best_first(met) + best_first(rest))[:nbest] for met, rest in zip(finished, unmet)]


def best_first(hypotheses: list[Hypothesis]) -> list[Hypothesis]:
    """``hypotheses`` by score, best first; equal scores in the order they finished."""
    return sorted(hypotheses, key=lambda h: h.score, reverse=True)
