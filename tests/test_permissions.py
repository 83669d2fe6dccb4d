"""Every file the toolkit writes has the mode any other file its user creates has: 0666 less the umask (0644
under umask 022, 0664 under 002). Atomic writes through `tempfile.mkstemp` left checkpoints 0600, and
safetensors left release weights 0600: a user who copied a release to a server account, or a team sharing
a run directory, got a permission error."""

import os
import stat
from pathlib import Path

import pytest
from conftest import toy_overrides

from transformer.cli import main


@pytest.fixture(params=[0o022, 0o002], ids=["umask022", "umask002"])
def umask(request):
    previous = os.umask(request.param)
    yield request.param
    os.umask(previous)


def assert_ordinary_files(folder: Path, umask: int) -> None:
    """Every file under ``folder`` has mode 0666 less ``umask``; there is at least one."""
    modes = {str(path.relative_to(folder)): oct(stat.S_IMODE(path.stat().st_mode))
             for path in folder.rglob("*") if path.is_file() and "cache" not in path.parts}
    assert modes and modes == dict.fromkeys(modes, oct(0o666 & ~umask))


def test_a_training_runs_files(umask, copy_corpus, tmp_path):
    """Checkpoints, the tokenizer, config.yaml, metrics and TensorBoard's records, and an averaged checkpoint."""
    run = tmp_path / "run"
    overrides = toy_overrides(copy_corpus, run, max_steps=4, save_every=2)
    assert main(["train", str(copy_corpus / "copy.yaml"), *overrides]) == 0
    assert main(["average", "--run-dir", str(run), "--last", "2", "--output", str(run / "averaged.pt")]) == 0
    assert {"checkpoint_last.pt", "checkpoint_step2.pt", "averaged.pt", "spm.model", "config.yaml",
            "metrics.jsonl"} <= {path.name for path in run.iterdir()}
    assert_ordinary_files(run, umask)


def test_a_release_folder_and_a_report(umask, quick_copy_run, tmp_path):
    checkpoint = quick_copy_run / "checkpoint_last.pt"
    report = tmp_path / "reports" / "valid.json"
    report.parent.mkdir()
    assert main(["evaluate", "--checkpoint", str(checkpoint), "--split", "valid", "decode.beam_size=1",
                 "--report", str(report), "--output", str(report.parent / "valid.hyp")]) == 0
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(tmp_path / "release"),
                 "--report", str(report)]) == 0
    assert (tmp_path / "release" / "model.safetensors").is_file()
    assert_ordinary_files(tmp_path / "release", umask)
    assert_ordinary_files(report.parent, umask)


EXPORTS = {"umask022-ctranslate2": (0o022, "ctranslate2"), "umask002-ctranslate2": (0o002, "ctranslate2"),
           "umask002-onnx": (0o002, "onnx")}  # the ONNX export takes 19 s: under the umask that tells more


@pytest.mark.parametrize("umask, export", EXPORTS.values(), indirect=["umask"], ids=EXPORTS.keys())
def test_exported_engine_folders(umask, quick_copy_run, tmp_path, export):
    pytest.importorskip(export if export == "ctranslate2" else "onnxruntime",
                        reason="the export extra is not installed")
    output = tmp_path / export
    assert main(["export", "--format", export, "--checkpoint", str(quick_copy_run / "checkpoint_last.pt"),
                 "--output", str(output)]) == 0
    assert_ordinary_files(output, umask)
