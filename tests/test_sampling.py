"""Sampling: temperature, top-k and top-p draws, several samples per sentence, reproducible with a seed."""

import math
from collections import Counter

import pytest
import torch
from test_search import SRC, A, B, C, ScriptedModel

from transformer.config import DecodeConfig
from transformer.decoding.sampling import Sampler, restrict, sample_seeds
from transformer.decoding.search import greedy_search

THREE_WAYS = {(): {A: 0.5, B: 0.3, C: 0.2}}  # then eos


def first_tokens(draws: int = 3000, **settings) -> dict[int, float]:
    """How often each first token was drawn, over ``draws`` samples of one-token outputs."""
    decode = DecodeConfig(sampling=True, **settings)
    found = greedy_search(ScriptedModel(THREE_WAYS), SRC.repeat(draws, 1), decode,
                          choose=Sampler(decode, list(range(draws))))
    counts = Counter(h.tokens[0] for h in found)
    return {token: counts[token] / draws for token in (A, B, C)}


@pytest.mark.parametrize("settings, expected", [
    ({}, [0.5, 0.3, 0.2]),
    ({"sampling_topk": 2}, [0.5 / 0.8, 0.3 / 0.8, 0.0]),
    ({"sampling_topp": 0.6}, [0.5 / 0.8, 0.3 / 0.8, 0.0]),  # A alone has 0.5 < 0.6: A and B
    ({"sampling_topp": 0.45}, [1.0, 0.0, 0.0]),
    ({"sampling_temperature": 0.5}, [0.25 / 0.38, 0.09 / 0.38, 0.04 / 0.38]),  # p^(1/T), renormalised
])
def test_samples_follow_the_restricted_distribution(settings, expected):
    frequencies = first_tokens(**settings)
    assert [frequencies[t] for t in (A, B, C)] == pytest.approx(expected, abs=0.03)


def test_restrict_keeps_the_most_likely_token_and_sums_to_one():
    log_probs = torch.tensor([[0.5, 0.3, 0.2, 0.0]]).log()
    for settings in ({"sampling_topp": 0.01}, {"sampling_topk": 1}):
        assert restrict(log_probs, DecodeConfig(sampling=True, **settings)).exp().tolist() == [[1.0, 0, 0, 0]]
    flat = restrict(log_probs, DecodeConfig(sampling=True, sampling_temperature=100.0)).exp()
    assert flat.sum().item() == pytest.approx(1.0) and flat[0, 3].item() == 0.0  # impossible stays impossible


def test_a_sample_scores_its_model_log_probability_whatever_the_temperature():
    decode = DecodeConfig(sampling=True, sampling_temperature=3.0, sampling_topk=2)
    for h in greedy_search(ScriptedModel(THREE_WAYS), SRC.repeat(20, 1), decode, choose=Sampler(decode, range(20))):
        assert h.log_prob == pytest.approx(math.log({A: 0.5, B: 0.3}[h.tokens[0]]))  # eos then has probability 1


def test_seeds_depend_on_the_seed_the_source_and_the_sample_number_only():
    seeds = sample_seeds(7, [[5, 6, 2], [5, 2]], 3)
    assert len(set(seeds)) == 6
    assert sample_seeds(7, [[5, 2]], 3) == seeds[3:]  # not on the other sentences of the batch
    assert sample_seeds(8, [[5, 6, 2], [5, 2]], 3) != seeds
    assert sample_seeds(7, [[5, 6, 2], [5, 2]], 2) == seeds[:2] + seeds[3:5]  # sample i is sample i whatever nbest


def test_sampling_settings_are_checked():
    for setting, message in (({"sampling_topp": 0.0}, "sampling_topp must be in"),
                             ({"sampling_temperature": 0.0}, r"sampling_temperature must be in \[1e-06, 1e\+06\]"),
                             ({"sampling_topk": -1}, "sampling_topk must be >= 0")):
        with pytest.raises(ValueError, match=message):
            DecodeConfig(sampling=True, **setting)
    assert DecodeConfig(sampling=True, beam_size=1, nbest=5).nbest == 5  # samples, not beams
