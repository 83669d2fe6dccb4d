"""Multilingual models (Johnson et al., 2017): several directions in one model, a target-language tag
leading each source; the tag is one piece of the joint vocabulary and the model learns to follow it."""

import random
from pathlib import Path

import pytest
from conftest import WORDS, toy_overrides

from transformer.config import ConfigError
from transformer.config_loading import load_config
from transformer.data.languages import tag_sources, target_languages
from transformer.data.loading import load_split
from transformer.data.textio import InputError
from transformer.data.tokenizer import train_tokenizer

# Two "languages" to translate the source words into: upper-cased, and in reverse order
TARGETS = {"up": lambda words: [w.upper() for w in words], "rev": lambda words: words[::-1]}


def write_two_target_corpus(directory: Path, n_train: int = 3000, n_valid: int = 60) -> Path:
    """Line-aligned files {split}.src, {split}.up, {split}.rev: one source, two target languages."""
    rng = random.Random(0)
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_valid)):
        sentences = [rng.choices(WORDS, k=rng.randint(3, 7)) for _ in range(n)]
        (directory / f"{split}.src").write_text("".join(" ".join(words) + "\n" for words in sentences))
        for lang, rule in TARGETS.items():
            (directory / f"{split}.{lang}").write_text("".join(" ".join(rule(words)) + "\n" for words in sentences))
    (directory / "two.yaml").write_text("model: {d_model: 64, n_heads: 4, d_ff: 128, n_encoder_layers: 2, "
                                        "n_decoder_layers: 2, dropout: 0.0, attention_dropout: 0.0}\n")
    return directory


def two_target_config(corpus: Path, run_dir: Path, **train):
    overrides = toy_overrides(corpus, run_dir, **train) + ["data.pairs=src-up,src-rev", "data.tgt_lang=up"]
    return load_config(corpus / "two.yaml", overrides)


@pytest.fixture(scope="module")
def two_target_corpus(tmp_path_factory) -> Path:
    return write_two_target_corpus(tmp_path_factory.mktemp("two_targets"))


def test_a_multilingual_split_holds_every_direction_each_source_led_by_its_target_tag(two_target_corpus, tmp_path):
    cfg = two_target_config(two_target_corpus, tmp_path).data
    valid = load_split(cfg, "valid")
    assert len(valid) == 120
    first, second = valid[0], valid[1]  # the directions take turns
    assert first["src"].startswith("<2up> ") and second["src"].startswith("<2rev> ")
    assert first["src"].removeprefix("<2up> ") == second["src"].removeprefix("<2rev> ")
    assert first["tgt"] == first["src"].removeprefix("<2up> ").upper()
    assert second["tgt"].split() == second["src"].split()[1:][::-1]


def test_each_tag_is_one_piece_of_the_joint_vocabulary(two_target_corpus, tmp_path):
    cfg = two_target_config(two_target_corpus, tmp_path).data
    train = load_split(cfg, "train")
    tokenizer = train_tokenizer(cfg, train["src"], train["tgt"], tmp_path, seed=1)
    plain = tokenizer.encode_src(["alpha beta"])[0]
    for lang in ("up", "rev"):
        (tagged,) = tokenizer.encode_src(tag_sources(["alpha beta"], cfg, lang))
        assert f"<2{lang}>" in tokenizer.src_pieces(tagged)  # whole, after SentencePiece's word-start piece
        assert tagged[-len(plain):] == plain


def test_the_target_language_is_required_and_checked(two_target_corpus, tmp_path):
    cfg = two_target_config(two_target_corpus, tmp_path).data
    assert target_languages(cfg) == ["up", "rev"]
    assert tag_sources(["a b", ""], cfg, "rev") == ["<2rev> a b", ""]
    with pytest.raises(InputError, match=r"target language 'fr': this model translates into up, rev only"):
        tag_sources(["a b"], cfg, "fr")
    with pytest.raises(InputError, match=r"multilingual model translates into up, rev: say which"):
        tag_sources(["a b"], cfg, None)
    bilingual = load_config(None, ["data.src_lang=de", "data.tgt_lang=en"]).data
    assert tag_sources(["a b"], bilingual, None) == tag_sources(["a b"], bilingual, "en") == ["a b"]
    with pytest.raises(InputError, match=r"target language 'fr': this model translates into en only"):
        tag_sources(["a b"], bilingual, "fr")


@pytest.mark.parametrize("pairs, message", [
    ("en-de,en", r"data.pairs: 'en' is not a direction such as en-de"),
    ("en-en", r"data.pairs: 'en-en' is not a direction"),
    ("en-de,en-de", r"data.pairs: a direction is given twice"),
])
def test_bad_pairs_are_one_line_errors(pairs, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [f"data.pairs={pairs}"])
    with pytest.raises(ConfigError, match="data.pairs needs data.joint_vocab=true"):
        load_config(None, ["data.pairs=en-de,de-en", "data.joint_vocab=false"])
