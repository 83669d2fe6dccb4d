"""scripts/run_recipe.sh end to end on the copy task: train, average, choose on validation, score the test split;
then scripts/results_table.py makes the README's table row of the run."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, subprocess_env, toy_overrides

from transformer.runtime.precision import select_precision


def test_recipe_picks_the_checkpoint_by_validation_and_scores_the_test_split(copy_corpus, tmp_path):
    run = tmp_path / "bob's" / "run"  # a quote in the path ended the recipe in a SyntaxError after training
    overrides = toy_overrides(copy_corpus, run, max_steps=30, save_every=10, valid_every=10) + ["data.test_split=valid"]
    env = subprocess_env()
    # started elsewhere, a relative train.run_dir= was the checkout's runs/..., not where the recipe was started
    relative = [f"train.run_dir={run.relative_to(tmp_path)}" if item.startswith("train.run_dir=") else item
                for item in overrides]
    result = subprocess.run(["bash", str(ROOT / "scripts" / "run_recipe.sh"), str(copy_corpus / "copy.yaml"),
                             *relative], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, [line for line in result.stderr.splitlines() if "step/s" not in line][-10:]
    assert not (ROOT / "bob's").exists()
    assert "checkpoint scores highest on valid" in result.stdout
    for name in ("valid.best.json", "valid.averaged.json", "valid.last.json", "valid.json"):
        assert "bleu" in json.loads((run / name).read_text())["scores"]
    assert (run / "checkpoint_averaged.pt").exists() and (run / "valid.hyp").read_text().count("\n") == 100

    # Run again with decode.beam_size=1, the recipe scored the best and averaged checkpoints with their own configs'
    # beam (the last alone took the new one, written into it by the resume), and a run interrupted while scoring left
    # the first session's reports beside the new command.
    (run / "valid.stale.json").write_text("{}")  # not one of the recipe's: left alone
    (run / "valid.best.json").write_text("{}")
    relative += ["decode.beam_size=1", "decode.length_penalty=1.0"]
    again = subprocess.run(["bash", str(ROOT / "scripts" / "run_recipe.sh"), str(copy_corpus / "copy.yaml"),
                            *relative], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    for name in ("best", "averaged", "last", None):
        decoding = json.loads((run / (f"valid.{name}.json" if name else "valid.json")).read_text())["decoding"]
        assert (decoding["beam_size"], decoding["length_penalty"]) == (1, 1.0), name
    assert (run / "valid.stale.json").read_text() == "{}"
    (run / "valid.stale.json").unlink()

    for checkpoint in run.glob("*.pt"):  # the table needs only the small records kept in docs/runs/
        checkpoint.unlink()
    table = subprocess.run([sys.executable, "scripts/results_table.py", str(run), "--detail",
                            "--curves", str(tmp_path / "curves")],
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
    assert row[8] == f"`{shlex.join(['bash', 'scripts/run_recipe.sh', str(copy_corpus / 'copy.yaml'), *relative])}` |"
    assert f"bleu: `{test['bleu']['signature']}`" in table.stdout
    assert (tmp_path / "curves" / "run.png").stat().st_size > 0
    assert "chosen on the split it is scored on" in row[7]  # this corpus has no test split, as Tatoeba
    brief = subprocess.run([sys.executable, "scripts/results_table.py", str(run)],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert brief.returncode == 0, brief.stderr[-2000:]
    row = brief.stdout.splitlines()[2].split(" | ")
    assert row[0] == f"| src→tgt, {copy_corpus.name} valid (no test split)"
    assert row[1] == f"{test['bleu']['score']:.2f} / {test['chrf']['score']:.2f}"
    assert row[2] == f"{decoding['beam_size']}, {decoding['length_penalty']}"  # the search that scored it
    assert row[3] == "30 steps" and row[4].startswith(f"{os.cpu_count()}-core ")
    portable = [word for word in relative if not word.startswith(("train.run_dir=", "data.dataset="))]
    assert row[5] == f"`bash scripts/run_recipe.sh {copy_corpus / 'copy.yaml'} {' '.join(portable)}` |"
    assert str(run) not in brief.stdout and f"data.dataset={copy_corpus}" not in brief.stdout
    for report in run.glob("valid.*.json"):  # a run of scripts/demo.sh: scored on test only
        report.unlink()
    table = subprocess.run([sys.executable, "scripts/results_table.py", str(run), "--detail"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert table.returncode == 0, table.stderr[-2000:]
    assert f"(best on validation during training, bleu; test: {search})" in table.stdout.splitlines()[2].split(" | ")[7]


def test_the_ensemble_recipe_trains_its_members_at_once_and_scores_their_ensemble(copy_corpus, tmp_path):
    """Two members differing in train.seed alone, each a whole recipe; their ensemble scored on validation, and the
    test split scored by whichever of ensemble and members scores highest there."""
    run = tmp_path / "ensemble"
    overrides = toy_overrides(copy_corpus, run, max_steps=30, save_every=10, valid_every=10) + ["data.test_split=valid"]
    overrides.remove("train.threads=1")  # the members share the cores out: of 2, 1 each (the default, 0, is all)
    env = {**subprocess_env(), "MEMBERS": "2"}
    result = subprocess.run(["bash", "scripts/run_ensemble_recipe.sh", str(copy_corpus / "copy.yaml"), *overrides],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-2000:])
    members = [run / "seed_1", run / "seed_2"]
    for seed, member in enumerate(members, 1):
        assert json.loads((member / "valid.json").read_text())["scores"]["bleu"]["score"] >= 0
        assert f"seed: {seed}" in (member / "config.yaml").read_text()
        assert f"threads: {max(1, len(os.sched_getaffinity(0)) // 2)}" in (member / "config.yaml").read_text()
    assert (members[0] / "spm.model").read_bytes() == (members[1] / "spm.model").read_bytes()  # one vocabulary
    ensemble = json.loads((run / "valid.ensemble.json").read_text())
    assert sorted(ensemble["checkpoint"]) == sorted(json.loads((m / "valid.json").read_text())["checkpoint"]
                                                    for m in members)
    assert re.search(r"training: [\d.]+ s from the first member's start to the last one's end, \[30, 30\] steps",
                     result.stdout)
    assert ("the ensemble scores highest on valid" in result.stdout) == (
        json.loads((run / "valid.json").read_text())["checkpoint"] == ensemble["checkpoint"])
    assert (run / "command.txt").read_text().startswith("MEMBERS=2 bash scripts/run_ensemble_recipe.sh ")
    for checkpoint in run.glob("seed_*/*.pt"):  # the table reads the small records alone
        checkpoint.unlink()
    shutil.copytree(run / "seed_2", run / "seed_3")  # left by an earlier MEMBERS=3 run: the table counted it
    detail, brief = (subprocess.run([sys.executable, "scripts/results_table.py", str(run), *options], cwd=ROOT,
                                    env=env, capture_output=True, text=True, timeout=300) for options in
                     (["--detail", "--curves", str(tmp_path / "curves")], []))
    assert detail.returncode == 0 and brief.returncode == 0, (detail.stderr[-2000:], brief.stderr[-2000:])
    row = detail.stdout.splitlines()[2].split(" | ")
    assert row[1] == f"{json.loads((run / 'valid.json').read_text())['scores']['bleu']['score']:.2f}"
    assert row[4].startswith("2 × ") and "2 members at once, 30 / 30 steps" in row[5] and "sessions" not in row[5]
    candidates = f"ensemble {ensemble['scores']['bleu']['score']:.2f}, seed_1 "
    assert row[7].startswith(("the ensemble of the 2 members' choices (", "seed_1's ", "seed_2's "))
    assert candidates in row[7]
    assert brief.stdout.splitlines()[2].split(" | ")[3] == "30 steps, 2 models at once"
    assert (tmp_path / "curves" / "ensemble.png").stat().st_size > 0
    chosen = Path(json.loads((run / "seed_1" / "valid.json").read_text())["checkpoint"]).stem.split("_")[-1]
    (run / "seed_1" / f"valid.{chosen}.json").unlink()  # a KeyError's traceback before
    missing = subprocess.run([sys.executable, "scripts/results_table.py", str(run)], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=300)
    assert missing.returncode == 2 and missing.stderr == (f"error: {run / 'seed_1' / f'valid.{chosen}.json'} is "
                                                          f"missing: the validation report of the checkpoint its "
                                                          f"test report names\n")
    env["MEMBERS"] = "1"
    alone = subprocess.run(["bash", "scripts/run_ensemble_recipe.sh", str(copy_corpus / "copy.yaml")], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=60)
    assert alone.returncode == 2 and alone.stderr == "error: MEMBERS=1: an ensemble has 2 members or more\n"


def test_the_ensemble_is_chosen_on_validation_and_a_tie_goes_to_the_single_model(tmp_path):
    def report(path, score, **extra):
        path.write_text(json.dumps({"scores": {"bleu": {"score": score}}, **extra}))

    for k, score in ((1, 40.0), (2, 41.0)):
        member = tmp_path / f"seed_{k}"
        member.mkdir()
        report(member / "val.last.json", score)
        report(member / "test.json", 0.0, checkpoint=str(member / "checkpoint_last.pt"))
    best = []
    for ensemble in (41.5, 41.0, 39.0):
        report(tmp_path / "val.ensemble.json", ensemble)
        chosen = subprocess.run([sys.executable, "scripts/ensemble_members.py", str(tmp_path), "val", "test", "2",
                                 "--best"], cwd=ROOT, capture_output=True, text=True, timeout=60)
        best.append(chosen.stdout.strip())
    assert best == ["ensemble", "seed_2", "seed_2"]
    for k in (1, 2):  # members whose tokenizers differ (other samples of a big corpus): said before the ensemble
        (tmp_path / f"seed_{k}" / "spm.model").write_bytes(bytes([k]))
    summary = subprocess.run([sys.executable, "scripts/ensemble_members.py", str(tmp_path), "val", "test", "2"],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert summary.returncode == 1 and "seed_2/spm.model differs from " in summary.stderr
    assert "an ensemble needs one vocabulary" in summary.stderr and not summary.stdout


def test_the_recipe_says_what_is_wrong_in_one_line_and_reads_a_config_where_it_is_started(copy_corpus):
    """A bad override ended in a Python traceback, no config in "$1: unbound variable", and a config path
    relative to where the recipe was started was looked up in the checkout."""
    env = subprocess_env()
    nothing = subprocess.run(["bash", "scripts/run_recipe.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    # it was bash's "scripts/run_recipe.sh: line 8: 1: usage: ...", exit 1
    assert (nothing.returncode, nothing.stderr) == (2, "usage: bash scripts/run_recipe.sh CONFIG [section.key=value "
                                                       "...]\n")
    seeded = subprocess.run(["bash", "scripts/run_ensemble_recipe.sh", "copy.yaml", "train.seed=5"], cwd=ROOT,
                            env=env, capture_output=True, text=True)  # the members' seeds were 1 and 2, unsaid
    assert (seeded.returncode, seeded.stderr) == (2, "error: train.seed=5: the members train with seeds 1 to "
                                                     "MEMBERS; drop it\n")
    bad = subprocess.run(["bash", str(ROOT / "scripts" / "run_recipe.sh"), "copy.yaml", "train.bogus=1"],
                         cwd=copy_corpus, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and bad.stderr.count("\n") == 1, bad.stderr
    assert "bogus" in bad.stderr  # the override, not "cannot read config file copy.yaml"


def test_settings_the_trainer_refuses_leave_the_runs_command_record(copy_corpus, tmp_path):
    """The recipe wrote command.txt before transformer-train refused its settings (train.cuda_graphs=true on the
    CPU): the refused command replaced the record of the run already in the folder."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "command.txt").write_text("the run's own\n")
    overrides = toy_overrides(copy_corpus, run, max_steps=30) + ["data.test_split=valid", "train.cuda_graphs=true",
                                                                 "data.pad_rows=true"]
    refused = subprocess.run(["bash", str(ROOT / "scripts" / "run_recipe.sh"), str(copy_corpus / "copy.yaml"),
                              *overrides],
                             cwd=copy_corpus, env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "train.cuda_graphs=true needs a GPU" in refused.stderr, refused.stderr
    assert (run / "command.txt").read_text() == "the run's own\n"


@pytest.mark.parametrize("document, options", [("README.md", []), ("docs/results.md", ["--detail"])])
def test_the_results_tables_are_the_ones_their_run_records_make(document, options):
    """The README's rows (and docs/results.md's in full) are what scripts/results_table.py makes of the runs
    docs/runs/README.md lists: a row left behind when a run is redone (the README's demo row stayed at 37.23
    after its records said 39.12), a run missing from a table or a row left over fails here; docs/results.md's
    own command names the README's runs first, then the older runs it shows in full only."""
    def listed_runs(path: str, prefix: str, end: str) -> list[str]:
        line = next(line for line in (ROOT / path).read_text().splitlines() if line.strip().startswith(prefix))
        words = line.strip()[len(prefix):].strip("`").split()
        return words[:words.index(end)] if end in words else words

    runs = listed_runs("docs/runs/README.md", "python scripts/results_table.py ", "--curves")
    if options:
        detailed = listed_runs("docs/results.md", "`python scripts/results_table.py --detail ", "")
        assert detailed[:len(runs)] == runs, "docs/results.md's command does not begin with the README's runs"
        runs = detailed
    made = subprocess.run([sys.executable, "scripts/results_table.py", *runs, *options], cwd=ROOT,
                          env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr[-2000:]
    rows = [line for line in made.stdout.splitlines() if line.startswith("|")]  # header, rule, a row per run
    text = (ROOT / document).read_text().splitlines()
    assert rows[0] in text, f"{document} has no table headed {rows[0]}"
    start = text.index(rows[0])
    end = start + len(rows)
    assert text[start:end] == rows and not (end < len(text) and text[end].startswith("|")), "a row too many"


def session(cpu: str, generation: str | None, *flags: str, gpu: str | None = None) -> dict:
    """A ``session`` record as training writes it, on 2 cores in bf16."""
    return {"cpu": cpu, "cpu_generation": generation, "cores": 2, "flags": {flag: True for flag in flags},
            "gpu": gpu, "ranks": 1, "precision": "bf16"}


def test_the_readme_table_names_the_machine_in_a_few_words_and_no_machine_paths(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from results_table import duration, parameter_count, portable_command

    from transformer.runtime.machine import machine_brief

    assert machine_brief(session("Intel(R) Xeon(R) Processor", "family 6 model 167", "avx2", "avx512f",
                                 "avx512_bf16", "amx_bf16")) == "2-core Xeon, AMX, bf16"
    assert machine_brief(session("AMD EPYC 9R14", "family 25 model 17", "avx2", "avx512f",
                                 "avx512_bf16")) == "2-core EPYC Zen 4, AVX512-BF16, bf16"
    zen5 = session("AMD EPYC", "family 26 model 2", "avx2", "avx512_bf16")
    assert machine_brief(zen5) == "2-core EPYC Zen 5, AVX512-BF16, bf16"
    assert machine_brief(session("AMD EPYC 7B13", "family 25 model 1", "avx2")) == "2-core EPYC Zen 3, AVX2, bf16"
    assert machine_brief(session("Intel(R) Xeon(R)", None, "avx2", gpu="NVIDIA H100 80GB HBM3")) == "1 H100, bf16"
    recorded = ("bash scripts/run_recipe.sh configs/multi30k_de_en.yaml train.max_time=45m "
                "train.run_dir=/work/runs/x data.dataset=/work/shared/data/multi30k data.dataset_config=de-en")
    assert portable_command(recorded) == ("bash scripts/run_recipe.sh configs/multi30k_de_en.yaml train.max_time=45m "
                                          "data.dataset_config=de-en")
    hub = "bash scripts/demo.sh data.dataset=wmt/wmt14"  # a hub dataset is no path of a machine
    assert portable_command(hub) == hub
    assert [duration(s) for s in (90.0, 180.0, 7200.4, 2700.0, 780.2)] == ["90 s", "3 min", "2 h", "45 min",
                                                                           "13 min"]
    assert [parameter_count(n) for n in (60_512_768, 214_000_000, 34_304, 150_000)] == [
        "60.5M", "214.0M", "34k", "0.1M"]  # a tiny model's was "0.0M"


def test_two_runs_of_one_name_draw_two_curves(monkeypatch, tmp_path):
    """results_table.py --curves named each plot after its run folder: runs/a/run's plot was overwritten by
    runs/b/run's. A name takes as many parent folders as tell the runs apart."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from results_table import curve_names
    assert curve_names([tmp_path / "a" / "run", tmp_path / "b" / "run", tmp_path / "other"]) == [
        "a_run", "b_run", "other"]
    assert curve_names([tmp_path / "x" / "a" / "run", tmp_path / "y" / "a" / "run"]) == ["x_a_run", "y_a_run"]
    assert curve_names([tmp_path / "solo"]) == ["solo"]


def test_the_recipe_of_a_run_that_never_validated_chooses_among_the_checkpoints_it_has(copy_corpus, tmp_path):
    """With train.valid_every beyond max_steps there is no checkpoint_best.pt: the recipe failed evaluating it. (The
    recipe's shell alone: its commands stand in, as a whole recipe runs them in the tests above.)"""
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint_last.pt").write_bytes(b"")
    result = run_recipe_with_stand_ins(copy_corpus, run, tmp_path / "bin", evaluate_status=0)
    assert result.returncode == 0, result.stderr
    assert f"no checkpoint_best.pt in {run}" in result.stdout and not (run / "valid.best.json").exists()
    assert [line for line in result.stdout.splitlines() if line.startswith("== ")][-1] == (
        "== averaged checkpoint scores highest on valid: translating valid with it")  # of averaged and last, the first
    assert "bleu" in json.loads((run / "valid.json").read_text())["scores"]


def test_a_config_named_like_an_option_is_one_line(tmp_path):
    """`bash scripts/run_recipe.sh -c` printed the settings reader's own usage (five lines): its config went to it
    as an option."""
    result = subprocess.run(["bash", str(ROOT / "scripts" / "run_recipe.sh"), "-c"], cwd=tmp_path,
                            env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr == f"error: cannot read config file {tmp_path / '-c'}: " \
                                                       f"No such file or directory\n", result.stderr


@pytest.mark.parametrize("script", ["run_recipe.sh", "run_ensemble_recipe.sh", "demo.sh"])
def test_each_shell_script_says_what_it_does_and_its_usage_with_help(script, tmp_path):
    """--help was taken for a config file ("cannot read config file --help"), or an override, as -h."""
    for option in ("--help", "-h"):
        result = subprocess.run(["bash", str(ROOT / "scripts" / script), option], cwd=tmp_path, env=subprocess_env(),
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0 and result.stderr == "", result.stderr
        lines = result.stdout.splitlines()
        assert f"bash scripts/{script}" in next(line for line in lines if line.startswith("Usage: "))
        assert not any(line.startswith("#") for line in lines) and not list(tmp_path.iterdir())  # nothing ran


@pytest.mark.parametrize("stages, says", [
    ([], "name the stages to run: benchmark, loss, tests, de-en, en-de, multilingual, en-de-sweep"),
    (["benchmark", "bench"], "unknown stage bench (benchmark, loss, tests, de-en, en-de, multilingual, en-de-sweep)"),
    (["en-de-sweep", "tests", "en-de"], "en-de after en-de-sweep would run beside its trainings: name it first, or "
                                        "in a call of its own"),
])
def test_the_gpu_check_refuses_a_stage_list_before_any_work(tmp_path, stages, says):
    """A lent GPU's minutes are few: a stage named wrong, or a timed stage beside the sweep's trainings, is said at
    once, before the wheels install, on any machine."""
    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), *stages], env={**subprocess_env(),
                            "OUT": str(tmp_path / "out")}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr == f"{says}\n" and not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", ["abc", "0", "-2"])
def test_a_bad_average_last_is_refused_before_training(copy_corpus, tmp_path, value):
    """AVERAGE_LAST=abc trained the whole budget, then failed as transformer-average's "--last: invalid int"."""
    run = tmp_path / "run"
    result = subprocess.run(["bash", str(ROOT / "scripts" / "run_recipe.sh"), str(copy_corpus / "copy.yaml"),
                             *toy_overrides(copy_corpus, run, max_steps=10)], env={**subprocess_env(),
                            "AVERAGE_LAST": value}, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr == (f"error: AVERAGE_LAST={value}: give how many numbered "
                                                        f"checkpoints to average (1 or more)\n")
    assert not run.exists()


def test_the_first_member_to_fail_stops_the_others(copy_corpus, tmp_path):
    """A member that failed at once was said only after every other member had trained its whole budget (hours, for
    the real recipes), the machine busy for nothing."""
    from transformer.atomic_file import hold

    run = tmp_path / "ensemble"
    (run / "seed_2").mkdir(parents=True)
    lock = hold(run / "seed_2")  # another training holds member 2's run directory: it fails at once
    if lock is None:
        pytest.skip("no file locks here")
    (run / "seed_2.log").write_text("an earlier start's output\n")  # overwritten by a re-run before
    overrides = toy_overrides(copy_corpus, run, max_steps=100_000, save_every=1000, valid_every=1000)
    overrides.remove("train.threads=1")
    start = time.monotonic()
    try:
        result = subprocess.run(["bash", "scripts/run_ensemble_recipe.sh", str(copy_corpus / "copy.yaml"),
                                 *overrides, "data.test_split=valid"], cwd=ROOT, env={**subprocess_env(),
                                "MEMBERS": "2"}, capture_output=True, text=True, timeout=600)
    finally:
        os.close(lock)
    assert result.returncode == 1 and "== member 2 failed" in result.stderr, result.stderr[-2000:]
    assert "== stopping the other members" in result.stderr and time.monotonic() - start < 300
    log = (run / "seed_2.log").read_text()
    assert log.startswith("an earlier start's output\n== ") and "MEMBERS=2 bash scripts/run_ensemble_recipe.sh" in log
    for _ in range(50):  # member 1's training is gone too, not left running on its own
        if subprocess.run(["pgrep", "-f", str(run / "seed_1")], capture_output=True).returncode != 0:
            break
        time.sleep(0.2)
    else:
        pytest.fail("member 1 still trains")


def test_a_ctrl_c_interrupts_the_ensemble_once_its_members_have_saved(copy_corpus, tmp_path):
    """A Ctrl-C was reported as every member's failure, exit 1."""
    import signal

    run = tmp_path / "ensemble"
    overrides = toy_overrides(copy_corpus, run, max_steps=100_000, save_every=1000, valid_every=1000, log_every=1)
    overrides.remove("train.threads=1")
    command = ["bash", "scripts/run_ensemble_recipe.sh", str(copy_corpus / "copy.yaml"), *overrides,
               "data.test_split=valid"]
    process = subprocess.Popen(command, cwd=ROOT, env={**subprocess_env(), "MEMBERS": "2"}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    logs = [run / f"seed_{k}" / "metrics.jsonl" for k in (1, 2)]
    deadline = time.monotonic() + 300
    while not all(log.exists() and '"kind": "train"' in log.read_text() for log in logs):  # both train
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.5)
    os.killpg(process.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole foreground group
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 130 and "failed" not in stderr, stderr[-2000:]
    assert stderr.endswith("interrupted: the same command resumes the members\n")
    assert all((run / f"seed_{k}" / "checkpoint_last.pt").exists() for k in (1, 2))  # each saved


def test_the_two_recipes_refuse_each_others_run_directory(monkeypatch, tmp_path):
    """Both default to the config's train.run_dir: the ensemble recipe wrote its members into a single run's folder and
    its test report and command.txt over the run's, and the reverse."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from recipe_settings import check_run_directory

    from transformer.config import ConfigError

    (tmp_path / "seed_1").mkdir()
    (tmp_path / "seed_1.log").write_text("")
    check_run_directory(tmp_path, "ensemble")  # its own folder, resumed
    with pytest.raises(ConfigError, match=r"holds an ensemble recipe's members \(seed_1\): give this run a folder"):
        check_run_directory(tmp_path, "single")
    (tmp_path / "seed_1").rmdir()
    (tmp_path / "checkpoint_last.pt").write_bytes(b"")
    check_run_directory(tmp_path, "single")
    with pytest.raises(ConfigError, match=r"holds a single run's checkpoints \(checkpoint_last.pt, ...\): give the "
                                          r"ensemble a folder"):
        check_run_directory(tmp_path, "ensemble")


def test_results_table_names_a_damaged_command_and_leaves_a_copied_member_folder(monkeypatch, tmp_path):
    """An unbalanced quote or bytes that are no UTF-8 in command.txt, and a member folder seed_1_old beside the
    members, were tracebacks (ValueError)."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from results_table import RecordError, read_command, read_run

    for damage in ("bash scripts/run_recipe.sh 'c.yaml".encode(), b"bash \xff"):
        (tmp_path / "command.txt").write_bytes(damage)
        with pytest.raises(RecordError, match=r"command.txt: damaged"):
            read_command(tmp_path)
    (tmp_path / "seed_1_old").mkdir()
    with pytest.raises(RecordError, match=r"no config.yaml; give the run directory of a finished recipe"):
        read_run(tmp_path)


def run_recipe_with_stand_ins(copy_corpus: Path, run: Path, commands: Path,
                              evaluate_status: int) -> subprocess.CompletedProcess:
    """run_recipe.sh on the copy corpus into ``run`` with stand-ins for the toolkit's commands on PATH: training does
    nothing, averaging writes its output, and evaluating writes a report of BLEU 1 and exits ``evaluate_status``."""
    commands.mkdir()
    stand_ins = {"transformer-train": "exit 0",
                 "transformer-average": 'while [ $# -gt 0 ]; do [ "$1" != --output ] || : > "$2"; shift; done',
                 "transformer-evaluate": 'while [ $# -gt 0 ]; do [ "$1" != --report ] || echo \'{"scores": {"bleu": '
                                         f'{{"score": 1.0}}}}}}\' > "$2"; shift; done; exit {evaluate_status}'}
    for name, body in stand_ins.items():
        (commands / name).write_text(f"#!/bin/sh\n{body}\n")
        (commands / name).chmod(0o755)
    env = subprocess_env()
    return subprocess.run(["bash", str(ROOT / "scripts" / "run_recipe.sh"), str(copy_corpus / "copy.yaml"),
                           *toy_overrides(copy_corpus, run), "data.test_split=valid"],
                          env={**env, "PATH": f"{commands}{os.pathsep}{env['PATH']}"}, capture_output=True, text=True,
                          timeout=120)


def test_a_recipe_stopped_after_training_says_where_and_how_to_go_on(copy_corpus, tmp_path):
    """A Ctrl-C while a checkpoint was scored (its evaluation exits 130) ended the recipe without a line."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint_best.pt").write_bytes(b"")
    result = run_recipe_with_stand_ins(copy_corpus, run, tmp_path / "bin", evaluate_status=130)
    assert result.returncode == 130
    assert result.stderr == ("run_recipe.sh: stopped (exit 130) while scoring checkpoint_best.pt on valid; the "
                             "training is done: the same command scores the run again\n")
