"""scripts/demo.sh on a fresh machine: a local corpus, the hub (simulated by a folder laid out like a hub
repository, loaded through the same `datasets.load_dataset` call), and offline with nothing; and the
hub's `translation`-column layout, streamed, through tokenizer training, training and evaluation."""

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, subprocess_env, write_copy_corpus
from test_data import write_parquet_repository

from transformer.cli import main

TINY = ["model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.n_encoder_layers=1",
        "model.n_decoder_layers=1", "data.vocab_size=320", "data.batch_tokens=512", "data.max_length=64",
        "train.max_steps=10", "train.valid_every=10", "train.save_every=10", "train.warmup_steps=10",
        "train.threads=1", "train.device=cpu", "decode.beam_size=2"]


def copy_pairs(directory: Path) -> dict[str, list[tuple[str, str]]]:
    """The copy task as German/English pairs, with Multi30k's three splits."""
    corpus = write_copy_corpus(directory, n_train=1500, n_valid=60)
    read = {split: list(zip((corpus / f"{split}.src").read_text().splitlines(),
                            (corpus / f"{split}.tgt").read_text().splitlines())) for split in ("train", "valid")}
    return {"train": read["train"], "validation": read["valid"][:30], "test": read["valid"][30:]}


def write_line_corpus(directory: Path, splits: dict[str, list[tuple[str, str]]]) -> Path:
    """The local Multi30k layout: {train,val,test2016}.{de,en}."""
    directory.mkdir(parents=True)
    for split, name in (("train", "train"), ("validation", "val"), ("test", "test2016")):
        for index, lang in enumerate(("de", "en")):
            (directory / f"{name}.{lang}").write_text("".join(pair[index] + "\n" for pair in splits[split]))
    return directory


def run_demo(tmp_path: Path, data: Path, hub: str = "bentrevett/multi30k", offline: bool = True,
             started: Path = ROOT, settings: list[str] = TINY):
    """The demo with its run in ``tmp_path / "run"``, given as a path relative to where it is ``started``."""
    env = {**subprocess_env(), "TRANSFORMER_DATA": str(data), "MULTI30K_HUB": hub}
    if offline:
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    run_dir = os.path.relpath(tmp_path / "run", started)
    return subprocess.run(["bash", str(ROOT / "scripts" / "demo.sh"), f"train.run_dir={run_dir}", *settings],
                          cwd=started, env=env, capture_output=True, text=True, timeout=600)


def test_demo_offline_with_no_corpus_stops_at_once_naming_both_ways_out(tmp_path):
    result = run_demo(tmp_path, tmp_path / "empty")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "set TRANSFORMER_DATA" in result.stderr and "go online" in result.stderr
    assert not (tmp_path / "run").exists()  # stopped before any work


def test_a_bad_override_stops_the_demo_at_once_in_one_line(tmp_path):
    data = write_line_corpus(tmp_path / "data" / "multi30k", copy_pairs(tmp_path / "copy")).parent
    env = {**subprocess_env(), "TRANSFORMER_DATA": str(data), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "demo.sh"), f"train.run_dir={tmp_path / 'run'}",
                             "train.bogus=1"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()] and "train.bogus" in result.stderr
    assert not (tmp_path / "run").exists()


def test_a_corpus_without_the_test_split_stops_the_demo_at_once(tmp_path):
    """It trained (13 minutes by default), translated, then failed with "unknown split 'test2016'"."""
    data = write_line_corpus(tmp_path / "data" / "multi30k", copy_pairs(tmp_path / "copy")).parent
    for path in (data / "multi30k").glob("test2016.*"):
        path.unlink()
    env = {**subprocess_env(), "TRANSFORMER_DATA": str(data), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "demo.sh"), f"train.run_dir={tmp_path / 'run'}"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "test2016" in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.parametrize("source", ["local", "hub"])
def test_demo_trains_translates_and_scores(tmp_path, source):
    splits = copy_pairs(tmp_path / "copy")
    if source == "local":
        # started elsewhere, with a relative run directory: the run went to the checkout's folder of that name. And
        # shortened within its first epoch: the demo config validates once an epoch (train.valid_every: 0), so the run
        # never validates and writes no checkpoint_best.pt; the demo stopped at "checkpoint not found" after training
        # instead of translating and scoring its last checkpoint
        short = [setting for setting in TINY if not setting.startswith(("train.valid_every=", "train.max_steps="))]
        result = run_demo(tmp_path, write_line_corpus(tmp_path / "data" / "multi30k", splits).parent, started=tmp_path,
                          settings=[*short, "train.valid_every=0", "train.max_steps=2"])
        assert "using checkpoint_last.pt" in result.stdout and not (tmp_path / "run" / "checkpoint_best.pt").exists()
    else:
        repository = write_parquet_repository(tmp_path / "bentrevett_multi30k", "columns", splits)
        result = run_demo(tmp_path, tmp_path / "empty", hub=str(repository))
        assert "using the hub dataset" in result.stdout
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((tmp_path / "run" / "test2016.json").read_text())
    assert report["scores"]["bleu"]["score"] >= 0 and report["split"] == "test2016"
    assert (tmp_path / "run" / "test2016.hyp.en").read_text().count("\n") == len(splits["test"])
    # results_table.py's record of how the run was made
    assert (tmp_path / "run" / "command.txt").read_text().startswith("bash scripts/demo.sh train.run_dir=")


@pytest.mark.slow
def test_translation_column_layout_streams_through_tokenizer_training_and_evaluation(tmp_path):
    repository = write_parquet_repository(tmp_path / "wmt_like", "translation", copy_pairs(tmp_path / "copy"), shards=2)
    run = tmp_path / "run"
    settings = [f"data.dataset={repository}", "data.src_lang=de", "data.tgt_lang=en", "data.valid_split=val",
                "data.streaming=true", "data.spm_input_sentence_size=1000", "data.shuffle_buffer=200",
                f"train.run_dir={run}", *TINY]
    assert main(["train", str(ROOT / "configs" / "multi30k_demo.yaml"), *settings]) == 0
    assert (run / "spm.model").exists() and (run / "checkpoint_best.pt").exists()
    assert main(["evaluate", "--checkpoint", str(run / "checkpoint_best.pt"), "--split", "test2016",
                 "--report", str(run / "test.json")]) == 0
    assert json.loads((run / "test.json").read_text())["split"] == "test2016"
