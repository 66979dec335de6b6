"""Key/value caches of incremental attention (the decoder's self-attention, the LM's attention layers) in a beam
search, reordered lazily.

Each search step keeps some hypotheses (rows) and extends them, so the cache of the keys and values of every
earlier position must follow the rows. Gathering the rows when they are chosen and concatenating the new
position at the next step copies the whole cache twice a step; here the rows chosen are only recorded (``order``)
and the next step gathers them straight into a buffer one position longer, in which it writes the new position:
one copy a step (a 2.6x faster step in isolation; docs/benchmarks.md, "CPU inference").
"""

from __future__ import annotations

import torch


def extend(past: torch.Tensor | None, order: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    """``(B, heads, t + 1, d)``: rows ``order`` of ``past`` ``(B', heads, t, d)`` (all of them, in order, when
    ``order`` is None) followed by ``new`` ``(B, heads, 1, d)``; ``new`` alone when there is no ``past``. (Where a
    gradient is recorded, by a gather and a concatenation.)"""
    if past is None:
        return new
    if torch.is_grad_enabled() and (past.requires_grad or new.requires_grad):  # out= cannot record a gradient
        return torch.cat([past if order is None else past.index_select(0, order), new], 2)
    t = past.shape[2]
    out = new.new_empty(new.shape[0], new.shape[1], t + 1, new.shape[3])
    if order is None:
        out[:, :, :t] = past
    else:
        torch.index_select(past, 0, order, out=out[:, :, :t])
    out[:, :, t:] = new
    return out


def reorder(order: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor:
    """The rows of a cache whose rows are ``order`` (None: as they are) that rows ``rows`` of it are."""
    return rows if order is None else order.index_select(0, rows)
