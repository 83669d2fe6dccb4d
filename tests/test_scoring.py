"""Forced decoding (`Engine.score`, transformer-translate --score) on a model that has learned the copy task
(target = source upper-cased): a given translation's score is the one the search gives it."""

import pytest

from transformer.cli import main
from transformer.decoding.translator import Translator
from transformer.errors import InputError

# of 1 to 40 tokens: pairs of several padded widths
SENTENCES = ["alpha beta gamma", "kappa lambda mu iota", "eta", "beta beta delta epsilon zeta theta",
             " ".join(["alpha", "beta", "gamma", "delta", "epsilon"] * 4)]


@pytest.mark.parametrize("options", [{}, {"dtype": "bf16"}, {"quantize": "int8"}])
def test_a_greedy_translations_score_is_the_searchs_to_the_bit(checkpoint, options):
    """Forced decoding runs the search's own steps: in bf16 and int8 too, where one teacher-forced pass over the
    whole translation sums in another order (0.1 apart in bf16 on 30 tokens)."""
    translator = Translator.from_checkpoint(checkpoint, device="cpu", **options)
    texts, searched = zip(*(hypotheses[0] for hypotheses in translator.translate_nbest(SENTENCES, beam_size=1)))
    assert translator.score(SENTENCES, list(texts)) == list(searched)


@pytest.mark.parametrize("length_penalty", [0.0, 0.6])
def test_a_beam_hypothesis_scores_as_the_beam_search_scored_it(translator, length_penalty):
    nbest = translator.translate_nbest(SENTENCES, beam_size=4, nbest=3, length_penalty=length_penalty)
    sources = [sentence for sentence, hypotheses in zip(SENTENCES, nbest) for _ in hypotheses]
    texts, searched = zip(*(hypothesis for hypotheses in nbest for hypothesis in hypotheses))
    assert translator.score(sources, list(texts), length_penalty=length_penalty) == pytest.approx(searched, abs=1e-4)


def test_a_pairs_score_does_not_depend_on_the_pairs_beside_it(translator):
    translations = [sentence.upper() for sentence in SENTENCES]
    translations[1] = "KAPPA LAMBDA"  # a worse one scores lower
    together = translator.score(SENTENCES, translations, batch_tokens=64)  # several batches
    assert together == [translator.score([s], [t])[0] for s, t in zip(SENTENCES, translations)]
    assert together[1] < translator.score([SENTENCES[1]], [SENTENCES[1].upper()])[0]


def test_empty_sentences_and_translations_are_scored(translator):
    (empty_source, empty_translation, both) = translator.score(["", "alpha beta", ""], ["ALPHA", "", ""])
    assert empty_source < 0 and empty_translation < 0 and both < 0  # not the 0 an unsearched empty line gets
    assert empty_translation < translator.score(["alpha beta"], ["ALPHA BETA"])[0]


def test_an_ensemble_scores_as_its_own_search(trained_copy_run):
    members = [trained_copy_run / "checkpoint_step250.pt", trained_copy_run / "checkpoint_best.pt"]
    ensemble = Translator.from_checkpoint(members, device="cpu")
    texts, searched = zip(*(hypotheses[0] for hypotheses in ensemble.translate_nbest(SENTENCES, beam_size=1)))
    assert ensemble.score(SENTENCES, list(texts)) == list(searched)
    first = Translator.from_checkpoint(members[0], device="cpu")
    assert first.score(SENTENCES, list(texts)) != ensemble.score(SENTENCES, list(texts))


def test_the_api_refuses_counts_that_differ_and_over_long_translations(translator):
    with pytest.raises(InputError, match=r"^1 translations for 2 sentences: give one each$"):
        translator.score(["alpha", "beta"], ["ALPHA"])
    with pytest.raises(InputError, match=r"^translations: give a list of strings"):
        translator.score(["alpha"], "ALPHA")
    with pytest.raises(InputError, match=r"^translation 2 has \d+ tokens; at most \d+ \(data.max_length\)"):
        translator.score(["alpha", "beta"], ["ALPHA", "BETA " * 300])


def test_translate_score_prints_the_score_of_each_line(checkpoint, translator, tmp_path, capsys):
    (tmp_path / "in.txt").write_text("\n".join(SENTENCES) + "\n")
    (tmp_path / "out.txt").write_text("\n".join(s.upper() for s in SENTENCES) + "\n")
    args = ["translate", "--checkpoint", checkpoint, "--input", str(tmp_path / "in.txt")]
    assert main([*args, "--score", str(tmp_path / "out.txt")]) == 0
    expected = translator.score(SENTENCES, [s.upper() for s in SENTENCES])
    assert capsys.readouterr().out == "".join(f"{score:.4f}\n" for score in expected)

    (tmp_path / "short.txt").write_text("ALPHA\n")
    assert main([*args, "--score", str(tmp_path / "short.txt"), "--checkpoint", "missing.pt"]) == 2
    assert capsys.readouterr().err == (f"error: --score {tmp_path / 'short.txt'}: 1 translations for 5 input lines: "
                                       f"give one line per input line\n")  # before the model is loaded
    for wrong, message in ((["--nbest", "2"], "it searches none: drop --nbest"),
                           (["--constraints"], "it searches none: drop --constraints"),
                           (["--output", str(tmp_path / "out.txt")], "--output")):
        assert main([*args, "--score", str(tmp_path / "out.txt"), *wrong]) == 2
        assert message in capsys.readouterr().err
    assert (tmp_path / "out.txt").read_text().startswith("ALPHA BETA")
    assert main([*args, "--score", "-"]) == 2
    assert capsys.readouterr().err.startswith("error: --score -: give the translations in a file")
