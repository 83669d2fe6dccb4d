import re
import subprocess
import sys

import pytest
import torch
from conftest import subprocess_env

from transformer.config import DataConfig
from transformer.data.loading import load_split
from transformer.data.tokenizer import Tokenizer, TokenizerError, train_tokenizer

DE = ["Ein Hund läuft über die Wiese.", "Zwei Kinder spielen im Park.", "Eine Frau liest ein Buch.",
      "Ein Mann fährt Fahrrad auf der Straße."] * 10
EN = ["A dog runs across the meadow.", "Two children play in the park.", "A woman reads a book.",
      "A man rides a bike on the street."] * 10


def tiny_config(**overrides) -> DataConfig:
    return DataConfig(**{"vocab_size": 300, **overrides})


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    return train_tokenizer(tiny_config(), DE, EN, tmp_path_factory.mktemp("run"), seed=1)


def test_training_is_deterministic_for_a_seed(tmp_path):
    cfg = tiny_config(spm_input_sentence_size=150)  # sampling the input is seeded too
    first = train_tokenizer(cfg, DE * 4, EN * 4, tmp_path / "a", seed=7)
    train_tokenizer(cfg, DE * 4, EN * 4, tmp_path / "b", seed=7)
    assert first.files == ["spm.model"]
    assert (tmp_path / "a" / "spm.model").read_bytes() == (tmp_path / "b" / "spm.model").read_bytes()


TRAIN_WITH_SAMPLING = """
import hashlib, random
from transformer.config import DataConfig
from transformer.data.tokenizer import _train_model
rng = random.Random(0)
words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 7))) for _ in range(3000)]
texts = [" ".join(rng.choice(words) for _ in range(10)) for _ in range(2000)]
cfg = DataConfig(vocab_size=300, spm_input_sentence_size=500, spm_threads=1)
print(*(hashlib.md5(_train_model(texts, cfg, seed)).hexdigest() for seed in (7, 8)))
"""


def test_a_sampled_tokenizer_input_gives_the_same_model_in_every_process():
    """SentencePiece's own sampling (input_sentence_size) ignored the seed: another model in each new process."""
    runs = [subprocess.run([sys.executable, "-c", TRAIN_WITH_SAMPLING], env=subprocess_env(), capture_output=True,
                           text=True, check=True).stdout.split() for _ in range(2)]
    assert runs[0] == runs[1] and runs[0][0] != runs[0][1]  # the seed decides, and only the seed


def test_round_trip_keeps_inner_whitespace_and_unseen_characters(tokenizer):
    texts = ["Zwei  Kinder\tspielen", "Nummer\u00a028", "Ω ☃ nie gesehen", "", "Café"]
    assert tokenizer.decode_tgt(tokenizer.encode_tgt(texts)) == texts
    assert tokenizer.decode_tgt(tokenizer.encode_src(texts)) == texts  # joint: one model for both sides
    assert tokenizer.unk_id not in sum(tokenizer.encode_src(texts), [])  # bytes, not <unk>


def test_ids_have_no_specials_and_decoding_stops_at_eos(tokenizer):
    (ids,) = tokenizer.encode_tgt(["A dog runs."])
    specials = {tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id}
    assert ids and not specials & set(ids)
    bos, eos, pad = tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id
    assert tokenizer.decode_tgt([[bos, *ids, eos, *ids, pad]]) == ["A dog runs."]
    search_output = torch.tensor([[*ids, eos, pad], [eos] + [pad] * (len(ids) + 1)])
    assert tokenizer.decode_tgt(search_output) == ["A dog runs.", ""]


def test_a_translation_has_no_spaces_around_it(tokenizer):
    """A hypothesis that ends (or starts) with a bare "▁" piece decoded to a trailing (or leading) space, which the
    n-best lists and files showed ("une une  ||| -18.49"); no training target has one."""
    (ids,) = tokenizer.encode_tgt(["A dog runs."])
    space = tokenizer.encode_tgt([" "])[0] or tokenizer.encode_tgt(["A dog runs. "])[0][-1:]
    assert tokenizer.decode_tgt([[*space, *ids, *space]]) == ["A dog runs."]
    assert tokenizer.decode_tgt(tokenizer.encode_tgt(["Zwei  Kinder\tspielen"])) == ["Zwei  Kinder\tspielen"]


def test_special_ids_come_from_the_config(tmp_path):
    cfg = tiny_config(pad_id=3, unk_id=0, bos_id=1, eos_id=2)
    trained = train_tokenizer(cfg, DE, EN, tmp_path, seed=1)
    assert (trained.pad_id, trained.unk_id, trained.bos_id, trained.eos_id) == (3, 0, 1, 2)
    with pytest.raises(TokenizerError, match=r"spm.model: special ids .* differ from the config's"):
        Tokenizer.load(tmp_path, tiny_config())


def test_one_model_per_language(tmp_path):
    cfg = tiny_config(joint_vocab=False)
    trained = train_tokenizer(cfg, DE, EN, tmp_path, seed=1)
    assert trained.files == ["spm.de.model", "spm.en.model"]
    loaded = Tokenizer.load(tmp_path, cfg)
    assert loaded.fingerprint == trained.fingerprint
    assert loaded.src_pieces("Wiese") != loaded.tgt_pieces(loaded.encode_tgt(["Wiese"])[0])  # different models
    assert loaded.decode_tgt(loaded.encode_tgt(EN[:4])) == EN[:4]


def test_load_names_the_missing_file(tmp_path):
    """In the folder it was read from (a damaged spm.model of an exported folder said "spm.model" alone), and
    without telling the user of an exported folder to train one."""
    with pytest.raises(TokenizerError, match=r"^cannot read tokenizer model .*spm\.model: .*; it lies beside the model "
                                             r"it was trained with \(a run directory or an exported folder\)$"):
        Tokenizer.load(tmp_path, tiny_config())
    (tmp_path / "spm.model").write_bytes(b"not a model")
    with pytest.raises(TokenizerError, match=f"^{re.escape(str(tmp_path / 'spm.model'))}: not a SentencePiece model"):
        Tokenizer.load(tmp_path, tiny_config())


def test_too_small_a_vocabulary_is_a_clear_error_naming_the_settings(tmp_path):
    """SentencePiece's message said "decrease character_coverage with --character_coverage option": its flag."""
    with pytest.raises(TokenizerError, match=r"^data.vocab_size=50 is smaller than the \d+ pieces the training "
                                             r"text's characters need \(with the special pieces\): raise "
                                             r"data.vocab_size above \d+, or lower data.character_coverage=1.0 so "
                                             r"that rare characters are spelt in bytes$"):
        train_tokenizer(tiny_config(vocab_size=50), DE, EN, tmp_path, seed=1)


def test_pieces_label_attention_plots(tokenizer):
    text = "Ein Hund läuft."
    (ids,) = tokenizer.encode_src([text])
    pieces = tokenizer.src_pieces(text)
    assert "".join(pieces).replace("▁", " ").strip() == text
    assert tokenizer.src_pieces(ids) == pieces
    assert tokenizer.tgt_pieces([*ids, tokenizer.eos_id])[-1] == "</s>"


@pytest.mark.corpus
def test_multi30k_round_trip_on_every_sentence(multi30k):
    cfg, tokenizer = multi30k
    assert tokenizer.src_vocab_size == tokenizer.tgt_vocab_size == cfg.vocab_size
    for split in ("train", "val", "test2016"):
        pairs = load_split(cfg, split)
        for texts in (pairs["src"], pairs["tgt"]):
            texts = list(texts)
            decoded = tokenizer.decode_tgt(tokenizer.encode_src(texts))
            assert [x for x, y in zip(texts, decoded) if x != y] == [], split
