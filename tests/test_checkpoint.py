import os

import pytest
import torch
from conftest import toy_overrides

from transformer.averaging import average_checkpoints
from transformer.checkpoint import (
    CheckpointError,
    load_checkpoint,
    prune_step_checkpoints,
    save_checkpoint,
    step_checkpoint_path,
    step_checkpoints,
)
from transformer.cli import main


def state(value: float, step: int = 1) -> dict:
    return {"model": {"w": torch.full((2, 2), value), "n": torch.tensor(step)}, "step": step, "config": {}}


def test_save_and_load_round_trip_with_weights_only(tmp_path):
    save_checkpoint(state(1.5), tmp_path / "a.pt")
    loaded = load_checkpoint(tmp_path / "a.pt")
    assert torch.equal(loaded["model"]["w"], torch.full((2, 2), 1.5))
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_checkpoint_in_torchs_legacy_format_is_still_a_checkpoint(tmp_path):
    """load_checkpoint tells a checkpoint by its first bytes: a zip, or the legacy format's pickle."""
    path = tmp_path / "legacy.pt"
    torch.save({"model": {"w": torch.ones(2)}, "config": {}, "step": 3}, path, _use_new_zipfile_serialization=False)
    state = load_checkpoint(path)
    assert state["step"] == 3 and torch.equal(state["model"]["w"], torch.ones(2))


def test_truncated_checkpoint_is_reported_with_its_path(tmp_path):
    path = tmp_path / "a.pt"
    save_checkpoint(state(1.0), path)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=r"a.pt: truncated or corrupt"):
        load_checkpoint(path)
    save_checkpoint(state(1.0), path)
    path.write_bytes(path.read_bytes()[:-100])  # torch's reason, without its 300 characters of guesses why
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(path)
    assert str(caught.value) == (f"{path}: truncated or corrupt checkpoint (PytorchStreamReader failed reading zip "
                                 f"archive: failed finding central directory)")


class RunsCode:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_checkpoint_that_would_run_code_is_refused(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"model": {}, "payload": RunsCode()}, path)
    with pytest.raises(CheckpointError, match=r"evil.pt: refused to load: it would import posix.system") as refused:
        load_checkpoint(path)
    assert "weights_only" not in str(refused.value) and "\n" not in str(refused.value)  # no advice to run it


@pytest.mark.parametrize("text", ["hello\n", '{"model": {}}\n', "model:\n  d_model: 512\n"])
def test_a_text_file_is_not_a_checkpoint_rather_than_unsafe(tmp_path, text):
    """torch's own error on a text or JSON file advised loading it with weights_only=False."""
    path = tmp_path / "notes.json"
    path.write_text(text)
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(path)
    assert str(error.value) == f"{path}: not a checkpoint (not a file written by torch.save)"


@pytest.mark.parametrize("data", [b"\x80", b"\x80\x02\xff", b"\x80\x02}q\x00(X"])
def test_a_damaged_pickle_is_corrupt_not_unsafe(tmp_path, data):
    path = tmp_path / "a.pt"
    path.write_bytes(data)
    with pytest.raises(CheckpointError, match=r"^\S*a.pt: truncated or corrupt checkpoint \([^\n]+\)$"):
        load_checkpoint(path)


class FailsToPickle:
    def __reduce__(self):
        raise RuntimeError("disk full")


def test_failed_write_keeps_the_previous_checkpoint(tmp_path):
    path = tmp_path / "last.pt"
    save_checkpoint(state(1.0), path)
    with pytest.raises(RuntimeError, match="disk full"):
        save_checkpoint({"model": {"bad": FailsToPickle()}}, path)
    assert torch.equal(load_checkpoint(path)["model"]["w"], torch.full((2, 2), 1.0))
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_prune_keeps_the_newest_numbered_checkpoints(tmp_path):
    for step in (5, 10, 15, 20):
        save_checkpoint(state(1.0, step), step_checkpoint_path(tmp_path, step))
    prune_step_checkpoints(tmp_path, keep_last=2)
    assert [p.name for p in step_checkpoints(tmp_path)] == ["checkpoint_step15.pt", "checkpoint_step20.pt"]


def test_average_of_checkpoints(tmp_path):
    paths = []
    for i, value in enumerate((1.0, 2.0, 6.0)):
        paths.append(tmp_path / f"{i}.pt")
        save_checkpoint(state(value, step=i), paths[-1])
    averaged = average_checkpoints(paths)
    assert torch.equal(averaged["model"]["w"], torch.full((2, 2), 3.0))
    assert averaged["step"] == 2 and "optimizer" not in averaged
    wider = {**state(1.0), "model": {"w": torch.ones(2, 3), "n": torch.tensor(1)}}  # another vocabulary size
    save_checkpoint(wider, tmp_path / "wider.pt")
    with pytest.raises(CheckpointError, match=r"wider.pt: parameters differ from .*0.pt's \(names or shapes\)"):
        average_checkpoints([paths[0], tmp_path / "wider.pt"])


def test_flipped_bytes_inside_a_tensor_are_detected_by_the_checksum(tmp_path):
    path = tmp_path / "a.pt"
    save_checkpoint({"model": {"w": torch.arange(4096, dtype=torch.float32)}}, path)
    data = bytearray(path.read_bytes())
    offset = data.find(torch.arange(4096, dtype=torch.float32).numpy().tobytes()[4000:4016])
    assert offset > 0
    data[offset] ^= 0xFF  # one corrupted byte in the middle of the tensor's storage
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"a.pt: corrupt checkpoint \(checksum mismatch\)"):
        load_checkpoint(path)


def test_a_folder_given_as_a_checkpoint_says_what_to_give(tmp_path):
    """A run directory given to --checkpoint said "checkpoint not found", as for a typo."""
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(tmp_path)
    assert str(error.value) == f"{tmp_path}: a folder, not a checkpoint file: give a .pt file"  # every command's
    (tmp_path / "checkpoint_best.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"give a \.pt file \(such as checkpoint_best\.pt in it\)"):
        load_checkpoint(tmp_path)


def test_a_validations_checkpoints_are_serialised_once_and_copied(copy_corpus, tmp_path, monkeypatch):
    """last, step and best checkpoints of one save were each serialised and checksummed (0.3-0.4 s a name for the
    recipe's 91 MB): now once, and copied, each a file of its own (damage to one leaves the others whole)."""
    from conftest import run_config

    from transformer.training import checkpoints, train

    written = []
    save = checkpoints.save_checkpoint
    monkeypatch.setattr(checkpoints, "save_checkpoint", lambda state, path: written.append(path) or save(state, path))
    train(run_config(copy_corpus, tmp_path, max_steps=4, valid_every=4, save_every=2, keep_last=5))
    assert [path.name for path in written] == ["checkpoint_last.pt", "checkpoint_last.pt", "checkpoint_last.pt"]
    names = ["checkpoint_last.pt", "checkpoint_step4.pt", "checkpoint_best.pt"]
    assert len({(tmp_path / name).read_bytes() for name in names}) == 1
    assert len({(tmp_path / name).stat().st_ino for name in names}) == 3
    assert load_checkpoint(tmp_path / "checkpoint_best.pt")["step"] == 4


def translate_and_resume(checkpoint, copy_corpus, run_dir) -> list[int]:
    """The exit statuses of translating with ``checkpoint`` and of resuming a run from it, through the CLI."""
    return [main(["translate", "--checkpoint", str(checkpoint), "alpha beta"]),
            main(["train", str(copy_corpus / "copy.yaml"), *toy_overrides(copy_corpus, run_dir), "--resume",
                  str(checkpoint)])]


def test_a_checkpoint_without_a_config_is_one_line_naming_it(parent_run, copy_corpus, tmp_path, capsys):
    """A bare state dict under "model", as other training scripts save one: no model settings to build it from."""
    bare = tmp_path / "bare.pt"
    torch.save({"model": load_checkpoint(parent_run / "checkpoint_last.pt")["model"]}, bare)
    capsys.readouterr()
    assert translate_and_resume(bare, copy_corpus, tmp_path / "run") == [2, 2]
    said = f"error: {bare}: not a checkpoint of this toolkit (no 'config' entry, which holds its model settings): " \
           f"give one written by transformer-train or transformer-average"
    assert [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")] == [said, said]


def test_weights_that_do_not_fit_name_the_first_weight_and_the_file(parent_run, copy_corpus, tmp_path, capsys):
    """A weight dropped or of another shape than the checkpoint's config makes (a file edited, another version's)."""
    state = load_checkpoint(parent_run / "checkpoint_last.pt")
    (tmp_path / "spm.model").write_bytes((parent_run / "spm.model").read_bytes())  # read beside each checkpoint
    dropped, reshaped = [name for name, weight in state["model"].items() if weight.dim() == 2 and "layers" in name][:2]
    wider = torch.zeros(state["model"][reshaped].shape[0], state["model"][reshaped].shape[1] + 1)
    edits = {"dropped.pt": ({k: v for k, v in state["model"].items() if k != dropped}, f"it has no {dropped}"),
             "reshaped.pt": ({**state["model"], reshaped: wider},
                             f"its {reshaped} has shape {tuple(wider.shape)}, the model's "
                             f"{tuple(state['model'][reshaped].shape)}")}
    for name, (weights, difference) in edits.items():
        save_checkpoint({**state, "model": weights}, tmp_path / name)
        capsys.readouterr()
        assert translate_and_resume(tmp_path / name, copy_corpus, tmp_path / f"run_{name}") == [2, 2]
        said = f"error: {tmp_path / name}: weights do not fit the model of its config: {difference}"
        assert [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")] == [said, said]
