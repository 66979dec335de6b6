"""The numpy building blocks the runtime's networks share: a linear layer, layer norm, log-softmax and
scaled dot-product attention, each computing what its torch counterpart computes (``torch.nn.Linear``,
``torch.nn.LayerNorm``, ``torch.log_softmax``, ``torch.nn.functional.scaled_dot_product_attention``) in float32.

Weights are float32 arrays by the names of the torch module's ``state_dict`` (:class:`Weights` takes them out one
at a time, so that a weight missing, of the wrong shape, or left over is found when a network is built).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from srupp_asr.threads import cpu_threads, one_thread

LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default
ATTENTION_SCORE_BYTES = 32 << 20  # the most attention scores computed at once (see attention)


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

    def take(self, name: str, shape: Sequence[int | None] | None = None, keep_float16: bool = False) -> np.ndarray:
        """The weight ``name`` as C-contiguous float32, its shape checked against ``shape`` (None: any size); with
        ``keep_float16``, a float16 weight stays float16 (for a network that casts it where it is used)."""
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
        keep = keep_float16 and array.dtype == np.float16
        return np.ascontiguousarray(array, dtype=np.float16 if keep else np.float32)

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


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """Scaled dot-product attention over the last two axes: ``softmax(q k^T / sqrt(d) + bias) v``; ``bias`` is 0
    where a key may be seen and -inf where not (broadcast to ``(..., Lq, Lk)``).

    The queries go a block at a time, so that the scores never take more than :data:`ATTENTION_SCORE_BYTES` (as
    torch's CPU kernel does): a 10-minute chunk's encoder attends over 15,000 frames, whose whole score matrix
    would take 0.9 GB a head. Each query's row is computed as it would be at once."""
    lq, lk = q.shape[-2], k.shape[-2]
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    rows = max(1, ATTENTION_SCORE_BYTES // (4 * lk * max(1, int(np.prod(lead)))))
    if rows >= lq:
        return _attention(q, k, v, bias)
    out = np.empty((*lead, lq, v.shape[-1]), np.float32)

    def block(a: int) -> None:
        part = None if bias is None else bias if bias.shape[-2] == 1 else bias[..., a : a + rows, :]
        _attention(q[..., a : a + rows, :], k, v, part, out[..., a : a + rows, :])

    starts = range(0, lq, rows)
    threads = cpu_threads()
    if threads == 1 or len(starts) == 1:
        for a in starts:
            block(a)
        return out
    # Blocks on every compute thread, each on one BLAS thread: the passes over the scores (numpy runs them on one
    # core) are then as parallel as the products.
    with one_thread(), ThreadPoolExecutor(threads) as pool:
        list(pool.map(block, starts))
    return out


def _attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray | None, out: np.ndarray | None = None
) -> np.ndarray:
    """:func:`attention` of all the queries at once (into ``out``): the scores in place, and normalised after the
    product with v (a row of d_head, not of Lk): 4 passes over the scores, not 7 as softmax then product."""
    scores = q @ np.swapaxes(k, -1, -2)
    scores *= np.float32(1.0 / np.sqrt(q.shape[-1]))
    if bias is not None:
        scores += bias
    scores -= scores.max(-1, keepdims=True)
    np.exp(scores, out=scores)
    return np.divide(scores @ v, scores.sum(-1, keepdims=True), out=out)


def mask_bias(allowed: np.ndarray) -> np.ndarray:
    """The additive attention bias of a boolean mask: 0 where True, -inf where False (float32)."""
    return np.where(allowed, np.float32(0.0), np.float32(-np.inf)).astype(np.float32)


class StepCache:
    """The keys and values of the steps a search has taken, for its current rows, stored once: what a step adds is
    written in the rows of that step and never moved, and :attr:`paths` ``(t, N)`` gives each current row's row at
    every earlier step. Reordering rows (:meth:`select`) moves only those indices, and :meth:`gather` copies the
    entries out for one attention; a copy of the whole cache at every step (what a reordered array needs) would hold
    two caches at once, 45-70 MB for a batch of eight 10-s pieces.

    Entries go in blocks of :data:`BLOCK` steps, so a growing cache is never copied. A block is one array of its
    steps' entries one after the other, step ``s``'s rows from ``offsets[s]``. When a block fills, the entries of
    the blocks before it that no current row reaches any more are dropped: a beam's hypotheses soon share their
    older steps, so an old step keeps a few rows, not one per hypothesis (the full blocks of read sentences keep
    about 30% of their entries). A cache is extended (:meth:`append`) once per step, by the search's one successor of
    it; a second extension of the same cache (a branch) copies the blocks first, so every cache stays valid."""

    BLOCK = 8  # (16: about 20 MB more at the 32 LJ files' peak, no faster)
    CHUNK_BYTES = 4 << 20  # the most keys (or values) :meth:`attend` gathers at once

    def __init__(self, blocks: list[tuple[np.ndarray, np.ndarray]], paths: np.ndarray, written: list[int]) -> None:
        """``blocks``: per block, its entries ``(rows, ...)`` and the ``(BLOCK + 1,)`` offsets of its steps."""
        self._blocks, self.paths, self._written = blocks, paths, written

    @classmethod
    def start(cls, entry: np.ndarray) -> StepCache:
        """A cache holding one step: ``entry`` ``(N, ...)``, one per row."""
        return cls([], np.zeros((0, entry.shape[0]), np.int64), [0]).append(entry)

    @property
    def steps(self) -> int:
        return self.paths.shape[0]

    @property
    def entries(self) -> int:
        """Entries stored (for tests and benchmarks)."""
        return sum(block.shape[0] for block, _ in self._blocks)

    def append(self, entry: np.ndarray) -> StepCache:
        """This cache with one more step, ``entry`` ``(N, ...)`` for its current rows."""
        t, rows = self.steps, entry.shape[0]
        blocks = self._blocks
        if self._written[0] != t:  # another successor extended this cache already: branch off a copy
            blocks = [(block.copy(), offsets) for block, offsets in blocks]
        written = self._written if blocks is self._blocks else [t]
        paths = np.empty((t + 1, rows), np.int64)
        paths[:t] = self.paths
        paths[t] = np.arange(rows)
        if t % self.BLOCK == 0:  # (rows only shrink in a search: the first step's rows fit every later step's)
            offsets = np.arange(self.BLOCK + 1) * rows
            block = np.empty((self.BLOCK * rows, *entry.shape[1:]), np.float32)  # pages taken as steps are written
            blocks, written = [*_compacted(blocks, paths[:t]), (block, offsets)], [t]
        block, offsets = blocks[-1]
        at = offsets[t % self.BLOCK]
        if rows > offsets[t % self.BLOCK + 1] - at:
            raise ValueError(f"a step of {rows} rows after one of {offsets[1] - offsets[0]}: rows only shrink")
        block[at : at + rows] = entry
        written[0] = t + 1
        return StepCache(blocks, paths, written)

    def select(self, rows: np.ndarray) -> StepCache:
        """The cache of rows ``rows`` (indices of the current rows, in that order, repeats allowed)."""
        return StepCache(self._blocks, self.paths[:, rows], self._written)

    def gather(self, first: int = 0, stop: int | None = None, part: int | None = None) -> np.ndarray:
        """``(stop - first, N, ...)``: the entries of the current rows at steps ``[first, stop)`` (default: every
        step), or of their ``part`` only (an index into each entry's first axis: 0 keys, 1 values)."""
        rows = self.paths.shape[1]
        stop = self.steps if stop is None else stop
        shape = self._blocks[0][0].shape[1:] if part is None else self._blocks[0][0].shape[2:]
        out = np.empty((stop - first, rows, *shape), np.float32)
        for b in range(first // self.BLOCK, -(-stop // self.BLOCK)):
            block, offsets = self._blocks[b]
            a, z = max(first, b * self.BLOCK), min(stop, (b + 1) * self.BLOCK)
            index = offsets[a - b * self.BLOCK : z - b * self.BLOCK, None] + self.paths[a:z]
            source = block if part is None else block[:, part]
            # (mode="clip": the indices are the cache's own, always in range; numpy's default "raise" copies
            # through a buffer when given ``out``, 3 times slower)
            np.take(source, index.reshape(-1), axis=0, out=out[a - first : z - first].reshape(-1, *shape), mode="clip")
        return out

    def attend(self, q: np.ndarray) -> np.ndarray:
        """:func:`attention` of ``q`` ``(N, heads, 1, d_head)`` over the keys and values of every step (entries
        ``(N, 2, heads, d_head)``), without gathering them all at once: the scores from the keys of a few blocks at a
        time, then the values likewise, at most :data:`CHUNK_BYTES` gathered at once (a whole gather was 2-3 times
        the compacted cache), once keys and values together exceed twice that (below, one gather is faster). The same
        scores and normalisation; past one chunk the values' sum is added up by chunk."""
        t, rows = self.paths.shape
        if t * rows * self._blocks[0][0][0].nbytes <= 2 * self.CHUNK_BYTES:  # small enough to gather at once
            kv = self.gather()
            return attention(q, kv[:, :, 0].transpose(1, 2, 0, 3), kv[:, :, 1].transpose(1, 2, 0, 3))
        blocks = max(1, self.CHUNK_BYTES // (self.BLOCK * rows * self._blocks[0][0][0, 0].nbytes))
        chunks = [(a, min(a + blocks * self.BLOCK, t)) for a in range(0, t, blocks * self.BLOCK)]
        scores = np.empty((*q.shape[:-1], t), np.float32)
        for a, z in chunks:
            scores[..., a:z] = q @ self.gather(a, z, 0).transpose(1, 2, 3, 0)
        scores *= np.float32(1.0 / np.sqrt(q.shape[-1]))
        scores -= scores.max(-1, keepdims=True)
        np.exp(scores, out=scores)
        out = None
        for a, z in chunks:  # normalised at the end, as _attention does
            part = scores[..., a:z] @ self.gather(a, z, 1).transpose(1, 2, 0, 3)
            out = part if out is None else np.add(out, part, out=out)
        return np.divide(out, scores.sum(-1, keepdims=True), out=out)


def _compacted(blocks: list[tuple[np.ndarray, np.ndarray]], paths: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Full ``blocks`` of a :class:`StepCache` without the entries no row's path reaches, where that saves a quarter
    of a block or more; ``paths`` ``(t, N)`` (all the blocks' steps) is rewritten in place to match. The blocks
    themselves are never written (other caches may share them): a compacted block is a new array."""
    if not blocks:
        return blocks
    B = StepCache.BLOCK
    t = paths.shape[0]
    width = max(int(np.diff(offsets).max()) for _, offsets in blocks)
    steps = np.arange(t)[:, None]
    used = np.zeros((t, width), bool)
    used[steps, paths] = True
    rank = np.cumsum(used, axis=1) - 1  # an entry's row in its step once compacted
    counts = used.sum(axis=1).reshape(-1, B)
    out = list(blocks)
    for b in np.flatnonzero(counts.sum(axis=1) * 4 <= np.array([block.shape[0] for block, _ in blocks]) * 3):
        block, offsets = blocks[b]
        span = slice(b * B, (b + 1) * B)
        new_offsets = np.r_[0, np.cumsum(counts[b])]
        step, row = np.nonzero(used[span])
        compact = np.empty((new_offsets[-1], *block.shape[1:]), np.float32)
        compact[new_offsets[step] + rank[span][step, row]] = block[offsets[step] + row]
        out[b] = compact, new_offsets
        paths[span] = rank[span][steps[:B], paths[span]]
    return out
