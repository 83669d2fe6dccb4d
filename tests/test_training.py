import gc
import logging
import math
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, metric_records, run_config, subprocess_env, toy_overrides

from transformer.averaging import average_checkpoints
from transformer.checkpoint import (
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
    step_checkpoints,
)
from transformer.config import ConfigError
from transformer.config_loading import load_config
from transformer.data.prepare import prepare_data
from transformer.errors import DataError
from transformer.runtime.distributed import DistributedContext
from transformer.runtime.machine import FLAGS
from transformer.runtime.precision import select_precision
from transformer.training import train
from transformer.training.schedule import noam_learning_rate
from transformer.training.trainer import Trainer


def train_losses(run_dir: Path) -> list[float]:
    return [r["loss"] for r in metric_records(run_dir, "train")]


def test_loss_goes_down_and_the_same_seed_gives_the_same_curve(copy_corpus, tmp_path):
    first = train(run_config(copy_corpus, tmp_path / "a", max_steps=30))
    train(run_config(copy_corpus, tmp_path / "b", max_steps=30))
    losses = train_losses(tmp_path / "a")
    assert losses == train_losses(tmp_path / "b")
    assert losses[-1] < 0.7 * losses[0]
    assert first.step == 30 and (tmp_path / "a" / "checkpoint_last.pt").exists()
    assert list((tmp_path / "a" / "tensorboard").iterdir())
    assert all(r["grad_norm"] > 0 for r in metric_records(tmp_path / "a", "train"))  # measured on logging steps only


def test_accumulated_batches_losses_are_read_from_the_device_once(copy_corpus, tmp_path, monkeypatch):
    # each batch's loss.item() and nll.item() made a GPU finish the batch before the host sent the next
    reads, item, tolist, update = [], torch.Tensor.item, torch.Tensor.tolist, Trainer.update
    monkeypatch.setattr(torch.Tensor, "item", lambda tensor: reads.append("item") or item(tensor))
    monkeypatch.setattr(torch.Tensor, "tolist", lambda tensor: reads.append("tolist") or tolist(tensor))

    def recorded_update(trainer, batches, measure_grad_norm=False):
        reads.clear()
        stats = update(trainer, batches, measure_grad_norm)
        updates.append((len(batches), list(reads), stats["loss"]))
        return stats

    updates = []
    monkeypatch.setattr(Trainer, "update", recorded_update)
    train(run_config(copy_corpus, tmp_path, max_steps=2, accumulate=3, log_every=1000))
    assert [(batches, reads) for batches, reads, _ in updates] == [(3, ["tolist"])] * 2
    assert all(math.isfinite(loss) and loss > 0 for _, _, loss in updates)


def test_a_cooldown_brings_the_learning_rate_to_zero_at_the_end_of_the_budget(copy_corpus, tmp_path):
    train(run_config(copy_corpus, tmp_path, max_steps=20, log_every=1, cooldown=0.5, max_time="1h"))
    logged = {r["step"]: r["lr"] for r in metric_records(tmp_path, "train")}
    for step in (5, 10, 11, 15, 20):  # 100 warm-up steps: the schedule still rises, the cooldown halves it by 16
        factor = min(1.0, (1 - (step - 1) / 20) / 0.5)
        assert math.isclose(logged[step], noam_learning_rate(step, 64, 100) * factor, rel_tol=1e-6), step
    state = load_checkpoint(tmp_path / "checkpoint_last.pt")["train_state"]
    assert 0 < state["max_time_used"] == pytest.approx(state["elapsed"] / 3600)  # max_time's share, for the schedule


def test_resumed_run_equals_an_uninterrupted_one(copy_corpus, tmp_path):
    # interrupted between two log lines (log_every 5): the first record after a resume averaged only the steps
    # since it; the checkpoint carries the window now
    settings = dict(max_steps=24, save_every=8, log_every=5, accumulate=2, **{"model.dropout": 0.1})
    train(run_config(copy_corpus, tmp_path / "straight", **settings))
    train(run_config(copy_corpus, tmp_path / "resumed", **{**settings, "max_steps": 8}))
    train(run_config(copy_corpus, tmp_path / "resumed", **{**settings, "max_steps": 16}))
    train(run_config(copy_corpus, tmp_path / "resumed", **settings))  # resumes automatically
    straight = load_checkpoint(tmp_path / "straight" / "checkpoint_last.pt")
    resumed = load_checkpoint(tmp_path / "resumed" / "checkpoint_last.pt")
    assert straight["step"] == resumed["step"] == 24
    for name, tensor in straight["model"].items():
        assert torch.equal(tensor, resumed["model"][name]), name
    assert train_losses(tmp_path / "straight") == train_losses(tmp_path / "resumed")
    sessions = metric_records(tmp_path / "resumed", "session")  # where each part of the run was trained
    assert [s["step"] for s in sessions] == [0, 8, 16]
    precision = select_precision("auto", torch.device("cpu"))
    assert all(s["precision"] == precision and s["threads"] == 1 for s in sessions)
    assert all(s["cpu"] and set(s["flags"]) == set(FLAGS) and s["parameters"] > 0 for s in sessions)
    stops = metric_records(tmp_path / "resumed", "stop")  # how far each session got, and why it ended
    assert [(s["step"], s["reason"]) for s in stops] == [(n, f"reached train.max_steps={n}") for n in (8, 16, 24)]


def test_checkpoint_from_an_incompatible_config_is_refused(copy_corpus, tmp_path):
    train(run_config(copy_corpus, tmp_path, max_steps=2))
    cfg = load_config(copy_corpus / "copy.yaml", toy_overrides(copy_corpus, tmp_path) + ["model.d_ff=256"])
    with pytest.raises(ConfigError, match=r"checkpoint has model.d_ff=128, the config says 256"):
        train(cfg)


def test_resuming_with_another_seed_or_from_an_averaged_checkpoint_is_one_line(copy_corpus, tmp_path):
    """The seed was checked when the batches' position loaded, after config.yaml had taken the refused settings
    (and a warning had said the run "goes on" with them)."""
    train(run_config(copy_corpus, tmp_path, max_steps=2, save_every=1))
    saved = (tmp_path / "config.yaml").read_text()
    with pytest.raises(ConfigError, match=r"checkpoint_last.pt: checkpoint's batch order comes from train.seed=1, "
                                          r"the config says 2: resume with train.seed=1, or start a new "
                                          r"train.run_dir$"):
        train(run_config(copy_corpus, tmp_path, max_steps=4, seed=2))
    assert (tmp_path / "config.yaml").read_text() == saved
    averaged = tmp_path / "checkpoint_averaged.pt"
    save_checkpoint(average_checkpoints(step_checkpoints(tmp_path)), averaged)
    with pytest.raises(CheckpointError, match="checkpoint_averaged.pt: no optimizer state to resume from"):
        train(run_config(copy_corpus, tmp_path, max_steps=4), resume_from=averaged)
    with pytest.raises(CheckpointError, match="another model or corpus than .* \\(model.dropout=0.2, not 0.0\\)"):
        other = tmp_path / "other"
        train(run_config(copy_corpus, other, max_steps=1, **{"model.dropout": 0.2}))
        average_checkpoints([tmp_path / "checkpoint_last.pt", other / "checkpoint_last.pt"])


def test_validation_searches_even_when_the_config_samples(copy_corpus, tmp_path):
    """decode.sampling is for translating; the best checkpoint must not be chosen on random samples."""
    settings = dict(max_steps=6, valid_every=6)
    train(run_config(copy_corpus, tmp_path / "search", **settings))
    train(run_config(copy_corpus, tmp_path / "sample", **settings, **{"decode.sampling": True, "decode.seed": 3}))
    searched, sampled = (metric_records(tmp_path / run, "valid")[0] for run in ("search", "sample"))
    assert (searched["bleu"], searched["chrf"]) == (sampled["bleu"], sampled["chrf"])


def test_a_finished_run_started_again_trains_no_further(copy_corpus, tmp_path):
    train(run_config(copy_corpus, tmp_path, max_steps=3))
    first = load_checkpoint(tmp_path / "checkpoint_last.pt")
    assert train(run_config(copy_corpus, tmp_path, max_steps=3)).step == 3
    again = load_checkpoint(tmp_path / "checkpoint_last.pt")
    assert again["step"] == 3 and all(torch.equal(t, again["model"][k]) for k, t in first["model"].items())


def test_training_data_that_gives_no_batch_is_an_error_not_an_endless_loop(copy_corpus, tmp_path):
    corpus = tmp_path / "corpus"
    shutil.copytree(copy_corpus, corpus)
    for side in ("src", "tgt"):  # one-word validation pairs: within the limit, unlike every training pair
        (corpus / f"valid.{side}").write_text("alpha\nbeta\n")
    with pytest.raises(DataError, match="the training data gives no batch"):  # every pair is longer than this
        train(run_config(corpus, tmp_path / "run", max_steps=3, **{"data.max_length": 2, "data.dataset": corpus}))
    with pytest.raises(DataError, match=r"every pair of the validation split 'valid' is longer than "
                                        r"data.max_length=2 tokens: nothing to validate on"):
        train(run_config(copy_corpus, tmp_path / "run2", max_steps=3, **{"data.max_length": 2}))


def test_an_empty_validation_split_is_refused_before_training(copy_corpus, tmp_path):
    corpus = tmp_path / "corpus"
    shutil.copytree(copy_corpus, corpus)
    for side in ("src", "tgt"):
        (corpus / f"valid.{side}").write_text("")
    with pytest.raises(DataError, match=r"valid.src, .*valid.tgt: split 'valid' has no pairs"):
        train(run_config(corpus, tmp_path / "run", max_steps=3))
    assert not list((tmp_path / "run").glob("*.pt"))


def test_streaming_under_torchrun_without_valid_every_is_refused(copy_corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")  # refused before any process group is joined
    with pytest.raises(ConfigError, match="data.streaming under torchrun needs train.valid_every > 0"):
        train(run_config(copy_corpus, tmp_path, max_steps=3, valid_every=0, **{"data.streaming": True}))


def test_unwritable_run_directory_is_reported_before_training(copy_corpus, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="train.run_dir: cannot write"):
        train(run_config(copy_corpus, blocker / "run"))


def cli(*args: str, **kwargs) -> subprocess.Popen:
    env = subprocess_env()
    return subprocess.Popen([sys.executable, "-m", "transformer", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def test_sigterm_saves_a_checkpoint_to_resume_from(copy_corpus, tmp_path):
    process = cli("train", str(copy_corpus / "copy.yaml"),
                  *toy_overrides(copy_corpus, tmp_path, max_steps=100000, save_every=100000, log_every=1))
    deadline = time.monotonic() + 120
    metrics = tmp_path / "metrics.jsonl"
    while not (metrics.exists() and metrics.read_text().count("\n") >= 3) and time.monotonic() < deadline:
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr
    state = load_checkpoint(tmp_path / "checkpoint_last.pt")
    assert state["step"] >= 3


def test_two_process_ddp_makes_the_same_update_as_one_process(copy_corpus, tmp_path):
    """Adam's epsilon is raised from 1e-9 to 1e-3 here. With 1e-9 Adam turns a gradient that is rounding noise
    (the attention keys' bias gets none, and part of their weights: softmax ignores a shift of all scores) into a
    whole step of the learning rate in a direction the noise chose, so that any last-bit difference between the
    runs could fail the test (it failed once in about 60 runs on a loaded CPU, in the first layer's query-key-value
    weights; its cause was not caught). With 1e-3 such a gradient moves its weight by a thousandth of a step,
    while real ones still move theirs by a good part of one: a gradient twice too large fails the test."""
    settings = dict(max_steps=3, device="cpu", adam_eps=1e-3)  # the ranks talk through gloo
    train(run_config(copy_corpus, tmp_path / "single", accumulate=2, **settings))
    env = subprocess_env()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "-m", "transformer", "train", str(copy_corpus / "copy.yaml"),
               *toy_overrides(copy_corpus, tmp_path / "ddp", accumulate=1, **settings)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    one = load_checkpoint(tmp_path / "single" / "checkpoint_last.pt")["model"]
    two = load_checkpoint(tmp_path / "ddp" / "checkpoint_last.pt")["model"]
    for name in one:
        torch.testing.assert_close(one[name], two[name], atol=1e-6, rtol=0, msg=lambda found: f"{name}: {found}")


def test_training_frees_its_trainer_before_the_process_group_is_destroyed(copy_corpus, tmp_path):
    """The Trainer sits in reference cycles, and under torchrun its DDP reducer holds the process group: left to the
    garbage collector, the group outlived destroy_process_group until the interpreter shut down, where a rank
    aborted now and then ("terminate called without an active exception": 2 of 12 runs of test_elastic's
    restart test, and in CI). train() frees it first; the collector is off here, so nothing else would. Only this
    run's Trainer counts: one another test keeps alive (an error it raised, holding the frames) is not this one's."""
    gc.collect()
    gc.disable()
    try:
        before = {id(thing) for thing in gc.get_objects() if type(thing) is Trainer}
        train(run_config(copy_corpus, tmp_path, max_steps=2))
        assert not [thing for thing in gc.get_objects() if type(thing) is Trainer and id(thing) not in before]
    finally:
        gc.enable()


def test_streaming_mode_trains_and_resumes_like_a_full_run(copy_corpus, tmp_path):
    # 200 pairs make about 5 batches an epoch: 12 steps cross epochs, and the resume happens mid-epoch
    streaming = {"data.streaming": "true", "data.shuffle_buffer": 50, "data.max_train_samples": 200}
    settings = dict(max_steps=12, save_every=6, log_every=3, **streaming)
    train(run_config(copy_corpus, tmp_path / "straight", **settings))
    train(run_config(copy_corpus, tmp_path / "resumed", **{**settings, "max_steps": 6}))
    summary = train(run_config(copy_corpus, tmp_path / "resumed", **settings))
    assert summary.step == 12
    assert train_losses(tmp_path / "straight") == train_losses(tmp_path / "resumed")
    assert load_checkpoint(tmp_path / "resumed" / "checkpoint_last.pt")["epoch"] >= 2


def test_a_validation_pair_longer_than_training_holds_is_left_out_of_the_loss(copy_corpus, tmp_path, caplog):
    """A stray line of 66,000 tokens took 25 s of teacher forcing at every validation (the rest 0.02 s), and one of a
    million kept the first validation going for over 13 minutes, deaf to Ctrl-C: the loss is over the pairs of at most
    data.max_length tokens a side, as training's."""
    corpus = tmp_path / "corpus"
    shutil.copytree(copy_corpus, corpus)
    long_line = " ".join(["alpha"] * 500) + "\n"  # the copy task's max_length is 64 tokens
    for side in ("src", "tgt"):
        with open(corpus / f"valid.{side}", "a") as file:
            file.write(long_line)
    run = tmp_path / "run"
    with caplog.at_level(logging.WARNING):
        train(run_config(corpus, run, max_steps=2, valid_every=2, **{"data.dataset": corpus}))
    assert "1 of 101 validation pairs are longer than data.max_length=64 tokens: the validation loss leaves them out" \
        in caplog.text
    data = prepare_data(run_config(corpus, run, **{"data.dataset": corpus}), run, DistributedContext())
    batched = sorted(index for batch in data.valid_batches() for index in batch.indices)
    assert batched == list(range(len(data.valid) - 1))  # all but the long pair, the last
