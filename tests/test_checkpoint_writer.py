"""Checkpoints written on a thread of their own (transformer/training/checkpoint_writer.py): training goes on while
a checkpoint is written, the file holds the state of its step, and a failed write is raised, not lost."""

import threading

import pytest
import torch
from conftest import toy_overrides

from transformer.checkpoint import load_checkpoint
from transformer.config_loading import load_config
from transformer.training import checkpoints, loop
from transformer.training.checkpoint_writer import CheckpointWriter
from transformer.training.trainer import Trainer


def test_the_job_writes_the_state_as_it_was_when_saved_while_the_caller_goes_on():
    writer, started, release, seen = CheckpointWriter(), threading.Event(), threading.Event(), []
    weight = torch.ones(3)

    def job(state):
        started.set()
        release.wait(10)
        seen.append(state["model"]["weight"].clone())

    writer.write({"model": {"weight": weight}, "step": 1}, job)
    assert started.wait(10) and not seen  # the job runs, and write() has returned before it ends
    weight.add_(1)  # the next step changes the parameters in place
    release.set()
    writer.wait()
    assert seen[0].tolist() == [1.0, 1.0, 1.0]
    writer.close()


def test_tied_tensors_stay_one_and_the_host_buffers_are_kept_from_one_save_to_the_next():
    writer, states = CheckpointWriter(), []
    shared, other = torch.randn(4, 2), torch.randn(3)
    for _ in range(2):
        writer.write({"model": {"embedding": shared, "projection": shared, "bias": other}, "list": [other]},
                     states.append)
        writer.wait()
    first, second = states
    assert first["model"]["embedding"] is first["model"]["projection"]  # torch.save stores them once
    assert first["list"][0] is first["model"]["bias"]
    assert second["model"]["embedding"] is first["model"]["embedding"]  # the same buffer, filled again
    assert first["model"]["embedding"] is not shared and torch.equal(first["model"]["embedding"], shared)
    writer.close()


def test_a_failed_write_is_raised_at_the_next_save_which_is_not_written(caplog):
    writer, written = CheckpointWriter(), []

    def failing(state):
        raise OSError("disk full")

    writer.write({"step": 1}, failing)
    with pytest.raises(OSError, match="disk full"):
        writer.write({"step": 2}, written.append)
    writer.wait()
    assert written == []
    writer.write({"step": 3}, failing)
    writer.close(raise_errors=False)  # the run failed already: its own error is raised, this one is logged
    assert "disk full" in caplog.text


def test_training_goes_on_while_a_checkpoint_is_written(copy_corpus, tmp_path, monkeypatch):
    """A step trains while the save of step 4 is still writing, and the run's checkpoints are all there at its end."""
    stepped, overlapped = threading.Event(), []
    write_checkpoint, update = checkpoints.save_checkpoint, Trainer.update

    def slow_save_checkpoint(state, path):
        if state["step"] == 4:
            overlapped.append(stepped.wait(30))  # set by a training step, which a blocking save would not reach
        write_checkpoint(state, path)

    def recorded_update(self, *args, **kwargs):
        if self.state.step >= 4:
            stepped.set()
        return update(self, *args, **kwargs)

    monkeypatch.setattr(checkpoints, "save_checkpoint", slow_save_checkpoint)
    monkeypatch.setattr(Trainer, "update", recorded_update)
    cfg = load_config(copy_corpus / "copy.yaml", toy_overrides(copy_corpus, tmp_path, max_steps=8, save_every=4,
                                                               keep_last=5))
    loop.train(cfg)
    assert overlapped == [True]
    assert load_checkpoint(tmp_path / "checkpoint_step4.pt")["step"] == 4
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["step"] == 8
