"""transformer-evaluate, scripts/run_recipe.sh and scripts/results_table.py as a user scoring runs meets them:
each mistake or mishap is one line naming what is at fault, and no work is lost."""

import importlib
import io
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import ROOT, subprocess_env, toy_overrides

from transformer.checkpoint import load_checkpoint, save_checkpoint
from transformer.cli import main
from transformer.config_loading import load_config


class _ClosedPipe:
    """stdout whose reader has gone (``transformer-evaluate ... | head -1``)."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self) -> int:
        raise io.UnsupportedOperation("fileno")  # as a test's capture: nothing to point at /dev/null


def test_a_closed_stdout_loses_no_report(tmp_path, monkeypatch, capsys):
    """The report was written after the scores were printed: piped into ``head -1`` the report was lost (a model's
    whole translation of the split with it) and the command said "error: [Errno 32] Broken pipe"."""
    hypotheses, references, report = tmp_path / "hyp.txt", tmp_path / "ref.txt", tmp_path / "scores.json"
    hypotheses.write_text("the cat sat on the mat\nhello world\n")
    references.write_text("the cat sat on a mat\nhello world\n")
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    code = main(["evaluate", "--hypotheses", str(hypotheses), "--references", str(references),
                 "--report", str(report)])
    assert code == 141  # 128 + SIGPIPE, as transformer-translate | head -1
    assert "bleu" in json.loads(report.read_text())["scores"]
    assert "error" not in capsys.readouterr().err


def test_a_setting_after_the_references_is_a_setting_and_nbest_is_refused(quick_copy_run, tmp_path, capsys):
    """--references took decode.beam_size=3 as a file ("cannot read decode.beam_size=3"); --nbest 2 was translated,
    recorded in the report, and unused (the 1-best is scored)."""
    (tmp_path / "hyp.txt").write_text("hello world\n")
    assert main(["evaluate", "--hypotheses", str(tmp_path / "hyp.txt"), "--references", str(tmp_path / "hyp.txt"),
                 "decode.beam_size=3"]) == 2
    assert capsys.readouterr().err == "error: decoding settings (decode.beam_size=3) need --checkpoint or --model\n"
    assert main(["evaluate", "--checkpoint", str(quick_copy_run / "checkpoint_last.pt"), "--nbest", "2"]) == 2
    assert capsys.readouterr().err.startswith("error: decode.nbest=2: evaluate scores the best translation of each "
                                              "sentence; drop it")


def test_translations_piped_in_are_scored_as_their_file_is(tmp_path, monkeypatch, capsys):
    """``transformer-translate ... | transformer-evaluate --hypotheses - --references REF``, as sacreBLEU reads its
    input (it said "cannot read -"); standard input is one of the files at most."""
    hypotheses, references = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hypotheses.write_text("the cat sat on the mat\nhello world\n")
    references.write_text("the cat sat on a mat\nhello world\n")
    assert main(["evaluate", "--hypotheses", str(hypotheses), "--references", str(references)]) == 0
    from_file = capsys.readouterr().out
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(hypotheses.read_bytes())))
    assert main(["evaluate", "--hypotheses", "-", "--references", str(references)]) == 0
    assert capsys.readouterr().out == from_file
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"one line\n")))
    assert main(["evaluate", "--hypotheses", "-", "--references", str(references)]) == 2
    assert capsys.readouterr().err == f"error: stdin has 1 lines but {references} has 2\n"
    assert main(["evaluate", "--hypotheses", "-", "--references", "-"]) == 2
    assert capsys.readouterr().err == "error: standard input ('-') can be one of the files, not several\n"


def test_a_report_that_cannot_be_written_keeps_the_scores_and_names_it(tmp_path, monkeypatch, capsys):
    """Written before printing, a report on a full disk lost the scores too ("error: [Errno 28] No space left on
    device", naming no file); and a report cut short by the failure was left behind."""
    import errno

    from transformer import atomic_file

    hypotheses, references, report = tmp_path / "hyp.txt", tmp_path / "ref.txt", tmp_path / "scores.json"
    hypotheses.write_text("the cat sat on the mat\n")
    references.write_text("the cat sat on a mat\n")
    report.write_text('{"scores": {}}\n')  # an earlier report, to be kept whole

    def full_disk(path: Path, text: str, encoding: str = "utf-8") -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic_file.Path, "write_text", full_disk)
    assert main(["evaluate", "--hypotheses", str(hypotheses), "--references", str(references),
                 "--report", str(report)]) == 2
    captured = capsys.readouterr()
    assert captured.out.startswith("BLEU = ")
    assert captured.err == f"error: --report {report}: cannot write it (No space left on device)\n"
    monkeypatch.undo()
    assert report.read_text() == '{"scores": {}}\n'


def test_the_recipe_refuses_a_missing_test_split_before_training(copy_corpus, tmp_path):
    """A test split the corpus lacks was found only after training, averaging and scoring validation."""
    run = tmp_path / "run"
    overrides = toy_overrides(copy_corpus, run, max_steps=10) + ["data.test_split=test"]
    result = subprocess.run(["bash", str(ROOT / "scripts" / "run_recipe.sh"), str(copy_corpus / "copy.yaml"),
                             *overrides], cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True,
                            timeout=600)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown split 'test'" in lines[0], lines
    assert not list(run.glob("*.pt"))


@pytest.fixture
def results_table(monkeypatch, capsys) -> Callable[..., tuple[int, str]]:
    """scripts/results_table.py's main in this process (a process each cost 2 s of imports): its exit status and
    what it wrote to stderr."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    module = importlib.import_module("results_table")

    def table(run_dir: Path, *options: str) -> tuple[int, str]:
        capsys.readouterr()
        status = module.main([str(run_dir), *options])
        return status, capsys.readouterr().err
    return table


def _one_line_error(result: tuple[int, str], *words: str) -> None:
    """A user's error (exit status 2, as the toolkit's commands give: it was 1) on one line naming ``words``."""
    status, error = result
    assert status == 2 and len(error.strip().splitlines()) == 1 and all(word in error for word in words), error


def test_results_table_names_a_damaged_or_foreign_record(quick_copy_run, results_table, tmp_path):
    """A run directory without metrics.jsonl, a test report cut short, one written for a release folder (no checkpoint,
    no step): tracebacks (FileNotFoundError, JSONDecodeError, KeyError) before."""
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(quick_copy_run / "config.yaml", run)
    _one_line_error(results_table(run), "metrics.jsonl")
    shutil.copy(quick_copy_run / "metrics.jsonl", run)
    test = run / f"{load_config(run / 'config.yaml').data.test_split}.json"
    test.write_text('{"scores": {"bleu": ')  # the recipe interrupted while writing it
    _one_line_error(results_table(run), test.name, "not a JSON file")
    decoding = {"beam_size": 4, "length_penalty": 0.6}
    scores = {name: {"score": 1.0, "signature": "nrefs:1", "text": ""} for name in ("bleu", "chrf", "ter")}
    test.write_text(json.dumps({"scores": scores, "model": "release", "decoding": decoding}))
    _one_line_error(results_table(run, "--detail"), test.name, "'checkpoint'")
    report = {"scores": scores, "checkpoint": "checkpoint_best.pt", "step": 10, "decoding": decoding}
    for edit, words in ((lambda r: r["scores"].pop("bleu"), "no 'scores.bleu.score'"),  # tracebacks: KeyError
                        (lambda r: r.update(decoding={}), "no 'decoding.beam_size'"),
                        (lambda r: r.update(step=None), "no 'step'"),
                        (lambda r: r.update(checkpoint=["a.pt", "b.pt"]), "a list for 'checkpoint'")):
        edited = json.loads(json.dumps(report))
        edit(edited)
        test.write_text(json.dumps(edited))
        _one_line_error(results_table(run, "--detail"), test.name, words)
    test.write_text(json.dumps(report))
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    _one_line_error(results_table(run, "--curves", str(not_a_folder / "curves")), "--curves", "Not a directory")
    _one_line_error(results_table(run, "--curves", str(not_a_folder)), f"--curves {not_a_folder}: a file, not a folder")


def test_the_models_own_corpus_unreadable_from_here_names_the_option(quick_copy_run, tmp_path, monkeypatch, capsys):
    """A model trained on a relative data.dataset, evaluated from another folder: the corpus was looked up on the
    hub, and the error said to "set data.dataset to a local copy", which transformer-evaluate refuses (only
    decode.* settings): it names --dataset."""
    checkpoint = quick_copy_run / "checkpoint_last.pt"
    state = load_checkpoint(checkpoint)
    state["config"]["data"]["dataset"] = "copy_corpus"  # relative, as trained from the corpus's parent folder
    save_checkpoint(state, tmp_path / "checkpoint.pt")
    shutil.copy(quick_copy_run / "spm.model", tmp_path / "spm.model")
    monkeypatch.chdir(tmp_path)
    assert main(["evaluate", "--checkpoint", str(tmp_path / "checkpoint.pt"), "--split", "valid"]) == 2
    error = capsys.readouterr().err
    assert error == ("error: cannot load the model's corpus, data.dataset='copy_corpus' in its config (Couldn't reach "
                     "'copy_corpus' on the Hub (OfflineModeIsEnabled)): give it with --dataset DIR\n")
    assert main(["evaluate", "--checkpoint", str(quick_copy_run / "checkpoint_last.pt"), "--split", "bogus"]) == 2
    assert "--dataset" not in capsys.readouterr().err  # a readable corpus without the split: not its fault
