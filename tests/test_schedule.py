import math

import pytest
import torch

from transformer.config import TrainConfig
from transformer.training.schedule import (
    build_optimizer,
    build_scheduler,
    cooldown_factor,
    inverse_sqrt_learning_rate,
    load_optimizer_state,
    noam_learning_rate,
)


@pytest.mark.parametrize("step", [1, 100, 3999, 4000, 4001, 100000])
def test_noam_schedule_matches_the_paper_formula(step):
    expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
    assert math.isclose(noam_learning_rate(step, 512, 4000), expected, rel_tol=1e-12)


def test_noam_schedule_peaks_at_the_end_of_warmup():
    values = [noam_learning_rate(s, 512, 4000) for s in range(1, 10000)]
    assert max(range(len(values)), key=values.__getitem__) + 1 == 4000
    assert math.isclose(max(values), 512**-0.5 * 4000**-0.5)


def test_inverse_sqrt_schedule_warms_up_to_the_peak_then_decays():
    assert math.isclose(inverse_sqrt_learning_rate(50, 5e-4, 100), 2.5e-4)
    assert math.isclose(inverse_sqrt_learning_rate(100, 5e-4, 100), 5e-4)
    assert math.isclose(inverse_sqrt_learning_rate(400, 5e-4, 100), 2.5e-4)


@pytest.mark.parametrize("name", ["noam", "inverse_sqrt"])
def test_scheduler_sets_the_learning_rate_of_each_update(name):
    cfg = TrainConfig(lr_schedule=name, warmup_steps=10, lr=1.0 if name == "noam" else 1e-3)
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.Adam([parameter], lr=123.0)
    scheduler = build_scheduler(optimizer, cfg, d_model=64)
    for update in range(1, 30):
        expected = (noam_learning_rate(update, 64, 10) if name == "noam"
                    else inverse_sqrt_learning_rate(update, 1e-3, 10))
        assert math.isclose(optimizer.param_groups[0]["lr"], expected, rel_tol=1e-9)
        optimizer.step()
        scheduler.step()


@pytest.mark.parametrize("spent, factor", [(0.0, 1.0), (0.8, 1.0), (0.9, 0.5), (0.95, 0.25), (1.0, 0.0), (1.2, 0.0)])
def test_the_cooldown_falls_linearly_to_zero_over_the_last_part_of_the_budget(spent, factor):
    assert math.isclose(cooldown_factor(spent, 0.2), factor, abs_tol=1e-12)
    assert cooldown_factor(spent, 0.0) == 1.0  # no cooldown: the schedule alone


def test_the_cooldown_follows_whichever_budget_is_spent_faster():
    cfg = TrainConfig(warmup_steps=10, max_steps=100, cooldown=0.5)
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.Adam([parameter])
    max_time_used = 0.0
    scheduler = build_scheduler(optimizer, cfg, d_model=64, max_time_used=lambda: max_time_used)
    for update in range(1, 101):
        steps_spent = (update - 1) / 100
        factor = cooldown_factor(max(steps_spent, max_time_used), 0.5)
        last = optimizer.param_groups[0]["lr"]
        assert math.isclose(last, noam_learning_rate(update, 64, 10) * factor)
        optimizer.step()
        max_time_used = 0.8 if update >= 60 else 0.0  # from update 61 on, max_time runs out first
        scheduler.step()
    assert 0 < last < 0.03 * noam_learning_rate(100, 64, 10)  # the last update still learns, a little
    assert optimizer.param_groups[0]["lr"] == 0.0  # the budget is spent


def test_the_optimizer_is_fused_adam_with_the_config_hyperparameters():
    cfg = TrainConfig(adam_beta1=0.9, adam_beta2=0.98, adam_eps=1e-9, weight_decay=0.0)
    parameter = torch.nn.Parameter(torch.ones(3))
    optimizer = build_optimizer([parameter], cfg, torch.device("cpu"))
    group = optimizer.param_groups[0]
    assert group["fused"] and group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9
    reference = torch.optim.Adam([torch.nn.Parameter(torch.ones(3))], lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    for opt in (optimizer, reference):
        opt.param_groups[0]["params"][0].grad = torch.tensor([0.5, -1.0, 2.0])
        opt.step()
    assert torch.allclose(parameter, reference.param_groups[0]["params"][0])


def test_resuming_from_a_plain_adam_checkpoint_keeps_the_optimizer_fused():
    cfg = TrainConfig()
    plain = torch.optim.Adam([torch.nn.Parameter(torch.ones(3))], lr=1e-3)
    plain.param_groups[0]["params"][0].grad = torch.ones(3)
    plain.step()
    optimizer = build_optimizer([torch.nn.Parameter(torch.ones(3))], cfg, torch.device("cpu"))
    load_optimizer_state(optimizer, plain.state_dict())
    assert optimizer.param_groups[0]["fused"] and optimizer.param_groups[0]["lr"] == 1e-3
    optimizer.param_groups[0]["params"][0].grad = torch.ones(3)
    optimizer.step()  # the restored state (step, moments) fits the fused implementation
    assert int(optimizer.state[optimizer.param_groups[0]["params"][0]]["step"]) == 2
