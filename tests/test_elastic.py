"""Two ranks under torchrun (CPU, gloo): a resumed run, and a rank killed mid-run that torchrun restarts,
both end with the parameters of an uninterrupted run. Each rank has its own RNG state (dropout)."""

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, metric_records, run_config, subprocess_env, toy_overrides

from transformer.checkpoint import load_checkpoint, save_checkpoint
from transformer.training import train
from transformer.training.checkpoints import rank_entry

# Runs `python -m transformer` as torchrun's script; rank 1 kills itself with SIGKILL right after the
# optimizer step of update KILL_AT, in the first attempt only (torchrun counts restarts from 0).
KILLER = """
import os, runpy, signal
from transformer.training import loop, trainer

at = int(os.environ["KILL_AT"])
update = trainer.Trainer.update

def killing_update(self, batches, **kwargs):
    stats = update(self, batches, **kwargs)
    if self.ctx.rank == 1 and self.state.step + 1 == at and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        os.kill(os.getpid(), signal.SIGKILL)
    return stats

trainer.Trainer.update = killing_update
runpy.run_module("transformer", run_name="__main__")
"""

# dropout makes each rank's RNG matter; the kill at 10 falls between the checkpoints of steps 6 and 12
SETTINGS = dict(max_steps=18, save_every=6, valid_every=12, log_every=3, **{"model.dropout": 0.1})


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A copy of the package, which every torchrun of this module runs. Workers import the package
    when they start, and a restart starts them again seconds later: an edit saved in the checkout
    meanwhile (an editor, a colleague in a shared tree) made the restarted workers run other code;
    one that left an import broken for a moment failed that attempt and torchrun restarted again."""
    root = tmp_path_factory.mktemp("checkout")
    shutil.copytree(ROOT / "transformer", root / "transformer", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def worker_launch(checkout: Path) -> dict:
    """Where a torchrun of this module runs, and its environment: ``python -m`` looks in the current
    directory first, a script's workers on PYTHONPATH; both find the copy."""
    env = subprocess_env()
    return dict(cwd=checkout, env={**env, "PYTHONPATH": os.pathsep.join([str(checkout), env["PYTHONPATH"]])})


def torchrun(checkout: Path, corpus: Path, run_dir: Path, *launcher: str,
             script: tuple[str, ...] = ("-m", "transformer"), env: dict[str, str] | None = None,
             **settings) -> subprocess.CompletedProcess:
    """Train the copy task on two CPU ranks under torchrun, with the package's copy in ``checkout``;
    fail the test past 4 minutes."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "--monitor-interval=0.5", *launcher, *script, "train", str(corpus / "copy.yaml"),
               *toy_overrides(corpus, run_dir, **settings)]
    launch = worker_launch(checkout)
    process = subprocess.Popen(command, cwd=launch["cwd"], env={**launch["env"], "LOGLEVEL": "INFO", **(env or {})},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = process.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail(f"torchrun did not finish in 4 minutes:\n{stop(process)[-3000:]}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def stop(process: subprocess.Popen) -> str:
    """Stop torchrun and its workers, which run in sessions of their own (a signal to torchrun's process
    group misses them); return its stderr."""
    process.send_signal(signal.SIGTERM)  # torchrun passes it on to its workers
    try:
        return process.communicate(timeout=60)[1]
    except subprocess.TimeoutExpired:
        workers = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
        for pid in [*map(int, workers), process.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return process.communicate()[1]


def failures(result: subprocess.CompletedProcess) -> str:
    """Why each attempt failed (the agent's verdicts, the workers' errors), then the end of stderr:
    the end alone shows only the last attempt."""
    lines = [line for line in result.stderr.splitlines()
             if "failed (exitcode" in line or re.match(r"(\[rank\d+\]: )?\w*(Error|Exception)\b", line)]
    return "\n".join([*lines, "...", result.stderr[-3000:]])


def assert_same_parameters(first: Path, second: Path) -> None:
    a, b = load_checkpoint(first / "checkpoint_last.pt"), load_checkpoint(second / "checkpoint_last.pt")
    assert a["step"] == b["step"]
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name  # bitwise: the same sums in the same order


@pytest.fixture(scope="module")
def straight_run(checkout, copy_corpus, tmp_path_factory) -> Path:
    """An uninterrupted two-rank run."""
    run_dir = tmp_path_factory.mktemp("straight")
    result = torchrun(checkout, copy_corpus, run_dir, **SETTINGS)
    assert result.returncode == 0, failures(result)
    return run_dir


def test_workers_of_every_attempt_import_the_copy_of_the_package(checkout, tmp_path):
    script = tmp_path / "where.py"
    script.write_text("import transformer; print(transformer.__file__)")
    for command in (["-c", script.read_text()], [str(script)]):  # looks where `python -m transformer` does; a script
        found = subprocess.run([sys.executable, *command], capture_output=True, text=True, check=True,
                               **worker_launch(checkout))
        assert Path(found.stdout.strip()).is_relative_to(checkout), command


def test_each_rank_takes_its_own_entry_of_a_checkpoint():
    assert rank_entry([{"rank": 0}, {"rank": 1}], rank=1, world_size=2) == {"rank": 1}
    assert rank_entry({"rank": 0}, rank=1, world_size=2) == {"rank": 0}  # written before entries were per rank
    assert rank_entry([{"rank": 0}, {"rank": 1}], rank=2, world_size=4) == {"rank": 0}  # another world size


def test_checkpoint_of_another_world_size_or_an_older_version_resumes(copy_corpus, tmp_path, caplog):
    settings = dict(max_steps=6, save_every=3, log_every=3, **{"model.dropout": 0.1})
    train(run_config(copy_corpus, tmp_path / "straight", **settings))
    for name, per_rank in (("two_ranks", lambda entry: [entry[0], entry[0]]), ("older", lambda entry: entry[0])):
        run_dir = tmp_path / name
        train(run_config(copy_corpus, run_dir, **{**settings, "max_steps": 3}))
        state = load_checkpoint(run_dir / "checkpoint_last.pt")
        assert len(state["rng"]) == len(state["batches"]) == 1  # one entry per rank
        save_checkpoint({**state, "rng": per_rank(state["rng"]), "batches": per_rank(state["batches"])},
                        run_dir / "checkpoint_last.pt")
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert train(run_config(copy_corpus, run_dir, **settings)).step == 6
        warned = "holds the random state and batch position of 2 rank(s), this run has 1" in caplog.text
        assert warned == (name == "two_ranks")
        assert_same_parameters(tmp_path / "straight", run_dir)  # rank 0's state is this run's own


@pytest.mark.slow
def test_two_rank_run_resumed_from_a_checkpoint_equals_an_uninterrupted_one(checkout, copy_corpus, tmp_path,
                                                                            straight_run):
    run_dir = tmp_path / "resumed"
    for max_steps in (6, SETTINGS["max_steps"]):  # the second session resumes from step 6 by itself
        result = torchrun(checkout, copy_corpus, run_dir, **{**SETTINGS, "max_steps": max_steps})
        assert result.returncode == 0, failures(result)
    assert result.stderr.count("resumed from ") == 1 and "at step 6" in result.stderr  # said once, not once a rank
    assert result.stdout.count("done: ") == 1, result.stdout  # rank 0's; rank 1's said "best bleu none"
    assert_same_parameters(straight_run, run_dir)
    assert metric_records(straight_run, "train") == metric_records(run_dir, "train")


@pytest.mark.slow
def test_rank_killed_mid_run_is_restarted_by_torchrun_and_ends_like_an_uninterrupted_run(checkout, copy_corpus,
                                                                                         tmp_path, straight_run):
    killer, run_dir = tmp_path / "killer.py", tmp_path / "killed"
    killer.write_text(KILLER)
    result = torchrun(checkout, copy_corpus, run_dir, "--max-restarts=3", script=(str(killer),),
                      env={"KILL_AT": "10"}, **SETTINGS)
    assert result.returncode == 0, failures(result)
    assert result.stderr.count("will restart worker group") == 1, failures(result)  # one restart
    assert "failed (exitcode: -9) local_rank: 1" in result.stderr
    assert result.stderr.count("checkpoint_last.pt at step 6") == 1  # "resumed from ...", once (by each rank before)
    assert_same_parameters(straight_run, run_dir)
    assert metric_records(straight_run, "train") == metric_records(run_dir, "train")
    assert metric_records(straight_run, "valid") == metric_records(run_dir, "valid")
