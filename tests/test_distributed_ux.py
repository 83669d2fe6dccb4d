"""What a user sees of a two-rank run under torchrun (CPU, gloo) when something goes wrong: one line naming the
fault on each rank that fails, never a rank's traceback, never a hang."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, subprocess_env, toy_overrides, write_copy_corpus

from transformer.atomic_file import hold
from transformer.runtime.distributed import DistributedContext, RankLost

TINY_MODEL = ("model: {d_model: 32, n_heads: 2, d_ff: 64, n_encoder_layers: 1, n_decoder_layers: 1, dropout: 0.0, "
              "attention_dropout: 0.0}\n")


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A copy of the package for the workers to run (an edit saved in the shared checkout meanwhile must not
    change the code a worker imports; `tests/test_elastic.py` says more)."""
    root = tmp_path_factory.mktemp("checkout")
    shutil.copytree(ROOT / "transformer", root / "transformer", ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory) -> Path:
    corpus = write_copy_corpus(tmp_path_factory.mktemp("corpus"), n_train=200, n_valid=10)
    (corpus / "copy.yaml").write_text(TINY_MODEL)
    return corpus


def torchrun(checkout: Path, corpus: Path, run_dir: Path, **settings) -> subprocess.CompletedProcess:
    """Train on two CPU ranks; a run that does not end in 2 minutes fails the test (a hang)."""
    env = subprocess_env()
    env["PYTHONPATH"] = os.pathsep.join([str(checkout), env["PYTHONPATH"]])
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "--monitor-interval=1", "-m", "transformer", "train", str(corpus / "copy.yaml"),
               *toy_overrides(corpus, run_dir, **{"data.batch_tokens": 256, "data.max_length": 32, **settings})]
    try:
        return subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"torchrun hung:\n{error.stderr}")


def rank_tracebacks(stderr: str) -> list[str]:
    """The workers' tracebacks (torchrun prefixes their lines with [rankN]:), not torchrun's own report."""
    return re.findall(r"^\[rank\d+\]: Traceback.*$", stderr, flags=re.MULTILINE)


def ranks_errors(stderr: str) -> list[str]:
    """The one-line errors the ranks printed (each names its rank), not torchrun's report of them."""
    return re.findall(r"^rank \d+: error: .*$", stderr, flags=re.MULTILINE)


def test_rank_waiting_for_rank_0_that_failed_says_so_in_one_line(checkout, small_corpus, tmp_path):
    # rank 0 alone holds the run directory, and finds it held by another training: rank 1, waiting for rank 0's
    # tokenizer, printed gloo's 30-line "Connection closed by peer" traceback beneath rank 0's one-line error
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lock = hold(run_dir)
    try:
        result = torchrun(checkout, small_corpus, run_dir)
    finally:
        if lock is not None:
            os.close(lock)
    if lock is None:
        pytest.skip("no file locks here")
    assert result.returncode != 0
    said = [line for line in ranks_errors(result.stderr) if "is in use by another training process" in line]
    assert [line.split(":")[0] for line in said] == ["rank 0"], result.stderr  # and torchrun's report says it
    assert not rank_tracebacks(result.stderr), result.stderr[-3000:]


def test_torchruns_report_names_the_error_and_each_rank_says_its_own(checkout, small_corpus, tmp_path):
    # torchrun's report of the failure said "traceback : To enable traceback see: https://pytorch.org/docs/..."
    # below the ranks' two identical "error: ..." lines, which named no rank
    result = torchrun(checkout, small_corpus, tmp_path / "run", **{"data.dataset": str(tmp_path / "nowhere")})
    assert result.returncode != 0
    said = ranks_errors(result.stderr)
    assert sorted(said) == [f"rank {rank}: error: dataset {tmp_path / 'nowhere'} not found (no such file or "
                            f"directory)" for rank in (0, 1)], result.stderr[-3000:]
    root_cause = result.stderr.split("Root Cause")[-1]  # the report names the rank
    assert f"traceback : {said[0].split(': ', 1)[1]}\n" in root_cause, root_cause
    assert "To enable traceback" not in result.stderr, result.stderr[-3000:]
    assert not rank_tracebacks(result.stderr), result.stderr[-3000:]


def test_a_ranks_error_line_is_one_write(monkeypatch):
    """The ranks' lines came out as "rank 1: error: ...rank 0: error: ...": print writes the line and its newline
    apart, and with Python's unbuffered output (as under torchrun) another rank's line went between them."""
    from transformer.cli import say_error

    writes = []

    class Stderr:
        def write(self, text: str) -> None:
            writes.append(text)

        def flush(self) -> None:
            pass

    monkeypatch.setattr(sys, "stderr", Stderr())
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    say_error("error: dataset x not found")
    assert writes == ["rank 1: error: dataset x not found\n"]


def test_resumed_two_rank_run_says_each_thing_once_and_records_each_step_once(checkout, small_corpus, tmp_path):
    run_dir = tmp_path / "run"
    first = torchrun(checkout, small_corpus, run_dir, max_steps=4, save_every=2, log_every=2)
    assert first.returncode == 0, first.stderr[-3000:]
    result = torchrun(checkout, small_corpus, run_dir, max_steps=6, save_every=2, log_every=2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("resumed from") == 1  # by rank 0, as tests/test_elastic.py counts it
    # the ranks' configs are the same: the changed settings were listed once a rank
    assert result.stderr.count("the run goes on with settings changed") == 1, result.stderr
    assert result.stdout.count("done: ") == 1
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [(r["kind"], r["step"]) for r in records if r["kind"] in ("train", "valid")]
    assert len(steps) == len(set(steps)) and ("train", 6) in steps  # each step once: rank 0 alone writes
    assert [r["step"] for r in records if r["kind"] == "session"] == [0, 4]
    assert not [path.name for path in run_dir.iterdir() if "rank" in path.name]


def test_lost_rank_is_one_line_naming_the_rank_and_the_collective():
    ctx = DistributedContext(rank=1, world_size=2)
    gloo = ("[/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer "
            "[127.0.0.1]:9653. This is typically caused by a remote worker crashing.\nmore")
    with pytest.raises(RankLost) as caught:
        with ctx._collective("barrier"):
            raise RuntimeError(gloo)
    assert str(caught.value) == ("stopped: lost another of the 2 ranks (barrier failed: Connection closed by peer "
                                 "[127.0.0.1]:9653); that rank's own error, or torchrun's report, says why")


def test_ranks_wait_for_rank_0_alone_in_a_group_of_their_own_with_a_long_timeout(monkeypatch):
    """Rank 0 alone trains the tokenizer, encodes the corpus and validates while the others wait in a barrier or an
    all_gather: the default group's timeout (10 minutes over nccl) ended them on a large corpus's first start."""
    from datetime import timedelta

    import torch

    from transformer.runtime import distributed

    made, waited = [], []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(distributed.dist, "get_rank", lambda: 1)
    monkeypatch.setattr(distributed.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(distributed.dist, "new_group", lambda **kwargs: made.append(kwargs) or "waits")
    monkeypatch.setattr(distributed.dist, "barrier", lambda group=None: waited.append(group))
    monkeypatch.setattr(distributed.dist, "all_gather_object", lambda out, value, group=None: waited.append(group))
    ctx = distributed.init_distributed(torch.device("cpu"))
    ctx.barrier()
    ctx.all_gather_object({"rng": 1})
    assert made == [{"backend": "gloo", "timeout": distributed.WAIT_TIMEOUT}] and waited == ["waits", "waits"]
    assert distributed.WAIT_TIMEOUT >= timedelta(hours=1)


def test_a_fault_of_the_rank_itself_is_not_called_a_lost_rank():
    """Out of memory, or a bug (lists of other lengths on two ranks), read "lost another rank" and exited 2."""
    import torch

    ctx = DistributedContext(rank=0, world_size=2)
    for error in (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                  RuntimeError("CUDA error: the launch timed out and was terminated"),
                  RuntimeError("[enforce fail at gloo/allreduce.cc:123] sizes mismatch")):
        with pytest.raises(type(error)) as caught:
            with ctx._collective("all_reduce"):
                raise error
        assert caught.value is error
    with pytest.raises(RankLost, match=r"all_reduce failed: Timed out waiting 1800000ms"):
        with ctx._collective("all_reduce"):
            raise RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms for recv")
