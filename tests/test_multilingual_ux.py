"""A multilingual model as its users drive it: tags they write themselves, the target language of every entry
point (attention and alignments too), and what an exported model's card tells them. One tiny model, trained
for a few steps, serves them all: the tests check what the model is given, not how well it translates."""

from pathlib import Path

import pytest
from conftest import toy_overrides, write_two_target_corpus

from transformer.config_loading import load_config
from transformer.data.languages import tag_sources
from transformer.errors import InputError

PAIRS = ["data.pairs=src-up,src-cap", "data.tgt_lang=up"]
TINY = ["model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.n_encoder_layers=1", "model.n_decoder_layers=1"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_two_target_corpus(tmp_path_factory.mktemp("ux_corpus"), n_train=300, n_valid=10)


@pytest.fixture(scope="module")
def checkpoint(corpus, tmp_path_factory) -> Path:
    """A tiny multilingual model (src→up, src→cap) trained 10 steps through the CLI."""
    from transformer.cli import main

    run_dir = tmp_path_factory.mktemp("ux_run")
    overrides = toy_overrides(corpus, run_dir, max_steps=10, save_every=10, warmup_steps=5)
    assert main(["train", str(corpus / "two.yaml"), *overrides, *PAIRS, *TINY]) == 0
    return run_dir / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def translator(checkpoint):
    from transformer import Translator

    return Translator.from_checkpoint(checkpoint)


def multilingual_data():
    return load_config(None, [*PAIRS, "data.src_lang=src"]).data


@pytest.mark.parametrize("sentence", ["<2up>alpha beta", " <2up> alpha beta", "<2up>\talpha beta", "\t<2cap> alpha"])
def test_a_tag_without_its_space_or_after_spaces_is_not_given_a_second_one(sentence):
    # SentencePiece cuts a known tag out of any text: "<2cap> <2up>alpha" gave the model two tags, without a word
    with pytest.raises(InputError, match=r"^sentence 1 leads with the tag <2(up|cap)>, and target language 'cap' is "
                                         r"asked for as well: give one of them$"):
        tag_sources([sentence], multilingual_data(), "cap")


def test_a_tag_without_its_space_or_after_spaces_counts_as_the_target_language():
    # was "say which (--tgt-lang, tgt_lang), or lead each sentence with its tag", to a user whose lines did
    found = tag_sources(["<2up>alpha", " <2cap> beta", "<2up>\tgamma", "  <2up>  ", "<2up>  delta"],
                        multilingual_data(), None)
    assert found == ["<2up> alpha", "<2cap> beta", "<2up> gamma", "", "<2up> delta"]  # as with_tag writes them
    with pytest.raises(InputError, match=r"^sentence 1 leads with <2fr>, the tag of no language"):
        tag_sources([" <2fr> alpha"], multilingual_data(), None)


def test_spaces_around_a_sentence_are_not_kept_after_its_tag():
    # "<2up>  alpha": the space a user's line began with stayed between tag and text, a lone "▁" the model never saw
    assert tag_sources([" alpha", "beta\t", "  "], multilingual_data(), "up") == ["<2up> alpha", "<2up> beta", "  "]


def test_attention_takes_the_target_language(translator):
    # attention() had no tgt_lang (a TypeError-like "unknown decoding setting") and translated an untagged
    # sentence of a multilingual model without a word, into a language of the model's choice
    for lang in ("up", "cap"):
        found = translator.attention("alpha beta", tgt_lang=lang, beam_size=1)
        assert found.source_pieces[:3] == ["▁", f"<2{lang}>", "▁alpha"]
    assert translator.attention("<2cap> alpha beta", beam_size=1).source_pieces[1] == "<2cap>"
    with pytest.raises(InputError, match=r"say which \(--tgt-lang, tgt_lang\)"):
        translator.attention("alpha beta")
    with pytest.raises(InputError, match=r"target language 'fr': this model translates into up, cap only"):
        translator.attention("alpha beta", tgt_lang="fr")


def test_alignments_take_the_target_language(translator):
    tagged = translator.align(["<2cap> alpha beta"], ["Alpha Beta"])
    assert translator.align(["alpha beta"], ["Alpha Beta"], tgt_lang="cap") == tagged
    with pytest.raises(InputError, match=r"say which \(--tgt-lang, tgt_lang\)"):
        translator.align(["alpha beta"], ["Alpha Beta"])  # was aligned as an untagged source


def test_ctranslate2_attention_takes_the_target_language(checkpoint, tmp_path):
    pytest.importorskip("ctranslate2")
    from transformer.deploy.ctranslate2 import CTranslate2Translator
    from transformer.deploy.ctranslate2_export import export_ctranslate2

    engine = CTranslate2Translator(export_ctranslate2(checkpoint, tmp_path / "ct2"))
    assert engine.attention("alpha beta", tgt_lang="cap", beam_size=1).source_pieces[:2] == ["▁", "<2cap>"]
    with pytest.raises(InputError, match=r"say which"):
        engine.attention("alpha beta")


def test_the_model_card_shows_a_tag_of_the_model(checkpoint, tmp_path):
    from transformer.deploy.release import export_release

    card = (export_release(checkpoint, tmp_path / "release") / "README.md").read_text()
    assert "leads the source (`<2up>`)" in card  # was `<2fr>`, a language this model does not translate into


def test_a_multilingual_checkpoint_beside_a_bilingual_tokenizer_names_it(corpus, checkpoint, tmp_path, capsys):
    """It said "no piece <2up> for data.pairs ...: train one with these (a new train.run_dir)" to a user who was
    translating: the tags were checked before the tokenizer's fingerprint."""
    import shutil

    from transformer.cli import main

    bilingual = tmp_path / "bilingual"
    overrides = toy_overrides(corpus, bilingual, max_steps=1, save_every=1)
    assert main(["train", str(corpus / "two.yaml"), *overrides, "data.src_lang=src", "data.tgt_lang=up", *TINY]) == 0
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(checkpoint, mixed)
    shutil.copy(bilingual / "spm.model", mixed)
    capsys.readouterr()
    assert main(["translate", "--checkpoint", str(mixed / checkpoint.name), "--tgt-lang", "up", "alpha"]) == 2
    assert capsys.readouterr().err == (f"error: {mixed / checkpoint.name}: trained with another tokenizer than "
                                       f"{mixed / 'spm.model'}; put the tokenizer of the run that wrote the "
                                       f"checkpoint there\n")


@pytest.mark.parametrize("options, says", [
    ({"prefixes": ["<2cap> ALPHA"]}, "prefix 1 holds <2cap>, a language tag"),
    ({"constraints": [["BETA", "<2cap>"]]}, "sentence 1: constraint 2 holds <2cap>, a language tag"),
])
def test_a_language_tag_in_a_prefix_or_constraint_is_refused(translator, options, says):
    """A tag given as a prefix was forced into the translation, which then began with it ("<2fr> side.")."""
    with pytest.raises(InputError, match=f"^{says}: a tag leads the source, not its translation; give the target "
                                         f"language as tgt_lang"):
        translator.translate(["alpha beta"], tgt_lang="up", **options)
    assert translator.translate(["alpha beta"], tgt_lang="up", prefixes=["<2 ALPHA"])  # no tag: text like any


def test_a_tag_of_the_vocabulary_is_refused_whatever_the_config_names(translator):
    """A fine-tuned child keeps its parent's vocabulary and tags, with data.pairs of fewer directions or none: the
    tags of its config alone were refused."""
    import dataclasses

    from transformer.data.tokenizer import Tokenizer
    from transformer.decoding.inputs import forced_ids

    for pairs in (["src-up"], []):
        data = dataclasses.replace(translator.data_config(), pairs=pairs, src_lang="src", tgt_lang="up")
        tokenizer = Tokenizer(translator.tokenizer.models, data)
        with pytest.raises(InputError, match="^prefix 1 holds <2cap>, a language tag"):
            forced_ids(tokenizer, ["<2cap> ALPHA"], 1, 64, "prefix")


def test_a_multilingual_run_resumed_beside_a_bilingual_tokenizer_names_the_tokenizer(corpus, tmp_path):
    """Resuming said "no piece <2up> for data.pairs ...: train one with these" of another run's spm.model."""
    from transformer.cli import main
    from transformer.data.tokenizer import TokenizerError
    from transformer.training import train

    run, bilingual = tmp_path / "run", tmp_path / "bilingual"
    assert main(["train", str(corpus / "two.yaml"), *toy_overrides(corpus, run, max_steps=1, save_every=1), *PAIRS,
                 *TINY]) == 0
    assert main(["train", str(corpus / "two.yaml"), *toy_overrides(corpus, bilingual, max_steps=1, save_every=1),
                 "data.src_lang=src", "data.tgt_lang=up", *TINY]) == 0
    (run / "spm.model").write_bytes((bilingual / "spm.model").read_bytes())
    cfg = load_config(run / "config.yaml", ["train.max_steps=2"])
    with pytest.raises(TokenizerError, match="checkpoint_last.pt: trained with another tokenizer than"):
        train(cfg)
