"""The CPU extension's pool of output buffers (srupp_asr/kernels/sru_cpu.cpp; on by default, up to 1024 MiB): freed
outputs are reused, live ones never are, results do not depend on it, and its limit ($SRUPP_CPU_POOL_MB,
``set_pool_limit``) holds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from srupp_asr import kernels
from srupp_asr.recurrence import sru_recurrence
from tests.reference import random_inputs

ROOT = Path(__file__).resolve().parent.parent
MiB = 2**20

try:
    EXT = kernels.cpu_extension()
except kernels.BackendUnavailable as err:  # no compiler: the loop fallback has no pool
    pytest.skip(str(err), allow_module_level=True)


@pytest.fixture
def pool_limit():
    """Sets the pool's limit for one test; puts the previous one back (which also empties what is above it)."""
    before = EXT.pool_stats()[0]
    yield EXT.set_pool_limit
    EXT.set_pool_limit(before)


def _big_inputs(seed: int = 0) -> list:
    # u is 200 x 4 x 512 x 3 floats (4.9 MB): every output but the final states is pooled (>= 1 MiB)
    u, x, wc, bias, c0, mask = random_inputs(200, 4, 512, True, True, True, seed=seed)
    return [t.requires_grad_() if t is not None and t.is_floating_point() else t for t in (u, x, wc, bias, c0, mask)]


def _forward_backward(inputs: list) -> list[torch.Tensor]:
    u, x, wc, bias, c0, mask = inputs
    h, c = sru_recurrence(u, x, wc, bias, c0=c0, mask=mask, bidirectional=True)
    grads = torch.autograd.grad((h * torch.linspace(-1, 1, h.shape[-1])).sum() + c.sum(), [u, x, wc, bias, c0])
    return [h.detach(), c.detach(), *grads]


def test_results_with_the_pool_equal_those_without(pool_limit):
    inputs = _big_inputs()
    pool_limit(0)
    plain = _forward_backward(inputs)
    assert EXT.pool_stats()[1] == 0
    pool_limit(256 * MiB)
    _, _, _, hits_before, _ = EXT.pool_stats()
    for _ in range(3):  # the 2nd and 3rd runs reuse the buffers the previous run freed
        pooled = _forward_backward(inputs)
        assert all(torch.equal(a, b) for a, b in zip(plain, pooled, strict=True))
    assert EXT.pool_stats()[3] >= hits_before + 4  # h, the states, grad_u and grad_x, at least once


def test_a_live_output_is_never_handed_out_again(pool_limit):
    pool_limit(256 * MiB)
    u, x, wc, bias, _, _ = _big_inputs(seed=1)
    with torch.no_grad():
        first, _ = sru_recurrence(u, x, wc, bias, bidirectional=True)
        kept = first.clone()
        for seed in (2, 3):  # other inputs, same sizes: buffers freed in between are reused, not `first`
            other, _ = sru_recurrence(*_big_inputs(seed=seed)[:4], bidirectional=True)
            assert other.data_ptr() != first.data_ptr()
            del other
    assert torch.equal(first, kept)


def test_the_limit_bounds_what_is_kept(pool_limit):
    pool_limit(256 * MiB)
    _forward_backward(_big_inputs())
    limit, pooled, buffers, _, _ = EXT.pool_stats()
    assert 0 < pooled <= limit and buffers > 0
    pool_limit(6 * MiB)  # lowering the limit frees what is above it at once
    _, pooled, _, _, _ = EXT.pool_stats()
    assert pooled <= 6 * MiB
    pool_limit(0)
    _forward_backward(_big_inputs())
    assert EXT.pool_stats()[:3] == [0, 0, 0]


def _pool_limit_in_a_new_process(env: str | None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "SRUPP_CPU_POOL_MB"}
    if env is not None:
        environ["SRUPP_CPU_POOL_MB"] = env
    code = "from srupp_asr import kernels; print(kernels.cpu_extension().pool_stats()[0])"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environ, cwd=ROOT, timeout=300
    )


@pytest.mark.parametrize(("env", "limit"), [(None, 1024 * MiB), ("", 1024 * MiB), ("0", 0), ("64", 64 * MiB)])
def test_the_limit_comes_from_the_environment(env, limit):
    done = _pool_limit_in_a_new_process(env)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) == limit


@pytest.mark.parametrize("env", ["-5", "1.5", "lots"])
def test_a_bad_limit_is_an_error_naming_the_variable(env):
    done = _pool_limit_in_a_new_process(env)
    assert done.returncode != 0
    assert f"UserError: SRUPP_CPU_POOL_MB={env!r}: not a whole number of MiB" in done.stderr
