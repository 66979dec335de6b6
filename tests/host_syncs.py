"""Count, on the CPU, the places where a training step would make the host wait for an accelerator.

On a GPU a host sync is any operation whose result the host needs before it can go on: reading a value
(``.item()``, ``bool(t)``, ``int(t)``, ``float(t)``, ``.tolist()``, ``.numpy()``, ``.cpu()``), an operation whose
output size depends on the data (``nonzero``, ``masked_select``, ``unique``), or a blocking copy from host memory
(``t.to(device)`` of a host tensor without ``non_blocking=True``, ``torch.tensor(data, device=...)``: PyTorch
synchronises the stream after such a copy). On a CPU none of these cost anything, so :class:`HostSyncCounter` tracks
which tensors would live on the host in a GPU run and counts the syncing operations on the others:

* host tensors are those given as ``host`` (the batch's lengths and tokens as the data loader made them, before the
  transfer to the device) and every tensor computed from host tensors only (tensors made by factory functions, like
  ``torch.arange(n, device=t.device)``, take the side of what they are combined with);
* ``F.ctc_loss`` is counted apart (``inherent``): PyTorch's CUDA CTC takes the lengths as host arrays and copies
  them, and its batch offsets, to the device with blocking copies in its forward and its backward, whatever the
  caller does.

Each count keeps a one-line source location, so a failing assertion says where the sync is.
"""

from __future__ import annotations

import traceback
from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

aten = torch.ops.aten
# Operations that read a device value back to the host, or whose output size the host must learn from the device.
SYNCING = {
    aten._local_scalar_dense.default,  # item(), bool(), int(), float()
    aten.nonzero.default,
    aten.masked_select.default,
    aten.unique_consecutive.default,
    aten._unique2.default,
    aten.unique_dim.default,
}
# Operations whose CUDA implementation syncs internally, whatever their inputs (counted apart).
INHERENT = {aten._ctc_loss, aten._ctc_loss_backward}
HOST, DEVICE, NEUTRAL = "host", "device", "neutral"


def _where() -> str:
    """The innermost frame of this repository's code (not torch's, lightning's or this file's) on the stack."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        name = frame.filename
        if "site-packages" in name or name.endswith("host_syncs.py") or "/torch/" in name:
            continue
        return f"{name.rsplit('/', 2)[-2]}/{name.rsplit('/', 1)[-1]}:{frame.lineno} {frame.line}"
    return "?"


class HostSyncCounter(TorchDispatchMode):
    """Context manager: ``syncs`` (what a GPU run would wait for) and ``inherent`` (CTC) Counters of locations."""

    def __init__(self, host: list[torch.Tensor]) -> None:
        super().__init__()
        self.side: WeakIdKeyDictionary = WeakIdKeyDictionary()
        for t in host:
            self.side[t] = HOST
        self.syncs: Counter[str] = Counter()
        self.inherent: Counter[str] = Counter()
        self._patched: list[tuple[Any, str, Any]] = []

    def side_of(self, t: torch.Tensor) -> str:
        return self.side.get(t, DEVICE)

    def _count(self, t: torch.Tensor | None) -> None:
        if t is None or self.side_of(t) != HOST:
            self.syncs[_where()] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        sides = {self.side_of(t) for t in inputs}
        if func.overloadpacket in INHERENT:
            self.inherent[_where()] += 1
        elif func in SYNCING and sides != {HOST}:
            self.syncs[_where()] += 1
        out = func(*args, **kwargs)
        if not inputs:
            side = NEUTRAL
        else:
            sides.discard(NEUTRAL)
            side = HOST if sides == {HOST} else DEVICE if sides else NEUTRAL
        if side != DEVICE:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.side[t] = side
        return out

    def _patch(self, owner: Any, name: str, wrapper: Any) -> None:
        original = getattr(owner, name)
        self._patched.append((owner, name, original))
        setattr(owner, name, wrapper(original))

    def __enter__(self):
        counter = self

        def reads(original):  # host reads not dispatched to ATen on a CPU tensor
            def wrapped(t, *args, **kwargs):
                counter._count(t)
                return original(t, *args, **kwargs)

            return wrapped

        def to(original):  # a host tensor copied to a device without non_blocking=True: a blocking copy
            def wrapped(t, *args, **kwargs):
                moves = any(isinstance(a, (torch.device, str)) for a in args) or "device" in kwargs
                if moves and counter.side_of(t) == HOST and not kwargs.get("non_blocking", False):
                    counter.syncs[_where()] += 1
                out = original(t, *args, **kwargs)
                if moves and counter.side_of(t) == HOST:
                    out = out.view_as(out) if out is t else out  # a distinct tensor: the device copy
                    counter.side[out] = DEVICE
                return out

            return wrapped

        def tensor(original):  # torch.tensor(data, device=...): made on the host, copied with a sync
            def wrapped(*args, **kwargs):
                if kwargs.get("device") is not None:
                    counter.syncs[_where()] += 1
                return original(*args, **kwargs)

            return wrapped

        def ctc_loss(original):  # lengths not on the host: CTC copies them there first (a blocking read each)
            def wrapped(log_probs, targets, input_lengths, target_lengths, *args, **kwargs):
                for lengths in (input_lengths, target_lengths):
                    if isinstance(lengths, torch.Tensor) and counter.side_of(lengths) != HOST:
                        counter.syncs[_where()] += 1
                return original(log_probs, targets, input_lengths, target_lengths, *args, **kwargs)

            return wrapped

        self._patch(torch, "ctc_loss", ctc_loss)
        for name in ("tolist", "numpy", "cpu"):
            self._patch(torch.Tensor, name, reads)
        self._patch(torch.Tensor, "to", to)
        self._patch(torch, "tensor", tensor)
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            for owner, name, original in reversed(self._patched):
                setattr(owner, name, original)
            self._patched.clear()
