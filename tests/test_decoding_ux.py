"""Decoding as a user meets it: inputs as typed (stray spaces), n-best lists, alignments of odd outputs."""

import pytest
import torch

from transformer.decoding.alignment import word_alignment, word_index
from transformer.decoding.translator import Translator
from transformer.errors import InputError

SENTENCE = "alpha beta gamma delta"


@pytest.fixture(scope="module")
def translator(quick_copy_run) -> Translator:
    """The tiny copy-task model of conftest's `quick_copy_run` (200 steps), on one thread."""
    torch.set_num_threads(1)
    return Translator.from_checkpoint(quick_copy_run / "checkpoint_last.pt")


def test_spaces_around_a_sentence_a_prefix_or_a_phrase_change_no_translation(translator):
    # the corpus is stripped for training: a stray space was a lone "▁" piece the model never saw
    plain = translator.translate_nbest([SENTENCE], beam_size=2, nbest=2)
    spaced = translator.translate_nbest([f" {SENTENCE}", f"{SENTENCE} ", f"{SENTENCE}\t"], beam_size=2, nbest=2)
    assert spaced == plain * 3
    assert translator.too_long([f" {SENTENCE} "]) == []
    prefixed = translator.translate_nbest([SENTENCE] * 3, prefixes=["ALPHA", "ALPHA ", " ALPHA"], beam_size=2)
    assert prefixed[1:] == prefixed[:1] * 2
    constrained = translator.translate_nbest([SENTENCE] * 3, constraints=[["MU"], ["MU "], [" MU"]], beam_size=2)
    assert constrained[1:] == constrained[:1] * 2
    assert "MU" in constrained[0][0][0] and "  " not in constrained[0][0][0]


def test_alignments_number_the_words_of_the_text_not_its_space_pieces(translator):
    # Moses pairs index the words that whitespace splits; a double space's lone "▁" piece is no word
    assert word_index(["\u2581A", "\u2581", "\u2581B", "C"]) == [0, 1, 1, 1]
    assert word_index(["\u2581", "\u2581A", "\u2581"]) == [0, 0, 0]
    assert word_alignment(["\u2581a"], ["\u2581", "\u2581"], torch.ones(2, 1)) == []
    translation = "ALPHA  BETA GAMMA"  # as a sample, or a weak model, may print it
    (pairs,) = translator.align(["alpha beta gamma"], [translation])
    assert [target for _, target in pairs] == list(range(len(translation.split())))
    # spaces SentencePiece keeps inside pieces (its identity normalisation): French's no-break space before "!", a tab
    assert word_index(["\u2581chat", "\u2581est", "\u2581grand", "\u00a0!"]) == [0, 1, 2, 3]
    assert word_index(["\u2581chat", "\t", "e", "s", "t", "\u2581grand"]) == [0, 1, 1, 1, 1, 2]
    assert word_index(["\u2581caf", "<0xC3>", "<0xA9>", "\u2581x"]) == [0, 0, 0, 1]  # bytes of "é": café's
    for translation in ("ALPHA\u00a0BETA GAMMA", "ALPHA\tBETA GAMMA"):
        (pairs,) = translator.align(["alpha beta gamma"], [translation])
        assert [target for _, target in pairs] == [0, 1, 2]


def test_an_ensemble_of_no_checkpoints_is_a_one_line_error():
    with pytest.raises(InputError, match="give a checkpoint path"):
        Translator.from_checkpoint([])
