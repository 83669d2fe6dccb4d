"""Target prefixes: the translation starts with given tokens, forced one step at a time, then searched on."""

import math

import pytest
import torch
from conftest import EOS
from test_search import (
    GREEDY_IS_NOT_BEST,
    SOURCES,
    SRC,
    A,
    B,
    C,
    D,
    ScriptedModel,
    assert_hypotheses,
    beam,
    greedy,
    pad,
    tiny_model_that_stops,
)

from transformer.config import DecodeConfig
from transformer.decoding.search import greedy_search


def test_the_search_goes_on_from_the_prefix_whose_tokens_count_in_the_score():
    # unforced, beam 2 finds [B] (0.36) first; forced to start with A: [A, C] (0.5 * 0.35) and [A] (0.5 * 0.4)
    nbest = beam(ScriptedModel(GREEDY_IS_NOT_BEST), SRC, prefixes=[[A]], beam_size=2, nbest=2, length_penalty=0.6)[0]
    assert_hypotheses(nbest, [([A, C], math.log(0.5 * 0.35), (8 / 6) ** 0.6),
                              ([A], math.log(0.5 * 0.4), (7 / 6) ** 0.6)])
    (found,) = greedy_search(ScriptedModel(GREEDY_IS_NOT_BEST), SRC, DecodeConfig(), prefixes=[[B]])
    assert (found.tokens, found.log_prob) == ([B], pytest.approx(math.log(0.4 * 0.9)))


def test_a_prefix_can_force_a_token_the_model_finds_unlikely():
    script = {(): {A: 0.9, D: 0.1}, (D,): {C: 0.2, B: 0.8}, (D, C): {A: 1.0}}
    for search in (lambda **kw: greedy(ScriptedModel(script), SRC, **kw)[0],
                   lambda **kw: beam(ScriptedModel(script), SRC, beam_size=3, **kw)[0][0].tokens):
        assert search(prefixes=[[D, C]]) == [D, C, A]
        assert search(prefixes=[[]]) == search() == [A]


def test_each_prefix_token_is_decoded_in_a_step_of_its_own():
    """As the free tokens are: the batch's common prefix was decoded in one call (bos A B at once), which made
    a sentence's scores depend on the prefixes of the sentences beside it."""
    script = {(): {A: 0.5, B: 0.5}, (A,): {B: 0.5, C: 0.5}, (A, B): {C: 1.0}, (A, B, C): {D: 1.0}}
    for search in (greedy, beam):
        model = ScriptedModel(script)
        search(model, SRC, prefixes=[[A, B, C]], max_len_a=0, max_len_b=1)  # bos, A, B, C, then D
        assert model.positions == [1, 1, 1, 1, 1]


def test_each_row_keeps_its_own_prefix_and_the_limit_counts_it():
    never_eos = {A: 0.6, B: 0.1, C: 0.1, D: 0.1, EOS: 0.1}
    prefixes, src = [[B, B, B], [], [C], [D, C]], torch.cat([SRC] * 4)
    found = greedy(ScriptedModel({}, default=never_eos), src, prefixes=prefixes, max_len_a=0, max_len_b=2)
    assert found == [[B, B, B, A, A], [A, A], [C, A, A], [D, C, A, A]]
    for prefix, hypotheses in zip(prefixes, beam(ScriptedModel({}, default=never_eos), src, prefixes=prefixes,
                                                 beam_size=2, nbest=2, max_len_a=0, max_len_b=2)):
        assert [h.tokens[: len(prefix)] for h in hypotheses] == [prefix, prefix]
        assert max(len(h.tokens) for h in hypotheses) == len(prefix) + 2


@pytest.mark.parametrize("beam_size", [1, 3])
def test_prefixed_translations_do_not_depend_on_the_batch(beam_size):
    model, prefixes = tiny_model_that_stops(), [[5, 6], [], [7], [5, 6, 7, 8], [9], [], [4, 4], [6]]
    together = beam(model, pad(SOURCES), prefixes=prefixes, beam_size=beam_size, nbest=beam_size)
    for sentence, prefix, hypotheses in zip(SOURCES, prefixes, together):
        alone = beam(model, sentence[None], prefixes=[prefix], beam_size=beam_size, nbest=beam_size)[0]
        assert [h.tokens for h in hypotheses] == [h.tokens for h in alone]
        assert [h.score for h in hypotheses] == pytest.approx([h.score for h in alone], abs=1e-4)
        assert all(h.tokens[: len(prefix)] == prefix for h in hypotheses)
    uncached = beam(model, pad(SOURCES), use_cache=False, prefixes=prefixes, beam_size=beam_size, nbest=beam_size)
    assert [[h.tokens for h in n] for n in uncached] == [[h.tokens for h in n] for n in together]
