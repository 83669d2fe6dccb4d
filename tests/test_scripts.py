"""scripts/run_recipe.sh end to end on the copy task: train, average, choose on validation, score the test split."""

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import toy_overrides

ROOT = Path(__file__).resolve().parents[1]


def test_recipe_picks_the_checkpoint_by_validation_and_scores_the_test_split(copy_corpus, tmp_path):
    run = tmp_path / "run"
    overrides = toy_overrides(copy_corpus, run, max_steps=30, save_every=10, valid_every=10) + ["data.test_split=valid"]
    bin_dir = str(Path(sys.executable).parent)  # the console scripts of this environment
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ["PATH"], "OMP_NUM_THREADS": "1"}
    result = subprocess.run(["bash", "scripts/run_recipe.sh", str(copy_corpus / "copy.yaml"), *overrides],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, [line for line in result.stderr.splitlines() if "step/s" not in line][-10:]
    assert "checkpoint scores higher on valid" in result.stdout
    for name in ("valid.best.json", "valid.averaged.json", "valid.json"):
        assert "bleu" in json.loads((run / name).read_text())["scores"]
    assert (run / "checkpoint_averaged.pt").exists() and (run / "valid.hyp").read_text().count("\n") == 100
