"""Forced decoding (`Engine.score`, transformer-translate --score) on a model that has learned the copy task
(target = source upper-cased): a given translation's score is the one the search gives it."""

import pytest

from transformer.cli import main
from transformer.decoding.translator import Translator
from transformer.errors import InputError

SENTENCES = ["alpha beta gamma", "kappa lambda mu iota", "eta", "beta beta delta epsilon zeta theta"]


@pytest.fixture(scope="module")
def checkpoint(trained_copy_run):
    return str(trained_copy_run / "checkpoint_best.pt")


@pytest.fixture(scope="module")
def translator(checkpoint):
    return Translator.from_checkpoint(checkpoint, device="cpu")


@pytest.mark.parametrize("length_penalty", [0.0, 0.6])
def test_a_translations_score_is_the_one_the_search_gave_it(translator, length_penalty):
    nbest = translator.translate_nbest(SENTENCES, beam_size=4, nbest=3, length_penalty=length_penalty)
    sources = [sentence for sentence, hypotheses in zip(SENTENCES, nbest) for _ in hypotheses]
    texts, searched = zip(*(hypothesis for hypotheses in nbest for hypothesis in hypotheses))
    assert translator.score(sources, list(texts), length_penalty=length_penalty) == pytest.approx(searched, abs=1e-4)


def test_a_pairs_score_does_not_depend_on_the_pairs_beside_it(translator):
    translations = [sentence.upper() for sentence in SENTENCES]
    translations[1] = "KAPPA LAMBDA"  # a worse one scores lower
    together = translator.score(SENTENCES, translations)
    assert together == [translator.score([s], [t])[0] for s, t in zip(SENTENCES, translations)]
    assert together[1] < together[0] and together[1] < translator.score([SENTENCES[1]], [SENTENCES[1].upper()])[0]


def test_an_ensemble_of_the_model_with_itself_scores_as_the_model(translator, checkpoint):
    ensemble = Translator.from_checkpoint([checkpoint, checkpoint], device="cpu")
    translations = [sentence.upper() for sentence in SENTENCES]
    assert ensemble.score(SENTENCES, translations) == pytest.approx(translator.score(SENTENCES, translations),
                                                                    abs=1e-5)


def test_the_api_refuses_counts_that_differ(translator):
    with pytest.raises(InputError, match=r"^1 translations for 2 sentences: give one each$"):
        translator.score(["alpha", "beta"], ["ALPHA"])
    with pytest.raises(InputError, match=r"^translations: give a list of strings"):
        translator.score(["alpha"], "ALPHA")


def test_translate_score_prints_the_score_of_each_line(checkpoint, translator, tmp_path, capsys):
    (tmp_path / "in.txt").write_text("\n".join(SENTENCES) + "\n")
    (tmp_path / "out.txt").write_text("\n".join(s.upper() for s in SENTENCES) + "\n")
    args = ["translate", "--checkpoint", checkpoint, "--input", str(tmp_path / "in.txt")]
    assert main([*args, "--score", str(tmp_path / "out.txt")]) == 0
    expected = translator.score(SENTENCES, [s.upper() for s in SENTENCES])
    assert capsys.readouterr().out == "".join(f"{score:.4f}\n" for score in expected)

    (tmp_path / "short.txt").write_text("ALPHA\n")
    assert main([*args, "--score", str(tmp_path / "short.txt")]) == 2
    assert capsys.readouterr().err == (f"error: --score {tmp_path / 'short.txt'}: 1 translations for 4 input lines: "
                                       f"give one line per input line\n")
    assert main([*args, "--score", str(tmp_path / "out.txt"), "--nbest", "2"]) == 2
    assert capsys.readouterr().err.endswith("it searches none: drop --nbest\n")
    assert main([*args, "--score", str(tmp_path / "out.txt"), "--output", str(tmp_path / "out.txt")]) == 2
    assert "--output" in capsys.readouterr().err and (tmp_path / "out.txt").read_text().startswith("ALPHA BETA")
