"""scripts/compare_multilingual.py end to end on the two-target toy corpus: a bilingual model per direction for
N steps, the multilingual one for N x directions, each scored per direction, the zero-shot direction too."""

import json
import subprocess

import pytest
from conftest import ROOT, metric_records, toy_overrides

pytestmark = pytest.mark.slow


def test_the_comparison_trains_matched_budgets_and_tables_every_direction(two_target_corpus, tmp_path, monkeypatch,
                                                                          capsys):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    monkeypatch.chdir(ROOT)
    from compare_multilingual import main

    config = tmp_path / "multilingual.yaml"
    config.write_text((two_target_corpus / "two.yaml").read_text()
                      + "data: {pairs: [src-up, src-cap], src_lang: src, tgt_lang: up, test_split: valid}\n")
    overrides = [o for o in toy_overrides(two_target_corpus, tmp_path / "unused") if not o.startswith(
        ("train.run_dir=", "data.src_lang=", "data.tgt_lang=", "train.max_steps=", "train.valid_every=",
         "train.save_every="))]
    root = tmp_path / "compare"
    (root / "multilingual").mkdir(parents=True)
    (root / "multilingual" / "log.txt").write_text("an earlier start's output\n")  # overwritten by a re-run before
    assert main(["--steps", "12", "--run-root", str(root), "--config", str(config), "--bilingual-vocab", "300",
                 "--zero-shot", "up-cap", "--parallel", "2", *overrides]) == 0

    def steps(run: str) -> int:
        return metric_records(root / run, "stop")[-1]["step"]

    assert steps("bilingual_src_up") == steps("bilingual_src_cap") == 12 and steps("multilingual") == 24
    log = (root / "multilingual" / "log.txt").read_text()
    assert log.startswith("an earlier start's output\n== transformer-train ")
    bilingual_config = (root / "bilingual_src_up" / "config.yaml").read_text()
    assert "pairs: []" in bilingual_config and "vocab_size: 300" in bilingual_config
    assert "warmup_steps: 50" in bilingual_config  # the multilingual 100 over two directions
    assert sorted(p.name for p in (root / "multilingual").glob("test.*.json")) == [
        "test.src-cap.json", "test.src-up.json", "test.up-cap.json"]
    table, said = capsys.readouterr()
    assert table == (root / "comparison.md").read_text() + "\n"
    # a line as each run starts and ends: the runs' own output goes to their log.txt
    assert f"== multilingual: training 24 steps, then scoring 3 direction(s); its output: {root}/multilingual/log.txt" \
        in said.splitlines() and said.count(": done in ") == 3
    rows = table.rstrip("\n").splitlines()
    assert rows[0].startswith("| direction | bilingual (12 steps) BLEU / chrF | multilingual (24 steps)")
    assert [row.split(" | ")[0] for row in rows[2:]] == ["| src-up", "| src-cap", "| up-cap (zero-shot)"]
    assert rows[4].split(" | ")[1] == "none"

    def report(run: str, direction: str) -> dict:  # each report scored the direction it is named after
        scored = json.loads((root / run / f"test.{direction}.json").read_text())
        assert f"{scored['src_lang']}-{scored['tgt_lang']}" == direction
        return scored["scores"]

    def scores(found: dict) -> str:
        return f"{found['bleu']['score']:.2f} / {found['chrf']['score']:.2f}"

    for row, direction in zip(rows[2:4], ("src-up", "src-cap")):  # the table's figures are the reports'
        bilingual, multilingual = report(f"bilingual_src_{direction[4:]}", direction), report("multilingual", direction)
        difference = multilingual["bleu"]["score"] - bilingual["bleu"]["score"]
        assert row.split(" | ")[1:] == [scores(bilingual), scores(multilingual), f"{difference:+.2f} |"]
    assert rows[4].split(" | ")[2] == scores(report("multilingual", "up-cap"))


def test_the_table_gives_each_directions_scores_and_what_the_multilingual_model_gains(monkeypatch):
    """By hand (the toy runs above score about alike, so they could not tell a gain from a loss)."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from compare_multilingual import comparison_table

    def scores(bleu: float, chrf: float) -> dict:
        return {"bleu": {"score": bleu}, "chrf": {"score": chrf}}

    multilingual = {"de-en": scores(31.5, 56.25), "en-fr": scores(10.0, 30.0)}
    table = comparison_table({"de-en": scores(30.0, 55.0)}, multilingual, steps=1000, n_directions=2)
    assert table.splitlines() == [
        "| direction | bilingual (1,000 steps) BLEU / chrF | multilingual (2,000 steps) BLEU / chrF "
        "| BLEU difference |",
        "|---|---|---|---|", "| de-en | 30.00 / 55.00 | 31.50 / 56.25 | +1.50 |",
        "| en-fr (zero-shot) | none | 10.00 / 30.00 | |"]


def test_the_bilingual_schedule_is_the_multilingual_curve_compressed_to_its_budget(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from compare_multilingual import bilingual_schedule

    from transformer.config import TrainConfig
    from transformer.training.schedule import inverse_sqrt_learning_rate, noam_learning_rate

    multilingual = TrainConfig(lr=0.6, warmup_steps=1000)
    overrides = dict(o.removeprefix("train.").split("=") for o in bilingual_schedule(multilingual, 4))
    warmup, lr = int(overrides["warmup_steps"]), float(overrides["lr"])
    assert warmup == 250
    for step in (1, 250, 1000, 3000):  # bilingual step n is multilingual step 4n: the same learning rate
        assert noam_learning_rate(step, 256, warmup, lr) == pytest.approx(noam_learning_rate(4 * step, 256, 1000, 0.6))
    inverse_sqrt = TrainConfig(lr=5e-4, warmup_steps=1000, lr_schedule="inverse_sqrt")
    overrides = dict(o.removeprefix("train.").split("=") for o in bilingual_schedule(inverse_sqrt, 4))
    assert float(overrides["lr"]) == 5e-4 and inverse_sqrt_learning_rate(300, 5e-4, 250) == pytest.approx(
        inverse_sqrt_learning_rate(1200, 5e-4, 1000))


def test_settings_that_would_unmatch_the_budgets_and_a_failed_run_are_one_line_errors(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    from compare_multilingual import main

    config = tmp_path / "multilingual.yaml"
    config.write_text("data: {pairs: [src-up, src-cap], src_lang: src, tgt_lang: up}\n")
    for argv, message in ((["--steps", "5", "train.max_steps=9"], "train.max_steps=9: the comparison sets this"),
                          (["--steps", "5", "--zero-shot", "upcap"], "--zero-shot 'upcap': give directions as"),
                          # found after the hours of training before, when the multilingual model was scored
                          (["--steps", "5"], "--zero-shot de-fr: de→fr: this model translates from cap, src, up "
                                             "into up, cap"),
                          (["--steps", "5", "--zero-shot", "src-up"], "--zero-shot src-up: a direction of data.pairs"),
                          # a setting after --zero-shot was taken as a direction ("give directions as source-target")
                          (["--steps", "5", "--zero-shot", "up-cap,cap-up", "train.max_steps=9"],
                           "train.max_steps=9: the comparison sets this"),
                          (["--steps", "0"], "must be positive")):
        with pytest.raises(SystemExit):
            main([*argv, "--config", str(config)])
        assert message in capsys.readouterr().err
    # no corpus there: the multilingual run's training fails, and the comparison says where its log is
    assert main(["--steps", "5", "--config", str(config), "--run-root", str(tmp_path / "runs"),
                 f"data.dataset={tmp_path / 'missing'}", "train.device=cpu", "--zero-shot", "up-cap"]) == 1
    said = capsys.readouterr().err.splitlines()  # a line as the run started, then the error's
    assert said[-1].startswith("compare_multilingual: transformer-train of ") and said[-1].endswith("log.txt")
    assert len(said) == 2 and said[0].startswith("== multilingual: training 10 steps")


def test_a_run_root_trained_further_than_the_budget_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    """Run again with a smaller --steps, the comparison resumed runs already past it and tabled them at the new
    budget's steps."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import compare_multilingual

    config = tmp_path / "multilingual.yaml"
    config.write_text("data: {pairs: [src-up, src-cap], src_lang: src, tgt_lang: up}\n")
    (tmp_path / "runs" / "multilingual").mkdir(parents=True)
    (tmp_path / "runs" / "multilingual" / "config.yaml").write_text("train: {max_steps: 48}\n")  # --steps 24 before
    monkeypatch.setattr(compare_multilingual, "run_all", lambda *args: pytest.fail("trained"))
    with pytest.raises(SystemExit):
        compare_multilingual.main(["--steps", "12", "--config", str(config), "--run-root", str(tmp_path / "runs"),
                                   "--zero-shot", ""])
    assert capsys.readouterr().err.endswith(f"error: --steps 12: {tmp_path / 'runs' / 'multilingual'} holds a run "
                                            "trained for 48 steps, more than its 24 here; give another --run-root, "
                                            "or --steps 24\n")


@pytest.mark.parametrize("interrupted", ["the script", "a run"])
def test_ctrl_c_ends_the_comparison_with_130_and_starts_no_other_run(tmp_path, monkeypatch, capsys, interrupted):
    """Ctrl-C reaches the script (KeyboardInterrupt) and the run under way (its train command exits 130): it was
    "transformer-train of multilingual failed (exit 130)", exit 1, and the runs not started yet were started."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import compare_multilingual

    config = tmp_path / "multilingual.yaml"
    config.write_text("data: {pairs: [src-up, src-cap], src_lang: src, tgt_lang: up}\n")
    started = []

    def run(command, **kwargs):
        started.append(command[0])
        if interrupted == "the script":
            raise KeyboardInterrupt
        return subprocess.CompletedProcess(command, 130)

    monkeypatch.setattr(compare_multilingual.subprocess, "run", run)
    assert compare_multilingual.main(["--steps", "5", "--config", str(config), "--run-root", str(tmp_path / "runs"),
                                      "--zero-shot", ""]) == 130
    assert started == ["transformer-train"]  # the multilingual run's; no bilingual one started
    assert capsys.readouterr().err.splitlines()[-1] == ("compare_multilingual: interrupted; run the same command "
                                                        "again to resume")
