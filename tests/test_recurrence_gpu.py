"""The CUDA kernels against the float64 reference (run on a GPU machine: tests/run_gpu_tests.py)."""

from __future__ import annotations

import pytest
import torch

from srupp_asr import kernels
from srupp_asr.recurrence import sru_recurrence
from srupp_asr.sru import SRUppEncoder
from tests.reference import random_inputs, reference_recurrence

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
cupy = pytest.importorskip("cupy", reason="needs CuPy (pip install 'srupp-asr[gpu]')")

TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2, torch.float64: 1e-12}
SHAPES = [(1, 1, 2), (37, 3, 66), (300, 8, 514), (128, 5, 1024)]


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return (a.double().cpu() - ref).abs().max().item() / max(ref.abs().max().item(), 1e-30)


def _run(args, mask, bidirectional, grads_out):
    ins = [t.detach().clone().requires_grad_() for t in args]
    h, c = sru_recurrence(*ins, mask, bidirectional)
    gh, gc = grads_out
    ((h * gh.to(h)).sum() + (c * gc.to(c)).sum()).backward()
    return h, c, [t.grad for t in ins]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("L,B,D", SHAPES)
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("cols", kernels.CUDA_COLUMN_CHOICES)
def test_cuda_matches_float64_reference_forward_and_gradients(dtype, L, B, D, bidirectional, padded, cols, monkeypatch):
    monkeypatch.setenv("SRUPP_CUDA_COLS", str(cols))  # shapes with an odd half width fall back to 1
    cpu = random_inputs(L, B, D, bidirectional, padded, True, dtype=dtype, seed=L + B + D)
    mask = cpu[5]
    # inputs rounded to dtype, reference in float64 on exactly those values
    ref_in = [t.detach().double().clone().requires_grad_() for t in cpu[:5]]
    g = torch.Generator().manual_seed(7)
    gh, gc = torch.randn(L, B, D, generator=g).to(dtype), torch.randn(B, D, generator=g).to(dtype)
    h_ref, c_ref = reference_recurrence(*ref_in, mask, bidirectional)
    ((h_ref * gh.double()).sum() + (c_ref * gc.double()).sum()).backward()
    gpu = [t.cuda() for t in cpu[:5]]
    h, c, grads = _run(gpu, None if mask is None else mask.cuda(), bidirectional, (gh.cuda(), gc.cuda()))
    assert h.dtype == dtype and c.dtype == dtype and h.is_cuda
    tol = TOLERANCE[dtype]
    assert _rel(h, h_ref.detach()) <= tol
    assert _rel(c, c_ref.detach()) <= tol
    for name, a, r in zip(("u", "x", "weight_c", "bias", "c0"), grads, ref_in, strict=True):
        assert _rel(a, r.grad) <= tol, f"grad {name}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cols", kernels.CUDA_COLUMN_CHOICES)
def test_cuda_backward_is_bitwise_deterministic(dtype, cols, monkeypatch):
    monkeypatch.setenv("SRUPP_CUDA_COLS", str(cols))
    args = [t.cuda() for t in random_inputs(200, 8, 1024, True, True, True, dtype=dtype)[:5]]
    mask = random_inputs(200, 8, 1024, True, True, True)[5].cuda()
    outs = (torch.randn(200, 8, 1024, device="cuda"), torch.randn(8, 1024, device="cuda"))
    first, second = _run(args, mask, True, outs), _run(args, mask, True, outs)
    assert torch.equal(first[0], second[0])
    for a, b in zip(first[2], second[2], strict=True):
        assert torch.equal(a, b)


def test_cuda_on_a_side_stream_gives_the_same_result():
    args = [t.cuda() for t in random_inputs(100, 4, 256, True, False, True)[:5]]
    outs = (torch.randn(100, 4, 256, device="cuda"), torch.randn(4, 256, device="cuda"))
    expected = _run(args, None, True, outs)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = _run(args, None, True, outs)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert torch.equal(expected[0], got[0])
    for a, b in zip(expected[2], got[2], strict=True):
        assert torch.equal(a, b)


def test_cuda_forward_and_backward_do_not_synchronise_the_host():
    args = [t.cuda().requires_grad_() for t in random_inputs(50, 2, 64, True, True, True)[:5]]
    mask = random_inputs(50, 2, 64, True, True, True)[5].cuda()
    sru_recurrence(*args, mask, True)  # compile outside the check
    torch.cuda.set_sync_debug_mode("error")
    try:
        h, c = sru_recurrence(*args, mask, True)
        (h.sum() + c.sum()).backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_cuda_gradcheck_float64():
    args = [t.cuda().requires_grad_() for t in random_inputs(6, 2, 4, True, True, True, dtype=torch.float64)[:5]]
    mask = random_inputs(6, 2, 4, True, True, True)[5].cuda()
    assert torch.autograd.gradcheck(lambda *a: sru_recurrence(*a, mask, True), tuple(args))


def test_encoder_on_cuda_matches_cpu():
    torch.manual_seed(0)
    enc = SRUppEncoder(40, d_model=64, num_layers=3, attn_dim=32, num_heads=2, attn_every=1, dropout=0.0).eval()
    x, lengths = torch.randn(3, 50, 40), torch.tensor([50, 31, 7])
    out_cpu, _ = enc(x, lengths)
    out_gpu, _ = enc.cuda()(x.cuda(), lengths.cuda())
    assert (out_gpu.cpu() - out_cpu).abs().max().item() <= 1e-4
