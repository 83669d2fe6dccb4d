"""Training a translator as a user does: corpora with defects, interruptions at awkward moments and the
logs and plots a resumed run leaves. Each test failed before the fix it names."""

import fcntl
import gzip
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_config, subprocess_env, toy_overrides
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from transformer.cli import main
from transformer.config import DataConfig
from transformer.data.files import _read_jsonl, _read_tsv, local_source
from transformer.errors import DataError, InputError
from transformer.plots import plot_training_curves
from transformer.training import loop, settings, trainer
from transformer.training.metrics import MetricsLogger

CPU = torch.device("cpu")

# Runs the train command in a child process that dies (os._exit, as SIGKILL: nothing is flushed or closed) at once
# after the checkpoint of step `at` is written, or after the train log record of step `at`.
DIE = """
import os, sys
from transformer.training import checkpoints, loop
from transformer.cli import main

point, at = sys.argv[1], int(sys.argv[2])
if point == "after_save":
    save = checkpoints.save
    def dying_save(trainer, names, **options):
        save(trainer, names, **options)
        trainer.checkpoint_writer.wait()  # written on its thread: dies once it is on disk
        if trainer.state.step == at:
            os._exit(9)
    checkpoints.save = dying_save
else:  # "after_log"
    log_window = loop.log_window
    def dying_log_window(logger, bar, step, *args):
        log_window(logger, bar, step, *args)
        if step == at:
            os._exit(9)
    loop.log_window = dying_log_window
sys.exit(main(["train", *sys.argv[3:]]))
"""


def train_args(corpus: Path, run_dir: Path, **values) -> list[str]:
    return [str(corpus / "copy.yaml"), *toy_overrides(corpus, run_dir, **values)]


def die(point: str, at: int, args: list[str]) -> None:
    done = subprocess.run([sys.executable, "-c", DIE, point, str(at), *args], cwd=ROOT, env=subprocess_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 9, done.stderr[-2000:]
    time.sleep(1.1)  # TensorBoard orders event files by the second their writer started in, then by process id


def tensorboard_steps(run_dir: Path, tag: str) -> list[int]:
    """The steps of ``tag`` that TensorBoard shows for the run (after its purges of resumed sessions)."""
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return [event.step for event in events.Scalars(tag)] if tag in events.Tags()["scalars"] else []


def jsonl_steps(run_dir: Path, kind: str) -> list[int]:
    return [r["step"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if r["kind"] == kind]


# -- interruptions and the logs a resumed run leaves ----------------------------------------------

def test_a_run_killed_just_after_a_validation_checkpoint_keeps_that_validation_in_its_logs(copy_corpus, tmp_path):
    """The validation record was written after its checkpoint: a run killed between the two resumed past the
    validation, whose scores were then missing from metrics.jsonl and TensorBoard for good."""
    args = train_args(copy_corpus, tmp_path, max_steps=20, valid_every=10, save_every=10, log_every=1)
    die("after_save", 10, args)
    assert main(["train", *args]) == 0
    assert jsonl_steps(tmp_path, "valid") == [10, 20]
    assert tensorboard_steps(tmp_path, "valid/bleu") == [10, 20]
    assert jsonl_steps(tmp_path, "train") == list(range(1, 21))
    assert tensorboard_steps(tmp_path, "train/loss") == list(range(1, 21))


def test_tensorboard_of_a_run_started_over_before_its_first_checkpoint_shows_each_step_once(copy_corpus, tmp_path):
    """A run killed before its first checkpoint starts over at step 0, and its killed session's TensorBoard events
    stayed: the curves showed steps 5..15 twice (metrics.jsonl dropped them)."""
    args = train_args(copy_corpus, tmp_path, max_steps=20, save_every=100, log_every=5)
    die("after_log", 15, args)
    assert main(["train", *args]) == 0
    assert jsonl_steps(tmp_path, "train") == [5, 10, 15, 20]
    assert tensorboard_steps(tmp_path, "train/loss") == [5, 10, 15, 20]


def test_a_kill_while_the_metrics_log_is_rewritten_on_resume_keeps_its_records(tmp_path, monkeypatch):
    """On resume the log is rewritten without the interrupted session's records: in place, a kill (here: a failed
    write) halfway through lost the run's whole history."""
    records = [{"kind": "train", "step": step, "loss": 1.0} for step in range(1, 101)]
    text = "".join(json.dumps(r) + "\n" for r in records)
    (tmp_path / "metrics.jsonl").write_text(text, encoding="utf-8")
    real_write_text = Path.write_text

    def dying_write_text(self, data, *args, **kwargs):
        real_write_text(self, data[: len(data) // 2], *args, **kwargs)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", dying_write_text)
    with pytest.raises(OSError):
        MetricsLogger(tmp_path, tensorboard=False, resume_step=80)
    monkeypatch.undo()
    assert (tmp_path / "metrics.jsonl").read_text(encoding="utf-8") == text
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]  # no temporary file left


def test_a_run_that_never_had_finite_weights_at_a_save_names_no_checkpoint(copy_corpus, tmp_path, monkeypatch, capsys):
    """Its summary named checkpoint_last.pt, which the non-finite weights had kept from being written."""
    update = trainer.Trainer.update

    def poisoning_update(self, batches, **kwargs):
        stats = update(self, batches, **kwargs)
        with torch.no_grad():
            next(self.model.parameters()).fill_(float("nan"))
        return stats

    monkeypatch.setattr(trainer.Trainer, "update", poisoning_update)
    assert main(["train", *train_args(copy_corpus, tmp_path, max_steps=3, save_every=0)]) == 0
    out = capsys.readouterr().out
    assert not (tmp_path / "checkpoint_last.pt").exists()
    assert "checkpoint none written" in out and "checkpoint_last.pt" not in out


def test_a_second_training_in_a_run_directory_in_use_is_refused(copy_corpus, tmp_path, capsys):
    """The same command started twice (two terminals, a scheduler's restart while the first still runs) trained
    twice in one directory: both wrote checkpoints, and metrics.jsonl held every record twice, interleaved."""
    args = train_args(copy_corpus, tmp_path, max_steps=2)
    held = os.open(tmp_path, os.O_RDONLY)  # as a running training holds it
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert main(["train", *args]) == 2
        err = capsys.readouterr().err
        assert f"error: train.run_dir: {tmp_path} is in use by another training process" in err
        assert list(tmp_path.iterdir()) == []  # nothing written, not even config.yaml
    finally:
        os.close(held)  # as when that process ends or dies
    assert main(["train", *args]) == 0
    assert main(["train", *train_args(copy_corpus, tmp_path, max_steps=4)]) == 0  # its own lock went with it


@pytest.mark.parametrize("weights", ["model.safetensors", "model.bin", "encoder.onnx"])
def test_an_exported_models_folder_is_no_run_directory(copy_corpus, tmp_path, capsys, weights):
    """Training into a release folder replaced its config.yaml (and took its spm.model): the folder no longer
    loaded ("model.d_model is 64, but model.safetensors was written with 32")."""
    (tmp_path / weights).write_bytes(b"weights")
    (tmp_path / "config.yaml").write_text("the export's\n")
    assert main(["train", *train_args(copy_corpus, tmp_path, max_steps=2)]) == 2
    assert capsys.readouterr().err == (f"error: train.run_dir: {tmp_path} is an exported model's folder (it holds "
                                       f"{weights}): training would write over its config.yaml; give the run a "
                                       f"train.run_dir of its own\n")
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(["config.yaml", weights])
    assert (tmp_path / "config.yaml").read_text() == "the export's\n"
    run = tmp_path / "run"  # a run directory with a file of that name of its own resumes
    assert main(["train", *train_args(copy_corpus, run, max_steps=2)]) == 0
    (run / weights).write_bytes(b"the user's")
    assert main(["train", *train_args(copy_corpus, run, max_steps=3)]) == 0


def test_an_override_after_a_bare_resume_is_an_override(copy_corpus, tmp_path, capsys):
    """--resume train.run_dir=x took the override for the checkpoint: "checkpoint not found: train.run_dir=x"."""
    args = train_args(copy_corpus, tmp_path / "elsewhere", max_steps=2)
    assert main(["train", *args]) == 0
    moved = [arg for arg in args if not arg.startswith(("train.run_dir=", "train.max_steps="))]
    assert main(["train", *moved, "--resume", f"train.run_dir={tmp_path / 'elsewhere'}", "train.max_steps=3"]) == 0
    assert "done: reached train.max_steps=3; step 3;" in capsys.readouterr().out
    twice = [*moved, "train.max_steps=4", "--resume", "train.max_steps=5", f"train.run_dir={tmp_path / 'elsewhere'}"]
    assert main(["train", *twice]) == 2  # 4 would have won, though 5 came last
    assert capsys.readouterr().err.endswith("error: --resume train.max_steps=5: train.max_steps is given twice, and "
                                            "which comes last is unclear; give --resume at the end\n")


# -- settings that contradict each other -----------------------------------------------------------

def test_warmup_and_validation_beyond_the_last_step_are_said(copy_corpus, tmp_path, caplog):
    """Accepted without a word: a warm-up the run never finishes, and a run that never validates (no best
    checkpoint, no scores)."""
    cfg = run_config(copy_corpus, tmp_path, max_steps=50, warmup_steps=400, valid_every=100)
    with caplog.at_level(logging.WARNING):
        said = settings.warn_about_settings(cfg, CPU, "bf16")
    assert len(said) == 2
    assert "train.warmup_steps=400 exceeds train.max_steps=50" in caplog.text
    assert "train.valid_every=100 exceeds train.max_steps=50: the run never validates" in caplog.text
    assert settings.warn_about_settings(run_config(copy_corpus, tmp_path, max_steps=500, warmup_steps=400,
                                                   valid_every=100), CPU, "bf16") == []


def test_speed_settings_where_they_cannot_work_or_cannot_pay_are_said(copy_corpus, tmp_path):
    """train.attention_row_length: without an even data.rows_multiple a batch's rows are as many as the budget
    holds, and an odd count leaves every row alone; on the CPU the grouped rows go past the attention formula.
    train.float32_residual=false in fp32: there is no low-precision dtype to keep."""
    grouped = run_config(copy_corpus, tmp_path, attention_row_length=64, warmup_steps=10,
                         **{"data.rows_multiple": 3})
    assert [message.split(":")[0] for message in settings.warn_about_settings(grouped, CPU, "bf16")] == [
        "train.attention_row_length=64", "train.attention_row_length groups rows for a GPU's fused attention kernels"]
    in_eights = run_config(copy_corpus, tmp_path, attention_row_length=64, warmup_steps=10,
                           **{"data.rows_multiple": 8})
    assert settings.warn_about_settings(in_eights, torch.device("cuda"), "bf16") == []
    too_short = run_config(copy_corpus, tmp_path, attention_row_length=15, warmup_steps=10,
                           **{"data.rows_multiple": 8, "data.pad_to_multiple": 8})
    assert settings.warn_about_settings(too_short, torch.device("cuda"), "bf16") == [
        "train.attention_row_length=15: no two rows fit (a row has at least 8 positions), so none attend in groups; "
        "the kernels' tiles hold 64"]
    bf16_stream = run_config(copy_corpus, tmp_path, float32_residual="false", warmup_steps=10)
    assert settings.warn_about_settings(bf16_stream, CPU, "bf16") == []
    assert settings.warn_about_settings(bf16_stream, CPU, "fp32") == [
        "train.float32_residual=false changes nothing in fp32: it keeps bf16 or fp16 activations"]


def test_a_vocabulary_smaller_than_asked_is_said(copy_corpus, tmp_path, caplog):
    """SentencePiece stops where the text has no more pieces: the model got another vocabulary size than
    data.vocab_size without a word."""
    with caplog.at_level(logging.WARNING):
        assert main(["train", *train_args(copy_corpus, tmp_path, max_steps=1, **{"data.vocab_size": 5000})]) == 0
    assert re.search(r"fewer pieces than data.vocab_size=5000 \(joint [\d,]+\): the training text holds no more",
                     caplog.text)


# -- corpus formats ----------------------------------------------------------------------------------

def test_a_blank_line_in_a_tsv_file_holds_no_pair_as_in_a_jsonl_file(tmp_path):
    """A TSV's last blank line (an editor's, or files joined with cat) stopped training with "1 tab-separated
    fields, expected 2"; JSONL skips blank lines."""
    path = tmp_path / "train.tsv"
    path.write_text("de\ten\r\nein Hund\ta dog\r\n\r\n\neine Katze\ta cat\n\n", encoding="utf-8")
    assert list(_read_tsv([str(path)], "de", "en")) == [{"src": "ein Hund", "tgt": "a dog"},
                                                        {"src": "eine Katze", "tgt": "a cat"}]
    path.write_text("de\ten\nein Hund\ta dog\n \n", encoding="utf-8")  # not blank: still an error
    with pytest.raises(DataError, match=r"train\.tsv line 3: 1 tab-separated fields, expected 2"):
        list(_read_tsv([str(path)], "de", "en"))


def test_a_jsonl_text_that_is_null_is_named_as_such(tmp_path):
    """It said "no text for language 'en' (keys: ['de', 'en'])": a key it had just listed."""
    path = tmp_path / "train.jsonl"
    path.write_text('{"de": "Hund", "en": null}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"train\.jsonl line 1: no text for language 'en' \(its value is null, not a "
                                        r"string\)"):
        list(_read_jsonl([str(path)], "de", "en"))


def test_a_file_and_its_gzip_copy_side_by_side_say_which_is_read(tmp_path, caplog):
    """train.de and train.de.gz both there: one was read without a word, though they may differ."""
    (tmp_path / "train.de").write_text("neu\n", encoding="utf-8")
    with gzip.open(tmp_path / "train.de.gz", "wt", encoding="utf-8") as file:
        file.write("alt\n")
    (tmp_path / "train.en").write_text("new\n", encoding="utf-8")
    cfg = DataConfig(dataset=str(tmp_path), src_lang="de", tgt_lang="en")
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            _, arguments = local_source(cfg, "train")
    assert arguments["src_paths"] == [str(tmp_path / "train.de")]
    assert caplog.text.count("both train.de and train.de.gz are there; reading train.de") == 1


def test_a_whole_split_file_beside_its_shards_says_which_is_read(tmp_path, caplog):
    """train.de beside train-00000-of-00002.de.gz ...: the shards' pairs were left out without a word."""
    for lang in ("de", "en"):
        (tmp_path / f"train.{lang}").write_text("a\n", encoding="utf-8")
        for shard in range(2):
            with gzip.open(tmp_path / f"train-0000{shard}-of-00002.{lang}.gz", "wt", encoding="utf-8") as file:
                file.write("b\n")
    cfg = DataConfig(dataset=str(tmp_path), src_lang="de", tgt_lang="en")
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            _, arguments = local_source(cfg, "train")
    assert arguments["src_paths"] == [str(tmp_path / "train.de")]
    assert caplog.text.count("both train.de and 2 shard(s) of the split (train-00000-of-00002.de.gz, ...) are "
                             "there; reading train.de") == 1


# -- transformer-plot --------------------------------------------------------------------------------

@pytest.fixture
def metrics_run(tmp_path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    records = [{"kind": "train", "step": s, "loss": 5.0 / s, "lr": 1e-3} for s in (1, 2, 3)]
    records.append({"kind": "valid", "step": 3, "loss": 2.0, "bleu": 1.0})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return run


def test_plot_reports_the_file_it_writes(metrics_run, tmp_path, capsys):
    """--output without a suffix wrote NAME.png but printed NAME, a file that is not there; a folder as --output
    wrote FOLDER.png beside it."""
    assert main(["plot", str(metrics_run), "--output", str(tmp_path / "curves")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 0 and not (tmp_path / "curves").exists()
    folder = tmp_path / "pictures"
    folder.mkdir()
    assert plot_training_curves(metrics_run, folder) == folder / "training_curves.png"
    assert (folder / "training_curves.png").exists() and not (tmp_path / "pictures.png").exists()
    assert plot_training_curves(metrics_run, tmp_path / "curves.svg").read_text().lstrip().startswith("<?xml")


def test_plot_takes_the_log_itself_and_says_what_to_plot_of_an_ensemble(metrics_run, tmp_path, capsys):
    """The log given said "no metrics log at RUN/metrics.jsonl/metrics.jsonl"; an ensemble's folder (its members in
    seed_K/) "no metrics log at RUN/metrics.jsonl"; a run without validation drew an empty BLEU axis around 0."""
    assert main(["plot", str(metrics_run / "metrics.jsonl"), "--output", str(tmp_path / "a.png")]) == 0
    ensemble = tmp_path / "ensemble"
    for member in ("seed_1", "seed_2"):
        shutil.copytree(metrics_run, ensemble / member)
    assert main(["plot", str(ensemble)]) == 2
    assert capsys.readouterr().err == (f"error: {ensemble}: an ensemble's folder; plot one of its members' runs "
                                       f"(seed_1, seed_2), e.g. {ensemble / 'seed_1'}\n")
    log = metrics_run / "metrics.jsonl"
    log.write_text("".join(line + "\n" for line in log.read_text().splitlines() if '"valid"' not in line))
    assert main(["plot", str(metrics_run), "--output", str(tmp_path / "b.png")]) == 0


def test_plot_refuses_a_format_it_cannot_write_in_one_line(metrics_run, tmp_path, capsys):
    """--output curves.txt was matplotlib's ValueError traceback, exit code 1."""
    assert main(["plot", str(metrics_run), "--output", str(tmp_path / "curves.txt")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'curves.txt'}: cannot draw a picture as .txt") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "curves.txt").exists()
    with pytest.raises(InputError, match=r"cannot write .*missing.*curves\.png \(No such file or directory\)"):
        plot_training_curves(metrics_run, tmp_path / "missing" / "curves.png")


def test_accumulating_more_batches_than_an_epoch_holds_is_said(copy_corpus, tmp_path, caplog):
    # an update of 10 epochs, without a word, took a tester 208 s a step on a small corpus
    cfg = run_config(copy_corpus, tmp_path / "big", max_steps=1, accumulate=4, **{"data.batch_tokens": 100_000})
    loop.train(cfg)
    epoch = int(re.search(r"exceeds the (\d+) batches of an epoch", caplog.text).group(1))
    assert epoch < 4 and f"train.accumulate=4 exceeds the {epoch} batches" in caplog.text
    caplog.clear()
    loop.train(run_config(copy_corpus, tmp_path / "small", max_steps=1, accumulate=2))
    assert "batches of an epoch" not in caplog.text
