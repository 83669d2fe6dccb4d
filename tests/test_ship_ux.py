"""Shipping and scoring a model as a user does: exports interrupted or out of disk, folders edited or given to the
wrong engine, reports edited by hand, the model card's command, and options that scoring files would drop."""

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, subprocess_env

pytest.importorskip("safetensors", reason='release folders need the export extra: pip install -e ".[dev,export]"')

from safetensors import SafetensorError  # noqa: E402

from transformer.atomic_file import hold, replacing_folder  # noqa: E402
from transformer.checkpoint import CheckpointError, load_checkpoint  # noqa: E402
from transformer.cli import main  # noqa: E402
from transformer.decoding.translator import Translator  # noqa: E402
from transformer.deploy.card import read_front_matter  # noqa: E402

FILES = ["README.md", "config.yaml", "model.safetensors", "spm.model"]


@pytest.fixture(scope="module")
def checkpoint(quick_copy_run):
    return quick_copy_run / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def release(checkpoint, tmp_path_factory):
    output = tmp_path_factory.mktemp("ship") / "release"
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(output)]) == 0
    return output


@pytest.fixture(scope="module")
def ct2_folder(checkpoint, tmp_path_factory):
    pytest.importorskip("ctranslate2", reason='needs the export extra: pip install -e ".[dev,export]"')
    output = tmp_path_factory.mktemp("ship") / "ct2_int8"
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(output), "--format", "ctranslate2",
                 "--quantization", "int8"]) == 0
    return output


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_what_a_killed_export_left_does_not_refuse_the_same_command_again(checkpoint, tmp_path, capsys):
    """A killed export leaves its hidden unfinished folder: ls shows the output empty, so "not empty" is false."""
    output = tmp_path / "model"
    (output / ".partial-0123456789ab").mkdir(parents=True)
    (output / ".partial-0123456789ab" / "model.safetensors").write_bytes(b"half")
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(output)]) == 0, capsys.readouterr().err
    assert sorted(p.name for p in output.iterdir()) == FILES  # the leftover is gone with the rest
    (output / "mine.txt").write_text("a file of the user's")
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(output)]) == 2
    assert "exists and is not empty" in error_line(capsys)


def test_an_export_still_writing_into_a_folder_is_left_alone_by_another(checkpoint, tmp_path, capsys):
    """Its unfinished folder was taken for a killed export's: a second export went on, deleted it, and the first
    failed and removed the whole output folder. The writer holds a lock on it, which a killed one lets go of."""
    output = tmp_path / "model"
    live = output / ".partial-0123456789ab"
    live.mkdir(parents=True)
    lock = hold(live)  # as the first export's replacing_folder does while it writes
    try:
        assert main(["export", "--checkpoint", str(checkpoint), "--output", str(output)]) == 2
        assert "another export is writing into it" in error_line(capsys)
        with replacing_folder(output) as folder:  # one that went on all the same (--force before the first began)
            (folder / "config.yaml").write_text("mine")
        assert live.is_dir() and (output / "config.yaml").read_text() == "mine"  # the other's folder left alone
        fresh = tmp_path / "fresh"
        with pytest.raises(RuntimeError), replacing_folder(fresh):
            raise RuntimeError("a failed export")
        assert not fresh.exists()  # created by it, and nothing else there: removed
    finally:
        os.close(lock)
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(output), "--force"]) == 0
    assert sorted(p.name for p in output.iterdir()) == FILES  # the lock let go: a leftover, replaced


def test_a_full_disk_during_a_release_export_is_one_line_naming_the_folder(checkpoint, tmp_path, capsys,
                                                                           monkeypatch):
    def full_disk(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr("safetensors.torch.save_file", full_disk)
    output = tmp_path / "model"
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(output)]) == 2
    line = error_line(capsys)
    assert line.startswith(f"error: cannot write {output}: ") and "No space left on device" in line
    assert not output.exists()  # nothing half-written


def test_a_full_disk_during_a_ctranslate2_export_names_the_folder(checkpoint, tmp_path, capsys, monkeypatch):
    pytest.importorskip("ctranslate2", reason='needs the export extra: pip install -e ".[dev,export]"')

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")  # as spec.save reports it: no file named

    monkeypatch.setattr("transformer.deploy.ctranslate2_export.convert_to_ctranslate2", full_disk)
    output = tmp_path / "ct2"
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(output), "--format", "ctranslate2"]) == 2
    assert error_line(capsys) == f"error: cannot write {output}: No space left on device"
    assert not output.exists()


def test_a_release_whose_config_was_edited_is_refused_naming_the_setting(release, tmp_path, capsys):
    """n_heads 4 -> 2 changes no weight's shape: the folder loaded and translated otherwise, differently."""
    edited = tmp_path / "edited"
    shutil.copytree(release, edited)
    config = edited / "config.yaml"
    config.write_text(config.read_text().replace("n_heads: 4", "n_heads: 2"))
    with pytest.raises(CheckpointError, match=r"config.yaml: model.n_heads is 2, but model.safetensors was written "
                                              r"with 4"):
        Translator.from_pretrained(edited)
    assert main(["translate", "--model", str(edited), "alpha"]) == 2
    assert str(config) in error_line(capsys)
    Translator.from_pretrained(release)  # as exported: loads


def test_a_release_given_another_tokenizer_is_refused_naming_it(release, tmp_path, capsys):
    """A release recorded no tokenizer fingerprint: another spm.model put beside the weights loaded, and the model
    read other tokens than it was trained on."""
    from transformer.config_loading import load_config
    from transformer.data.tokenizer import train_tokenizer

    swapped = tmp_path / "swapped"
    shutil.copytree(release, swapped)
    words = [" ".join(word[::-1] for word in line.split()) for line in ("alpha beta gamma", "delta epsilon zeta")]
    train_tokenizer(load_config(swapped / "config.yaml").data, words * 50, words * 50, tmp_path / "other", seed=1)
    shutil.copyfile(tmp_path / "other" / "spm.model", swapped / "spm.model")
    with pytest.raises(CheckpointError, match=r"spm.model: not the tokenizer model.safetensors was exported with"):
        Translator.from_pretrained(swapped)
    assert main(["translate", "--model", str(swapped), "alpha"]) == 2
    assert str(swapped / "spm.model") in error_line(capsys)


def test_an_engine_folder_given_to_model_alone_says_which_engine(ct2_folder, capsys):
    assert main(["translate", "--model", str(ct2_folder), "alpha"]) == 2
    assert error_line(capsys) == (f"error: {ct2_folder}: a folder of the ctranslate2 engine, not a release folder; "
                                  f"give --engine ctranslate2")


def test_the_ctranslate2_engine_says_what_it_computes_in(ct2_folder, tmp_path, capsys):
    """An int8 folder runs in int8 by default: the report said "precision": "default", and nothing of the engine."""
    report = tmp_path / "r.json"
    assert main(["evaluate", "--engine", "ctranslate2", "--model", str(ct2_folder), "--split", "valid",
                 "--report", str(report)]) == 0, capsys.readouterr().err
    written = json.loads(report.read_text())
    assert written["engine"] == "ctranslate2" and written["decoding"]["precision"] == "int8_float32"


@pytest.mark.parametrize("scores", [{"bleu": 37.2}, {"bleu": {"score": "high", "signature": "x"}},
                                    {"bleu": {"score": 37.2}}, {}])
def test_a_report_edited_by_hand_is_one_line_naming_it(checkpoint, tmp_path, capsys, scores):
    step = load_checkpoint(checkpoint)["step"]
    report = tmp_path / "edited.json"
    report.write_text(json.dumps({"scores": scores, "checkpoint": str(checkpoint), "step": step}))
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(tmp_path / "out"),
                 "--report", str(report)]) == 2
    assert error_line(capsys).startswith(f"error: {report}: ")
    assert not (tmp_path / "out").exists()


def test_the_cards_command_reproduces_its_scores(checkpoint, copy_corpus, tmp_path, capsys, monkeypatch):
    """Scored greedily with int8 weights on a local corpus: the card's command said neither, nor where the corpus
    is, and scored another search (or failed) where the card promised these scores."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(copy_corpus, tmp_path / copy_corpus.name)  # the reader's copy, under the corpus's own name
    report = tmp_path / "greedy_int8.json"
    assert main(["evaluate", "--checkpoint", str(checkpoint), "--split", "valid", "--beam-size", "1",
                 "--quantize", "int8", "--report", str(report)]) == 0
    assert main(["export", "--checkpoint", str(checkpoint), "--output", "model", "--report", str(report)]) == 0
    card = (tmp_path / "model" / "README.md").read_text()
    assert "beam 1, length penalty" in card and "int8 weights" in card
    command = next(line for line in card.splitlines() if line.startswith("transformer-evaluate "))
    assert command == (f"transformer-evaluate --model model --dataset {copy_corpus.name} --split valid "
                       f"--beam-size 1 --quantize int8 --report scores.json")
    assert f"`{copy_corpus.name}`: the path of your copy of {copy_corpus.name}" in card
    capsys.readouterr()
    assert main(["evaluate", *shlex.split(command)[1:]]) == 0, capsys.readouterr().err
    scored = json.loads((tmp_path / "scores.json").read_text())["scores"]
    index = read_front_matter(card)["model-index"][0]["results"][0]["metrics"]
    assert {metric["type"]: metric["value"] for metric in index} == {k: v["score"] for k, v in scored.items()}


@pytest.mark.parametrize("option", [["--beam-size", "3"], ["--split", "val"], ["--quantize", "int8"],
                                    ["--output", "out.txt"]])
def test_scoring_files_refuses_the_options_of_translating(tmp_path, capsys, option):
    """decode.beam_size=3 was refused there, --beam-size 3 (and --split, --quantize, ...) dropped without a word."""
    (tmp_path / "hyp.txt").write_text("a b c d\n")
    assert main(["evaluate", "--hypotheses", str(tmp_path / "hyp.txt"), "--references", str(tmp_path / "hyp.txt"),
                 *option]) == 2
    assert error_line(capsys).startswith(f"error: {option[0]} is for translating a split")


def test_an_empty_split_is_an_unknown_split_not_the_default_one(checkpoint, capsys):
    assert main(["evaluate", "--checkpoint", str(checkpoint), "--split", ""]) == 2
    assert error_line(capsys).startswith("error: split '': expected a split's name")


def test_onnx_export_says_nothing_the_user_cannot_act_on(checkpoint, tmp_path):
    """torch.onnx warned of each torchvision operator it could not register, and torch.export of its own deprecation."""
    pytest.importorskip("onnxruntime", reason='needs the export extra: pip install -e ".[dev,export]"')
    output = tmp_path / "onnx"
    done = subprocess.run([sys.executable, "-m", "transformer", "export", "--checkpoint", str(checkpoint),
                           "--output", str(output), "--format", "onnx"], cwd=ROOT, env=subprocess_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == f"{output}\n"
    assert "torchvision" not in done.stderr and "LeafSpec" not in done.stderr, done.stderr


def test_a_release_exported_before_its_settings_were_recorded_still_loads(release, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    old = tmp_path / "old"
    shutil.copytree(release, old)
    with safe_open(str(old / "model.safetensors"), framework="pt") as file:
        metadata = {k: v for k, v in (file.metadata() or {}).items() if k != "model"}
        tensors = {name: file.get_tensor(name) for name in file.keys()}
    save_file(tensors, str(old / "model.safetensors"), metadata=metadata)
    assert Translator.from_pretrained(old).translate(["alpha"]) == Translator.from_pretrained(release).translate(
        ["alpha"])


def test_the_release_records_the_settings_it_checks(release):
    from safetensors import safe_open

    with safe_open(str(Path(release) / "model.safetensors"), framework="pt") as file:
        assert json.loads(file.metadata()["model"])["n_heads"] == 4
