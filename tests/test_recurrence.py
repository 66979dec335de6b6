"""The SRU recurrence on CPU against an independent float64 reference (tests/reference.py)."""

from __future__ import annotations

import random
import sys

import pytest
import torch

from srupp_asr import kernels, recurrence
from srupp_asr.recurrence import sru_recurrence, sru_recurrence_loop
from tests.reference import random_inputs, reference_recurrence


def _random_cases(n: int, seed: int = 1234):
    rnd = random.Random(seed)
    cases = [(1, 1, 2), (300, 8, 258), (2, 1, 514)]  # the corners of L 1..300, B 1..8, d 1..257
    while len(cases) < n:
        cases.append((rnd.randint(1, 300), rnd.randint(1, 8), 2 * rnd.randint(1, 257)))
    return cases


# d = 48: whole 16-column vectors in a block shorter than 64; d = 80: a block of 64 and one of 16 (unidirectional,
# D = 160 is blocks of 64, 64 and 32)
CASES = [*_random_cases(10), (50, 3, 96), (40, 2, 160)]


@pytest.fixture(params=["vector", "generic"])
def cpu_form(request):
    """Run the CPU extension's hand-written AVX-512 float steps ("vector", where the build has AVX-512) or the
    compiler-vectorised scalar steps of sru_step.h ("generic"), so both forms are checked on this machine."""
    ext = kernels.cpu_extension()
    previous = ext.set_vector_form(request.param == "vector")
    yield request.param
    ext.set_vector_form(previous)


@pytest.mark.parametrize("L,B,D", CASES)
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("padded,with_c0", [(False, False), (True, True), (True, False)])
def test_forward_matches_float64_reference(L, B, D, bidirectional, padded, with_c0, cpu_form):
    args = random_inputs(L, B, D, bidirectional, padded, with_c0, seed=L * 1000 + B + D)
    h, c = sru_recurrence(*args, bidirectional=bidirectional)
    h_ref, c_ref = reference_recurrence(*args, bidirectional=bidirectional)
    assert h.dtype == torch.float32 and c.dtype == torch.float32
    assert (h.double() - h_ref).abs().max().item() <= 1e-6
    assert (c.double() - c_ref).abs().max().item() <= 1e-6


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_gradcheck_float64(bidirectional, padded):
    u, x, wc, b, c0, mask = random_inputs(7, 3, 6, bidirectional, padded, True, dtype=torch.float64, seed=5)
    inputs = tuple(t.requires_grad_() for t in (u, x, wc, b, c0))
    assert torch.autograd.gradcheck(lambda *a: sru_recurrence(*a, mask, bidirectional), inputs)


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("D", [130, 256])
def test_fp32_gradients_match_float64_reference(bidirectional, D, cpu_form):
    args = random_inputs(120, 4, D, bidirectional, True, True, seed=9)
    ours = [t.clone().requires_grad_() for t in args[:5]]
    ref = [t.double().requires_grad_() for t in args[:5]]
    h, c = sru_recurrence(*ours, args[5], bidirectional)
    h_ref, c_ref = reference_recurrence(*ref, args[5], bidirectional)
    g = torch.Generator().manual_seed(3)
    gh, gc = torch.randn(h.shape, generator=g), torch.randn(c.shape, generator=g)
    ((h * gh).sum() + (c * gc).sum()).backward()
    ((h_ref * gh.double()).sum() + (c_ref * gc.double()).sum()).backward()
    for name, a, r in zip(("u", "x", "weight_c", "bias", "c0"), ours, ref, strict=True):
        err = (a.grad.double() - r.grad).abs().max().item() / r.grad.abs().max().item()
        assert err <= 1e-5, f"grad {name}: relative error {err:.2e}"


def test_padded_steps_keep_state_and_emit_zero():
    u, x, wc, b, c0, _ = random_inputs(10, 2, 4, False, False, True, seed=2)
    mask = torch.ones(10, 2, dtype=torch.bool)
    mask[6:, 1] = False  # sequence 1 ends after step 5
    mask[2, 0] = False  # a hole in sequence 0
    h, c = sru_recurrence(u, x, wc, b, c0, mask)
    assert torch.all(h[6:, 1] == 0) and torch.all(h[2, 0] == 0)
    h_short, c_short = sru_recurrence(u[:6, 1:], x[:6, 1:], wc, b, c0[1:])
    torch.testing.assert_close(c[1], c_short[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(h[:6, 1], h_short[:, 0], rtol=0, atol=1e-6)
    # the state after the hole is the state before it
    _, c_before = sru_recurrence(u[:2, :1], x[:2, :1], wc, b, c0[:1])
    h_after, _ = sru_recurrence(u[3:4, :1], x[3:4, :1], wc, b, c_before)
    torch.testing.assert_close(h[3, 0], h_after[0, 0], rtol=0, atol=1e-6)


def test_backward_direction_final_state_is_at_first_real_step():
    u, x, wc, b, _, _ = random_inputs(8, 1, 4, True, False, False, seed=4)
    mask = torch.ones(8, 1, dtype=torch.bool)
    mask[5:] = False
    _, c = sru_recurrence(u, x, wc, b, None, mask, bidirectional=True)
    # the backward half walks steps 4..0 of the real part only
    _, c_ref = sru_recurrence(u[:5], x[:5], wc, b, None, None, bidirectional=True)
    torch.testing.assert_close(c, c_ref, rtol=0, atol=1e-6)


def test_bidirectional_halves_see_past_and_future():
    u, x, wc, b, _, _ = random_inputs(6, 1, 4, True, False, False, seed=6)
    h, _ = sru_recurrence(u, x, wc, b, bidirectional=True)
    u2 = u.clone()
    u2[-1] += 1.0  # change only the last step
    h2, _ = sru_recurrence(u2, x, wc, b, bidirectional=True)
    assert torch.equal(h[0, :, :2], h2[0, :, :2])  # forward half at t=0 cannot see t=5
    assert not torch.equal(h[0, :, 2:], h2[0, :, 2:])  # backward half can


def test_backward_is_bitwise_deterministic():
    args = random_inputs(200, 8, 512, True, True, True, seed=8)

    def grads():
        ins = [t.clone().requires_grad_() for t in args[:5]]
        h, c = sru_recurrence(*ins, args[5], True)
        (h.square().sum() + c.sum()).backward()
        return [t.grad for t in ins]

    for a, b in zip(grads(), grads(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs_give_outputs_in_their_dtype(dtype):
    args = random_inputs(50, 2, 16, True, True, True, seed=10)
    low = [None if t is None else (t.to(dtype) if t.is_floating_point() else t) for t in args]
    h, c = sru_recurrence(*low, bidirectional=True)
    assert h.dtype == dtype and c.dtype == dtype
    h_ref, _ = reference_recurrence(*low, bidirectional=True)
    assert (h.double() - h_ref).abs().max().item() <= 1e-2 * h_ref.abs().max().item()


def test_loop_fallback_matches_native_forward_and_backward():
    args = random_inputs(40, 3, 10, True, True, True, seed=11)
    native = [t.clone().requires_grad_() for t in args[:5]]
    loop = [t.clone().requires_grad_() for t in args[:5]]
    h1, c1 = sru_recurrence(*native, args[5], True)
    h2, c2 = sru_recurrence_loop(*loop, args[5], True)
    torch.testing.assert_close(h1, h2, rtol=0, atol=1e-5)
    torch.testing.assert_close(c1, c2, rtol=0, atol=1e-5)
    (h1.sum() + c1.sum()).backward()
    (h2.sum() + c2.sum()).backward()
    for a, b in zip(native, loop, strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)


def test_without_compiler_falls_back_to_loop_with_warning(monkeypatch, caplog):
    def broken():
        raise kernels.BackendUnavailable("cannot build the SRU CPU extension (no g++)")

    monkeypatch.setattr(kernels, "cpu_extension", broken)
    monkeypatch.setattr(recurrence, "_warned_fallback", False)
    args = random_inputs(5, 2, 4, False, False, False)
    with caplog.at_level("WARNING"):
        h, _ = sru_recurrence(*args)
    assert "per-step PyTorch loop" in caplog.text and "no g++" in caplog.text
    torch.testing.assert_close(h.double(), reference_recurrence(*args)[0], rtol=0, atol=1e-6)
    monkeypatch.setenv(recurrence.BACKEND_ENV, "native")
    with pytest.raises(kernels.BackendUnavailable):
        sru_recurrence(*args)


def test_empty_sequence_returns_initial_state():
    u, x, wc, b, c0, _ = random_inputs(1, 2, 4, False, False, True)
    h, c = sru_recurrence(u[:0], x[:0], wc, b, c0)
    assert h.shape == (0, 2, 4)
    torch.testing.assert_close(c, c0)


def test_bad_shapes_are_rejected_with_a_message():
    u, x, wc, b, _, _ = random_inputs(3, 2, 4, False, False, False)
    with pytest.raises(ValueError, match="x must be"):
        sru_recurrence(u, x[:2], wc, b)
    with pytest.raises(ValueError, match="even number of columns"):
        sru_recurrence(u[:, :, :3], x[:, :, :3], wc[:, :3], b[:, :3], bidirectional=True)


def test_cuda_without_cupy_says_to_install_the_gpu_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # makes `import cupy` fail
    with pytest.raises(kernels.BackendUnavailable, match=r"srupp-asr\[gpu\]"):
        kernels.cuda_function("sru_forward", torch.float32, 0)
