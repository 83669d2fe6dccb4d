"""Multilingual models (Johnson et al., 2017): several directions in one model, a target-language tag
leading each source; the tag is one piece of the joint vocabulary and the model learns to follow it."""

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import IN_LANGUAGE, TARGETS, toy_overrides

from transformer.config import ConfigError
from transformer.config_loading import load_config
from transformer.data.languages import directions_split, tag_sources, target_languages
from transformer.data.loading import load_split
from transformer.data.tokenizer import train_tokenizer
from transformer.errors import InputError


def two_target_config(corpus: Path, run_dir: Path, **train):
    overrides = toy_overrides(corpus, run_dir, **train) + ["data.pairs=src-up,src-cap", "data.tgt_lang=up"]
    return load_config(corpus / "two.yaml", overrides)


def test_a_multilingual_split_holds_every_direction_each_source_led_by_its_target_tag(two_target_corpus, tmp_path):
    cfg = two_target_config(two_target_corpus, tmp_path).data
    valid = load_split(cfg, "valid")
    assert len(valid) == 120
    first, second = valid[0], valid[1]  # the directions take turns
    assert first["src"].startswith("<2up> ") and second["src"].startswith("<2cap> ")
    assert first["src"].removeprefix("<2up> ") == second["src"].removeprefix("<2cap> ")
    assert first["tgt"] == first["src"].removeprefix("<2up> ").upper()
    assert second["tgt"] == second["src"].removeprefix("<2cap> ").title()


def test_directions_of_unequal_length_take_turns_until_the_longer_one_ends(two_target_corpus, tmp_path):
    import datasets

    cfg = two_target_config(two_target_corpus, tmp_path).data
    sizes = {"up": 2, "cap": 4}

    def read(direction):
        n = sizes[direction.tgt_lang]
        return datasets.Dataset.from_dict({"src": [f"s{i}" for i in range(n)],
                                           "tgt": [f"{direction.tgt_lang}{i}" for i in range(n)]})

    split = directions_split(cfg, "train", read)
    assert split["tgt"] == ["up0", "cap0", "up1", "cap1", "cap2", "cap3"]  # every pair of both, in turns
    assert split["src"][:2] == ["<2up> s0", "<2cap> s0"]


def test_a_run_says_each_directions_pairs_once(tmp_path, caplog):
    """The training split's counts were logged twice: read for the tokenizer's sample, then for the batches."""
    import logging

    from conftest import write_two_target_corpus

    from transformer.training import train

    corpus = write_two_target_corpus(tmp_path / "corpus")
    with caplog.at_level(logging.INFO):
        train(two_target_config(corpus, tmp_path / "run", max_steps=1))
    assert caplog.text.count("train: src-up ") == 1


def test_each_tag_is_one_piece_of_the_joint_vocabulary(two_target_corpus, tmp_path):
    cfg = two_target_config(two_target_corpus, tmp_path).data
    train = load_split(cfg, "train")
    tokenizer = train_tokenizer(cfg, train["src"], train["tgt"], tmp_path, seed=1)
    plain = tokenizer.encode_src(["alpha beta"])[0]
    for lang in ("up", "cap"):
        (tagged,) = tokenizer.encode_src(tag_sources(["alpha beta"], cfg, lang))
        assert f"<2{lang}>" in tokenizer.src_pieces(tagged)  # whole, after SentencePiece's word-start piece
        assert tagged[-len(plain):] == plain


def test_the_target_language_is_required_and_checked(two_target_corpus, tmp_path):
    cfg = two_target_config(two_target_corpus, tmp_path).data
    assert target_languages(cfg) == ["up", "cap"]
    assert tag_sources(["a b", ""], cfg, "cap") == ["<2cap> a b", ""]
    assert tag_sources(["<2up> a b", ""], cfg, None) == ["<2up> a b", ""]  # tagged already
    # a tag alone is blank, with the space after it or without (an editor strips it)
    assert tag_sources(["<2up> ", "<2cap>   ", "<2up>", "<2up> a"], cfg, None) == ["", "", "", "<2up> a"]
    with pytest.raises(InputError, match=r"^in.txt line 2 leads with <2xx>, the tag of no language"):
        tag_sources(["<2up> a", "<2xx> b"], cfg, None, names=["in.txt line 1", "in.txt line 2"])  # was "sentence 2"
    with pytest.raises(InputError, match=r"target language 'fr': this model translates into up, cap only"):
        tag_sources(["a b"], cfg, "fr")
    with pytest.raises(InputError, match=r"multilingual model translates into up, cap: say which"):
        tag_sources(["a b"], cfg, None)
    one = dataclasses.replace(cfg, pairs=["src-cap"], tgt_lang="cap")  # a multilingual parent fine-tuned on one pair
    assert tag_sources(["a b", "", "<2cap> c"], one, None) == ["<2cap> a b", "", "<2cap> c"]  # was "say which"
    with pytest.raises(InputError, match=r"^in.txt line 3 has no target-language tag: this multilingual model "
                                         r"translates into up, cap: say which"):  # every sentence leads with one
        tag_sources(["<2up> a b", "", "c d"], cfg, None, names=["in.txt line 1", "in.txt line 2", "in.txt line 3"])
    with pytest.raises(InputError, match=r"sentence 2 leads with <2fr>, the tag of no language this model translates "
                                         r"into \(up, cap\)"):
        tag_sources(["<2up> a b", "<2fr> c d"], cfg, None)
    with pytest.raises(InputError, match=r"sentence 1 leads with the tag <2up>, and target language 'cap' is asked "
                                         r"for as well: give one of them"):  # not two tags
        tag_sources(["<2up> a b"], cfg, "cap")
    bilingual = load_config(None, ["data.src_lang=de", "data.tgt_lang=en"]).data
    assert tag_sources(["a b"], bilingual, None) == tag_sources(["a b"], bilingual, "en") == ["a b"]
    with pytest.raises(InputError, match=r"target language 'fr': this model translates into en only"):
        tag_sources(["a b"], bilingual, "fr")


@pytest.mark.parametrize("pairs, message", [
    ("en-de,en", r"data.pairs: 'en' is not a direction such as en-de"),
    ("en-en", r"data.pairs: 'en-en' is not a direction"),
    ("en-EN,de-en", r"data.pairs: 'en-EN' is not a direction"),
    ("en-de,en-de", r"data.pairs: a direction is given twice"),
    ("EN-de,en-de", r"data.pairs: a direction is given twice"),
])
def test_bad_pairs_are_one_line_errors(pairs, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [f"data.pairs={pairs}"])
    with pytest.raises(ConfigError, match="data.pairs needs data.joint_vocab=true"):
        load_config(None, ["data.pairs=en-de,de-en", "data.joint_vocab=false"])


SOURCES = ["alpha beta gamma", "delta epsilon zeta eta", "theta iota kappa lambda mu"]


@pytest.mark.slow
def test_the_model_follows_its_tag(two_target_run):
    """Each tag gives translations in its language (which words they get right: BLEU, the next test)."""
    from transformer import Translator

    translator = Translator.from_checkpoint(two_target_run / "checkpoint_last.pt")
    for lang, rule in TARGETS.items():
        assert all(map(IN_LANGUAGE[lang], translator.translate(SOURCES, tgt_lang=lang, beam_size=2)))
        expected = [" ".join(rule(sentence.split())) for sentence in SOURCES]
        other = next(name for name in TARGETS if name != lang)  # a forced translation is likelier behind its tag
        assert all(right > wrong for right, wrong in zip(translator.score(SOURCES, expected, tgt_lang=lang),
                                                         translator.score(SOURCES, expected, tgt_lang=other)))
    with pytest.raises(InputError, match=r"target language 'fr': this model translates into up, cap only"):
        translator.translate(SOURCES, tgt_lang="fr")
    with pytest.raises(InputError, match=r"say which \(--tgt-lang, tgt_lang\)"):
        translator.translate(SOURCES)


@pytest.mark.slow
def test_translate_and_evaluate_take_the_target_language(two_target_run, two_target_corpus, tmp_path, capsys):
    from transformer import Translator
    from transformer.cli import main

    checkpoint = str(two_target_run / "checkpoint_last.pt")
    assert main(["translate", "--checkpoint", checkpoint, "--tgt-lang", "cap", *SOURCES]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed == Translator.from_checkpoint(checkpoint).translate(SOURCES, tgt_lang="cap")
    assert all(map(IN_LANGUAGE["cap"], printed))
    assert main(["translate", "--checkpoint", checkpoint, "--tgt-lang", "fr", "alpha"]) == 2
    assert "target language 'fr': this model translates into up, cap only" in capsys.readouterr().err
    report = tmp_path / "cap.json"
    assert main(["evaluate", "--checkpoint", checkpoint, "--split", "valid", "--src-lang", "src", "--tgt-lang", "cap",
                 "--report", str(report)]) == 0
    scored = json.loads(report.read_text())
    # scored against the other language's references (each word's case wrong), its BLEU would be about 0
    assert (scored["src_lang"], scored["tgt_lang"]) == ("src", "cap") and scored["scores"]["bleu"]["score"] > 50
    assert capsys.readouterr().err.splitlines()[0] == "scoring src→cap on split valid"  # it said no direction
    assert main(["evaluate", "--checkpoint", checkpoint, "--split", "valid", "--tgt-lang", "src"]) == 2
    assert "src→src" in capsys.readouterr().err
    assert main(["evaluate", "--checkpoint", checkpoint, "--split", "valid", "--src-lang", "up"]) == 2  # default target
    assert capsys.readouterr().err == ("error: up→up: the source and target language are the same; give both "
                                       "languages of a direction (this model translates from cap, src, up into up, "
                                       "cap)\n")


@pytest.mark.slow
def test_the_service_takes_the_target_language(two_target_run):
    from fastapi.testclient import TestClient

    from transformer import Translator
    from transformer.serve.app import create_app
    from transformer.serve.config import ServeConfig
    from transformer.serve.model_info import describe

    checkpoint = two_target_run / "checkpoint_last.pt"
    translator = Translator.from_checkpoint(checkpoint)
    app = create_app(translator, ServeConfig(), describe(translator, "torch", [str(checkpoint)]))
    with TestClient(app) as client:
        model = client.get("/model").json()
        assert model["target_languages"] == ["up", "cap"] and model["directions"] == ["src→up", "src→cap"]
        # no one target language: a request without tgt_lang is refused (it said the default's, "up")
        assert (model["source_language"], model["target_language"]) == ("src", None)
        for lang in TARGETS:
            found = client.post("/translate", json={"text": SOURCES, "tgt_lang": lang, "alignments": True}).json()
            translations = [t["text"] for t in found["translations"]]
            assert translations == translator.translate(SOURCES, tgt_lang=lang)
            assert all(map(IN_LANGUAGE[lang], translations))
            # the tag is no word of the alignment: the first word is its copy's, none lies past the source's three
            links = [tuple(map(int, link.split("-"))) for link in found["translations"][0]["alignment"].split()]
            assert (0, 0) in links and {source for source, _ in links} <= {0, 1, 2}
        refused = client.post("/translate", json={"text": "alpha", "tgt_lang": "fr"})
        assert refused.status_code == 422 and "translates into up, cap only" in refused.json()["error"]
        assert client.post("/translate", json={"text": "alpha"}).status_code == 422
        attention = client.post("/attention", json={"text": "alpha beta", "tgt_lang": "up"}).json()
        assert "<2up>" in attention["source"]
        tag_alone = client.post("/attention", json={"text": "<2up> "})  # was a 200 with the attention of "</s>"
        assert tag_alone.status_code == 422 and tag_alone.json()["error"] == "text: empty; give a sentence to translate"


@pytest.mark.slow
def test_exported_engines_carry_the_tag(two_target_run, tmp_path):
    from transformer import Translator
    from transformer.deploy.ctranslate2 import CTranslate2Translator
    from transformer.deploy.ctranslate2_export import export_ctranslate2
    from transformer.deploy.onnx import OnnxTranslator
    from transformer.deploy.onnx_export import export_onnx
    from transformer.deploy.release import export_release

    checkpoint = two_target_run / "checkpoint_last.pt"
    model = Translator.from_checkpoint(checkpoint)
    release = Translator.from_pretrained(export_release(checkpoint, tmp_path / "release"))
    engine = CTranslate2Translator(export_ctranslate2(checkpoint, tmp_path / "ct2"))
    graphs = OnnxTranslator(export_onnx(checkpoint, tmp_path / "onnx"))
    for lang in TARGETS:
        expected = model.translate(SOURCES, tgt_lang=lang, beam_size=2)
        assert all(map(IN_LANGUAGE[lang], expected))
        assert release.translate(SOURCES, tgt_lang=lang, beam_size=2) == expected
        # CTranslate2's beam normalises scores its own way (deploy/ctranslate2.py): its greedy search is ours
        greedy = model.translate(SOURCES, tgt_lang=lang, beam_size=1)
        assert engine.translate(SOURCES, tgt_lang=lang, beam_size=1) == greedy
        assert graphs.translate(SOURCES, tgt_lang=lang, beam_size=2) == expected
    with pytest.raises(InputError, match="translates into up, cap only"):
        engine.translate(SOURCES, tgt_lang="fr")
    card = (tmp_path / "release" / "README.md").read_text()
    assert "src→up, src→cap" in card and "--tgt-lang up" in card


def test_a_tokenizer_without_the_tags_is_refused(two_target_corpus, tmp_path):
    from transformer.data.tokenizer import Tokenizer, TokenizerError

    cfg = two_target_config(two_target_corpus, tmp_path).data
    bilingual = dataclasses.replace(cfg, pairs=[])
    train = load_split(bilingual, "train")
    train_tokenizer(bilingual, train["src"], train["tgt"], tmp_path, seed=1)
    with pytest.raises(TokenizerError, match=r"spm.model: no piece <2up> for data.pairs src-up,src-cap"):
        Tokenizer.load(tmp_path, cfg)


def test_the_default_direction_is_one_of_the_pairs():
    with pytest.raises(ConfigError, match=r"data.src_lang-data.tgt_lang \(de-en\), the direction scored by default, "
                                          r"must be one of data.pairs en-fr,fr-en"):
        load_config(None, ["data.pairs=en-fr,fr-en"])
    with pytest.raises(ConfigError, match=r"must be one of data.pairs DE-en,en-fr \(language codes are "
                                          r"case-sensitive: DE-en is another direction\)$"):
        load_config(None, ["data.pairs=DE-en,en-fr"])


def test_the_model_cards_scores_name_the_direction_they_scored():
    from transformer.deploy.card import front_matter

    cfg = load_config(None, ["data.pairs=en-de,en-cs", "data.src_lang=en", "data.tgt_lang=de", "data.dataset=hub/m30k"])
    report = {"scores": {"bleu": {"score": 30.0, "signature": "nrefs:1"}}, "split": "test2016", "src_lang": "en",
              "tgt_lang": "cs"}
    [model] = front_matter(cfg, "multi", report)["model-index"]
    assert model["results"][0]["task"]["name"] == "Translation en→cs"
    assert front_matter(cfg, "multi", report)["language"] == ["en", "de", "cs"]


@pytest.mark.parametrize("pairs, languages", [
    ([], ("en", "de")),
    (["en-de", "fr-de"], (None, "de")),  # one target: a request needs no tgt_lang
    (["en-de", "en-fr"], ("en", None)),
    (["en-de", "de-en"], (None, None)),
])
def test_the_service_names_a_language_only_where_the_model_has_one(pairs, languages):
    from transformer.config import DataConfig
    from transformer.serve.model_info import source_and_target

    assert source_and_target(DataConfig(src_lang="en", tgt_lang="de", pairs=pairs)) == languages
