"""The numpy building blocks the runtime's networks share: a linear layer, layer norm, (log-)softmax and
scaled dot-product attention, each computing what its torch counterpart computes (``torch.nn.Linear``,
``torch.nn.LayerNorm``, ``torch.log_softmax``, ``torch.nn.functional.scaled_dot_product_attention``) in float32.

Weights are float32 arrays by the names of the torch module's ``state_dict`` (:class:`Weights` takes them out one
at a time, so that a weight missing, of the wrong shape, or left over is found when a network is built).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default


class WeightsError(ValueError):
    """A model's weights do not fit the network its config describes (a name missing or left over, a shape)."""


class Weights:
    """The float32 weights of a network by name; :meth:`take` hands each one out once, checked for its shape."""

    def __init__(self, arrays: Mapping[str, np.ndarray], prefix: str = "", taken: set[str] | None = None) -> None:
        self._arrays, self._prefix = arrays, prefix
        self._taken = taken if taken is not None else set()

    def sub(self, name: str) -> Weights:
        """The weights under ``name.`` (a submodule's), sharing this one's record of what was taken."""
        return Weights(self._arrays, f"{self._prefix}{name}.", self._taken)

    def has(self, name: str) -> bool:
        return f"{self._prefix}{name}" in self._arrays

    def take(self, name: str, shape: Sequence[int | None] | None = None) -> np.ndarray:
        """The weight ``name`` as C-contiguous float32, its shape checked against ``shape`` (None: any size)."""
        key = f"{self._prefix}{name}"
        if key not in self._arrays:
            raise WeightsError(f"weight {key} is missing")
        array = self._arrays[key]
        if shape is not None and (
            array.ndim != len(shape)
            or any(want is not None and got != want for got, want in zip(array.shape, shape, strict=True))
        ):
            want = "x".join("?" if s is None else str(s) for s in shape)
            raise WeightsError(f"weight {key} has shape {'x'.join(map(str, array.shape))}, the config needs {want}")
        if array.dtype.kind != "f":  # float16 bits relabelled int16 would be cast by value into garbage
            raise WeightsError(f"weight {key} is stored as {array.dtype}, the network needs floating-point values")
        self._taken.add(key)
        return np.ascontiguousarray(array, dtype=np.float32)

    def check_all_taken(self) -> None:
        """A WeightsError naming the weights no network took (a config that does not describe these weights)."""
        left = sorted(k for k in self._arrays if k.startswith(self._prefix) and k not in self._taken)
        if left:
            more = f" and {len(left) - 3} more" if len(left) > 3 else ""
            raise WeightsError(f"weights the config has no place for: {', '.join(left[:3])}{more}")


def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """``x @ weight.T + bias`` over the last axis (``weight`` ``(out, in)``, as torch stores it), as one matrix
    product over all leading axes (numpy runs a 3-D input as a product per slice of its first axis: 4x slower for a
    few rows each)."""
    y = x.reshape(-1, x.shape[-1]) @ weight.T
    if bias is not None:
        y += bias
    return y.reshape(*x.shape[:-1], weight.shape[0])


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float = LAYER_NORM_EPS) -> np.ndarray:
    """Layer norm over the last axis (biased variance, as torch)."""
    mean = x.mean(-1, keepdims=True)
    centred = x - mean
    var = np.mean(centred * centred, -1, keepdims=True)
    out = centred / np.sqrt(var + eps)
    out *= weight
    out += bias
    return out


def log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """``log(softmax(x))`` computed stably; a row of -inf stays -inf (NaN where every entry is -inf, as torch)."""
    peak = np.max(x, axis=axis, keepdims=True)
    shifted = x - peak
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    peak = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - peak)
    e /= np.sum(e, axis=axis, keepdims=True)
    return e


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """Scaled dot-product attention over the last two axes: ``softmax(q k^T / sqrt(d) + bias) v``; ``bias`` is 0
    where a key may be seen and -inf where not (broadcast to ``(..., Lq, Lk)``)."""
    scores = q @ np.swapaxes(k, -1, -2)
    scores *= np.float32(1.0 / np.sqrt(q.shape[-1]))
    if bias is not None:
        scores += bias
    return softmax(scores) @ v


def mask_bias(allowed: np.ndarray) -> np.ndarray:
    """The additive attention bias of a boolean mask: 0 where True, -inf where False (float32)."""
    return np.where(allowed, np.float32(0.0), np.float32(-np.inf)).astype(np.float32)


class StepCache:
    """The keys and values of the steps a search has taken, for its current rows, stored once: what a step adds is
    written in the rows of that step and never moved, and :attr:`paths` ``(t, N)`` gives each current row's row at
    every earlier step. Reordering rows (:meth:`select`) moves only those indices, and :meth:`gather` copies the
    entries out for one attention; a copy of the whole cache at every step (what a reordered array needs) would hold
    two caches at once, 45-70 MB for a batch of eight 10-s pieces.

    Entries go in blocks of :data:`BLOCK` steps, so a growing cache is never copied; when a block is full, the
    entries of the blocks before it that no current row reaches any more are dropped (a beam's hypotheses soon share
    their older steps: 40-50% of the memory on read sentences). A cache is extended
    (:meth:`append`) once per step, by the search's one successor of it; a second extension of the same cache
    (a branch) copies the blocks first, so every cache stays valid."""

    BLOCK = 16

    def __init__(self, blocks: list[np.ndarray], paths: np.ndarray, written: list[int]) -> None:
        self._blocks, self.paths, self._written = blocks, paths, written

    @classmethod
    def start(cls, entry: np.ndarray) -> StepCache:
        """A cache holding one step: ``entry`` ``(N, ...)``, one per row."""
        return cls([], np.zeros((0, entry.shape[0]), np.int64), [0]).append(entry)

    @property
    def steps(self) -> int:
        return self.paths.shape[0]

    def append(self, entry: np.ndarray) -> StepCache:
        """This cache with one more step, ``entry`` ``(N, ...)`` for its current rows."""
        t, rows = self.steps, entry.shape[0]
        blocks = self._blocks
        if self._written[0] != t:  # another successor extended this cache already: branch off a copy
            blocks = [block.copy() for block in blocks]
        written = self._written if blocks is self._blocks else [t]
        paths = np.empty((t + 1, rows), np.int64)
        paths[:t] = self.paths
        paths[t] = np.arange(rows)
        if t % self.BLOCK == 0:
            width = max([rows, *(b.shape[1] for b in blocks)])
            blocks = [*_compacted(blocks, paths[:t]), np.empty((self.BLOCK, width, *entry.shape[1:]), np.float32)]
            written = [t]
        blocks[-1][t % self.BLOCK, :rows] = entry
        written[0] = t + 1
        return StepCache(blocks, paths, written)

    def select(self, rows: np.ndarray) -> StepCache:
        """The cache of rows ``rows`` (indices of the current rows, in that order, repeats allowed)."""
        return StepCache(self._blocks, self.paths[:, rows], self._written)

    def gather(self) -> np.ndarray:
        """``(t, N, ...)``: every step's entry of the current rows."""
        t, rows = self.paths.shape
        first = self._blocks[0]
        out = np.empty((t, rows, *first.shape[2:]), np.float32)
        for b, block in enumerate(self._blocks):
            start, stop = b * self.BLOCK, min((b + 1) * self.BLOCK, t)
            if start >= t:
                break
            flat = block.reshape(self.BLOCK * block.shape[1], *block.shape[2:])
            index = np.arange(stop - start)[:, None] * block.shape[1] + self.paths[start:stop]
            np.take(flat, index.reshape(-1), axis=0, out=out[start:stop].reshape(-1, *block.shape[2:]))
        return out


def _compacted(blocks: list[np.ndarray], paths: np.ndarray) -> list[np.ndarray]:
    """Full ``blocks`` of a :class:`StepCache` with the entries no row's path reaches left out, where that saves a
    quarter of a block or more; ``paths`` ``(t, N)`` (all the blocks' steps) is rewritten in place to match.

    A beam's hypotheses soon share their older tokens, so an old step is reached from a few rows, not all of them:
    storing only those is the cache's memory (the gather is unchanged: it reads the same entries). The blocks
    themselves are never written (other caches may share them): a compacted block is a new array."""
    if not blocks:
        return blocks
    t = paths.shape[0]
    width = max(b.shape[1] for b in blocks)
    steps = np.arange(t)[:, None]
    used = np.zeros((t, width), bool)
    used[steps, paths] = True
    rank = np.cumsum(used, axis=1) - 1  # an entry's row in its compacted step
    needed = used.sum(axis=1).reshape(-1, StepCache.BLOCK).max(axis=1)
    out = list(blocks)
    for b in np.flatnonzero(needed * 4 <= np.array([block.shape[1] for block in blocks]) * 3):
        block, span = blocks[b], slice(b * StepCache.BLOCK, (b + 1) * StepCache.BLOCK)
        step, row = np.nonzero(used[span, : block.shape[1]])
        out[b] = np.empty((StepCache.BLOCK, int(needed[b]), *block.shape[2:]), np.float32)
        out[b][step, rank[span][step, row]] = block[step, row]
        paths[span] = rank[span][steps[: StepCache.BLOCK], paths[span]]
    return out
