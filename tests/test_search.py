import math

import pytest
import torch
import torch.nn.functional as F
from conftest import BOS, EOS, PAD, VOCAB, make_model
from torch import Tensor, nn

from transformer.config import DecodeConfig
from transformer.decoding.limits import length_limits
from transformer.decoding.search import (
    PLAIN_STEPS,
    Hypothesis,
    SearchSteps,
    beam_search,
    greedy_search,
    normalized_score,
    output_limits,
)
from transformer.runtime.int8 import quantize_int8

A, B, C, D = 4, 5, 6, 7  # tokens of the scripted model


class ScriptedCache:
    """Remembers the prefix of each row, so decode can check that search reordered it with the beams;
    not ``incremental``, it remembers nothing and the whole prefix is decoded at every step."""

    def __init__(self, incremental: bool = True) -> None:
        self.prefix: Tensor | None = None
        self.incremental = incremental

    @property
    def length(self) -> int:
        return 0 if self.prefix is None or not self.incremental else self.prefix.size(1)

    def reorder(self, index: Tensor, source_index: Tensor | None = None) -> None:
        if self.incremental:
            self.prefix = self.prefix.index_select(0, index)


class ScriptedModel(nn.Module):
    """Stands in for Transformer: P(next token | prefix) comes from a table, whatever the source.

    ``script`` maps a prefix (without bos) to {token: probability}; other prefixes get ``default``
    and other tokens probability 0. ``batch_sizes`` records the rows of every decode call, ``positions``
    how many positions it decoded.
    """

    pad_id, bos_id, eos_id = PAD, BOS, EOS

    def __init__(self, script: dict, default: dict | None = None, vocab_size: int = 8) -> None:
        super().__init__()
        self.script, self.default, self.vocab_size = script, default or {EOS: 1.0}, vocab_size
        self.batch_sizes: list[int] = []
        self.positions: list[int] = []

    def new_cache(self, incremental: bool = True) -> ScriptedCache:
        return ScriptedCache(incremental)

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        return torch.zeros(src.size(0), src.size(1), 1)

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor, cache: ScriptedCache) -> Tensor:
        assert tgt_in.size(0) % memory.size(0) == 0 and memory.size(0) == src_mask.size(0)
        self.batch_sizes.append(tgt_in.size(0))
        start = cache.length
        self.positions.append(tgt_in.size(1) - start)
        if cache.incremental:
            assert cache.prefix is None or torch.equal(cache.prefix, tgt_in[:, :start])
            cache.prefix = tgt_in
        logits = torch.full((tgt_in.size(0), tgt_in.size(1) - start, self.vocab_size), float("-inf"))
        for row, tokens in enumerate(tgt_in.tolist()):
            for t in range(start, len(tokens)):
                for token, p in self.script.get(tuple(tokens[1 : t + 1]), self.default).items():
                    logits[row, t - start, token] = math.log(p)
        return logits


SRC = torch.tensor([[8, 9, EOS]])


def greedy(model: nn.Module, src: Tensor, use_cache: bool = True, steps: SearchSteps = PLAIN_STEPS,
           prefixes: list[list[int]] | None = None, **settings) -> list[list[int]]:
    """greedy_search's tokens with the default decoding settings, except ``settings``."""
    return [h.tokens for h in greedy_search(model, src, DecodeConfig(**settings), use_cache, steps, prefixes)]


def beam(model: nn.Module, src: Tensor, use_cache: bool = True, steps: SearchSteps = PLAIN_STEPS,
         prefixes: list[list[int]] | None = None, **settings) -> list[list[Hypothesis]]:
    """beam_search with the default decoding settings (beam 4, alpha 0.6), except ``settings``."""
    return beam_search(model, src, DecodeConfig(**settings), use_cache, steps, prefixes)


# greedy takes A (0.5) then eos (0.4): P = 0.2; beam 2 also keeps B (0.4), then eos (0.9): P = 0.36
GREEDY_IS_NOT_BEST = {(): {A: 0.5, B: 0.4, EOS: 0.1}, (A,): {EOS: 0.4, C: 0.35, D: 0.25}, (B,): {EOS: 0.9, C: 0.1}}

# beam 2: step 0 finishes [] (0.46) and keeps A (0.5), B (0.04); step 1 keeps AB (0.4), AC (0.075) over
# BC (0.04) and A-eos (0.025); step 2 finishes [A, B] (0.4), the second finished hypothesis: done.
# Raw log P prefers [] (-0.78 > -0.92); with alpha = 1, -0.92 / (8/6) = -0.69 beats -0.78 / (6/6).
SHORT_OR_LONG = {(): {A: 0.5, EOS: 0.46, B: 0.04}, (A,): {B: 0.8, C: 0.15, EOS: 0.05}, (B,): {C: 1.0},
                 (A, B): {EOS: 1.0}, (A, C): {EOS: 1.0}}


def assert_hypotheses(actual: list[Hypothesis], expected: list[tuple[list[int], float, float]]) -> None:
    assert [h.tokens for h in actual] == [tokens for tokens, _, _ in expected]
    for h, (_, log_prob, length_penalty) in zip(actual, expected):
        assert h.log_prob == pytest.approx(log_prob, abs=1e-6)
        assert h.score == pytest.approx(log_prob / length_penalty, abs=1e-6)


def test_beam_search_finds_a_more_probable_path_than_greedy():
    assert greedy(ScriptedModel(GREEDY_IS_NOT_BEST), SRC) == [[A]]
    assert [h.tokens for h in beam(ScriptedModel(GREEDY_IS_NOT_BEST), SRC, beam_size=1, length_penalty=0)[0]] == [[A]]
    nbest = beam(ScriptedModel(GREEDY_IS_NOT_BEST), SRC, beam_size=2, nbest=2, length_penalty=0.0)[0]
    assert_hypotheses(nbest, [([B], math.log(0.4 * 0.9), 1.0), ([A], math.log(0.5 * 0.4), 1.0)])


def test_search_goes_on_while_a_live_beam_can_still_win_under_the_length_penalty():
    # alpha 0.6: B and A have finished at step 1 (0.36 and 0.2, lp (7/6)^0.6), but the live A C (0.175)
    # could still score up to log 0.175 / lp(limit); it ends at step 2 with P = 0.175 and lp (8/6)^0.6,
    # -1.4665 > A's -1.4673. Stopping once the best continuation was eos returned A second.
    nbest = beam(ScriptedModel(GREEDY_IS_NOT_BEST), SRC, beam_size=2, nbest=2, length_penalty=0.6)[0]
    assert_hypotheses(nbest, [([B], math.log(0.4 * 0.9), (7 / 6) ** 0.6),
                              ([A, C], math.log(0.5 * 0.35), (8 / 6) ** 0.6)])


@pytest.mark.parametrize("alpha, order", [(0.0, "short first"), (1.0, "long first")])
def test_length_penalty_changes_the_winner(alpha, order):
    nbest = beam(ScriptedModel(SHORT_OR_LONG), SRC, beam_size=2, nbest=2, length_penalty=alpha)[0]
    short = ([], math.log(0.46), 1.0)
    long = ([A, B], math.log(0.5 * 0.8), (8 / 6) ** alpha)
    assert_hypotheses(nbest, [short, long] if order == "short first" else [long, short])
    top = beam(ScriptedModel(SHORT_OR_LONG), SRC, beam_size=2, nbest=1, length_penalty=alpha)[0]
    assert top == nbest[:1]


def test_search_goes_on_until_the_best_continuation_is_eos():
    # beam 2: [] finishes at step 0 (0.3) and A at step 1 (0.03), but the best continuation is still A B:
    # stopping at K finished hypotheses would return [] although A B (0.3, lp 8/6) scores better
    script = {(): {A: 0.6, EOS: 0.3, B: 0.1}, (A,): {B: 0.5, EOS: 0.05, C: 0.45}, (B,): {C: 1.0}}
    nbest = beam(ScriptedModel(script), SRC, beam_size=2, nbest=2, length_penalty=1.0)[0]
    assert_hypotheses(nbest, [([A, B], math.log(0.6 * 0.5), 8 / 6), ([A, C], math.log(0.6 * 0.45), 8 / 6)])


def test_a_confident_model_is_not_cut_short_by_early_eos():
    script = {(): {A: 0.9, EOS: 0.06}, (A,): {B: 0.9, EOS: 0.06}, (A, B): {C: 0.9, EOS: 0.06}}
    best = beam(ScriptedModel(script), SRC, beam_size=2, length_penalty=0.0)[0][0]
    assert best.tokens == [A, B, C]


def test_equal_scores_are_ranked_by_token_id():
    tie = {(): {B: 0.4, A: 0.4, EOS: 0.2}}
    assert greedy(ScriptedModel(tie), SRC) == [[A]]
    assert beam(ScriptedModel(tie), SRC, beam_size=1)[0][0].tokens == [A]
    assert [h.tokens for h in beam(ScriptedModel(tie), SRC, beam_size=2, nbest=2)[0]] == [[A], [B]]


def test_nbest_cannot_exceed_the_beam():
    with pytest.raises(ValueError, match=r"decode.nbest must be in \[1, decode.beam_size=2\], got 3"):
        beam(ScriptedModel({}), SRC, beam_size=2, nbest=3)


def test_max_output_length_counts_real_source_tokens():
    src = torch.tensor([[5, 6, 7, EOS], [5, EOS, PAD, PAD]])

    def limits(src, a, b):
        return output_limits(src, PAD, DecodeConfig(max_len_a=a, max_len_b=b), None)

    assert limits(src, 1.5, 10).tolist() == [16, 13]
    assert limits(src, 0.5, 1).tolist() == [3, 2]
    assert limits(torch.full((1, 90), 5), 1.3, 0).item() == int(1.3 * 90)  # 117; float32 says 116


def test_the_length_limit_grows_by_the_prefix_and_the_constraint_tokens():
    decode = DecodeConfig(max_len_a=1.5, max_len_b=10)
    assert length_limits([4, 2], decode) == [16, 13]
    assert length_limits([4, 2], decode, prefixes=[[8, 9], []], constraints=[[[5], [6, 7]], []]) == [21, 13]
    assert length_limits([4], decode, prefixes=[["▁A", "B"]]) == [18]  # pieces count as ids do
    with pytest.raises(ValueError):
        length_limits([4, 2], decode, prefixes=[[8]])


def test_eos_is_forced_at_the_maximum_length_and_finished_sentences_leave_the_batch():
    src = torch.tensor([[5, 6, 7, EOS], [5, EOS, PAD, PAD]])  # at most 3 and 2 tokens
    never_eos = {A: 0.7, B: 0.2, EOS: 0.1}  # eos never ranks in the top 2
    model = ScriptedModel({}, default=never_eos)
    assert greedy(model, src, max_len_a=0.5, max_len_b=1) == [[A, A, A], [A, A]]
    assert model.batch_sizes == [2, 2, 2, 1]
    model = ScriptedModel({}, default=never_eos)
    result = beam(model, src, beam_size=2, nbest=2, length_penalty=0.0, max_len_a=0.5, max_len_b=1)
    assert [[len(h.tokens) for h in hypotheses] for hypotheses in result] == [[3, 3], [2, 2]]
    assert result[1][0].log_prob == pytest.approx(math.log(0.7 * 0.7 * 0.1))  # forced eos keeps its probability
    assert model.batch_sizes == [4, 4, 4, 2]


def tiny_model_that_stops(seed: int = 1) -> nn.Module:
    """A random tiny model whose output layer favours eos, so that sentences end at different steps,
    some by choice and some at the length limit (without the bias a random model rarely says eos)."""
    model = make_model(seed)
    output_proj = nn.Linear(model.cfg.d_model, VOCAB)
    output_proj.weight = model.output_proj.weight
    with torch.no_grad():
        output_proj.bias.zero_()
        output_proj.bias[EOS] = 1.75
    model.output_proj = output_proj
    return model


def random_sources(lengths: list[int], seed: int = 1) -> list[Tensor]:
    """Sentences of the given lengths (eos included) without padding."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.cat([torch.randint(4, VOCAB, (n - 1,), generator=generator), torch.tensor([EOS])]) for n in lengths]


def pad(sentences: list[Tensor]) -> Tensor:
    return nn.utils.rnn.pad_sequence(sentences, batch_first=True, padding_value=PAD)


SOURCES = random_sources([7, 3, 5, 1, 6, 4, 2, 7])


def test_beam_size_one_equals_greedy():
    for model in (make_model(0), make_model(1, norm_first=True), tiny_model_that_stops()):
        src = pad(SOURCES)
        assert greedy(model, src) == [hypotheses[0].tokens for hypotheses in beam(model, src, beam_size=1)]


def test_greedy_translation_does_not_depend_on_the_batch():
    model = tiny_model_that_stops()
    together = greedy(model, pad(SOURCES))
    assert len({len(tokens) for tokens in together}) > 3  # sentences finish at different steps
    assert together == [greedy(model, sentence[None])[0] for sentence in SOURCES]
    assert together[::-1] == greedy(model, pad(SOURCES[::-1]))


def test_beam_translation_does_not_depend_on_the_batch():
    model = tiny_model_that_stops()
    together = beam(model, pad(SOURCES), beam_size=3, nbest=3)
    one_at_a_time = [beam(model, sentence[None], beam_size=3, nbest=3)[0] for sentence in SOURCES]
    reversed_batch = beam(model, pad(SOURCES[::-1]), beam_size=3, nbest=3)[::-1]
    for other in (one_at_a_time, reversed_batch):
        for mine, theirs in zip(together, other):
            assert [h.tokens for h in mine] == [h.tokens for h in theirs]
            assert [h.score for h in mine] == pytest.approx([h.score for h in theirs], abs=1e-4)


def test_int8_translation_does_not_depend_on_the_batch():
    """Each row's activations get their own int8 scale: torch's dynamic quantization scaled the whole
    batch by one factor, so a sentence's scores changed with the sentences decoded beside it."""
    model = quantize_int8(tiny_model_that_stops())
    together = beam(model, pad(SOURCES), beam_size=3, nbest=3)
    one_at_a_time = [beam(model, sentence[None], beam_size=3, nbest=3)[0] for sentence in SOURCES]
    for mine, theirs in zip(together, one_at_a_time):
        assert [h.tokens for h in mine] == [h.tokens for h in theirs]
        assert [h.score for h in mine] == pytest.approx([h.score for h in theirs], abs=1e-6)


def test_decoding_with_and_without_cache_gives_the_same_translations():
    model, src = tiny_model_that_stops(), pad(SOURCES)
    assert greedy(model, src, use_cache=True) == greedy(model, src, use_cache=False)
    cached = beam(model, src, beam_size=3, nbest=3, use_cache=True)
    uncached = beam(model, src, beam_size=3, nbest=3, use_cache=False)
    assert [[h.tokens for h in n] for n in cached] == [[h.tokens for h in n] for n in uncached]


def test_hypothesis_scores_are_the_model_log_probabilities():
    model = tiny_model_that_stops()
    for sentence, hypotheses in zip(SOURCES, beam(model, pad(SOURCES), beam_size=3, nbest=3)):
        scores = [h.score for h in hypotheses]
        assert scores == sorted(scores, reverse=True)
        for h in hypotheses:
            tgt = torch.tensor([[BOS, *h.tokens, EOS]])
            log_probs = F.log_softmax(model(sentence[None], tgt[:, :-1]), dim=-1)  # teacher forcing
            assert h.log_prob == pytest.approx(log_probs[0].gather(1, tgt[0, 1:, None]).sum().item(), abs=1e-4)
            assert h.score == pytest.approx(normalized_score(h.log_prob, len(h.tokens) + 1, 0.6))


def test_search_runs_under_bf16_autocast():
    model, src = tiny_model_that_stops(), pad(SOURCES[:3])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hypotheses = beam(model, src, beam_size=2, nbest=2)
        assert len(greedy(model, src)) == 3
    assert all(math.isfinite(h.score) and h.log_prob <= 0 for n in hypotheses for h in n)
