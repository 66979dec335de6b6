"""The Noam (warm-up, inverse-square-root) learning-rate schedule."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from srupp_asr.schedulers import NoamLR

PEAK, WARMUP = 2e-3, 100


def _optimizer() -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=PEAK)


def _lrs(optimizer: torch.optim.Optimizer, scheduler: NoamLR, steps: int) -> list[float]:
    """The learning rate each of the next ``steps`` optimizer steps runs with."""
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def test_rate_at_first_step_peak_and_four_times_warmup():
    optimizer = _optimizer()
    lrs = _lrs(optimizer, NoamLR(optimizer, warmup_steps=WARMUP), 4 * WARMUP)
    assert math.isclose(lrs[0], PEAK / WARMUP)  # step 1
    assert math.isclose(lrs[WARMUP - 1], PEAK)  # step = warmup
    assert math.isclose(lrs[4 * WARMUP - 1], PEAK / 2)  # sqrt(warmup / (4 warmup))
    assert math.isclose(max(lrs), PEAK)


def test_rate_rises_until_warmup_then_falls():
    optimizer = _optimizer()
    lrs = _lrs(optimizer, NoamLR(optimizer, warmup_steps=WARMUP), 3 * WARMUP)
    rising, falling = lrs[:WARMUP], lrs[WARMUP - 1 :]
    assert all(a < b for a, b in itertools.pairwise(rising))
    assert all(a > b for a, b in itertools.pairwise(falling))


def test_resumed_schedule_continues_exactly():
    optimizer = _optimizer()
    scheduler = NoamLR(optimizer, warmup_steps=WARMUP)
    _lrs(optimizer, scheduler, 150)
    saved_optimizer, saved_scheduler = optimizer.state_dict(), scheduler.state_dict()
    expected = _lrs(optimizer, scheduler, 20)

    resumed_optimizer = _optimizer()
    resumed_scheduler = NoamLR(resumed_optimizer, warmup_steps=WARMUP)
    resumed_optimizer.load_state_dict(saved_optimizer)
    resumed_scheduler.load_state_dict(saved_scheduler)
    assert _lrs(resumed_optimizer, resumed_scheduler, 20) == expected
    assert math.isclose(expected[0], PEAK * math.sqrt(WARMUP / 151))


def test_each_parameter_group_scales_its_own_peak():
    optimizer = torch.optim.SGD(
        [{"params": [torch.nn.Parameter(torch.zeros(1))]}, {"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 1.0}],
        lr=PEAK,
    )
    scheduler = NoamLR(optimizer, warmup_steps=4)
    _lrs(optimizer, scheduler, 3)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([PEAK, 1.0])


def test_warmup_must_be_positive():
    with pytest.raises(ValueError, match="warmup_steps must be at least 1"):
        NoamLR(_optimizer(), warmup_steps=0)
