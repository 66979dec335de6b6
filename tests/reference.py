"""An independent float64 reference of the SRU recurrence, written step by step from the
equations in docs/design.md (shared by the CPU and the GPU tests; no library code involved)."""

from __future__ import annotations

import torch


def reference_recurrence(u, x, weight_c, bias, c0=None, mask=None, bidirectional=False):
    """Float64, differentiable, one time step at a time, one direction at a time."""
    u, x = u.double(), x.double()
    L, B, D, _ = u.shape
    v, vr = weight_c.double()
    bf, br = bias.double()
    c_init = torch.zeros(B, D, dtype=torch.float64) if c0 is None else c0.double()
    real = torch.ones(L, B, dtype=torch.bool) if mask is None else mask.cpu()
    halves = [(0, D // 2, False), (D // 2, D, True)] if bidirectional else [(0, D, False)]
    h = [[None] * len(halves) for _ in range(L)]
    c_last = []
    for k, (lo, hi, backward) in enumerate(halves):
        c = c_init[:, lo:hi]
        for t in reversed(range(L)) if backward else range(L):
            ut = u[t, :, lo:hi]
            f = torch.sigmoid(ut[..., 0] + v[lo:hi] * c + bf[lo:hi])
            r = torch.sigmoid(ut[..., 1] + vr[lo:hi] * c + br[lo:hi])
            c_new = f * c + (1 - f) * ut[..., 2]
            ht = r * c_new + (1 - r) * x[t, :, lo:hi]
            keep = real[t][:, None]
            c = torch.where(keep, c_new, c)
            h[t][k] = torch.where(keep, ht, torch.zeros_like(ht))
        c_last.append(c)
    h_all = torch.stack([torch.cat(parts, -1) for parts in h]) if L else torch.zeros(0, B, D, dtype=torch.float64)
    return h_all, torch.cat(c_last, -1)


def random_inputs(L, B, D, bidirectional, padded, with_c0, dtype=torch.float32, device="cpu", seed=0):
    """Random inputs of the recurrence; with ``padded`` the batch has random lengths (>= 1)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(L, B, D, 3, generator=g)
    x = torch.randn(L, B, D, generator=g)
    wc = torch.rand(2, D, generator=g) - 0.5
    bias = torch.randn(2, D, generator=g) * 0.5
    c0 = torch.randn(B, D, generator=g) if with_c0 else None
    mask = None
    if padded:
        lengths = torch.randint(1, L + 1, (B,), generator=g)
        lengths[0] = L
        mask = torch.arange(L)[:, None] < lengths[None, :]

    def to(t):
        return None if t is None else t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)

    return to(u), to(x), to(wc), to(bias), to(c0), to(mask)
