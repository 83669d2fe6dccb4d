"""scripts/run_recipe.sh end to end on the copy task: train, average, choose on validation, score the test split;
then scripts/results_table.py makes the README's table row of the run."""

import json
import subprocess
import sys

import torch
from conftest import ROOT, subprocess_env, toy_overrides

from transformer.runtime.precision import select_precision


def test_recipe_picks_the_checkpoint_by_validation_and_scores_the_test_split(copy_corpus, tmp_path):
    run = tmp_path / "run"
    overrides = toy_overrides(copy_corpus, run, max_steps=30, save_every=10, valid_every=10) + ["data.test_split=valid"]
    env = subprocess_env()
    result = subprocess.run(["bash", "scripts/run_recipe.sh", str(copy_corpus / "copy.yaml"), *overrides],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, [line for line in result.stderr.splitlines() if "step/s" not in line][-10:]
    assert "checkpoint scores highest on valid" in result.stdout
    for name in ("valid.best.json", "valid.averaged.json", "valid.last.json", "valid.json"):
        assert "bleu" in json.loads((run / name).read_text())["scores"]
    assert (run / "checkpoint_averaged.pt").exists() and (run / "valid.hyp").read_text().count("\n") == 100
    for checkpoint in run.glob("*.pt"):  # the table needs only the small records kept in docs/runs/
        checkpoint.unlink()
    table = subprocess.run([sys.executable, "scripts/results_table.py", str(run), "--curves", str(tmp_path / "curves")],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert table.returncode == 0, table.stderr[-2000:]
    row = table.stdout.splitlines()[2].split(" | ")
    test = json.loads((run / "valid.json").read_text())["scores"]
    assert row[0].startswith("| run: ") and row[0].endswith(" src→tgt (valid)")  # the run directory, then its data
    assert row[1:4] == [f"{test[name]['score']:.2f}" for name in ("bleu", "chrf", "ter")]
    assert f"30 steps, {select_precision('auto', torch.device('cpu'))}, 1 thread" in row[5] and "cores; " in row[6]
    decoding = json.loads((run / "valid.json").read_text())["decoding"]
    search = f"beam {decoding['beam_size']}, length penalty {decoding['length_penalty']}"
    assert f"validation BLEU, {search}: best " in row[7] and ", last " in row[7]  # the three candidates' scores
    assert row[8] == f"`bash scripts/run_recipe.sh {copy_corpus / 'copy.yaml'} {' '.join(overrides)}` |"
    assert f"bleu: `{test['bleu']['signature']}`" in table.stdout
    assert (tmp_path / "curves" / "run.png").stat().st_size > 0
    for report in run.glob("valid.*.json"):  # a run of scripts/demo.sh: scored on test only
        report.unlink()
    table = subprocess.run([sys.executable, "scripts/results_table.py", str(run)],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert table.returncode == 0, table.stderr[-2000:]
    assert f"(best on validation during training, bleu; test: {search})" in table.stdout.splitlines()[2].split(" | ")[7]
