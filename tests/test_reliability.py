"""Faults and bad input: crashes at awkward moments, corrupt checkpoints, NaN losses, a full
disk, wrong configs, and a fuzzed translation input. Each test fails if its property breaks."""

import errno
import logging
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, metric_records, run_config, subprocess_env, toy_overrides

from transformer import fast
from transformer.checkpoint import CheckpointError, load_checkpoint
from transformer.cli import main
from transformer.config import ConfigError
from transformer.config_loading import load_config
from transformer.data.tokenizer import TokenizerError
from transformer.errors import DataError
from transformer.training import loop

# Runs the train command in a child process that kills itself with SIGKILL at a chosen point.
KILLER = """
import os, signal, sys
import torch
from transformer.training import loop, trainer
from transformer.cli import main

point, at = sys.argv[1], int(sys.argv[2])

def die():
    os.kill(os.getpid(), signal.SIGKILL)

if point == "update":  # right after the optimizer step of update `at`
    update = trainer.Trainer.update
    def killing_update(self, batches, **kwargs):
        stats = update(self, batches, **kwargs)
        if self.state.step + 1 == at:
            die()
        return stats
    trainer.Trainer.update = killing_update
elif point == "save":  # halfway through writing the checkpoint of step `at`
    save = torch.save
    def killing_save(state, file, *args, **kwargs):
        if state.get("step") == at:
            file.write(b"half a checkpoint")
            file.flush()
            die()
        return save(state, file, *args, **kwargs)
    torch.save = killing_save
elif point == "validate":  # during the validation at step `at`
    validate = trainer.Trainer.validate
    def killing_validate(self):
        if self.state.step == at:
            die()
        return validate(self)
    trainer.Trainer.validate = killing_validate
sys.exit(main(["train", *sys.argv[3:]]))
"""

SETTINGS = dict(max_steps=24, save_every=6, valid_every=12, log_every=3, **{"model.dropout": 0.1})


def train_args(corpus: Path, run_dir: Path, **values) -> list[str]:
    return [str(corpus / "copy.yaml"), *toy_overrides(corpus, run_dir, **values)]


def run_killed(point: str, at: int, args: list[str]) -> subprocess.CompletedProcess:
    env = subprocess_env()
    return subprocess.run([sys.executable, "-c", KILLER, point, str(at), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def assert_same_parameters(first: Path, second: Path) -> None:
    a, b = load_checkpoint(first), load_checkpoint(second)
    assert a["step"] == b["step"]
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name


@pytest.mark.slow
def test_sigkill_at_any_point_then_resume_gives_the_uninterrupted_result(copy_corpus, tmp_path):
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    loop.train(load_config(copy_corpus / "copy.yaml", toy_overrides(copy_corpus, straight, **SETTINGS)))
    args = train_args(copy_corpus, crashed, **SETTINGS)
    for point, at in (("update", 8), ("save", 12), ("validate", 24)):
        result = run_killed(point, at, args)
        assert result.returncode == -9, f"{point}: {result.stderr[-2000:]}"
        if point == "save":  # the half-written checkpoint is a temporary file; the last one is intact
            assert list(crashed.glob(".checkpoint_*.tmp"))
            assert load_checkpoint(crashed / "checkpoint_last.pt")["step"] == 6
    assert main(["train", *args]) == 0
    assert not list(crashed.glob(".checkpoint_*.tmp"))  # cleaned up when training starts again
    assert_same_parameters(straight / "checkpoint_last.pt", crashed / "checkpoint_last.pt")
    assert metric_records(straight, "train") == metric_records(crashed, "train")
    bleu = [[r["bleu"] for r in metric_records(run, "valid")] for run in (straight, crashed)]
    assert bleu[0] == bleu[1]


def test_corrupt_last_checkpoint_falls_back_to_the_newest_intact_one(copy_corpus, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    run = tmp_path / "run"
    loop.train(load_config(copy_corpus / "copy.yaml", toy_overrides(copy_corpus, run, max_steps=12, save_every=6)))
    last = run / "checkpoint_last.pt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    summary = loop.train(load_config(copy_corpus / "copy.yaml",
                                     toy_overrides(copy_corpus, run, max_steps=14, save_every=6)))
    assert "checkpoint_last.pt: truncated or corrupt checkpoint" in caplog.text
    assert "resumed from" in caplog.text and "checkpoint_step12.pt at step 12" in caplog.text
    assert summary.step == 14


def test_with_every_other_checkpoint_unreadable_the_best_resumes_and_with_none_the_run_is_refused(
        copy_corpus, tmp_path, caplog):
    """All but checkpoint_best.pt cut in half: the run started over from step 0 and wrote over the best."""
    caplog.set_level(logging.INFO)
    run = tmp_path / "run"
    settings = dict(max_steps=12, save_every=6, valid_every=6)
    loop.train(load_config(copy_corpus / "copy.yaml", toy_overrides(copy_corpus, run, **settings)))
    best = load_checkpoint(run / "checkpoint_best.pt")["step"]
    for path in run.glob("checkpoint_*.pt"):
        if path.name != "checkpoint_best.pt":
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    loop.train(load_config(copy_corpus / "copy.yaml", toy_overrides(copy_corpus, run, **{**settings, "max_steps": 14})))
    assert f"checkpoint_best.pt at step {best}" in caplog.text
    for path in run.glob("checkpoint_*.pt"):
        path.write_bytes(b"not a checkpoint")
    before = {path.name: path.read_bytes() for path in run.iterdir() if path.is_file()}
    with pytest.raises(CheckpointError, match=r"run: no intact checkpoint to resume from \(checkpoint_last.pt, .*"
                                              r"checkpoint_best.pt: unreadable\); move them away"):
        loop.train(load_config(copy_corpus / "copy.yaml", toy_overrides(copy_corpus, run, max_steps=20)))
    assert {path.name: path.read_bytes() for path in run.iterdir() if path.is_file()} == before


def test_a_refused_resume_leaves_the_runs_config_and_a_stopped_run_stays_stopped(copy_corpus, tmp_path):
    run = tmp_path / "run"
    early = dict(max_steps=1000, valid_every=2, patience=1, best_metric="loss", lr=50.0)  # no better loss soon
    summary = loop.train(load_config(copy_corpus / "copy.yaml", toy_overrides(copy_corpus, run, **early)))
    assert summary.stop_reason.startswith("early stopping") and summary.step < 1000
    config = (run / "config.yaml").read_text()
    again = loop.train(load_config(copy_corpus / "copy.yaml", toy_overrides(copy_corpus, run, **early)))
    assert again.step == summary.step and again.stop_reason.startswith("early stopping")  # no step more
    with pytest.raises(ConfigError, match="checkpoint has model.d_model=64, the config says 32"):
        loop.train(load_config(copy_corpus / "copy.yaml", toy_overrides(copy_corpus, run, **{**early,
                                                                                             "model.d_model": 32})))
    assert (run / "config.yaml").read_text() == config
    with pytest.raises(ConfigError, match="train.run_dir is empty"):
        load_config(None, ["train.run_dir="])


def test_resume_asked_for_where_there_is_nothing_to_resume_is_refused(copy_corpus, tmp_path, capsys):
    """--resume on a run directory without checkpoints (a typo in train.run_dir) started a new run."""
    assert main(["train", str(copy_corpus / "copy.yaml"), *toy_overrides(copy_corpus, tmp_path / "typo"),
                 "--resume"]) == 2
    assert capsys.readouterr().err == f"error: --resume: {tmp_path / 'typo'} holds no checkpoint to resume from\n"
    assert not (tmp_path / "typo").exists()


def test_a_resume_on_another_corpus_or_vocabulary_is_refused_and_other_changes_are_said(
        copy_corpus, tmp_path, caplog):
    """A resume with another training split or vocabulary size trained on, with the run's tokenizer and batch
    position (another corpus: `test_the_corpus_of_a_resume_is_known_by_its_files_*`)."""
    run = tmp_path / "run"
    loop.train(run_config(copy_corpus, run, max_steps=10))
    before = {path.name: path.read_bytes() for path in run.iterdir() if path.is_file()}
    for change, message in (({"data.vocab_size": 300}, "data.vocab_size=320, the config says 300"),
                            ({"data.train_split": "valid"}, "data.train_split=train, the config says valid")):
        with pytest.raises(ConfigError, match=f"checkpoint_last.pt: checkpoint was trained with {message}; a run "
                                              f"keeps its corpus and vocabulary"):
            loop.train(run_config(copy_corpus, run, max_steps=12, **change))
    assert {path.name: path.read_bytes() for path in run.iterdir() if path.is_file()} == before
    caplog.set_level(logging.WARNING)
    assert loop.train(run_config(copy_corpus, run, max_steps=12, **{"data.batch_tokens": 256})).step == 12
    assert "settings changed since checkpoint_last.pt: data.batch_tokens 512 -> 256; train.max_steps 10 -> 12" \
        in caplog.text


def test_a_tokenizer_left_in_the_run_directory_is_not_reused_for_another_vocabulary(copy_corpus, tmp_path):
    """A run stopped before its first checkpoint left its tokenizer, which a start with another size reused."""
    run = tmp_path / "run"
    loop.train(run_config(copy_corpus, run, max_steps=2, save_every=0))
    for path in run.glob("checkpoint_*.pt"):
        path.unlink()
    with pytest.raises(ConfigError, match=f"{run}: its tokenizer was trained with data.vocab_size=320 \\(its "
                                          f"config.yaml\\), the config says 300; use another train.run_dir, or "
                                          f"remove spm.model there"):
        loop.train(run_config(copy_corpus, run, max_steps=2, **{"data.vocab_size": 300}))
    assert loop.train(run_config(copy_corpus, run, max_steps=2)).step == 2  # its own settings: reused


def test_another_runs_checkpoint_resumes_with_its_own_tokenizer(copy_corpus, tmp_path):
    """--resume of another run's checkpoint trained a new tokenizer in the new run directory and went on with it."""
    first = tmp_path / "first"
    loop.train(run_config(copy_corpus, first, max_steps=10, **{"data.spm_input_sentence_size": 500}))
    summary = loop.train(run_config(copy_corpus, tmp_path / "second", max_steps=12), first / "checkpoint_last.pt")
    assert summary.step == 12
    assert (tmp_path / "second" / "spm.model").read_bytes() == (first / "spm.model").read_bytes()
    alone = tmp_path / "alone"  # without its tokenizer, the new run trained another: refused before that
    alone.mkdir()
    shutil.copy(first / "checkpoint_last.pt", alone)
    with pytest.raises(CheckpointError, match=f"checkpoint_last.pt: its tokenizer \\(spm.model\\) is neither in "
                                              f"{tmp_path / 'third'} nor beside the checkpoint; copy it there"):
        loop.train(run_config(copy_corpus, tmp_path / "third", max_steps=12), alone / "checkpoint_last.pt")
    assert not (tmp_path / "third" / "spm.model").exists()
    loop.train(run_config(copy_corpus, tmp_path / "fourth", max_steps=1))  # a tokenizer of the default sample
    with pytest.raises(TokenizerError, match=f"checkpoint_last.pt: trained with another tokenizer than "
                                             f"{tmp_path / 'fourth' / 'spm.model'}; put the tokenizer of the run"):
        loop.train(run_config(copy_corpus, tmp_path / "fourth", max_steps=12), alone / "checkpoint_last.pt")


def test_a_checkpoint_beside_another_tokenizer_is_refused_by_every_command(copy_corpus, tmp_path, capsys):
    """A checkpoint copied beside another run's tokenizer of its size translated garbage, and was exported and
    fine-tuned, without a word."""
    loop.train(run_config(copy_corpus, tmp_path / "first", max_steps=1))
    loop.train(run_config(copy_corpus, tmp_path / "other", max_steps=1, **{"data.spm_input_sentence_size": 500}))
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(tmp_path / "first" / "checkpoint_last.pt", mixed)
    shutil.copy(tmp_path / "other" / "spm.model", mixed)
    checkpoint = str(mixed / "checkpoint_last.pt")
    message = (f"{checkpoint}: trained with another tokenizer than {mixed / 'spm.model'}; put the tokenizer of the "
               f"run that wrote the checkpoint there")
    capsys.readouterr()
    for command in (["translate", "--checkpoint", checkpoint, "alpha"],
                    ["evaluate", "--checkpoint", checkpoint, "--split", "valid"],
                    ["export", "--checkpoint", checkpoint, "--output", str(tmp_path / "release")],
                    ["export", "--checkpoint", checkpoint, "--format", "onnx", "--output", str(tmp_path / "onnx")]):
        assert main(command) == 2
        assert capsys.readouterr().err == f"error: {message}\n"
    with pytest.raises(TokenizerError, match=re.escape(message)):
        loop.train(run_config(copy_corpus, tmp_path / "child", max_steps=2, init_from=checkpoint))
    with pytest.raises(TokenizerError, match=re.escape(message)):  # resumed in a new run directory: it copied that
        loop.train(run_config(copy_corpus, tmp_path / "resumed", max_steps=2), mixed / "checkpoint_last.pt")
    assert not (tmp_path / "resumed" / "spm.model").exists()  # tokenizer there first, and refused the right one


def test_the_corpus_of_a_resume_is_known_by_its_files_not_by_how_its_path_is_written(
        copy_corpus, tmp_path, monkeypatch):
    """data.dataset was compared as written: the same folder written another way was refused, and another
    folder under the same relative path (a start from another directory) resumed."""
    monkeypatch.chdir(copy_corpus.parent)
    run = tmp_path / "run"
    loop.train(run_config(copy_corpus, run, max_steps=4, save_every=2, **{"data.dataset": copy_corpus.name}))
    summary = loop.train(run_config(copy_corpus, run, max_steps=6, save_every=2,
                                    **{"data.dataset": f"./{copy_corpus.name}/"}))  # the same folder
    assert summary.step == 6
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(copy_corpus, elsewhere / copy_corpus.name)
    with (elsewhere / copy_corpus.name / "train.src").open("a") as train:
        train.write("alpha\n")
    with (elsewhere / copy_corpus.name / "train.tgt").open("a") as train:
        train.write("ALPHA\n")
    monkeypatch.chdir(elsewhere)
    with pytest.raises(ConfigError, match=f"checkpoint_last.pt: checkpoint was trained on another corpus than "
                                          f"data.dataset={copy_corpus.name} \\(other training files, or other "
                                          f"sizes\\)"):
        loop.train(run_config(copy_corpus, run, max_steps=8, **{"data.dataset": copy_corpus.name}))


def test_a_failed_first_start_of_a_fine_tuning_run_does_not_lock_its_directory(copy_corpus, tmp_path):
    """A fine-tuning start with a typo in data.dataset left config.yaml and the parent's tokenizer; the start
    with the typo fixed was refused as if that tokenizer had been trained for the typo."""
    loop.train(run_config(copy_corpus, tmp_path / "parent", max_steps=2))
    fine_tuning = dict(max_steps=4, init_from=tmp_path / "parent" / "checkpoint_last.pt")
    with pytest.raises(DataError, match="not found"):
        loop.train(run_config(copy_corpus, tmp_path / "child", **fine_tuning, **{"data.dataset": tmp_path / "typo"}))
    assert loop.train(run_config(copy_corpus, tmp_path / "child", **fine_tuning)).step == 4


def test_damaged_lines_of_the_metrics_log_are_skipped_by_a_resume_and_the_plot(copy_corpus, tmp_path, capsys):
    """A line of JSON that is no record, or bytes that are not UTF-8, ended a resume in a traceback."""
    run = tmp_path / "run"
    loop.train(load_config(copy_corpus / "copy.yaml", toy_overrides(copy_corpus, run, max_steps=10)))
    with (run / "metrics.jsonl").open("ab") as log:
        log.write(b'{}\n5\n{"kind": "train", "step": "x"}\n\xff\xfe\n')
    assert loop.train(load_config(copy_corpus / "copy.yaml", toy_overrides(copy_corpus, run, max_steps=12))).step == 12
    assert main(["plot", str(run), "--output", str(tmp_path / "curves.png")]) == 0
    (run / "metrics.jsonl").write_bytes(b'{"kind": "session", "step": 0}\n')  # just started: an empty figure
    capsys.readouterr()
    assert main(["plot", str(run), "--output", str(tmp_path / "empty.png")]) == 2
    assert capsys.readouterr().err == f"error: {run / 'metrics.jsonl'}: no training records to plot\n"
    (run / "metrics.jsonl").write_bytes(b"garbage\n")
    capsys.readouterr()
    assert main(["plot", str(run), "--output", str(tmp_path / "empty.png")]) == 2
    assert capsys.readouterr().err == f"error: {run / 'metrics.jsonl'}: no training records to plot\n"


def test_checkpoint_that_would_run_code_is_refused_by_the_commands(tmp_path, capsys):
    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    torch.save({"model": {}, "config": Payload()}, tmp_path / "evil.pt")
    assert main(["translate", "--checkpoint", str(tmp_path / "evil.pt"), "Hallo"]) == 2
    assert "evil.pt: refused to load" in capsys.readouterr().err
    assert not (tmp_path / "pwned").exists()


def nan_after(monkeypatch, step: int, until: int | None = None) -> None:
    """Make the training loss NaN for updates step+1 .. until (forever without ``until``)."""
    calls, for_training = {"n": 0}, fast.for_training

    def nan_for_training(model):
        real = for_training(model)

        def loss(logits, target, epsilon, pad_id):
            smoothed, nll = real(logits, target, epsilon, pad_id)
            calls["n"] += 1
            if calls["n"] > step and (until is None or calls["n"] <= until):
                return smoothed * float("nan"), nll * float("nan")
            return smoothed, nll

        return loss

    monkeypatch.setattr(fast, "for_training", nan_for_training)


def test_nan_losses_are_skipped_with_a_warning(copy_corpus, tmp_path, monkeypatch, caplog):
    nan_after(monkeypatch, 5, until=8)
    summary = loop.train(load_config(copy_corpus / "copy.yaml", toy_overrides(copy_corpus, tmp_path, max_steps=10)))
    assert summary.step == 10 and "non-finite loss at step 6: update skipped (3 in a row)" in caplog.text
    state = load_checkpoint(tmp_path / "checkpoint_last.pt")
    assert all(t.isfinite().all() for t in state["model"].values())


def test_endless_nan_losses_stop_training_and_keep_the_last_good_checkpoint(copy_corpus, tmp_path, monkeypatch):
    loop.train(load_config(copy_corpus / "copy.yaml", toy_overrides(copy_corpus, tmp_path, max_steps=5)))
    good = load_checkpoint(tmp_path / "checkpoint_last.pt")
    nan_after(monkeypatch, 0)
    summary = loop.train(load_config(copy_corpus / "copy.yaml", toy_overrides(
        copy_corpus, tmp_path, max_steps=50, max_nonfinite_steps=4)))
    assert summary.step == 5 and "4 consecutive non-finite losses" in summary.stop_reason
    after = load_checkpoint(tmp_path / "checkpoint_last.pt")
    for name, tensor in good["model"].items():
        assert torch.equal(tensor, after["model"][name])


def test_full_disk_mid_run_reports_and_keeps_the_previous_checkpoint(copy_corpus, tmp_path, monkeypatch, capsys):
    real_save = torch.save

    def save(state, file, *args, **kwargs):
        if state.get("step", 0) >= 10:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(state, file, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    assert main(["train", *train_args(copy_corpus, tmp_path, max_steps=20, save_every=5)]) == 2
    err = capsys.readouterr().err
    assert "checkpoint_last.pt at step 10 (No space left on device); the previous one is intact" in err
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["step"] == 5


@pytest.mark.parametrize("override, message", [
    ("model.d_modle=3", "unknown key 'model.d_modle'; valid keys of 'model': d_model"),
    ("train.lr=fast", "train.lr must be of type float, got 'fast'"),
    ("data.dataset=/nonexistent/corpus", "/nonexistent/corpus"),
])
def test_bad_config_gives_one_line_and_exit_code_2(copy_corpus, tmp_path, capsys, override, message):
    assert main(["train", *train_args(copy_corpus, tmp_path), override]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_debug_flag_shows_the_traceback(copy_corpus, tmp_path):
    with pytest.raises(Exception, match="unknown key"):
        main(["train", *train_args(copy_corpus, tmp_path), "model.d_modle=3", "--debug"])


def test_missing_tokenizer_file_names_the_file(trained_copy_run, tmp_path, capsys):
    checkpoint = tmp_path / "checkpoint.pt"
    checkpoint.write_bytes((trained_copy_run / "checkpoint_best.pt").read_bytes())
    assert main(["translate", "--checkpoint", str(checkpoint), "alpha beta gamma"]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "spm.model") in err and err.count("\n") == 1


def fuzz_lines(count: int, seed: int = 0) -> list[str]:
    """Awkward inputs: empty, blank, huge, emoji, right-to-left, combining marks, controls, mixed scripts."""
    rng = random.Random(seed)
    pools = [
        "😀🚀👍🏽🇩🇪‍❤️", "שלום עולם مرحبا بالعالم", "e\u0301a\u0308o\u0303\u20dd",
        "\t\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029\x00\x07\x1b",
        "Ein Mann fährt Fahrrad", "中文字符日本語한국어", "ΑΒΓ абв ﷽ ︎", "\u200b\u200d\ufeff\u202e\u00ad",
    ]
    lines = ["", " ", "\t \t", "x" * 10_000, "alpha " * 2_000]
    while len(lines) < count:
        pieces = rng.choices(pools, k=rng.randint(1, 4))
        text = "".join(rng.choice(piece) for piece in pieces for _ in range(rng.randint(1, 30)))
        if rng.random() < 0.1:
            code_point = rng.randint(0x20, 0x10FFFF)
            text += chr(0xFFFD if 0xD800 <= code_point <= 0xDFFF else code_point)  # anything but a surrogate
        lines.append(text.replace("\n", " ").replace("\r", " "))
    return lines


def test_fuzzed_input_gives_exactly_one_line_per_input_line(trained_copy_run, tmp_path, capsys):
    lines = fuzz_lines(1200)
    source = tmp_path / "fuzz.txt"
    source.write_bytes("".join(line + "\n" for line in lines).encode("utf-8"))
    output = tmp_path / "out.txt"
    assert main(["translate", "--checkpoint", str(trained_copy_run / "checkpoint_best.pt"), "--input", str(source),
                 "--output", str(output), "--beam-size", "2"]) == 0
    translations = output.read_bytes().decode("utf-8").split("\n")
    assert translations[-1] == "" and len(translations) - 1 == len(lines)
    assert all(t == "" for line, t in zip(lines, translations) if not line.strip())
    assert "line 4: longer than 64 tokens, truncated" in capsys.readouterr().err
