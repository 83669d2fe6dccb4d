"""A user's own corpus, as a fairseq, OpenNMT-py, Marian or HuggingFace user brings it: what goes wrong is one line
naming the file or setting at fault, found before work is done, and no work is lost."""

import logging

import pytest
from conftest import WORDS
from datasets import Dataset
from test_data import config, write

from transformer.config_loading import load_config
from transformer.data.corpus import dataset_name
from transformer.data.loading import load_split
from transformer.data.prepare import tokenizer_sample
from transformer.errors import DataError
from transformer.training import train


def numbered_tsv(path, count: int):
    return write(path, "de\ten\n" + "".join(f"a{i}\tb{i}\n" for i in range(count)))


TINY = ["data.vocab_size=320", "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.n_encoder_layers=1",
        "model.n_decoder_layers=1", "train.max_steps=1", "train.valid_every=1", "train.threads=1", "train.device=cpu",
        "data.batch_tokens=256", "data.max_length=32", "decode.beam_size=1"]


@pytest.mark.parametrize("streaming", [False, True])
def test_a_validation_slice_sharing_training_pairs_is_refused_before_the_tokenizer_is_trained(tmp_path, streaming):
    # refused after it, the run directory kept a tokenizer of data.train_split=train, and the command the error
    # asked for was refused in turn: "its tokenizer was trained with data.train_split=train ... remove spm.model"
    lines = [f"{w} {v}\t{w.upper()} {v.upper()}\n" for w in WORDS for v in WORDS]
    path = write(tmp_path / "pairs.tsv", "src\ttgt\n" + "".join(lines))
    run_dir = tmp_path / "run"
    settings = [*TINY, f"data.dataset={path}", "data.src_lang=src", "data.tgt_lang=tgt", f"train.run_dir={run_dir}",
                f"data.streaming={str(streaming).lower()}", "data.valid_split=train[:50]"]
    with pytest.raises(DataError, match=r"data.valid_split 'train\[:50\]' shares 50 .*pairs of 'train' with "
                                        r"data.train_split 'train': train on the rest "
                                        r"\(data.train_split='train\[50:\]'\)"):
        train(load_config(None, settings))
    assert not (run_dir / "spm.model").exists()
    train(load_config(None, [*settings, "data.train_split=train[50:]"]))  # the command set as the error says
    assert (run_dir / "checkpoint_last.pt").exists()


def test_a_whole_validation_split_beside_a_sliced_training_split_is_refused(tmp_path):
    path = numbered_tsv(tmp_path / "pairs.tsv", 10)
    cfg = config(tmp_path, path, train_split="train[:-3]", valid_split="train")
    with pytest.raises(DataError, match=r"data.valid_split 'train' shares 7 of the 10 pairs of 'train' with "
                                        r"data.train_split 'train\[:-3\]': hold out the pairs training leaves "
                                        r"\(data.valid_split='train\[-3:\]'\)"):
        load_split(cfg, "train")
    assert len(load_split(config(tmp_path, path, train_split="train", valid_split="train"), "train")) == 10  # a choice


def test_a_streamed_validation_slice_reads_only_its_pairs(tmp_path):
    # it read the whole split: a hub stream into memory, local files into an Arrow copy of a corpus that streams
    # because it is large; a broken line far past the slice shows what is read
    write(tmp_path / "train.de", "".join(f"a{i}\n" for i in range(10)).encode() + b"\xff\n")
    write(tmp_path / "train.en", "".join(f"b{i}\n" for i in range(11)))
    cfg = config(tmp_path, tmp_path, streaming=True, train_split="train[3:]", valid_split="train[:3]")
    assert load_split(cfg, "train[:3]")["src"] == ["a0", "a1", "a2"]
    assert load_split(cfg, "train[1:3]")["src"] == ["a1", "a2"]
    assert not (tmp_path / "cache").exists()
    with pytest.raises(DataError, match=r"split 'train\[2:2\]' selects none of the pairs of 'train'"):
        load_split(cfg, "train[2:2]")
    with pytest.raises(DataError, match=r"data.valid_split 'train\[:3\]' shares 1 pair of 'train' with "
                                        r"data.train_split 'train\[2:\]'"):
        load_split(config(tmp_path, tmp_path, streaming=True, train_split="train[2:]", valid_split="train[:3]"),
                   "train[:3]")


def test_an_empty_streamed_training_split_is_one_line_not_a_sentencepiece_error(tmp_path):
    # SentencePiece said "INTERNAL: src/trainer_interface.cc(467) [!sentences_.empty()]"
    path = numbered_tsv(tmp_path / "pairs.tsv", 10)
    cfg = config(tmp_path, path, streaming=True, train_split="train[20:]", valid_split="train[:5]")
    with pytest.raises(DataError, match=r"pairs\.tsv: training split 'train\[20:\]' has no source text \(no pairs, or "
                                        r"blank lines alone\)"):
        tokenizer_sample(cfg, seed=1, cache_dir=tmp_path / "cache")


@pytest.mark.parametrize("streaming", [False, True])
def test_a_training_split_of_blank_lines_is_one_line_not_a_sentencepiece_error(tmp_path, streaming):
    """Blank lines passed the check for no pairs (streamed), or met none (not streamed): SentencePiece's
    "INTERNAL: src/trainer_interface.cc(467) [!sentences_.empty()]"."""
    for lang in ("de", "en"):
        write(tmp_path / f"train.{lang}", "\n" * 50)
        write(tmp_path / f"valid.{lang}", "a\nb\n")
    cfg = config(tmp_path, tmp_path, streaming=streaming, valid_split="valid")
    with pytest.raises(DataError, match=r"training split 'train' has no source text \(no pairs, or blank lines "
                                        r"alone\)"):
        tokenizer_sample(cfg, seed=1, cache_dir=tmp_path / "cache")


def test_a_gzip_or_utf16_file_under_a_plain_name_says_what_it_is(tmp_path):
    # "invalid UTF-8 (byte 0x8b at column 2)" was all that was said of train.de gzipped, or saved as "Unicode"
    write(tmp_path / "train.de", "Hallo\n", gz=True)
    write(tmp_path / "train.en", "Hello\n".encode("utf-16"))
    with pytest.raises(DataError, match=r"train\.de line 1: invalid UTF-8 \(byte 0x8b at column 2\): the file is "
                                        r"gzip-compressed, and only a name ending in \.gz is read as such \(rename it "
                                        r".*train\.de\.gz\)$"):
        load_split(config(tmp_path, tmp_path), "train")
    write(tmp_path / "train.de", "Hallo\n")
    with pytest.raises(DataError, match=r"train\.en line 1: .*: the file is UTF-16; convert it to UTF-8"):
        load_split(config(tmp_path, tmp_path), "train")


@pytest.mark.parametrize("name", ["train.de", "pairs.csv"])
def test_a_single_file_neither_tsv_nor_jsonl_is_refused_naming_what_to_give(tmp_path, name):
    # it was read as a TSV: "no column for language 'de': the first line must name the language of each column"
    path = write(tmp_path / name, "de,en\nHallo,Hello\n")
    with pytest.raises(DataError, match=rf"{name}: a single file must be TSV \(\.tsv\) or JSON lines \(\.jsonl\), "
                                        rf"gzip allowed .* set data.dataset to their folder$"):
        load_split(config(tmp_path, path), "train")


def test_a_shard_and_its_gzip_copy_side_by_side_is_read_once(tmp_path, caplog):
    # the shard was counted twice: "split 'train' has 2 de file(s) but 1 en file(s)"
    write(tmp_path / "train-00000-of-00001.de", "neu\n")
    write(tmp_path / "train-00000-of-00001.de.gz", "alt\n", gz=True)
    write(tmp_path / "train-00000-of-00001.en", "new\n")
    assert load_split(config(tmp_path, tmp_path), "train")["src"] == ["neu"]
    assert "both train-00000-of-00001.de and train-00000-of-00001.de.gz are there; reading train-00000-of-00001.de" \
        in caplog.text


def test_a_hub_layout_folder_is_named_with_the_splits_it_has(tmp_path):
    # every split was listed ("pq (local files: train, validation, test)") for a folder without a test split: the
    # model card named a split it lacked
    (tmp_path / "pq" / "data").mkdir(parents=True)
    for split in ("train", "val"):
        Dataset.from_dict({"de": ["Hallo"], "en": ["Hello"]}).to_parquet(
            str(tmp_path / "pq" / "data" / f"{split}-00000-of-00001.parquet"))
    assert dataset_name(config(tmp_path, tmp_path / "pq")) == "pq (local files: train, validation)"
    assert dataset_name(config(tmp_path, tmp_path / "pq", test_split="train[-1:]")) == \
        "pq (local files: train, validation, train[-1:])"


def test_a_folder_without_a_validation_split_says_how_to_hold_pairs_out(tmp_path):
    # "unknown split 'validation'; the splits are train" and no more, where a single file's error names slices
    write(tmp_path / "train.de", "Hallo\n")
    write(tmp_path / "train.en", "Hello\n")
    with pytest.raises(DataError, match=r"unknown split 'validation'; the splits are train; hold pairs out of "
                                        r"'train' instead with slices \(data.valid_split='train\[:1000\]' "
                                        r"data.test_split='train\[1000:2000\]' "
                                        r"data.train_split='train\[2000:\]'\)$"):
        load_split(config(tmp_path, tmp_path), "validation")
    with pytest.raises(DataError, match=r"unknown split 'train2'; the splits are train$"):
        load_split(config(tmp_path, tmp_path), "train2")
    for name in ("copy.yaml", "README.md", "README", "LICENSE", ".DS_Store", "corpus.yaml.bak", "train.de.orig",
                 "checksums.sha256"):  # beside the corpus, no split ("the splits are , LICENSE, README, copy, ...")
        write(tmp_path / name, "x\n")
    with pytest.raises(DataError, match=r"unknown split 'train2'; the splits are train$"):
        load_split(config(tmp_path, tmp_path), "train2")


def test_split_names_with_dots_as_moses_and_fairseq_write_them(tmp_path):
    # train.tok.de / valid.tok.de (tokenized, cleaned, BPE'd copies): data.train_split=train.tok was "unknown split",
    # and a folder of train.clean.* alone said "unknown language code 'de': ... has split 'train' in de, en"
    for split, lines in (("train.tok", "a b\nc d\n"), ("valid.tok", "e f\n"), ("train", "x\n")):
        write(tmp_path / f"{split}.de", lines)
        write(tmp_path / f"{split}.en", lines.upper())
    cfg = config(tmp_path, tmp_path)
    assert load_split(cfg, "train.tok")["src"] == ["a b", "c d"] and load_split(cfg, "valid.tok")["tgt"] == ["E F"]
    assert load_split(cfg, "train")["src"] == ["x"] and load_split(cfg, "train.tok[1:]")["src"] == ["c d"]
    with pytest.raises(DataError, match=r"unknown split 'valid'; the splits are train, train.tok, valid.tok"):
        load_split(cfg, "valid")


def test_a_held_out_split_is_checked_as_training_reads_its_split(tmp_path, caplog):
    """A review's findings: a test slice was never checked (now a warning where it is scored: training never reads
    it, and a run must stay scorable); data.max_train_samples was ignored (a slice past the pairs training reads was
    refused); the same slice for both was refused, the same whole split allowed; a streamed slice counted from the
    end read the whole corpus; a stream's message counted 4,611,686,018,427,387,901 pairs."""
    path = numbered_tsv(tmp_path / "pairs.tsv", 10)
    with caplog.at_level(logging.WARNING, logger="transformer.data"):
        assert len(load_split(config(tmp_path, path, test_split="train[-3:]"), "train[-3:]")) == 3
    assert ("data.test_split 'train[-3:]' shares 3 of the 10 pairs of 'train' with data.train_split 'train': cut "
            "slices that do not overlap, such as data.valid_split='train[:1000]'") in caplog.text
    assert "its scores are of pairs the model trained on" in caplog.text
    assert load_split(config(tmp_path, path, valid_split="train[-3:]", max_train_samples=5), "train[-3:]")["src"] == \
        ["a7", "a8", "a9"]
    assert len(load_split(config(tmp_path, path, train_split="train[:5]", valid_split="train[:5]"), "train[:5]")) == 5
    streaming = config(tmp_path, path, streaming=True, train_split="train[3:]", valid_split="train")
    with pytest.raises(DataError, match=r"split 'train\[-3:\]' of a stream \(data.streaming=true\) must count"):
        load_split(streaming, "train[-3:]")
    with pytest.raises(DataError, match=r"data.valid_split 'train' shares every pair from pair 3 on of 'train' with "
                                        r"data.train_split 'train\[3:\]': hold out the pairs training leaves "
                                        r"\(data.valid_split='train\[:3\]'\)$"):
        load_split(streaming, "train")
    with pytest.raises(DataError, match=r"shares 2 of the 10 pairs .*: cut slices that do not overlap, such as "
                                        r"data.valid_split='train\[:1000\]'"):
        load_split(config(tmp_path, path, train_split="train[2:5]", valid_split="train[3:7]"), "train[3:7]")


def test_a_refused_held_out_split_leaves_the_run_directory_unwritten(tmp_path):
    path = numbered_tsv(tmp_path / "pairs.tsv", 40)
    run_dir = tmp_path / "run"
    with pytest.raises(DataError, match=r"data.valid_split 'train\[:5\]' shares 5 of the 40 pairs"):
        train(load_config(None, [*TINY, f"data.dataset={path}", f"train.run_dir={run_dir}",
                                 "data.valid_split=train[:5]"]))
    assert not (run_dir / "config.yaml").exists() and not (run_dir / "spm.model").exists()


@pytest.mark.parametrize("step", ["from_generator", "map"])  # reading the corpus into its cache, encoding it
def test_a_full_disk_while_the_corpus_is_cached_is_one_line_naming_the_cache(copy_corpus, tmp_path, monkeypatch,
                                                                             capsys, step):
    """datasets' traceback of 95 lines (DatasetGenerationError), or a bare "[Errno 28] No space left on device"."""
    import errno

    from conftest import toy_overrides
    from datasets.exceptions import DatasetGenerationError

    from transformer.cli import main

    def full_disk(*args, **kwargs):
        error = OSError(errno.ENOSPC, "No space left on device")
        if step == "from_generator":
            raise DatasetGenerationError("An error occurred while generating the dataset") from error
        raise error

    monkeypatch.setattr(Dataset, step, full_disk)
    assert main(["train", str(copy_corpus / "copy.yaml"), *toy_overrides(copy_corpus, tmp_path / "run")]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: cannot write the corpus's cache into {tmp_path / 'run' / 'cache'} (No space left on device): free "
        f"space there, or set data.cache_dir to a folder with room")


def test_a_full_disk_while_a_multilingual_split_is_tagged_is_one_line(two_target_corpus, tmp_path, monkeypatch,
                                                                      capsys):
    """The tagging map writes into the cache too: a bare "[Errno 28] No space left on device"."""
    import errno

    from conftest import toy_overrides

    from transformer.cli import main

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Dataset, "map", full_disk)
    overrides = toy_overrides(two_target_corpus, tmp_path / "run") + ["data.pairs=src-up,src-cap", "data.tgt_lang=up"]
    assert main(["train", str(two_target_corpus / "two.yaml"), *overrides]) == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(
        f"error: cannot write the corpus's cache into {tmp_path / 'run' / 'cache'} (No space left on device)")


def test_a_cache_folder_that_cannot_be_written_is_refused_before_any_work(copy_corpus, tmp_path, capsys):
    """A read-only data.cache_dir was found after the tokenizer had trained, as "[Errno 30] Read-only file system"."""
    from conftest import toy_overrides

    from transformer.cli import main

    blocked = tmp_path / "a_file"
    blocked.write_text("")
    overrides = toy_overrides(copy_corpus, tmp_path / "run") + [f"data.cache_dir={blocked / 'cache'}"]
    assert main(["train", str(copy_corpus / "copy.yaml"), *overrides]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: data.cache_dir={blocked / 'cache'}: cannot write into it (Not a directory)")
    assert not (tmp_path / "run" / "spm.model").exists()
