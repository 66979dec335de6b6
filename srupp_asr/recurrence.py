"""The SRU elementwise recurrence over a whole sequence, on CPU and CUDA.

Per direction and column, with U split in three and x the highway input (docs/design.md, "The SRU++ encoder")::

    f[t] = sigmoid(U[t,0] + v  * c[t-1] + b)
    r[t] = sigmoid(U[t,1] + v' * c[t-1] + b')
    c[t] = f[t] * c[t-1] + (1 - f[t]) * U[t,2]
    h[t] = r[t] * c[t]   + (1 - r[t]) * x[t]

Padded steps (``mask`` False) keep ``c`` unchanged and emit ``h = 0``. With
``bidirectional=True`` the first half of the columns runs forward in time and the second half
backward. :func:`sru_recurrence` is the entry point; one ``torch.autograd.Function`` dispatches
to the CUDA kernels (CuPy), the CPU extension (C++), or, when no compiler is available, a
per-step PyTorch loop (:func:`sru_recurrence_loop`) with a warning.
"""

from __future__ import annotations

import functools
import logging
import os

import numpy as np
import torch

from srupp_asr import kernels

log = logging.getLogger(__name__)

BACKEND_ENV = "SRUPP_RECURRENCE_BACKEND"  # "auto" (default), "native" or "loop"
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def sru_recurrence(
    u: torch.Tensor,
    x: torch.Tensor,
    weight_c: torch.Tensor,
    bias: torch.Tensor,
    c0: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    bidirectional: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the SRU recurrence over a sequence; return ``(h, c_last)``.

    Args:
        u: ``(L, B, D, 3)`` projected inputs (forget-gate, reset-gate and candidate parts).
        x: ``(L, B, D)`` highway input (the layer input).
        weight_c: ``(2, D)`` recurrent weights ``v`` and ``v'``.
        bias: ``(2, D)`` gate biases ``b`` and ``b'``.
        c0: ``(B, D)`` initial state, zeros when ``None``.
        mask: ``(L, B)`` bool, True on real steps; ``None`` when nothing is padded.
        bidirectional: columns ``[D/2, D)`` run backward in time.

    Returns:
        ``h`` of shape ``(L, B, D)`` and the final state ``c_last`` of shape ``(B, D)``, both in
        ``u``'s dtype. ``c_last`` holds, per column, the state after the last real step in that
        column's direction (the first real step for backward columns).
    """
    _check_shapes(u, x, weight_c, bias, c0, mask, bidirectional)
    if _backend_for(u) == "loop":
        return sru_recurrence_loop(u, x, weight_c, bias, c0, mask, bidirectional)
    # The per-step states are stored only when a backward pass can follow (Function.forward itself
    # always runs with grad mode off, so this is decided here).
    keep = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (u, x, weight_c, bias, c0))
    return _SRURecurrence.apply(u, x, weight_c, bias, c0, mask, bidirectional, keep)


def sru_recurrence_loop(
    u: torch.Tensor,
    x: torch.Tensor,
    weight_c: torch.Tensor,
    bias: torch.Tensor,
    c0: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    bidirectional: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-step PyTorch loop of the recurrence (autograd does the backward).

    The fallback when no native backend can be built, and the baseline in the benchmarks. Same
    arguments and results as :func:`sru_recurrence`.
    """
    L, B, D, _ = u.shape
    dtype = u.dtype
    # fp16/bf16 run in fp32 arithmetic, as in the native backends; a copy of c0, so that c_last never is c0.
    compute = torch.float32 if dtype in _LOW_PRECISION else dtype
    u, x = u.to(compute), x.to(compute)
    c = u.new_zeros(B, D) if c0 is None else c0.to(compute, copy=True)
    v, vr = weight_c.to(compute).unbind(0)
    bf, br = bias.to(compute).unbind(0)
    if bidirectional:
        # Reverse the backward columns' time axis so every column walks t = 0..L-1.
        u, x = _flip_backward_half(u), _flip_backward_half(x)
        if mask is not None:
            half = (L, B, D // 2)
            mask = torch.cat([mask.unsqueeze(-1).expand(half), mask.flip(0).unsqueeze(-1).expand(half)], -1)
    elif mask is not None:
        mask = mask.unsqueeze(-1).expand(L, B, D)
    # unbind once: indexing u[t] inside the loop would make autograd allocate a full-size
    # gradient per step.
    us, xs = u.unbind(0), x.unbind(0)
    ms = None if mask is None else mask.unbind(0)
    hs = []
    for t in range(L):
        u0, u1, u2 = us[t].unbind(-1)
        f = torch.sigmoid(u0 + v * c + bf)
        r = torch.sigmoid(u1 + vr * c + br)
        c_new = f * c + (1 - f) * u2
        h = r * c_new + (1 - r) * xs[t]
        if ms is not None:
            c_new = torch.where(ms[t], c_new, c)
            h = torch.where(ms[t], h, 0.0)
        c = c_new
        hs.append(h)
    h = torch.stack(hs) if hs else x.new_zeros(L, B, D)
    if bidirectional:
        h = _flip_backward_half(h)
    return h.to(dtype), c.to(dtype)


def _flip_backward_half(t: torch.Tensor) -> torch.Tensor:
    half = t.shape[2] // 2
    return torch.cat([t[:, :, :half], t[:, :, half:].flip(0)], 2)


def _check_shapes(u, x, weight_c, bias, c0, mask, bidirectional) -> None:
    if u.dim() != 4 or u.shape[-1] != 3:
        raise ValueError(f"u must be (L, B, D, 3), got {tuple(u.shape)}")
    L, B, D, _ = u.shape
    if x.shape != (L, B, D):
        raise ValueError(f"x must be {(L, B, D)} to match u, got {tuple(x.shape)}")
    for name, p in (("weight_c", weight_c), ("bias", bias)):
        if p.shape != (2, D):
            raise ValueError(f"{name} must be {(2, D)}, got {tuple(p.shape)}")
    if c0 is not None and c0.shape != (B, D):
        raise ValueError(f"c0 must be {(B, D)}, got {tuple(c0.shape)}")
    if mask is not None and mask.shape != (L, B):
        raise ValueError(f"mask must be {(L, B)}, got {tuple(mask.shape)}")
    if bidirectional and D % 2:
        raise ValueError(f"bidirectional recurrence needs an even number of columns, got {D}")
    if not u.is_floating_point() or x.dtype != u.dtype:
        raise TypeError(f"u and x must share one floating dtype, got {u.dtype} and {x.dtype}")


_warned_fallback = False


def _backend_for(u: torch.Tensor) -> str:
    """'native' (CUDA kernels or CPU extension) or 'loop' (per-step PyTorch)."""
    global _warned_fallback
    choice = os.environ.get(BACKEND_ENV, "auto")
    if choice not in ("auto", "native", "loop"):
        raise ValueError(f"{BACKEND_ENV} must be auto, native or loop, not {choice!r}")
    if choice == "loop":
        return "loop"
    if u.is_cuda:
        return "native"  # a missing CuPy raises its one-line message at launch
    try:
        kernels.cpu_extension()
        return "native"
    except kernels.BackendUnavailable as err:
        if choice == "native":
            raise
        if not _warned_fallback:
            log.warning("%s; using the slow per-step PyTorch loop", err)
            _warned_fallback = True
        return "loop"


class _SRURecurrence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u, x, weight_c, bias, c0, mask, bidirectional, keep):
        dtype = u.dtype
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        wc = weight_c.detach().to(compute).contiguous()
        b = bias.detach().to(compute).contiguous()
        c0f = None if c0 is None else c0.detach().to(compute).contiguous()
        m = None if mask is None else mask.to(torch.uint8).contiguous()
        u_, x_ = u.detach().contiguous(), x.detach().contiguous()
        if u.is_cuda:
            h, c_all, c_last = _cuda_forward(u_, x_, wc, b, c0f, m, bidirectional, keep)
        else:
            ext = kernels.cpu_extension()
            if dtype in _LOW_PRECISION:  # CPU arithmetic in fp32, results back in the input dtype
                h, c_all, c_last = ext.forward(u_.float(), x_.float(), wc, b, c0f, m, bidirectional, keep)
                h = h.to(dtype)
            else:
                h, c_all, c_last = ext.forward(u_, x_, wc, b, c0f, m, bidirectional, keep)
        ctx.save_for_backward(u_, x_, wc, b, c0f, m, c_all, u, x, weight_c, bias, c0)
        ctx.mask = mask
        ctx.bidirectional = bidirectional
        ctx.dtypes = (weight_c.dtype, bias.dtype, None if c0 is None else c0.dtype)
        return h, c_last.to(dtype)

    @staticmethod
    def backward(ctx, grad_h, grad_c_last):
        if torch.is_grad_enabled():  # create_graph=True: the kernels' gradients could not be differentiated again
            return _backward_through_loop(ctx, grad_h, grad_c_last)
        u, x, wc, b, c0, m, c_all = ctx.saved_tensors[:7]
        dtype = u.dtype
        grad_h = torch.zeros_like(x) if grad_h is None else grad_h.to(dtype).contiguous()
        gcl = None if grad_c_last is None else grad_c_last.to(wc.dtype).contiguous()
        if u.is_cuda:
            grad_u, grad_x, grad_c0, wpart = _cuda_backward(u, x, wc, b, c0, m, c_all, grad_h, gcl, ctx.bidirectional)
        else:
            ext = kernels.cpu_extension()
            if dtype in _LOW_PRECISION:
                grad_u, grad_x, grad_c0, wpart = ext.backward(
                    u.float(), x.float(), wc, b, c0, m, c_all, grad_h.float(), gcl, ctx.bidirectional
                )
                grad_u, grad_x = grad_u.to(dtype), grad_x.to(dtype)
            else:
                grad_u, grad_x, grad_c0, wpart = ext.backward(u, x, wc, b, c0, m, c_all, grad_h, gcl, ctx.bidirectional)
        # Summing the per-batch partials in torch keeps the parameter gradients deterministic.
        gw = wpart.sum(0)
        wdtype, bdtype, c0dtype = ctx.dtypes
        grad_wc = gw[:2].to(wdtype)
        grad_bias = gw[2:].to(bdtype)
        grad_c0 = None if c0dtype is None else grad_c0.to(c0dtype)
        return grad_u, grad_x, grad_wc, grad_bias, grad_c0, None, None, None


def _backward_through_loop(ctx, grad_h, grad_c_last) -> tuple:
    """The backward of :class:`_SRURecurrence` under ``create_graph=True``: the per-step loop's gradients, built
    with a graph so that second-order gradients are exact (the kernels' own gradients are constants to autograd)."""
    inputs = ctx.saved_tensors[7:]
    needs = ctx.needs_input_grad[:5]
    wanted = [t for t, need in zip(inputs, needs, strict=True) if need]
    h, c = sru_recurrence_loop(*inputs, ctx.mask, ctx.bidirectional)
    pairs = [(out, g) for out, g in ((h, grad_h), (c, grad_c_last)) if g is not None]
    grads = iter(
        torch.autograd.grad(
            [out for out, _ in pairs], wanted, [g for _, g in pairs], create_graph=True, allow_unused=True
        )
    )
    return (*(next(grads) if need else None for need in needs), None, None, None)


def cuda_columns_for(D: int, bidirectional: bool, tensors: list[torch.Tensor | None]) -> int:
    """Columns per CUDA thread for a launch: ``kernels.cuda_columns(dtype)`` (the first tensor's dtype) where
    every direction's width is a multiple of it and each of ``tensors`` (those the kernel moves in words of that
    many values) is aligned to its words; otherwise 1."""
    dtype = next((t.dtype for t in tensors if t is not None), torch.float32)
    cols = kernels.cuda_columns(dtype)
    if cols == 1 or D % cols or (bidirectional and (D // 2) % cols):
        return 1
    if any(t is not None and t.numel() and t.data_ptr() % (cols * t.element_size()) for t in tensors):
        return 1
    return cols


def _launch(name: str, dtype: torch.dtype, device: torch.device, n: int, args: list, cols: int) -> None:
    """Launch kernel ``name`` (built for ``cols`` columns per thread) over ``n`` threads on torch's current CUDA
    stream."""
    import cupy

    fn = kernels.cuda_function(name, dtype, device.index, cols)
    stream = _cupy_stream(torch.cuda.current_stream(device).cuda_stream, device.index)
    blocks = (n + kernels.THREADS_PER_BLOCK - 1) // kernels.THREADS_PER_BLOCK
    with cupy.cuda.Device(device.index):
        fn((blocks,), (kernels.THREADS_PER_BLOCK,), tuple(_kernel_arg(a) for a in args), stream=stream)


@functools.lru_cache(maxsize=64)
def _cupy_stream(handle: int, device_index: int):
    """CuPy's view of torch's CUDA stream ``handle`` (made once per stream, not per launch)."""
    import cupy

    return cupy.cuda.ExternalStream(handle, device_index)


def _kernel_arg(a):
    if isinstance(a, torch.Tensor):
        return np.uint64(a.data_ptr())  # zero-copy: the kernel reads torch's memory
    if a is None:
        return np.uint64(0)
    if isinstance(a, bool):
        return np.int32(int(a))
    return np.int32(a)


def _cuda_forward(u, x, wc, b, c0, m, bidirectional, keep_states):
    L, B, D, _ = u.shape
    h = torch.empty_like(x)
    c_all = torch.empty(L if keep_states else 0, B, D, dtype=wc.dtype, device=u.device)
    c_last = torch.empty(B, D, dtype=wc.dtype, device=u.device)
    if L and B and D:
        cols = cuda_columns_for(D, bidirectional, [u, x, h, c_all])
        _launch(
            "sru_forward",
            u.dtype,
            u.device,
            B * D // cols,
            [u, x, wc, b, c0, m, h, c_all if keep_states else None, c_last, L, B, D, bidirectional],
            cols,
        )
    elif c0 is not None:
        c_last.copy_(c0)
    else:
        c_last.zero_()
    return h, c_all, c_last


def _cuda_backward(u, x, wc, b, c0, m, c_all, grad_h, gcl, bidirectional):
    L, B, D, _ = u.shape
    grad_u, grad_x = torch.empty_like(u), torch.empty_like(x)
    grad_c0 = torch.empty(B, D, dtype=wc.dtype, device=u.device)
    wpart = torch.zeros(B, 4, D, dtype=wc.dtype, device=u.device)
    if L and B and D:
        cols = cuda_columns_for(D, bidirectional, [u, x, c_all, grad_h, grad_u, grad_x])
        _launch(
            "sru_backward",
            u.dtype,
            u.device,
            B * D // cols,
            [u, x, wc, b, c0, m, c_all, grad_h, gcl, grad_u, grad_x, grad_c0, wpart, L, B, D, bidirectional],
            cols,
        )
    else:
        grad_c0.copy_(gcl if gcl is not None else torch.zeros_like(grad_c0))
    return grad_u, grad_x, grad_c0, wpart
