"""Claims of the README and docs/reliability.md about `transformer-train` on the command line: Ctrl-C,
and one-line errors with exit code 2."""

import signal
import subprocess
import sys
import time

from conftest import ROOT, run_config, subprocess_env, toy_overrides

from transformer.checkpoint import load_checkpoint
from transformer.training import train


def test_ctrl_c_saves_a_checkpoint_and_exits_with_130(copy_corpus, tmp_path):
    # no periodic checkpoints: the one found afterwards was written because of the signal
    command = [sys.executable, "-m", "transformer", "train", str(copy_corpus / "copy.yaml"),
               *toy_overrides(copy_corpus, tmp_path, max_steps=100000, save_every=100000, log_every=1)]
    process = subprocess.Popen(command, cwd=ROOT, env=subprocess_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    metrics, deadline = tmp_path / "metrics.jsonl", time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count("\n") >= 3) and time.monotonic() < deadline:
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "interrupted by SIGINT" in stdout
    step = load_checkpoint(tmp_path / "checkpoint_last.pt")["step"]
    assert step >= 3 and f"; step {step};" in stdout


def run_train(corpus, run_dir, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "transformer", "train", str(corpus / "copy.yaml"),
               *toy_overrides(corpus, run_dir), *extra]
    return subprocess.run(command, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=300)


def error_line(result: subprocess.CompletedProcess) -> str:
    """The one `error:` line, which ends stderr (INFO log lines may come before it), of a command that exited with 2."""
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1, result.stderr[-3000:]
    assert result.stderr.endswith(errors[0] + "\n") and "Traceback" not in result.stderr
    return errors[0]


def test_incompatible_checkpoint_is_one_error_line_and_exit_code_2(copy_corpus, tmp_path):
    train(run_config(copy_corpus, tmp_path, max_steps=2))
    line = error_line(run_train(copy_corpus, tmp_path, "model.d_ff=256"))
    assert "checkpoint_last.pt: checkpoint has model.d_ff=128, the config says 256" in line


def test_fp16_on_the_cpu_is_refused_with_one_error_line_and_exit_code_2(copy_corpus, tmp_path):
    result = run_train(copy_corpus, tmp_path, "train.precision=fp16", "train.device=cpu")
    assert result.stderr == error_line(result) + "\n"  # nothing else: refused before any work
    assert "fp16" in result.stderr and not (tmp_path / "checkpoint_last.pt").exists()
