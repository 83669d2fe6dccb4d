import re

import pytest
from conftest import toy_overrides

from transformer.cli import main
from transformer.training.progress import StepRate, epoch_steps_left, expected_total_steps


def test_the_first_limit_to_bind_sets_the_total():
    assert expected_total_steps(10, max_steps=100) == 100
    assert expected_total_steps(10, max_steps=100, max_epochs=2, epoch_steps_left=30) == 40
    assert expected_total_steps(10, max_steps=100, max_epochs=2, epoch_steps_left=300) == 100
    # 45 minutes at 2 steps/s end the run at step 10 + 5400, long before the default 100,000 steps
    assert expected_total_steps(10, max_steps=100_000, time_left=2700, steps_per_second=2.0) == 5410
    assert expected_total_steps(10, max_steps=100, time_left=2700, steps_per_second=2.0) == 100


def test_time_spent_ends_the_run_at_the_current_step():
    assert expected_total_steps(10, max_steps=100, time_left=-3.0, steps_per_second=2.0) == 10


def test_a_limit_that_cannot_be_estimated_yet_gives_no_total():
    assert expected_total_steps(0, max_steps=100, time_left=60.0, steps_per_second=None) is None
    assert expected_total_steps(5, max_steps=100, max_epochs=1, epoch_steps_left=None) is None  # a stream's 1st epoch


def test_updates_left_in_the_epochs_count_accumulated_batches_and_the_position():
    assert epoch_steps_left(max_epochs=2, epoch=0, position=0, epoch_batches=50) == 100
    assert epoch_steps_left(max_epochs=2, epoch=1, position=10, epoch_batches=50) == 40
    assert epoch_steps_left(max_epochs=2, epoch=1, position=10, epoch_batches=50, accumulate=4) == 10
    assert epoch_steps_left(max_epochs=2, epoch=1, position=50, epoch_batches=50) == 0  # the last epoch just ended
    assert epoch_steps_left(max_epochs=2, epoch=0, position=3, epoch_batches=None) is None


def test_step_rate_follows_the_recent_speed():
    rate = StepRate(step=0, now=0.0, window=10.0)
    assert rate.per_second is None
    for second in range(1, 11):  # 1 step/s for 10 s, then 4 steps/s
        rate.add(second, float(second))
    assert rate.per_second == pytest.approx(1.0)
    for second in range(11, 31):
        rate.add(10 + 4 * (second - 10), float(second))
    assert rate.per_second == pytest.approx(4.0)


def test_progress_bar_of_a_time_limited_run_does_not_count_to_max_steps(copy_corpus, tmp_path, capsys):
    overrides = toy_overrides(copy_corpus, tmp_path, max_steps=100_000, max_time="3s", save_every=0, log_every=5)
    assert main(["train", str(copy_corpus / "copy.yaml"), *overrides]) == 0
    out, err = capsys.readouterr()
    assert "done: reached train.max_time=3s" in out
    totals = [int(total) for total in re.findall(r"\d+/(\d+) \[", err)]
    steps = [int(step) for step in re.findall(r"(\d+)(?:/\d+)? \[", err)]
    assert totals, err[-2000:]
    assert 100_000 not in totals
    assert max(totals) < 3 * max(steps)  # the estimate follows the speed, give or take


def test_a_resumed_log_keeps_the_resumed_steps_records_in_tensorboard_too(tmp_path):
    """A run resumed from the checkpoint of step 2 logs step 3 again: both logs drop the old step 3, and
    both keep step 2's validation (TensorBoard's purge_step drops events from that step on)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from transformer.training.metrics import MetricsLogger, read_metrics

    logger = MetricsLogger(tmp_path)
    for step in (1, 2, 3):
        logger.log("valid", step, bleu=float(step))
    logger.close()
    logger = MetricsLogger(tmp_path, resume_step=2)
    logger.log("valid", 3, bleu=30.0)
    logger.close()
    assert [(r["step"], r["bleu"]) for r in read_metrics(tmp_path)] == [(1, 1.0), (2, 2.0), (3, 30.0)]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("valid/bleu")] == [(1, 1.0), (2, 2.0), (3, 30.0)]
