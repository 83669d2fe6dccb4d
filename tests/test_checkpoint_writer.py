"""Checkpoints written on a thread of their own (transformer/training/checkpoint_writer.py): training goes on while
a checkpoint is written, the file holds the state of its step, and a failed write is raised, not lost."""

import errno
import os
import re
import threading

import pytest
import torch
from conftest import metric_records, toy_overrides

from transformer.checkpoint import CheckpointError, load_checkpoint
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


def test_the_last_save_is_written_before_write_returns_from_the_state_itself():
    writer, seen = CheckpointWriter(), []
    weight = torch.ones(2)
    writer.write({"weight": weight}, lambda state: seen.append((threading.current_thread(), state["weight"])),
                 in_background=False)  # the run's end: nothing trains meanwhile, a copy would only cost time
    assert len(seen) == 1 and seen[0][0] is threading.current_thread() and seen[0][1] is weight
    writer.close()


def test_tensors_that_share_memory_still_do_and_the_host_buffers_are_kept_from_one_save_to_the_next():
    writer, states = CheckpointWriter(), []
    model = torch.nn.Linear(2, 4)
    model.bias = torch.nn.Parameter(model.weight[:, 0])  # a view of the weight's memory: not the same tensor
    rows = torch.randn(3, 5)
    for _ in range(2):
        writer.write({"model": model.state_dict(), "tied": model.weight, "columns": rows.t()}, states.append)
        writer.wait()
    first, second = states

    def memory(tensor):
        return tensor.untyped_storage().data_ptr()

    assert memory(first["model"]["weight"]) == memory(first["model"]["bias"]) == memory(first["tied"])
    assert torch.equal(first["model"]["bias"], model.weight[:, 0]) and torch.equal(first["columns"], rows.t())
    assert first["columns"].stride() == rows.t().stride()  # as the original, which torch.save stores
    assert memory(second["model"]["weight"]) == memory(first["model"]["weight"])  # the same buffer, filled again
    assert memory(first["model"]["weight"]) != memory(model.weight)
    # a state_dict stays an OrderedDict with its modules' versions, which load_state_dict reads
    assert type(first["model"]) is type(model.state_dict()) and first["model"]._metadata == model.state_dict()._metadata
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


def test_a_write_whose_wait_was_interrupted_is_still_waited_for_and_its_error_raised(monkeypatch):
    writer, release = CheckpointWriter(), threading.Event()

    def failing_later(state):
        release.wait(10)
        raise OSError("disk full")

    writer.write({"step": 1}, failing_later)
    with monkeypatch.context() as patch:  # a second Ctrl-C while the loop waits for the write
        patch.setattr(type(writer._pending), "result", lambda self, timeout=None: (_ for _ in ()).throw(
            KeyboardInterrupt()))
        with pytest.raises(KeyboardInterrupt):
            writer.wait()
    release.set()
    with pytest.raises(OSError, match="disk full"):  # was dropped with the interrupted wait, never reported
        writer.close()


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


def test_a_failed_copy_of_a_checkpoint_says_the_checkpoint_of_its_step_is_written(copy_corpus, tmp_path, monkeypatch):
    """A copy (the step's numbered checkpoint, copied from checkpoint_last.pt) said "no earlier one was written"."""
    copy = checkpoints.atomic_copy

    def full_disk(source, target):
        if target.name == "checkpoint_step4.pt":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        copy(source, target)

    monkeypatch.setattr(checkpoints, "atomic_copy", full_disk)
    cfg = load_config(copy_corpus / "copy.yaml", toy_overrides(copy_corpus, tmp_path, max_steps=40, save_every=2))
    with pytest.raises(CheckpointError) as failed:
        loop.train(cfg)
    assert str(failed.value) == (f"cannot write checkpoint {tmp_path / 'checkpoint_step4.pt'} at step 4 (No space "
                                 f"left on device); checkpoint_last.pt of this step is written")
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["step"] == 4


def test_a_failed_write_stops_the_run_at_the_next_step_naming_the_file_and_its_step(
        copy_corpus, tmp_path, monkeypatch):
    """torch.save on a full disk raises a RuntimeError ("unexpected pos"), not an OSError: the run went on to the
    next save, which then raised it bare, naming neither the file nor the step."""
    write_checkpoint = checkpoints.save_checkpoint

    def full_disk(state, path):
        if state["step"] == 4:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 832 vs 726")
        write_checkpoint(state, path)

    monkeypatch.setattr(checkpoints, "save_checkpoint", full_disk)
    cfg = load_config(copy_corpus / "copy.yaml", toy_overrides(copy_corpus, tmp_path, max_steps=40, save_every=4,
                                                               log_every=1))
    message = re.escape(f"cannot write checkpoint {tmp_path / 'checkpoint_last.pt'} at step 4 (torch.save failed: "
                        f"[enforce fail")
    # the first save: there is no previous checkpoint to say is intact (it was said); the disk's free space is
    with pytest.raises(CheckpointError, match=message + r".* MB free on its disk\); no earlier one was written$"):
        loop.train(cfg)
    steps = [record["step"] for record in metric_records(tmp_path, "train")]
    assert steps and max(steps) < 8  # stopped before the next save, not 36 steps later
    assert not (tmp_path / "checkpoint_last.pt").exists()  # and wrote nothing after the failed write
