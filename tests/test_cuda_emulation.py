"""The CUDA kernels' source, run thread by thread on the CPU (tests/cuda_emulation.py), against the float64
reference: indexing, chunked loads, two and four columns per thread and padding are checked in CI without a GPU."""

from __future__ import annotations

import shutil

import pytest
import torch

from srupp_asr import kernels, recurrence
from tests.cuda_emulation import emulated_launch
from tests.reference import random_inputs, reference_recurrence

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 1e-2, torch.bfloat16: 1e-2}
# (L, B, D): one step and one column per direction; D / 2 odd (two columns per thread fall back to one when
# bidirectional); D / 2 even but not a multiple of 4 (four columns fall back to one); D / 2 a multiple of 4;
# L not a multiple of the chunk everywhere.
SHAPES = [(1, 1, 2), (37, 3, 66), (23, 4, 20), (19, 2, 24)]
BUILDS = [(dtype, cols, 4) for dtype in TOLERANCE for cols in kernels.CUDA_COLUMN_CHOICES]
BUILDS += [(torch.float32, 2, 3), (torch.float32, 4, 3), (torch.float32, 1, 1)]
BUILDS += [(dtype, *kernels.CUDA_VARIANTS[dtype]) for dtype in TOLERANCE if kernels.CUDA_VARIANTS[dtype][1] != 4]


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return (a.double() - ref).abs().max().item() / max(ref.abs().max().item(), 1e-30)


@pytest.fixture
def launches(monkeypatch):
    """Route the recurrence's CUDA launches to the emulation; record (kernel, threads, columns) per launch."""
    seen = []

    def launch(name, dtype, device, n, args, cols):
        seen.append((name, n, cols))
        emulated_launch(name, dtype, device, n, args, cols)

    monkeypatch.setattr(recurrence, "_launch", launch)
    return seen


@pytest.mark.parametrize("dtype,cols,chunk", BUILDS, ids=lambda v: str(v).replace("torch.", ""))
@pytest.mark.parametrize("L,B,D", SHAPES)
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_kernel_source_matches_float64_reference(
    dtype, cols, chunk, L, B, D, bidirectional, padded, launches, monkeypatch
):
    monkeypatch.setenv("SRUPP_CUDA_COLS", str(cols))
    monkeypatch.setenv("SRUPP_CUDA_CHUNK", str(chunk))
    u, x, wc, bias, c0, mask = random_inputs(L, B, D, bidirectional, padded, True, dtype=dtype, seed=L + B + D)
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    m = None if mask is None else mask.to(torch.uint8)
    wc_, b_, c0_ = wc.to(compute), bias.to(compute), c0.to(compute)
    h, c_all, c_last = recurrence._cuda_forward(u, x, wc_, b_, c0_, m, bidirectional, True)
    h_inf, _, c_last_inf = recurrence._cuda_forward(u, x, wc_, b_, c0_, m, bidirectional, False)
    g = torch.Generator().manual_seed(7)
    gh, gc = torch.randn(L, B, D, generator=g).to(dtype), torch.randn(B, D, generator=g).to(compute)
    grad_u, grad_x, grad_c0, wpart = recurrence._cuda_backward(u, x, wc_, b_, c0_, m, c_all, gh, gc, bidirectional)

    ref_in = [t.double().requires_grad_() for t in (u, x, wc, bias, c0)]
    h_ref, c_ref = reference_recurrence(*ref_in, mask, bidirectional)
    ((h_ref * gh.double()).sum() + (c_ref * gc.double()).sum()).backward()
    tol = TOLERANCE[dtype]
    assert h.dtype == dtype and c_all.dtype == compute
    assert _rel(h, h_ref.detach()) <= tol
    assert _rel(c_last, c_ref.detach()) <= tol
    assert torch.equal(h_inf, h) and torch.equal(c_last_inf, c_last)  # no states kept: the same outputs
    gw = wpart.sum(0)
    for what, got, ref in (
        ("u", grad_u, ref_in[0].grad),
        ("x", grad_x, ref_in[1].grad),
        ("weight_c", gw[:2], ref_in[2].grad),
        ("bias", gw[2:], ref_in[3].grad),
        ("c0", grad_c0, ref_in[4].grad),
    ):
        assert _rel(got, ref) <= tol, f"grad {what}"
    even = D % cols == 0 and not (bidirectional and (D // 2) % cols)
    used = cols if even else 1
    assert launches == [(name, B * D // used, used) for name in ("sru_forward", "sru_forward", "sru_backward")]


def test_two_columns_fall_back_to_one_on_unaligned_tensors(monkeypatch):
    monkeypatch.setenv("SRUPP_CUDA_COLS", "2")
    base = torch.zeros(2 * 3 * 8 + 1, dtype=torch.bfloat16)
    aligned, shifted = base[:-1].view(2, 3, 8), base[1:].view(2, 3, 8)
    assert recurrence.cuda_columns_for(8, True, [aligned, None]) == 2
    assert recurrence.cuda_columns_for(8, True, [aligned, shifted]) == 1
    assert recurrence.cuda_columns_for(6, True, [aligned]) == 1  # 3 columns per direction
    monkeypatch.setenv("SRUPP_CUDA_COLS", "4")
    assert recurrence.cuda_columns_for(16, True, [aligned.view(-1)[:48].view(2, 3, 8)]) == 4
    assert recurrence.cuda_columns_for(16, True, [base[2:50]]) == 1  # 4 bytes off an 8-byte word
    assert recurrence.cuda_columns_for(12, True, [aligned]) == 1  # 6 columns per direction
    monkeypatch.setenv("SRUPP_CUDA_COLS", "1")
    assert recurrence.cuda_columns_for(8, True, [aligned]) == 1


@pytest.mark.parametrize(
    ("dtype", "cols", "chunk"),
    [(torch.float32, 2, 8), (torch.float64, 1, 4), (torch.float16, 2, 8), (torch.bfloat16, 2, 8)],
)
def test_default_variant_per_dtype_and_its_override(dtype, cols, chunk, monkeypatch):
    """Without SRUPP_CUDA_COLS / SRUPP_CUDA_CHUNK each dtype gets its measured variant; set, they win."""
    monkeypatch.delenv("SRUPP_CUDA_COLS", raising=False)
    monkeypatch.delenv("SRUPP_CUDA_CHUNK", raising=False)
    aligned = torch.zeros(2, 3, 8, dtype=dtype)
    assert recurrence.cuda_columns_for(8, True, [aligned]) == cols
    assert f"-DSRU_CHUNK={chunk}" in kernels.nvrtc_options(dtype, cols)
    monkeypatch.setenv("SRUPP_CUDA_COLS", "1")
    monkeypatch.setenv("SRUPP_CUDA_CHUNK", "3")
    assert recurrence.cuda_columns_for(8, True, [aligned]) == 1
    assert "-DSRU_CHUNK=3" in kernels.nvrtc_options(dtype, 1)


@pytest.mark.parametrize("value", ["3", "0", "two", "-1"])
def test_bad_column_setting_is_refused(monkeypatch, value):
    monkeypatch.setenv("SRUPP_CUDA_COLS", value)
    with pytest.raises(ValueError, match="SRUPP_CUDA_COLS"):
        recurrence.cuda_columns_for(8, True, [])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cols", kernels.CUDA_COLUMN_CHOICES)
def test_half_outputs_are_the_float_results_rounded_to_nearest_even(dtype, cols, launches, monkeypatch):
    """The same inputs through the float32 build and the 16-bit build differ only in the outputs' rounding."""
    monkeypatch.setenv("SRUPP_CUDA_COLS", str(cols))
    u, x, wc, bias, c0, mask = random_inputs(29, 3, 40, True, True, True, dtype=dtype, seed=3)
    u = u * 8  # outputs over a wide range of exponents
    m = mask.to(torch.uint8)
    gh = torch.randn(29, 3, 40, generator=torch.Generator().manual_seed(1)).to(dtype) * 8
    low = recurrence._cuda_forward(u, x, wc.float(), bias.float(), c0.float(), m, True, True)
    high = recurrence._cuda_forward(u.float(), x.float(), wc.float(), bias.float(), c0.float(), m, True, True)
    assert torch.equal(low[0], high[0].to(dtype))
    assert torch.equal(low[1], high[1]) and torch.equal(low[2], high[2])
    low_g = recurrence._cuda_backward(u, x, wc.float(), bias.float(), c0.float(), m, low[1], gh, None, True)
    high_g = recurrence._cuda_backward(
        u.float(), x.float(), wc.float(), bias.float(), c0.float(), m, high[1], gh.float(), None, True
    )
    assert torch.equal(low_g[0], high_g[0].to(dtype)) and torch.equal(low_g[1], high_g[1].to(dtype))
    assert torch.equal(low_g[2], high_g[2]) and torch.equal(low_g[3], high_g[3])
