"""Lexically constrained beam search with dynamic beam allocation (transformer.decoding.constraints)."""

import math

import pytest
import torch
from conftest import EOS
from test_search import GREEDY_IS_NOT_BEST, SOURCES, SRC, A, B, C, D, ScriptedModel, beam, pad, tiny_model_that_stops

from transformer.config import DecodeConfig
from transformer.decoding.constraints import ConstraintState, allocate
from transformer.decoding.search import PLAIN_STEPS, beam_search
from transformer.fast.search import FAST_STEPS


def constrained(model, src, constraints, prefixes=None, **settings):
    return beam_search(model, src, DecodeConfig(**settings), prefixes=prefixes, constraints=constraints)


def contains(tokens: list[int], phrase: list[int]) -> bool:
    return any(tokens[i: i + len(phrase)] == phrase for i in range(len(tokens) - len(phrase) + 1))


def test_a_state_meets_phrases_token_by_token_and_another_token_undoes_the_progress():
    state = ConstraintState(((A, B, C), (D,)))
    assert (state.bank, state.done, sorted(state.next_tokens())) == (0, False, [A, D])
    state = state.advance(A).advance(B)
    assert (state.bank, state.next_tokens()) == (2, [C])
    undone = state.advance(D)  # D meets the second phrase; the first must start again
    assert (undone.met, undone.current, undone.bank, undone.next_tokens()) == ({1}, -1, 1, [A])
    state = state.advance(C).advance(A).advance(D)
    assert (state.bank, state.done) == (4, True)
    assert ConstraintState(()).done and ConstraintState(()).next_tokens() == []


def test_allocation_deals_the_beam_out_over_the_banks_best_bank_first():
    banks = [0, 0, 2, 1, 0, 2]  # of candidates listed best first
    assert allocate(banks, 4) == [2, 3, 0, 5]
    assert allocate(banks, 6) == [2, 3, 0, 5, 1, 4]
    assert allocate([0, 0, 0], 2) == [0, 1]


def test_a_constraint_forces_a_less_likely_translation():
    model = ScriptedModel(GREEDY_IS_NOT_BEST)
    assert beam(model, SRC, beam_size=2)[0][0].tokens == [B]
    (best,) = constrained(model, SRC, [[[C]]], beam_size=2)[0]
    assert (best.tokens, best.log_prob) == ([A, C], pytest.approx(math.log(0.5 * 0.35)))  # then eos, p = 1
    two = constrained(ScriptedModel(GREEDY_IS_NOT_BEST), SRC, [[[D], [A]]], beam_size=2)[0][0]
    assert two.tokens == [A, D]


def test_end_of_sentence_waits_for_every_constraint():
    eager = {(): {EOS: 0.9, A: 0.05, B: 0.05}, (A,): {EOS: 0.9, B: 0.1}, (B,): {EOS: 0.9, A: 0.1}}
    assert beam(ScriptedModel(eager), SRC, beam_size=2)[0][0].tokens == []
    assert constrained(ScriptedModel(eager), SRC, [[[B], [A]]], beam_size=2)[0][0].tokens in ([A, B], [B, A])
    assert constrained(ScriptedModel(eager), SRC, [[[B, A]]], beam_size=1)[0][0].tokens == [B, A]


def test_without_constraints_the_search_is_exactly_beam_search():
    model, src = tiny_model_that_stops(), pad(SOURCES)
    for settings in ({"beam_size": 3, "nbest": 3}, {"beam_size": 1}, {"beam_size": 4, "length_penalty": 0.0},
                     {"beam_size": 2, "max_len_a": 0.0, "max_len_b": 3}):
        plain = beam(model, src, **settings)
        found = constrained(model, src, [[] for _ in SOURCES], **settings)
        assert [[(h.tokens, h.score, h.log_prob) for h in n] for n in found] == \
            [[(h.tokens, h.score, h.log_prob) for h in n] for n in plain]


def test_beside_sentences_with_constraints_one_without_gets_exactly_beam_search():
    """One beam_search call searches them all (at beam 1 the Translator still searches these apart, by greedy)."""
    model, src = tiny_model_that_stops(), pad(SOURCES)
    constraints = [[[9]] if i % 3 == 0 else [] for i in range(len(SOURCES))]
    for settings in ({"beam_size": 3, "nbest": 3}, {"beam_size": 1}, {"beam_size": 4, "length_penalty": 0.0},
                     {"beam_size": 2, "max_len_a": 0.0, "max_len_b": 3}):
        plain = beam(model, src, **settings)
        found = constrained(model, src, constraints, **settings)
        for i in range(len(SOURCES)):
            if not constraints[i]:
                assert [(h.tokens, h.score, h.log_prob) for h in found[i]] == \
                    [(h.tokens, h.score, h.log_prob) for h in plain[i]]


def test_finished_sentences_that_ride_along_change_no_constrained_translation():
    model, src = tiny_model_that_stops(), pad(SOURCES)
    constraints = [[[4 + i % 5]] if i % 2 else [[6], [7, 8]] for i in range(len(SOURCES))]
    fast, plain = (beam_search(model, src, DecodeConfig(beam_size=3, nbest=3), steps=steps, constraints=constraints)
                   for steps in (FAST_STEPS, PLAIN_STEPS))
    assert [[h.tokens for h in n] for n in fast] == [[h.tokens for h in n] for n in plain]


def test_every_output_of_a_batch_holds_its_own_constraints():
    model, src = tiny_model_that_stops(), pad(SOURCES)
    generator = torch.Generator().manual_seed(3)
    constraints = [[torch.randint(4, 16, (length,), generator=generator).tolist() for length in lengths]
                   for lengths in ([1], [2], [], [1, 1], [3], [2, 1], [1], [1, 2, 1])]
    found = constrained(model, src, constraints, beam_size=4, nbest=4)
    for phrases, hypotheses in zip(constraints, found):
        # this random model loops until the length limit, where eos is forced on beams that had not met
        # them all: those come last, after the ones that did (the first always did)
        meets = [all(contains(h.tokens, phrase) for phrase in phrases) for h in hypotheses]
        assert len(hypotheses) == 4 and meets[0] and meets == sorted(meets, reverse=True)
    for sentence, phrases, hypotheses in zip(SOURCES, constraints, found):  # nor on its batch
        alone = constrained(model, sentence[None], [phrases], beam_size=4, nbest=4)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in hypotheses]


def test_a_prefix_and_constraints_together():
    model = tiny_model_that_stops()
    (best,) = constrained(model, SRC, [[[9, 9]]], prefixes=[[5, 6]], beam_size=3)[0]
    assert best.tokens[:2] == [5, 6] and contains(best.tokens, [9, 9])
    (met,) = constrained(model, SRC, [[[6]]], prefixes=[[5, 6]], beam_size=3)[0]  # the prefix meets it
    assert met.tokens[:2] == [5, 6]
