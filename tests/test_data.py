import gzip
import json
import logging
import re

import pytest
from conftest import WORDS, corpus_dir
from datasets import Dataset, Features, Translation

from transformer.config import ConfigError, DataConfig
from transformer.config_loading import load_config
from transformer.data.cleaning import clean_training_pairs, encode_dataset, stream_training_pairs
from transformer.data.corpus import corpus_files, dataset_name
from transformer.data.files import is_line_corpus
from transformer.data.loading import load_split, normalize, select_pair, stream_split
from transformer.data.prepare import tokenizer_sample
from transformer.errors import DataError
from transformer.training import train


def write(path, text: str | bytes, gz: bool = False):
    data = text.encode("utf-8") if isinstance(text, str) else text
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def config(tmp_path, dataset, **overrides) -> DataConfig:
    values = dict(dataset=str(dataset), src_lang="de", tgt_lang="en", cache_dir=str(tmp_path / "cache"))
    values.update(overrides)
    return DataConfig(**values)


def pairs(dataset) -> list[tuple[str, str]]:
    return list(zip(dataset["src"], dataset["tgt"]))


class WordTokenizer:
    """Stands in for SentencePiece: one id per whitespace-separated word; counts its calls."""

    fingerprint = "words"

    def __init__(self):
        self.calls = 0

    def encode_src(self, texts):
        self.calls += 1
        return [[5] * len(text.split()) for text in texts]

    encode_tgt = encode_src


def test_text_pairs_plain_and_gzip_are_normalised_not_otherwise_changed(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    # decomposed é -> NFC; surrounding whitespace stripped; inner double space, tab and NBSP kept
    write(corpus / "train.de", "Cafe\u0301  am\tMeer\n  Nummer\u00a028 \n\nEnde\n")
    write(corpus / "train.en.gz", "Café by the sea\nNumber 28\n\nEnd\n", gz=True)
    dataset = load_split(config(tmp_path, corpus), "train")
    assert pairs(dataset) == [("Café  am\tMeer", "Café by the sea"), ("Nummer\u00a028", "Number 28"), ("", ""),
                              ("Ende", "End")]
    assert normalize(" Cafe\u0301 ") == "Café"


def test_misaligned_files_name_both_files_and_both_counts(tmp_path):
    write(tmp_path / "train.de", "a\nb\nc\n")
    write(tmp_path / "train.en", "a\nb\n")
    with pytest.raises(DataError, match=r"train\.de has 3 lines but .*train\.en has 2"):
        load_split(config(tmp_path, tmp_path), "train")
    write(tmp_path / "train.en", "a\nb\nc\nd\ne\n")
    with pytest.raises(DataError, match=r"train\.de has 3 lines but .*train\.en has 5"):
        load_split(config(tmp_path, tmp_path), "train")


@pytest.mark.parametrize("gz", [False, True])
def test_invalid_utf8_names_the_file_and_line(tmp_path, gz):
    write(tmp_path / "train.de" if not gz else tmp_path / "train.de.gz", "gut\n", gz=gz)
    name = "train.en.gz" if gz else "train.en"
    write(tmp_path / name, b"fine\nbad \xff byte\n", gz=gz)
    with pytest.raises(DataError, match=rf"{name} line 2: invalid UTF-8"):
        load_split(config(tmp_path, tmp_path), "train")


def test_missing_files_and_unknown_languages_are_named(tmp_path):
    write(tmp_path / "train.de", "a\n")
    write(tmp_path / "train.en", "a\n")
    with pytest.raises(DataError, match=r"unknown split 'validation'; the splits are train"):
        load_split(config(tmp_path, tmp_path), "validation")
    with pytest.raises(DataError, match=r"unknown language code 'fr'.*split 'train' in de, en"):
        load_split(config(tmp_path, tmp_path, src_lang="fr"), "train")
    with pytest.raises(DataError, match="not found"):
        load_split(config(tmp_path, tmp_path / "nowhere"), "train")


@pytest.mark.parametrize("src_lang, tgt_lang", [("DE", "EN"), ("xx", "yy")])
def test_a_folder_of_line_files_in_other_languages_is_ours_not_a_hub_layout(tmp_path, src_lang, tgt_lang):
    """data.pairs=EN-DE (or languages the folder lacks) on a folder of train.de / train.en.gz was taken for a hub
    repository's layout, and datasets said "no (supported) data files found": the languages are named instead.
    A hub layout's files (csv, json, a loading script) still go to datasets."""
    write(tmp_path / "train.de", "a\n")
    write(tmp_path / "train.en.gz", "a\n", gz=True)
    with pytest.raises(DataError, match=rf"unknown language code '{src_lang}'.*split 'train' in de, en$"):
        load_split(config(tmp_path, tmp_path, src_lang=src_lang, tgt_lang=tgt_lang), "train")
    hub = tmp_path / "hub"
    hub.mkdir()
    write(hub / "train.csv", "translation\n")
    write(hub / "README.md", "# a dataset card\n")
    assert not is_line_corpus(hub, config(tmp_path, hub))
    for name in ("train.jsonl.zst", "dev.csv.zst", "train.xml", "train.pkl", "train.tgz"):  # not a language
        (hub / name).write_bytes(b"")
    assert not is_line_corpus(hub, config(tmp_path, hub))
    with pytest.raises(DataError, match="data.dataset is empty"):
        load_split(config(tmp_path, ""), "train")


def test_tsv_header_names_the_languages(tmp_path):
    write(tmp_path / "train.tsv", "en\tde\nHello \tHallo\n\t\n")
    assert pairs(load_split(config(tmp_path, tmp_path), "train")) == [("Hallo", "Hello"), ("", "")]
    write(tmp_path / "bad.tsv", "en\tde\nHello\tHallo\tzu viel\n")
    with pytest.raises(DataError, match=r"bad\.tsv line 2: 3 tab-separated fields, expected 2"):
        load_split(config(tmp_path, tmp_path / "bad.tsv"), "train")
    with pytest.raises(DataError, match=r"no column for language 'fr'.*it reads \['en', 'de'\]"):
        load_split(config(tmp_path, tmp_path / "train.tsv", src_lang="fr"), "train")
    write(tmp_path / "headless.tsv", "Hello\tHallo\n")
    with pytest.raises(DataError, match=r"headless.tsv: .*the first line must name the language of each column "
                                        r"\(such as de<TAB>en\), and it reads \['Hello', 'Hallo'\]"):
        load_split(config(tmp_path, tmp_path / "headless.tsv"), "train")


def test_jsonl_takes_both_hub_layouts(tmp_path):
    lines = [{"de": "Hallo", "en": "Hello"}, {"translation": {"en": "Bye", "de": "Tschüss"}}]
    write(tmp_path / "train.jsonl", "\n".join(json.dumps(line) for line in lines) + "\n")
    assert pairs(load_split(config(tmp_path, tmp_path), "train")) == [("Hallo", "Hello"), ("Tschüss", "Bye")]
    write(tmp_path / "missing.jsonl", '{"de": "a", "en": "b"}\n{"de": "a"}\n')
    with pytest.raises(DataError, match=r"missing\.jsonl line 2: no text for language 'en'"):
        load_split(config(tmp_path, tmp_path / "missing.jsonl"), "train")
    write(tmp_path / "broken.jsonl", '{"de": "a", "en": "b"}\n{"de": \n')
    with pytest.raises(DataError, match=r"broken\.jsonl line 2, column 8: invalid JSON \(Expecting value\)$"):
        load_split(config(tmp_path, tmp_path / "broken.jsonl"), "train")
    write(tmp_path / "unclosed.jsonl", '{"de": "a", "en": "b"}\n{"de": "broken\n')  # was "Invalid control character at"
    with pytest.raises(DataError, match=r"unclosed\.jsonl line 2, column 8: invalid JSON \(Unterminated string "
                                        r"starting\)$"):
        load_split(config(tmp_path, tmp_path / "unclosed.jsonl"), "train")


@pytest.mark.parametrize("name", ["pairs.tsv", "pairs.jsonl.gz"])
def test_a_single_file_is_the_train_split_only(tmp_path, name):
    # as datasets.load_dataset("csv"/"json", data_files=FILE) reads it: serving every split, one file had runs
    # validate and evaluate on their own training pairs without a word
    text = "de\ten\nHallo\tHello\n" if name.endswith(".tsv") else '{"de": "Hallo", "en": "Hello"}\n'
    path = write(tmp_path / name, text, gz=name.endswith(".gz"))
    cfg = config(tmp_path, path)
    for split in ("train", "training"):
        assert pairs(load_split(cfg, split)) == [("Hallo", "Hello")]
        assert pairs(stream_split(cfg, split)) == [("Hallo", "Hello")]
        assert corpus_files(cfg, split) == [path]
    assert dataset_name(cfg) == f"{name} (a local file: train)"  # model cards listed every split for it
    assert dataset_name(config(tmp_path, tmp_path / "gone" / name)) == f"{name} (a local file: train)"  # not here
    suffix = ".jsonl" if "jsonl" in name else ".tsv"
    for split in ("validation", "val", "test"):
        message = (rf"{name}: a single file is the 'train' split only, so it has no split '{split}': hold pairs "
                   rf"out of it with slices \(data.valid_split='train\[:1000\]' "
                   rf"data.test_split='train\[1000:2000\]' data.train_split='train\[2000:\]'\), or set "
                   rf"data.dataset to a folder holding a file per split, such as train{suffix}, "
                   rf"validation{suffix} and test{suffix}$")
        for read in (load_split, stream_split, corpus_files):
            with pytest.raises(DataError, match=message):
                read(cfg, split)


def test_training_on_a_single_file_validates_on_a_slice_held_out_of_it(tmp_path):
    lines = [f"{w} {v}\t{w.upper()} {v.upper()}\n" for w in WORDS for v in WORDS]
    path = write(tmp_path / "pairs.tsv", "src\ttgt\n" + "".join(lines))
    settings = [f"data.dataset={path}", "data.src_lang=src", "data.tgt_lang=tgt", "data.vocab_size=320",
                "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.n_encoder_layers=1",
                "model.n_decoder_layers=1", "train.max_steps=2", "train.valid_every=2", "train.threads=1",
                "train.device=cpu", "data.batch_tokens=256", "data.max_length=32", "decode.beam_size=1"]
    with pytest.raises(DataError, match=r"pairs\.tsv: a single file is the 'train' split only, so it has no "
                                        r"split 'validation'"):
        train(load_config(None, [*settings, f"train.run_dir={tmp_path / 'refused'}"]))
    assert not (tmp_path / "refused").exists()  # found out before a tokenizer is trained, or anything written
    for valid, refusal in (("train[-50:", r"split 'train\[-50:': expected a split's name"),
                           ("train[-50:]", r"data.valid_split 'train\[-50:\]' shares 50 of the \d+ pairs of 'train' "
                                           r"with data.train_split 'train': train on the rest "
                                           r"\(data.train_split='train\[:-50\]'\)")):
        with pytest.raises(DataError, match=refusal):
            train(load_config(None, [*settings, f"data.valid_split={valid}", f"train.run_dir={tmp_path / 'bad'}"]))
    run_dir = tmp_path / "run"
    train(load_config(None, [*settings, "data.train_split=train[:-50]", "data.valid_split=train[-50:]",
                             f"train.run_dir={run_dir}"]))
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records if record.get("kind") == "valid"] == [2]


def test_a_split_can_be_a_slice_of_its_pairs_as_datasets_writes_one(tmp_path):
    path = write(tmp_path / "pairs.tsv", "de\ten\n" + "".join(f"a{i}\tb{i}\n" for i in range(10)))
    cfg = config(tmp_path, path, train_split="train[:-3]", valid_split="train[-3:]")
    sources = {split: load_split(cfg, split)["src"] for split in
               ("train[:-3]", "train[-3:]", "train[:50%]", "train[2:4]", "training[-30%:]", "train[:]")}
    assert sources == {"train[:-3]": [f"a{i}" for i in range(7)], "train[-3:]": ["a7", "a8", "a9"],
                       "train[:50%]": [f"a{i}" for i in range(5)], "train[2:4]": ["a2", "a3"],
                       "training[-30%:]": ["a7", "a8", "a9"], "train[:]": [f"a{i}" for i in range(10)]}
    assert [row["src"] for row in stream_split(cfg, "train[2:5]")] == ["a2", "a3", "a4"]
    assert [row["src"] for row in stream_split(cfg, "train[7:]")] == ["a7", "a8", "a9"]
    assert corpus_files(cfg, "train[-3:]") == [path] and dataset_name(cfg) == "pairs.tsv (a local file: train[:-3])"
    for split in ("train[-3]", "train[:150%]", "train[1:2:3]", "train [:3]"):
        with pytest.raises(DataError, match=rf"split '{re.escape(split)}': expected a split's name, or a name and a "
                                            rf"slice of its pairs such as train\[:-1000\]"):
            load_split(cfg, split)
    with pytest.raises(DataError, match=r"pairs\.tsv: split 'train\[20:\]' selects none of the 10 pairs of 'train'"):
        load_split(cfg, "train[20:]")
    with pytest.raises(DataError, match=r"split 'train\[-3:\]' of a stream \(data.streaming=true\) must count its "
                                        r"pairs from the start, such as train\[:1000\] and train\[1000:\]"):
        list(stream_split(cfg, "train[-3:]"))
    for train_split, shared, remedy in (("train", 3, "train on the rest (data.train_split='train[:-3]')"),
                                        ("train[:-2]", 1, "hold out the pairs training leaves "
                                                          "(data.valid_split='train[-2:]')"),
                                        ("train[3:]", 3, "hold out the pairs training leaves "
                                                         "(data.valid_split='train[:3]')")):
        with pytest.raises(DataError, match=rf"shares {shared} of the 10 pairs of 'train' with data.train_split "
                                            rf"'{re.escape(train_split)}': {re.escape(remedy)}$"):
            load_split(config(tmp_path, path, train_split=train_split, valid_split="train[-3:]"), "train[-3:]")
    with pytest.raises(DataError, match=r"\(data.train_split='training\[3:\]'\)"):  # another name of the split
        load_split(config(tmp_path, path, train_split="train", valid_split="training[:3]"), "training[:3]")


def test_hub_layouts_translation_column_or_one_column_per_language():
    features = Features({"translation": Translation(languages=["de", "en"])})
    nested = Dataset.from_dict({"translation": [{"de": " Hallo ", "en": "Hello"}]}, features=features)
    assert pairs(select_pair(nested, "de", "en", "wmt")) == [("Hallo", "Hello")]
    flat = Dataset.from_dict({"en": ["Hello"], "de": ["Hallo"], "id": [7]})
    assert select_pair(flat, "en", "de", "multi30k").column_names == ["src", "tgt"]
    assert list(select_pair(flat.to_iterable_dataset(), "de", "en", "stream")) == [{"src": "Hallo", "tgt": "Hello"}]
    with pytest.raises(DataError, match="multi30k: missing column 'fr'.*columns: en, de, id"):
        select_pair(flat, "fr", "de", "multi30k")
    with pytest.raises(DataError, match="wmt: unknown language code 'fr'.*has de, en"):
        select_pair(nested, "de", "fr", "wmt")


def test_hub_names_are_not_fetched_offline_and_a_path_like_name_says_it_is_neither(tmp_path):
    with pytest.raises(DataError) as error:
        load_split(config(tmp_path, "no-such-user/no-such-corpus"), "train")
    message = str(error.value)
    assert "\n" not in message and "no local directory or file" in message
    assert "cannot be loaded from the hub" in message
    assert "go online" in message  # offline here (conftest): the way out is named
    with pytest.raises(DataError, match=r"^cannot load hub dataset 'wmt14_offline'"):
        load_split(config(tmp_path, "wmt14_offline"), "train")


def test_script_based_hub_dataset_is_one_line_saying_what_to_use(tmp_path):
    repository = tmp_path / "iwslt2017"  # the layout of a script-based hub dataset: a loading script, no data files
    repository.mkdir()
    write(repository / "iwslt2017.py", "import datasets\n")
    with pytest.raises(DataError) as error:
        load_split(config(tmp_path, repository), "train")
    assert "is script-based" in str(error.value) and "parquet" in str(error.value) and "\n" not in str(error.value)


def test_a_folder_with_no_data_files_is_named_as_a_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"^cannot load dataset folder '.*empty'"):
        load_split(config(tmp_path, tmp_path / "empty"), "train")


def write_parquet_repository(root, layout: str, splits: dict[str, list[tuple[str, str]]], shards: int = 1):
    """A folder laid out like a hub dataset repository: data/{split}-0000i-of-0000n.parquet, in the
    bentrevett/multi30k layout (a column per language) or the wmt layout (a translation column)."""
    (root / "data").mkdir(parents=True)
    for split, rows in splits.items():
        for shard in range(shards):
            part = rows[shard::shards]
            if layout == "columns":
                table = {"de": [de for de, _ in part], "en": [en for _, en in part]}
            else:
                table = {"translation": [{"de": de, "en": en} for de, en in part]}
            Dataset.from_dict(table).to_parquet(str(root / "data" / f"{split}-{shard:05d}-of-{shards:05d}.parquet"))
    return root


@pytest.mark.parametrize("layout", ["columns", "translation"])
def test_hub_layout_folder_loads_through_load_dataset_with_split_aliases(tmp_path, layout):
    rows = {"train": [("Hallo", "Hello"), ("Tschüss ", "Bye")], "validation": [("ja", "yes")], "test": [("nein", "no")]}
    repository = write_parquet_repository(tmp_path / layout, layout, rows)
    cfg = config(tmp_path, repository)
    assert pairs(load_split(cfg, "train")) == [("Hallo", "Hello"), ("Tschüss", "Bye")]
    assert pairs(load_split(cfg, "val")) == [("ja", "yes")]  # the local Multi30k's names, resolved
    assert pairs(load_split(cfg, "test2016")) == [("nein", "no")]
    streaming = config(tmp_path, repository, streaming=True)
    assert pairs(load_split(streaming, "val")) == [("ja", "yes")]
    for hub in (cfg, streaming):  # slices of a hub split, as of our own files
        assert pairs(load_split(hub, "train[1:]")) == [("Tschüss", "Bye")]
        assert [(row["src"], row["tgt"]) for row in stream_split(hub, "training[:1]")] == [("Hallo", "Hello")]
    with pytest.raises(DataError, match=r"unknown split 'test2017'; the splits are test, train, validation"):
        load_split(cfg, "test2017")


def test_local_split_names_resolve_through_the_alias_table(tmp_path):
    for split in ("train", "val", "test2016"):
        write(tmp_path / f"{split}.de", f"{split}\n")
        write(tmp_path / f"{split}.en", f"{split}\n")
    cfg = config(tmp_path, tmp_path)
    assert load_split(cfg, "validation")["src"] == ["val"] and load_split(cfg, "dev")["src"] == ["val"]
    assert load_split(cfg, "test")["src"] == ["test2016"]
    with pytest.raises(DataError, match=r"unknown split 'test2017'; the splits are test2016, train, val"):
        load_split(cfg, "test2017")


def test_max_train_samples_shortens_only_the_training_split(tmp_path):
    for split in ("train", "val"):
        write(tmp_path / f"{split}.de", "a\nb\nc\n")
        write(tmp_path / f"{split}.en", "a\nb\nc\n")
    cfg = config(tmp_path, tmp_path, max_train_samples=2, cache_dir=None)
    assert len(load_split(cfg, "train", tmp_path / "run")) == 2 and len(load_split(cfg, "val", tmp_path / "run")) == 3
    assert (tmp_path / "run").is_dir()  # the cache_dir argument wins over the config's


def test_cleaning_drops_and_counts_empty_long_and_ratio_outliers(tmp_path, caplog):
    texts = [("ein Hund", "a dog"), ("", "empty source"), ("leeres Ziel", ""),
             ("eins zwei drei vier fünf sechs", "one two three four five six"),  # 6 > max_length
             ("ja", "yes indeed it is so"),  # ratio 4 > 2
             ("ein sehr langer Satz", "a long one")]
    dataset = Dataset.from_dict({"src": [x for x, _ in texts], "tgt": [y for _, y in texts]})
    cfg = config(tmp_path, tmp_path, max_length=5, max_length_ratio=2.0)
    with caplog.at_level(logging.INFO, logger="transformer.data"):
        cleaned, counts = clean_training_pairs(dataset, cfg, WordTokenizer())
    assert counts == {"pairs": 6, "empty": 2, "too_long": 1, "length_ratio": 1, "kept": 2}
    assert pairs(cleaned) == [texts[0], texts[5]]
    assert cleaned["src_ids"] == [[5, 5], [5, 5, 5, 5]] and cleaned["tgt_len"] == [2, 3]
    assert "kept 2 of 6" in caplog.text


def test_encoded_ids_are_cached_by_data_and_tokenizer(tmp_path):
    dataset = Dataset.from_dict({"src": ["a b", "c"], "tgt": ["x", "y z"]})
    tokenizer = WordTokenizer()
    first = encode_dataset(dataset, tokenizer, tmp_path / "cache")
    again = encode_dataset(dataset, tokenizer, tmp_path / "cache")
    assert tokenizer.calls == 2  # one batch, both sides, once: the second call read the cache
    assert again.cache_files == first.cache_files and again["src_ids"] == [[5, 5], [5]]
    other = WordTokenizer()
    other.fingerprint = "another tokenizer"
    encode_dataset(dataset, other, tmp_path / "cache")
    assert other.calls == 2


def test_stream_is_sharded_disjointly_and_cleaned(tmp_path):
    n = 50
    write(tmp_path / "train.de", "".join(f"satz {i}\n" for i in range(n)) + "\n")  # one empty pair
    write(tmp_path / "train.en", "".join(f"sentence {i}\n" for i in range(n)) + "\n")
    cfg = config(tmp_path, tmp_path, shuffle_buffer=8)
    shards = [[row["src"] for row in stream_training_pairs(cfg, WordTokenizer(), seed=3, rank=rank, world_size=2)]
              for rank in range(2)]
    assert sorted(shards[0] + shards[1]) == sorted(f"satz {i}" for i in range(n))
    again = stream_training_pairs(cfg, WordTokenizer(), seed=3, rank=0, world_size=2)
    assert [row["src"] for row in again] == shards[0] and shards[0] != sorted(shards[0])  # shuffled, reproducibly
    again.set_epoch(1)
    assert [row["src"] for row in again] != shards[0]


def write_shards(root, shards: int, lines_per_shard: int, gz: bool = True):
    """train-0000i-of-0000n.{de,en}.gz whose lines name their shard: "shard 2 line 7"."""
    root.mkdir(parents=True, exist_ok=True)
    for shard in range(shards):
        for lang in ("de", "en"):
            text = "".join(f"shard {shard} line {i}\n" for i in range(lines_per_shard))
            write(root / f"train-{shard:05d}-of-{shards:05d}.{lang}{'.gz' if gz else ''}", text, gz=gz)
    return root


def test_each_rank_reads_only_its_own_shards_of_a_local_corpus(tmp_path):
    corpus = write_shards(tmp_path / "corpus", shards=4, lines_per_shard=30)
    cfg = config(tmp_path, corpus, shuffle_buffer=16)
    assert len(load_split(cfg, "train")) == 120 and stream_split(cfg, "train").num_shards == 4
    streams = [stream_training_pairs(cfg, WordTokenizer(), seed=1, rank=rank, world_size=2) for rank in range(2)]
    seen = [{row["src"].split(" line")[0] for row in stream} for stream in streams]
    assert len(seen[0]) == len(seen[1]) == 2 and not seen[0] & seen[1]  # whole shards, disjoint: nothing skipped
    for lang in ("de", "en"):  # a shard gone was skipped without a word ("kept 90 of 90")
        (corpus / f"train-00002-of-00004.{lang}.gz").unlink()
    with pytest.raises(DataError, match=r"split 'train' is cut into 4 shards \(de\), and train-00002-of-00004.de is "
                                        r"missing"):
        load_split(cfg, "train")


def test_max_train_samples_of_a_stream_are_the_same_pairs_under_torchrun(tmp_path):
    """The ranks share the first N pairs a single process reads: each rank took N / ranks pairs of its own shards
    (of 4 shards of 30, one process read shard 0 and a third of shard 1; two ranks, 20 of shards 0 and 1)."""
    corpus = write_shards(tmp_path / "corpus", shards=4, lines_per_shard=30)
    cfg = config(tmp_path, corpus, shuffle_buffer=16, max_train_samples=40)
    one = stream_training_pairs(cfg, WordTokenizer(), seed=1)
    ranks = [stream_training_pairs(cfg, WordTokenizer(), seed=1, rank=rank, world_size=2) for rank in range(2)]
    for epoch in range(2):
        for stream in (one, *ranks):
            stream.set_epoch(epoch)
        first = [row["src"] for row in one]
        assert sorted(first) == sorted([f"shard 0 line {i}" for i in range(30)] +
                                       [f"shard 1 line {i}" for i in range(10)])
        read = [[row["src"] for row in stream] for stream in ranks]
        assert len(read[0]) == len(read[1]) == 20 and sorted(read[0] + read[1]) == sorted(first)


def test_a_sliced_stream_is_the_same_pairs_under_torchrun(tmp_path):
    corpus = write_shards(tmp_path / "corpus", shards=4, lines_per_shard=30)
    cfg = config(tmp_path, corpus, shuffle_buffer=16, train_split="train[20:50]")
    first = [row["src"] for row in stream_training_pairs(cfg, WordTokenizer(), seed=1)]
    assert sorted(first) == sorted([f"shard 0 line {i}" for i in range(20, 30)] +
                                   [f"shard 1 line {i}" for i in range(20)])
    read = [[row["src"] for row in stream_training_pairs(cfg, WordTokenizer(), seed=1, rank=rank, world_size=2)]
            for rank in range(2)]
    assert len(read[0]) == len(read[1]) == 15 and sorted(read[0] + read[1]) == sorted(first)


def test_too_few_shards_for_the_ranks_is_a_warning_of_rank_0(tmp_path, caplog):
    corpus = write_shards(tmp_path / "corpus", shards=1, lines_per_shard=10)
    with caplog.at_level(logging.WARNING, logger="transformer.data"):
        stream_training_pairs(config(tmp_path, corpus), WordTokenizer(), seed=1, rank=1, world_size=2)
        assert caplog.text == ""  # every rank said it
        stream_training_pairs(config(tmp_path, corpus), WordTokenizer(), seed=1, rank=0, world_size=2)
    assert "1 shard(s), not a multiple of 2 ranks" in caplog.text


def test_streaming_tokenizer_sample_is_bounded_by_its_setting(tmp_path):
    corpus = write_shards(tmp_path / "corpus", shards=2, lines_per_shard=500)
    cfg = config(tmp_path, corpus, streaming=True, spm_input_sentence_size=300, shuffle_buffer=100)
    src, tgt = tokenizer_sample(cfg, seed=1, cache_dir=tmp_path / "cache")
    assert len(src) == len(tgt) == 300 and len({s.split(" line")[0] for s in src}) == 2  # shuffled over shards
    with pytest.raises(ConfigError, match="data.spm_input_sentence_size"):
        config(tmp_path, corpus, streaming=True, spm_input_sentence_size=0)


@pytest.mark.corpus
def test_multi30k_splits_load_in_full(tmp_path):
    cfg = config(tmp_path, corpus_dir("multi30k"))
    sizes = {split: len(load_split(cfg, split)) for split in ("train", "val", "test2016")}
    assert sizes == {"train": 29000, "val": 1014, "test2016": 1000}
    train = load_split(cfg, "train")
    assert "\t" in train[7365]["src"]  # the one tab of train.de (line 7366) is kept inside its line
