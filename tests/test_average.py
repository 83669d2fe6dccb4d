"""transformer-average: what it refuses to average, the tokenizer beside its output, and its one-line errors."""

import errno
import logging
import shutil
from pathlib import Path

import pytest
import torch
from conftest import run_config

from transformer.checkpoint import load_checkpoint, save_checkpoint
from transformer.cli import main
from transformer.config import Config
from transformer.config_loading import config_to_dict
from transformer.data.tokenizer import fingerprint
from transformer.training import train


def checkpoint(path: Path, value: float = 1.0, step: int = 1, tokenizer: bytes = b"spm",
               recorded: dict | None = None, **settings) -> str:
    """A tiny checkpoint of a run with ``settings`` ({"data.src_lang": "fr"}) and what a run records besides
    (``recorded``: its corpus, `corpus_identity`, and its tokenizer's fingerprint), a tokenizer file beside it."""
    config = config_to_dict(Config())
    for key, setting in settings.items():
        section, name = key.split(".")
        config[section][name] = setting
    path.parent.mkdir(parents=True, exist_ok=True)
    save_checkpoint({"model": {"w": torch.full((2, 2), value)}, "step": step, "config": config,
                     "tokenizer_files": ["spm.model"], "optimizer": {}, "parent": {"name": "parent/checkpoint_best.pt"},
                     "corpus": [["train.de", 100], ["train.en", 90]],
                     "tokenizer_fingerprint": fingerprint({"spm.model": tokenizer}), **(recorded or {})}, path)
    (path.parent / "spm.model").write_bytes(tokenizer)
    return str(path)


def average(capsys, *arguments: str) -> tuple[int, str]:
    """The command's exit status and its error output, which is one line or none."""
    status = main(["average", *arguments])
    err = capsys.readouterr().err
    assert err.count("\n") == (status != 0)
    return status, err


@pytest.mark.parametrize("setting, value", [("model.norm_first", True), ("model.dropout", 0.3),
                                            ("data.src_lang", "fr"), ("data.vocab_size", 16000),
                                            ("data.train_split", "other"), ("data.joint_vocab", False),
                                            ("training.corpus", [["train.de", 100], ["train.en", 91]]),
                                            ("training.tokenizer_fingerprint", "4567")])
def test_checkpoints_of_other_model_or_vocabulary_settings_are_refused_naming_it_and_both(tmp_path, capsys, setting,
                                                                                          value):
    first = checkpoint(tmp_path / "a" / "checkpoint_step1.pt")
    other = checkpoint(tmp_path / "b" / "checkpoint_step2.pt", step=2, **(
        {"recorded": {setting.split(".")[1]: value}} if setting.startswith("training.") else {setting: value}))
    status, err = average(capsys, first, other, "--output", str(tmp_path / "avg.pt"))
    assert status == 2 and f"{setting}={value!r}" in err and first in err and other in err
    assert not (tmp_path / "avg.pt").exists()


def test_a_checkpoint_given_twice_is_refused_not_counted_double(tmp_path, capsys):
    """Twice by its path, or as a copy (checkpoint_last.pt beside --run-dir's numbered one): counted double."""
    first = checkpoint(tmp_path / "checkpoint_step1.pt", 1.0, step=1)
    last = checkpoint(tmp_path / "checkpoint_step2.pt", 3.0, step=2)
    shutil.copyfile(last, tmp_path / "checkpoint_last.pt")
    for given, again in ((first, first), (str(tmp_path / "checkpoint_last.pt"), last)):
        status, err = average(capsys, given, "--run-dir", str(tmp_path), "--output", str(tmp_path / "avg.pt"))
        assert (status, err) == (2, f"error: {again}: the same weights as {given} (checkpoint_last.pt and "
                                    f"checkpoint_best.pt are copies of numbered ones); give each checkpoint once\n")
    assert not (tmp_path / "avg.pt").exists()


def test_checkpoints_of_one_run_average_whatever_the_training_settings(tmp_path, capsys):
    """A resume may change the training settings (steps, learning rate): the model is the same."""
    first = checkpoint(tmp_path / "checkpoint_step1.pt", 1.0, step=1)
    later = checkpoint(tmp_path / "checkpoint_step2.pt", 3.0, step=2, **{"train.max_steps": 9, "train.lr": 0.5})
    assert average(capsys, first, later, "--output", str(tmp_path / "checkpoint_averaged.pt"))[0] == 0
    averaged = load_checkpoint(tmp_path / "checkpoint_averaged.pt")
    assert torch.equal(averaged["model"]["w"], torch.full((2, 2), 2.0)) and averaged["step"] == 2
    assert averaged["parent"] == {"name": "parent/checkpoint_best.pt"}  # its card names what it was fine-tuned from


def test_checkpoints_beside_different_tokenizers_are_refused(tmp_path, capsys):
    """The same settings, another tokenizer (another corpus at the same path, another sample of it); checkpoints
    of older versions, which record no fingerprint of their tokenizer (this one's: `training.tokenizer_fingerprint`
    above)."""
    older = {"tokenizer_fingerprint": None}
    first = checkpoint(tmp_path / "a" / "checkpoint_step1.pt", tokenizer=b"one", recorded=older)
    other = checkpoint(tmp_path / "b" / "checkpoint_step1.pt", 3.0, tokenizer=b"two", recorded=older)
    status, err = average(capsys, first, other, "--output", str(tmp_path / "avg.pt"))
    assert status == 2 and str(tmp_path / "b" / "spm.model") in err and str(tmp_path / "a" / "spm.model") in err


@pytest.fixture(scope="module")
def tiny_run(copy_corpus, tmp_path_factory) -> Path:
    """A run of two steps with a checkpoint at each, and its tokenizer."""
    run_dir = tmp_path_factory.mktemp("tiny_run")
    train(run_config(copy_corpus, run_dir, max_steps=2, save_every=1))
    return run_dir


def test_the_tokenizer_is_copied_beside_an_output_in_another_folder(tiny_run, tmp_path, capsys):
    output = tmp_path / "averaged.pt"
    assert average(capsys, "--run-dir", str(tiny_run), "--output", str(output))[0] == 0
    assert (tmp_path / "spm.model").read_bytes() == (tiny_run / "spm.model").read_bytes()
    assert main(["translate", "--checkpoint", str(output), "alpha beta"]) == 0
    assert capsys.readouterr().out.count("\n") == 1


def test_tied_matrices_stay_one_and_fewer_checkpoints_than_asked_are_said(tiny_run, tmp_path, caplog):
    """The embeddings and the output projection are one tied matrix: averaged, it stayed one in the output (three
    tensors made a release store it three times and its card count it thrice); --last beyond what the run keeps
    averages what there is, and says so."""
    output = tmp_path / "averaged.pt"
    with caplog.at_level(logging.WARNING):
        assert main(["average", "--run-dir", str(tiny_run), "--last", "5", "--output", str(output)]) == 0
    assert f"--last 5: {tiny_run} holds 2 numbered checkpoints; averaging those" in caplog.text
    tied = ["encoder.embedding.embedding.weight", "decoder.embedding.embedding.weight", "output_proj.weight"]

    def storages(model):
        return {name: tensor.untyped_storage().data_ptr() for name, tensor in model.items()}

    paths = tiny_run / "checkpoint_step2.pt", output
    trained, averaged = (storages(load_checkpoint(path)["model"]) for path in paths)
    assert len({trained[name] for name in tied}) == len({averaged[name] for name in tied}) == 1
    assert len(set(averaged.values())) == len(set(trained.values()))


def test_another_tokenizer_where_the_output_goes_is_refused_and_left_alone(tiny_run, tmp_path, capsys):
    (tmp_path / "spm.model").write_bytes(b"another run's tokenizer")
    status, err = average(capsys, "--run-dir", str(tiny_run), "--output", str(tmp_path / "averaged.pt"))
    assert status == 2 and str(tmp_path / "spm.model") in err
    assert (tmp_path / "spm.model").read_bytes() == b"another run's tokenizer"
    assert not (tmp_path / "averaged.pt").exists()


@pytest.mark.parametrize("name", ["checkpoint_last.pt", "checkpoint_best.pt", "checkpoint_step7.pt"])
def test_an_output_named_as_training_names_its_checkpoints_is_refused(tmp_path, capsys, name):
    """A resume would read it and find no optimizer state."""
    first = checkpoint(tmp_path / "checkpoint_step1.pt")
    status, err = average(capsys, first, "--output", str(tmp_path / name))
    assert status == 2 and f"--output {tmp_path / name}: " in err and "checkpoint_averaged.pt" in err
    assert not (tmp_path / name).exists()


@pytest.mark.parametrize("name", ["metrics.jsonl", "config.yaml", "test2016.json", "notes.pt"])
def test_an_output_over_a_runs_records_is_refused(tiny_run, tmp_path, capsys, name):
    """`--output RUN/metrics.jsonl` wrote a checkpoint over the run's training history, and said it had averaged;
    a text file named notes.pt was written over, its name taken for its contents."""
    record = tmp_path / name
    record.write_text("the run's records\n")
    status, err = average(capsys, "--run-dir", str(tiny_run), "--output", str(record))
    assert status == 2 and err == (f"error: --output {record}: exists and is no checkpoint; writing the average "
                                   f"over it would lose it; give a new file, e.g. checkpoint_averaged.pt\n")
    assert record.read_text() == "the run's records\n"


def test_last_without_a_run_dir_and_a_missing_run_dir_are_refused(tmp_path, capsys):
    """--last 3 with files was ignored, unsaid; a missing --run-dir said "no numbered checkpoints"."""
    first = checkpoint(tmp_path / "one.pt")
    status, err = average(capsys, first, "--last", "3", "--output", str(tmp_path / "avg.pt"))
    assert status == 2 and err == "error: --last counts the numbered checkpoints of --run-dir: give --run-dir, or " \
                                  "the files\n"
    status, err = average(capsys, "--run-dir", str(tmp_path / "nowhere"), "--output", str(tmp_path / "avg.pt"))
    assert status == 2 and err == f"error: --run-dir {tmp_path / 'nowhere'}: no such folder\n"


def test_an_output_that_is_an_input_or_its_tokenizer_is_refused(tmp_path, capsys):
    first, second = checkpoint(tmp_path / "one.pt", 1.0), checkpoint(tmp_path / "two.pt", 3.0)
    for output in (second, str(tmp_path / "spm.model")):
        status, err = average(capsys, first, second, "--output", output)
        assert status == 2 and f"--output {output}: " in err
    assert load_checkpoint(second)["model"]["w"][0, 0] == 3.0 and (tmp_path / "spm.model").read_bytes() == b"spm"


def test_errors_name_the_output_not_the_file_written_first(tmp_path, capsys, monkeypatch):
    first = checkpoint(tmp_path / "run" / "one.pt")
    for output, reason in ((tmp_path / "missing" / "avg.pt", "no directory"), (tmp_path / "run", "a directory")):
        status, err = average(capsys, first, "--output", str(output))
        assert status == 2 and err.startswith(f"error: --output {output}: {reason}") and ".tmp" not in err

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    status, err = average(capsys, first, "--output", str(tmp_path / "avg.pt"))
    assert status == 2 and f"--output {tmp_path / 'avg.pt'}: cannot write it (No space left on device)" in err
    assert not [p for p in tmp_path.iterdir() if p.suffix in (".pt", ".tmp")]


def test_no_checkpoint_or_a_missing_one_is_a_one_line_error(tmp_path, capsys):
    assert "no checkpoints to average" in average(capsys, "--output", str(tmp_path / "avg.pt"))[1]
    status, err = average(capsys, "--run-dir", str(tmp_path), "--output", str(tmp_path / "avg.pt"))
    assert status == 2 and f"--run-dir {tmp_path}: no numbered checkpoints" in err
    first = checkpoint(tmp_path / "one.pt")
    status, err = average(capsys, first, str(tmp_path / "gone.pt"), "--output", str(tmp_path / "avg.pt"))
    assert status == 2 and f"checkpoint not found: {tmp_path / 'gone.pt'}" in err
