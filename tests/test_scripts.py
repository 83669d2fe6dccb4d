"""scripts/run_recipe.sh end to end on the copy task: train, average, choose on validation, score the test split."""

import json
import subprocess

from conftest import ROOT, subprocess_env, toy_overrides


def test_recipe_picks_the_checkpoint_by_validation_and_scores_the_test_split(copy_corpus, tmp_path):
    run = tmp_path / "run"
    overrides = toy_overrides(copy_corpus, run, max_steps=30, save_every=10, valid_every=10) + ["data.test_split=valid"]
    env = subprocess_env()
    result = subprocess.run(["bash", "scripts/run_recipe.sh", str(copy_corpus / "copy.yaml"), *overrides],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, [line for line in result.stderr.splitlines() if "step/s" not in line][-10:]
    assert "checkpoint scores higher on valid" in result.stdout
    for name in ("valid.best.json", "valid.averaged.json", "valid.json"):
        assert "bleu" in json.loads((run / name).read_text())["scores"]
    assert (run / "checkpoint_averaged.pt").exists() and (run / "valid.hyp").read_text().count("\n") == 100
