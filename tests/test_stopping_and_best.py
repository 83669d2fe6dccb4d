"""README claims about the train loop: stopping rules, the best checkpoint, clipping, precision, the NaN guard."""

import itertools
import json
import logging
import types

import pytest
import torch
from conftest import metric_records, run_config

from transformer import fast
from transformer.checkpoint import load_checkpoint
from transformer.runtime import cpuinfo
from transformer.runtime.precision import select_precision
from transformer.training import loop, train, trainer


def script_validations(monkeypatch, scores: list[dict]) -> None:
    """Validations return ``scores`` in turn (and need no decoding), so the test decides which step is best."""
    turns = iter(scores)
    monkeypatch.setattr(trainer.Trainer, "validate", lambda self: {"ppl": 1.0, **next(turns)})


# loss, BLEU and chrF are each best at a different validation: steps 8, 12 and 16
SCORES = [dict(loss=3.0, bleu=10.0, chrf=30.0), dict(loss=1.0, bleu=20.0, chrf=20.0),
          dict(loss=2.0, bleu=40.0, chrf=35.0), dict(loss=1.5, bleu=30.0, chrf=50.0)]


@pytest.mark.parametrize("metric, pick, step", [("loss", min, 8), ("bleu", max, 12), ("chrf", max, 16)])
def test_best_checkpoint_is_the_step_where_best_metric_was_best(copy_corpus, tmp_path, monkeypatch,
                                                                metric, pick, step):
    script_validations(monkeypatch, SCORES)
    summary = train(run_config(copy_corpus, tmp_path, max_steps=16, valid_every=4, best_metric=metric))
    records = metric_records(tmp_path, "valid")
    assert [r["step"] for r in records] == [4, 8, 12, 16]
    assert pick(records, key=lambda r: r[metric])["step"] == step
    best = load_checkpoint(tmp_path / "checkpoint_best.pt")
    assert best["step"] == step and summary.checkpoint == tmp_path / "checkpoint_best.pt"
    same_step = load_checkpoint(tmp_path / f"checkpoint_step{step}.pt")
    assert all(torch.equal(best["model"][name], same_step["model"][name]) for name in best["model"])


@pytest.mark.parametrize("metric, pick", [("loss", min), ("bleu", max)])
def test_best_checkpoint_follows_the_real_validation_scores(copy_corpus, tmp_path, metric, pick):
    # on the CPU where this was written, validation loss was lowest at step 35 and BLEU highest at step 25
    train(run_config(copy_corpus, tmp_path, max_steps=40, valid_every=5, valid_max_sentences=20, best_metric=metric))
    records = metric_records(tmp_path, "valid")
    best = pick(records, key=lambda r: r[metric])  # the first of equal scores: a tie is no improvement
    assert load_checkpoint(tmp_path / "checkpoint_best.pt")["step"] == best["step"]


def test_patience_stops_after_n_validations_without_improvement(copy_corpus, tmp_path, monkeypatch):
    # BLEU 1, 3, 2, 4 (a new best resets the count), 3, 2: the 2nd validation without improvement is the 6th
    script_validations(monkeypatch, [dict(loss=1.0, chrf=1.0, bleu=b) for b in (1, 3, 2, 4, 3, 2, 1, 1)])
    summary = train(run_config(copy_corpus, tmp_path, max_steps=100, valid_every=2, patience=2))
    assert summary.step == 12 and len(metric_records(tmp_path, "valid")) == 6
    assert summary.stop_reason.startswith("early stopping")
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["step"] == 12


def test_a_resume_with_another_best_metric_starts_its_best_anew(copy_corpus, tmp_path, monkeypatch, caplog):
    """BLEU's best score was compared with -loss: the run stopped early ("no better loss in 2 validations") though the
    loss fell, kept the BLEU-chosen checkpoint as best, and reported the BLEU score as its best loss."""
    script_validations(monkeypatch, [dict(loss=3.0, bleu=10.0, chrf=30.0), dict(loss=2.0, bleu=5.0, chrf=20.0),
                                     dict(loss=1.0, bleu=4.0, chrf=20.0)])
    train(run_config(copy_corpus, tmp_path, max_steps=4, valid_every=4))
    with caplog.at_level(logging.WARNING):
        summary = train(run_config(copy_corpus, tmp_path, max_steps=12, valid_every=4, best_metric="loss", patience=2))
    assert "the best loss so far is not carried over (train.best_metric was bleu)" in caplog.text
    assert summary.step == 12 and summary.best_score == -1.0 and "early stopping" not in summary.stop_reason
    assert load_checkpoint(tmp_path / "checkpoint_best.pt")["step"] == 12


def test_another_runs_checkpoint_resumed_brings_no_best_score(copy_corpus, tmp_path, monkeypatch, caplog):
    """--resume OTHER_RUN/checkpoint: the run ended naming its checkpoint_last.pt with the other run's best score,
    and wrote no checkpoint_best.pt of its own until a validation beat that score."""
    script_validations(monkeypatch, [dict(loss=1.0, bleu=40.0, chrf=30.0), dict(loss=2.0, bleu=20.0, chrf=20.0)])
    train(run_config(copy_corpus, tmp_path / "a", max_steps=4, valid_every=4))
    with caplog.at_level(logging.WARNING):
        summary = train(run_config(copy_corpus, tmp_path / "b", max_steps=8, valid_every=4),
                        resume_from=tmp_path / "a" / "checkpoint_last.pt")
    assert f"not carried over (no checkpoint_best.pt in {tmp_path / 'b'})" in caplog.text
    assert summary.best_score == 20.0 and summary.checkpoint == tmp_path / "b" / "checkpoint_best.pt"
    assert load_checkpoint(tmp_path / "b" / "checkpoint_best.pt")["step"] == 8


def test_max_time_stops_training(copy_corpus, tmp_path, monkeypatch):
    ticks = itertools.count()  # a clock that advances one second at every reading: no waiting
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(monotonic=lambda: float(next(ticks))))
    summary = train(run_config(copy_corpus, tmp_path, max_steps=200, max_time="10s"))
    assert summary.stop_reason == "reached train.max_time=10s"
    assert 0 < summary.step < 200 and summary.seconds >= 10


def test_max_epochs_1_stops_after_exactly_one_pass_over_the_data(copy_corpus, tmp_path, monkeypatch):
    seen, corpus_size = [], []
    next_batches = trainer.Trainer.next_batches

    def recording_next_batches(self):
        batches = next_batches(self)
        seen.extend(index for batch in batches for index in batch.indices)
        corpus_size[:] = [len(self.data.train)]
        return batches

    monkeypatch.setattr(trainer.Trainer, "next_batches", recording_next_batches)
    summary = train(run_config(copy_corpus, tmp_path, max_steps=10_000, max_epochs=1,
                               **{"data.max_train_samples": 300}))
    assert summary.stop_reason == "reached train.max_epochs=1"
    assert sorted(seen) == list(range(corpus_size[0]))  # every training pair once, none twice
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["epoch"] == 1


def record_gradient_norms(monkeypatch) -> list[float]:
    """The norm of the gradients each optimizer step is given."""
    norms, build_optimizer = [], trainer.build_optimizer

    def recording_build_optimizer(*args, **kwargs):
        optimizer = build_optimizer(*args, **kwargs)
        optimizer.register_step_pre_hook(lambda opt, *_: norms.append(torch.norm(torch.stack(
            [torch.norm(p.grad) for group in opt.param_groups for p in group["params"]])).item()))
        return optimizer

    monkeypatch.setattr(trainer, "build_optimizer", recording_build_optimizer)
    return norms


def test_clip_norm_clips_the_update_and_logs_the_norm_before_clipping(copy_corpus, tmp_path, monkeypatch):
    norms = record_gradient_norms(monkeypatch)
    train(run_config(copy_corpus, tmp_path / "free", max_steps=3, log_every=1))
    free_norms, norms[:] = list(norms), []
    train(run_config(copy_corpus, tmp_path / "clipped", max_steps=3, log_every=1, clip_norm=1e-3))
    assert all(norm > 0.1 for norm in free_norms)
    assert norms == pytest.approx([1e-3] * 3, rel=1e-3)  # the optimizer saw clipped gradients
    logged = [r["grad_norm"] for r in metric_records(tmp_path / "clipped", "train")]
    assert logged[0] == pytest.approx(free_norms[0], rel=1e-5)  # same start, same gradient, logged unclipped
    assert all(norm > 0.1 for norm in logged)
    free = load_checkpoint(tmp_path / "free" / "checkpoint_last.pt")["model"]
    clipped = load_checkpoint(tmp_path / "clipped" / "checkpoint_last.pt")["model"]
    assert not all(torch.equal(free[name], clipped[name]) for name in free)


@pytest.mark.parametrize("flags, expected", [
    ("fpu sse2 avx2 avx512f avx512_bf16", "bf16"),
    ("fpu sse2 avx2 amx_bf16 amx_tile", "bf16"),
    ("fpu sse2 avx2 avx512f avx512_vnni", "fp32"),
    (None, "fp32"),  # no /proc/cpuinfo
])
def test_auto_precision_on_the_cpu_is_bf16_only_with_native_bf16(monkeypatch, tmp_path, flags, expected):
    fake = tmp_path / "cpuinfo"
    if flags is not None:
        fake.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
    monkeypatch.setattr(cpuinfo, "CPUINFO", fake)
    assert select_precision("auto", torch.device("cpu")) == expected


@pytest.mark.parametrize("capability, expected", [((6, 1), "fp32"), ((7, 5), "fp32"), ((8, 0), "bf16"),
                                                  ((9, 0), "bf16")])
def test_auto_precision_on_cuda_is_bf16_from_compute_capability_8(monkeypatch, capability, expected):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert select_precision("auto", torch.device("cuda", 0)) == expected


def test_bf16_on_the_cpu_trains_with_bf16_forward_and_fp32_weights(copy_corpus, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    logits_dtypes, for_training = set(), fast.for_training

    def recording_for_training(model):
        loss = for_training(model)

        def recording_loss(logits, *args):
            logits_dtypes.add(logits.dtype)
            return loss(logits, *args)

        return recording_loss

    monkeypatch.setattr(fast, "for_training", recording_for_training)
    train(run_config(copy_corpus, tmp_path, max_steps=30, precision="bf16", device="cpu"))
    assert logits_dtypes == {torch.bfloat16} and "precision bf16" in caplog.text
    losses = [r["loss"] for r in metric_records(tmp_path, "train")]
    assert losses[-1] < 0.8 * losses[0]
    state = load_checkpoint(tmp_path / "checkpoint_last.pt")
    assert {t.dtype for t in state["model"].values()} == {torch.float32}


def test_non_finite_parameters_never_overwrite_a_good_checkpoint(copy_corpus, tmp_path, monkeypatch, caplog):
    train(run_config(copy_corpus, tmp_path, max_steps=5))
    good = (tmp_path / "checkpoint_last.pt").read_bytes()
    update = trainer.Trainer.update

    def poisoning_update(self, batches, **kwargs):
        stats = update(self, batches, **kwargs)
        with torch.no_grad():
            next(self.model.parameters())[0] = float("nan")
        return stats

    monkeypatch.setattr(trainer.Trainer, "update", poisoning_update)
    summary = train(run_config(copy_corpus, tmp_path, max_steps=20, save_every=2, max_nonfinite_steps=3))
    assert summary.step == 6  # one update, poisoned after it; then non-finite losses until the limit
    assert "parameters are not finite at step 6: checkpoint not written" in caplog.text
    assert (tmp_path / "checkpoint_last.pt").read_bytes() == good
    assert not (tmp_path / "checkpoint_step6.pt").exists()


def test_a_validation_shows_its_progress(copy_corpus, tmp_path, capsys):
    """The training bar stood still while the validation sentences were translated (tens of seconds on a CPU)."""
    train(run_config(copy_corpus, tmp_path, max_steps=2, valid_every=2, valid_max_sentences=10))
    assert "translating" in capsys.readouterr().err


def test_a_validation_records_the_seconds_of_its_parts(copy_corpus, tmp_path):
    """Validations took 5-16 s of the 90-second GPU recipe, and nothing said where: loss, translation or scoring."""
    train(run_config(copy_corpus, tmp_path, max_steps=2, valid_every=2, valid_max_sentences=10))
    (record,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
                 if json.loads(line)["kind"] == "valid"]
    parts = [record[f"seconds_{part}"] for part in ("loss", "translate", "score")]
    assert all(0 <= seconds < 60 for seconds in parts) and parts[1] > 0
