"""The Noam (warm-up, inverse-square-root) learning-rate schedule."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from srupp_asr.schedulers import NoamLR, build_optimizer

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


@pytest.mark.parametrize(("name", "cls"), [("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW)])
def test_optimizer_on_the_cpu_is_torchs_default_implementation(name, cls):
    """On the CPU the update stays torch's default (not fused), whose steps the resume tests pin bit for bit."""
    params = [torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.randn(4))]
    optimizer = build_optimizer(name, params, lr=0.01, weight_decay=1e-6)
    assert type(optimizer) is cls
    group = optimizer.param_groups[0]
    assert group["fused"] is None and group["lr"] == 0.01 and group["weight_decay"] == 1e-6
    reference = cls([p.detach().clone().requires_grad_() for p in params], lr=0.01, weight_decay=1e-6)
    for opt, ps in ((optimizer, params), (reference, reference.param_groups[0]["params"])):
        sum((p**2).sum() for p in ps).backward()
        opt.step()
    for mine, theirs in zip(params, reference.param_groups[0]["params"], strict=True):
        assert torch.equal(mine, theirs)


def test_the_fused_optimizer_can_be_asked_for_on_the_cpu():
    params = [torch.nn.Parameter(torch.randn(3, 2))]
    assert not build_optimizer("adam", params, lr=0.01, weight_decay=0.0).param_groups[0]["fused"]
    fused = build_optimizer("adamw", params, lr=0.01, weight_decay=0.0, fused=True)
    assert isinstance(fused, torch.optim.AdamW) and fused.param_groups[0]["fused"] is True


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.gpu
def test_optimizer_on_cuda_is_fused():
    params = [torch.nn.Parameter(torch.randn(3, 2, device="cuda"))]
    assert build_optimizer("adam", params, lr=0.01, weight_decay=0.0).param_groups[0]["fused"] is True


# ----------------------------------------------------------------------------------------------------
# moved from tests/test_frontend_audit.py
# Audit of the frontend, the Noam schedule and the manifest check against references written from their
# definitions: SpecAugment (Park et al. 2019, per utterance as ESPnet's time warp), the Noam formula, lhotse's own
# validation of supervisions.


# Noam schedule and CMVN (checked clean) --------------------------------------------------------------------


@pytest.mark.reference
def test_noam_with_one_warmup_step_starts_at_the_peak_and_decays():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = NoamLR(optimizer, warmup_steps=1)
    lrs = []
    for _ in range(4):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([1.0, 1 / math.sqrt(2), 1 / math.sqrt(3), 0.5])


@pytest.mark.reference
def test_noam_resumed_mid_warmup_continues_the_ramp():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = NoamLR(optimizer, warmup_steps=100)
    for _ in range(30):
        optimizer.step()
        scheduler.step()
    resumed_optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    resumed = NoamLR(resumed_optimizer, warmup_steps=100)
    resumed_optimizer.load_state_dict(optimizer.state_dict())
    resumed.load_state_dict(scheduler.state_dict())
    assert resumed_optimizer.param_groups[0]["lr"] == pytest.approx(31 / 100)
    resumed_optimizer.step()
    resumed.step()
    assert resumed_optimizer.param_groups[0]["lr"] == pytest.approx(32 / 100)
