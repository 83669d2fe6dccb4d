"""The README's commands as a user runs them, shortened with overrides: what a helper's read-through found."""

import json
import subprocess

import pytest
from conftest import ROOT, subprocess_env
from test_demo import TINY, copy_pairs, write_line_corpus

from transformer.cli import command


def test_demo_shortened_within_its_first_epoch_translates_and_scores_its_last_checkpoint(tmp_path):
    # scripts/demo.sh takes overrides; the demo config validates once an epoch (train.valid_every: 0), so a
    # run shortened to a few steps never validates and writes no checkpoint_best.pt: the demo stopped at
    # "checkpoint not found" after training instead of translating and scoring its last checkpoint
    data = write_line_corpus(tmp_path / "data" / "multi30k", copy_pairs(tmp_path / "copy")).parent
    short = [setting for setting in TINY if not setting.startswith(("train.valid_every=", "train.max_steps="))]
    env = {**subprocess_env(), "TRANSFORMER_DATA": str(data), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run(["bash", "scripts/demo.sh", f"train.run_dir={tmp_path / 'run'}", *short,
                             "train.valid_every=0", "train.max_steps=2"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert not (tmp_path / "run" / "checkpoint_best.pt").exists()
    assert "using checkpoint_last.pt" in result.stdout
    assert json.loads((tmp_path / "run" / "test2016.json").read_text())["split"] == "test2016"


def test_train_without_a_config_names_only_the_config_as_required(capsys):
    # "transformer-train" alone said "the following arguments are required: config, overrides", though a
    # config alone runs, as the README's first training command does
    with pytest.raises(SystemExit) as stopped:
        command("train")([])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert "required: config" in error and "overrides" not in error.splitlines()[-1]
