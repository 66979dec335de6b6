"""Label-synchronous beam search and the CTC prefix scorer in numpy: the twins of
:func:`srupp_asr.decoding.beam_search.beam_search` and :class:`srupp_asr.decoding.scorers.CTCPrefixScorer` (whose
docstrings explain the algorithms), for CPU inference without torch. They compute in float32 what the torch ones
compute, to rounding, and choose the same hypotheses: ties included, as :func:`_topk` orders them as
``torch.topk`` on CPU does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from srupp_asr.decoding.end_detection import END_MARGIN, finished
from srupp_asr.tokenizer import Tokenizer

BLANK_ID = Tokenizer.blank_id
SOS_EOS_ID = Tokenizer.sos_eos_id
NEG_INF = float("-inf")
PRE_BEAM_RATIO = 1.5  # the torch search's: candidates scored by the partial scorers per hypothesis, per beam
WINDOW_THRESHOLD = 40.0  # the torch CTC scorer's: nats below its peak at which a prefix' frames count as zero
WINDOW_BLOCK = 8  # frames computed between two checks of whether every extension's window has ended


class Scorer(Protocol):
    """One source of next-token scores for :func:`beam_search`: the torch ``Scorer`` protocol over numpy arrays."""

    #: True: :meth:`score` scores the whole vocabulary ``(N, V)``; False: only the candidates given ``(N, K)``.
    full: bool

    def init_state(self, utterances: np.ndarray) -> Any:
        """The state of ``N`` bare ``<sos/eos>`` prefixes of utterances ``utterances`` ``(N,)`` (int64)."""
        ...

    def score(self, state: Any, ys: np.ndarray, candidates: np.ndarray | None) -> tuple[np.ndarray, Any]:
        """float32 log scores of the next token after ``ys`` ``(N, i)`` (every token, or ``candidates``
        ``(N, K)``), and what :meth:`select` needs to extend the hypotheses."""
        ...

    def select(self, state: Any, rows: np.ndarray, tokens: np.ndarray | None, pending: Any) -> Any:
        """The state of hypotheses ``rows`` ``(M,)`` extended by ``tokens`` ``(M,)`` (``pending`` from the last
        :meth:`score`), or of ``rows`` as they are (``tokens`` None)."""
        ...


def beam_search(
    scorers: list[tuple[Scorer, float]],
    batch_size: int,
    max_lengths: np.ndarray,
    vocab_size: int,
    beam: int,
    nbest: int = 1,
    length_penalty: float = 0.0,
    end_margin: float = END_MARGIN,
) -> list[list[tuple[list[int], float]]]:
    """Per utterance, its ``nbest`` ended hypotheses (tokens without ``<sos/eos>``, score), best first.

    ``scorers`` pairs each scorer with its weight (those of weight 0 are not run); ``max_lengths`` ``(B,)`` is the
    most tokens per utterance; ``end_margin`` when an utterance is done with a length bonus
    (:func:`srupp_asr.decoding.end_detection.finished`)."""
    scorers = [(s, w) for s, w in scorers if w > 0.0]
    if not scorers:
        raise ValueError("beam search needs at least one scorer with a positive weight")
    W = beam
    has_full = any(s.full for s, _ in scorers)
    eos = SOS_EOS_ID
    excluded = np.zeros(vocab_size, dtype=bool)
    excluded[[BLANK_ID, eos]] = True
    pre_beam = min(int(PRE_BEAM_RATIO * W), vocab_size - 2) if has_full else vocab_size - 2
    all_tokens = np.flatnonzero(~excluded)

    alive = np.arange(batch_size)
    states = [s.init_state(np.repeat(alive, W)) for s, _ in scorers]
    ys = np.full((batch_size * W, 1), eos, dtype=np.int64)
    score = np.full((batch_size, W), NEG_INF, dtype=np.float32)
    score[:, 0] = 0.0
    max_lengths = np.asarray(max_lengths, dtype=np.int64)
    ended: list[list[tuple[list[int], float]]] = [[] for _ in range(batch_size)]
    step = 0
    while alive.size:
        n = alive.size
        full_scores = np.zeros((n * W, vocab_size), dtype=np.float32)
        pending = [None] * len(scorers)
        for k, (scorer, weight) in enumerate(scorers):
            if scorer.full:
                scores, pending[k] = scorer.score(states[k], ys, None)
                full_scores += weight * scores
        if has_full:
            top = _topk(np.where(excluded, np.float32(NEG_INF), full_scores), pre_beam)
        else:
            top = np.broadcast_to(all_tokens, (n * W, all_tokens.size))
        candidates = np.concatenate([top, np.full((n * W, 1), eos, dtype=np.int64)], 1)
        total = score.reshape(-1, 1) + np.take_along_axis(full_scores, candidates, 1)
        for k, (scorer, weight) in enumerate(scorers):
            if not scorer.full:
                scores, pending[k] = scorer.score(states[k], ys, candidates)
                total += weight * scores
        total[:, :-1] += length_penalty
        total = np.nan_to_num(total, nan=NEG_INF, neginf=NEG_INF)  # a NaN score (a broken model): never chosen
        at_max = np.repeat(max_lengths[alive] <= step, W)
        total[at_max, :-1] = NEG_INF  # only <sos/eos> is left
        C = candidates.shape[1]
        sel = _topk(total.reshape(n, W * C), W)
        new_score = np.take_along_axis(total.reshape(n, W * C), sel, 1)
        rows = (np.arange(n)[:, None] * W + sel // C).ravel()
        tokens = candidates.reshape(-1)[rows * C + (sel % C).ravel()]
        ys = np.concatenate([ys[rows], tokens[:, None]], 1)
        states = [s.select(st, rows, tokens, p) for (s, _), st, p in zip(scorers, states, pending, strict=True)]
        is_end = (tokens == eos).reshape(n, W) & (new_score > NEG_INF)
        if is_end.any():
            for u, w in zip(*np.nonzero(is_end), strict=True):
                ended[alive[u]].append((ys[u * W + w, 1:-1].tolist(), float(new_score[u, w])))
            new_score[is_end] = NEG_INF
        score = new_score
        step += 1
        done = np.array(finished(score.max(1).tolist(), [ended[u] for u in alive], nbest, length_penalty, end_margin))
        done |= max_lengths[alive] < step
        if done.any():
            keep = np.flatnonzero(~done)
            rows = (keep[:, None] * W + np.arange(W)).ravel()
            alive, score, ys = alive[keep], score[keep], ys[rows]
            states = [s.select(st, rows, None, None) for (s, _), st in zip(scorers, states, strict=True)]
    return [sorted(hyps, key=lambda h: -h[1])[:nbest] or [([], NEG_INF)] for hyps in ended]


def _topk(values: np.ndarray, k: int) -> np.ndarray:
    """The indices ``(N, k)`` of each row's ``k`` largest values, largest first (NaN above all), in the order of
    ``torch.topk`` on CPU.

    Where the order is unique, a partition and a sort find it. torch orders equal values as libstdc++'s
    ``std::nth_element`` / ``std::partial_sort`` and ``std::sort`` leave them (no simple rule): rows where equal
    values compete for a place are ordered by :func:`_libstdcxx_topk`. Equal -inf values are not: a -inf score is
    never a hypothesis', whichever of them fills a place."""
    key = np.where(np.isnan(values), np.float32(np.inf), values)
    N, n = values.shape
    part = np.argpartition(-key, k, axis=1)[:, : k + 1] if k < n else np.broadcast_to(np.arange(n), (N, n))
    order = np.take_along_axis(part, np.argsort(-np.take_along_axis(key, part, 1), axis=1, kind="stable"), 1)
    top = np.take_along_axis(key, order, 1)
    order = order[:, :k]
    for i in np.flatnonzero(((top[:, :-1] == top[:, 1:]) & (top[:, 1:] > NEG_INF)).any(1)):
        _, rank = np.unique(key[i], return_inverse=True)
        order[i] = _libstdcxx_topk((rank + np.isnan(values[i])).tolist(), k)
    return order


def _libstdcxx_topk(keys: list[int], k: int) -> list[int]:
    """The first ``k`` indices that ``torch.topk`` (``aten/src/ATen/native/TopKImpl.h``) returns for ``keys``:
    libstdc++'s ``std::partial_sort`` where ``64 k <= n``, else ``std::nth_element`` at ``k - 1`` then
    ``std::sort`` of the ``k - 1`` before it, with the comparison ``keys[a] > keys[b]``, step for step."""
    n = len(keys)
    q = list(range(n))

    def before(a: int, b: int) -> bool:
        return keys[a] > keys[b]

    def adjust_heap(first: int, hole: int, length: int, value: int) -> None:
        top = second = hole
        while second < (length - 1) // 2:
            second = 2 * (second + 1)
            if before(q[first + second], q[first + second - 1]):
                second -= 1
            q[first + hole] = q[first + second]
            hole = second
        if length % 2 == 0 and second == (length - 2) // 2:
            second = 2 * (second + 1)
            q[first + hole] = q[first + second - 1]
            hole = second - 1
        parent = (hole - 1) // 2
        while hole > top and before(q[first + parent], value):
            q[first + hole] = q[first + parent]
            hole = parent
            parent = (hole - 1) // 2
        q[first + hole] = value

    def pop_heap(first: int, last: int, result: int) -> None:
        value = q[result]
        q[result] = q[first]
        adjust_heap(first, 0, last - first, value)

    def heap_select(first: int, middle: int, last: int) -> None:
        length = middle - first
        if length >= 2:
            for parent in range((length - 2) // 2, -1, -1):
                adjust_heap(first, parent, length, q[first + parent])
        for i in range(middle, last):
            if before(q[i], q[first]):
                pop_heap(first, middle, i)

    def partial_sort(first: int, middle: int, last: int) -> None:
        heap_select(first, middle, last)
        while middle - first > 1:
            middle -= 1
            pop_heap(first, middle, middle)

    def partition_pivot(first: int, last: int) -> int:
        a, b, c = first + 1, first + (last - first) // 2, last - 1
        if before(q[a], q[b]):
            m = b if before(q[b], q[c]) else c if before(q[a], q[c]) else a
        else:
            m = a if before(q[a], q[c]) else c if before(q[b], q[c]) else b
        q[first], q[m] = q[m], q[first]
        lo, hi = first + 1, last
        while True:
            while before(q[lo], q[first]):
                lo += 1
            hi -= 1
            while before(q[first], q[hi]):
                hi -= 1
            if lo >= hi:
                return lo
            q[lo], q[hi] = q[hi], q[lo]
            lo += 1

    def linear_insert(last: int) -> None:
        value = q[last]
        while before(value, q[last - 1]):
            q[last] = q[last - 1]
            last -= 1
        q[last] = value

    def insertion_sort(first: int, last: int) -> None:
        for i in range(first + 1, last):
            if before(q[i], q[first]):
                q[first : i + 1] = [q[i], *q[first:i]]
            else:
                linear_insert(i)

    def introsort_loop(first: int, last: int, depth: int) -> None:
        while last - first > 16:
            if depth == 0:
                partial_sort(first, last, last)
                return
            depth -= 1
            cut = partition_pivot(first, last)
            introsort_loop(cut, last, depth)
            last = cut

    if k * 64 <= n:
        partial_sort(0, k, n)
        return q[:k]
    first, last, nth, depth = 0, n, k - 1, 2 * (n.bit_length() - 1)
    while last - first > 3:  # nth_element (introselect)
        if depth == 0:
            heap_select(first, nth + 1, last)
            q[first], q[nth] = q[nth], q[first]
            break
        depth -= 1
        cut = partition_pivot(first, last)
        first, last = (cut, last) if cut <= nth else (first, cut)
    else:
        insertion_sort(first, last)
    m = k - 1  # sort (introsort, then the final insertion sort)
    introsort_loop(0, m, 2 * (m.bit_length() - 1))
    insertion_sort(0, min(m, 16))
    for i in range(16, m):
        linear_insert(i)
    return q[:k]


def _logaddexp(
    a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None, scratch: np.ndarray | None = None
) -> np.ndarray:
    """``torch.logaddexp``: ``max + log1p(exp(min - max))``, several times faster than ``np.logaddexp`` (a scalar
    loop): every step is a vectorised ufunc. Where both are the same infinity (``min - max`` NaN), ``fmax`` gives
    ``max``; elsewhere the sum is at least ``max``. ``out`` and ``scratch`` (``(2, *a.shape)``) spare the
    allocations in a loop."""
    big, small = np.empty((2, *a.shape), dtype=a.dtype) if scratch is None else scratch
    np.maximum(a, b, out=big)
    np.minimum(a, b, out=small)
    small -= big
    np.exp(small, out=small)
    np.log1p(small, out=small)
    small += big
    return np.fmax(small, big, out=out)


def _logsumexp(x: np.ndarray, axis: int) -> np.ndarray:
    """``torch.logsumexp``: shifted by the largest value (by 0 where that is infinite), -inf over no mass."""
    peak = x.max(axis, keepdims=True)
    peak[np.isinf(peak)] = 0.0
    return (np.log(np.exp(x - peak).sum(axis, keepdims=True)) + peak).squeeze(axis)


@dataclass
class _CTCState:
    utterances: np.ndarray  # (N,)
    r: np.ndarray  # (hi - lo, 2, N): r_{t-1}^n, r_{t-1}^b of each prefix at index t = lo..hi-1 (-inf elsewhere)
    lo: int  # the window: index t (frame t - 1) of the first row of r
    psi: np.ndarray  # (N,) log prefix probability of each prefix
    last: np.ndarray  # (N,) each prefix's last token, -1 for the bare <sos/eos>


@dataclass
class _CTCPending:
    candidates: np.ndarray  # (N, K)
    r: np.ndarray  # (F, 2, N, K): r_{t-1}^n, r_{t-1}^b of each extension at index t = lo..lo+F-1
    lo: int
    peak: np.ndarray  # (N, K) the largest log(r^n + r^b) of each extension over its frames
    psi: np.ndarray  # (N, K)


class CTCPrefixScorer:
    """CTC prefix scores of candidate tokens (a partial scorer), each prefix computed over a window of frames: the
    numpy twin of :class:`srupp_asr.decoding.scorers.CTCPrefixScorer`, on ``log_probs`` ``(B, T, V)`` float32
    and ``lengths`` ``(B,)``."""

    full = False

    def __init__(
        self,
        log_probs: np.ndarray,
        lengths: np.ndarray,
        eos: int = SOS_EOS_ID,
        window_threshold: float = WINDOW_THRESHOLD,
    ) -> None:
        _, T, _ = log_probs.shape
        if not window_threshold > 0:  # (nan too)
            raise ValueError(f"window_threshold must be > 0, got {window_threshold}")
        self.eos, self.T, self.threshold = eos, T, float(window_threshold)
        self.lengths = np.asarray(lengths, dtype=np.int64)
        # (B, V, T): a token's frames are contiguous, so that gathering the candidates' frames copies runs of them.
        self.log_probs = np.ascontiguousarray(np.asarray(log_probs, dtype=np.float32).transpose(0, 2, 1))
        # Cumulative log-probabilities over frames (index t: the sum over frames before t) in float64, as torch's
        # float32 cumsum accumulates on CPU: each utterance's blank's now, a token's when first needed (np.zeros
        # leaves the pages of the others untouched, so they take no memory).
        self.cumulative = np.zeros((self.log_probs.shape[0], self.log_probs.shape[1], T + 1))
        self._summed = np.zeros(self.log_probs.shape[:2], dtype=bool)
        self._cumulative(np.arange(self.log_probs.shape[0]), np.full(self.log_probs.shape[0], BLANK_ID))
        #: frames computed by the last score() (one per frame, however many hypotheses): for tests and benchmarks
        self.frames_computed = 0

    def init_state(self, utterances: np.ndarray) -> _CTCState:
        """The bare prefix: all-blank paths, prefix probability 1 (windowed like any prefix)."""
        N = utterances.shape[0]
        r = np.full((self.T + 1, 2, N), NEG_INF, dtype=np.float32)
        r[:, 1] = self.cumulative[utterances, BLANK_ID].T
        past_end = np.arange(self.T + 1)[:, None] > self.lengths[utterances][None, :]
        r[:, 1][past_end] = NEG_INF
        with np.errstate(invalid="ignore"):
            r, lo = self._window(r[:, :, :, None], 0)
        last = np.full(N, -1, dtype=np.int64)
        return _CTCState(utterances, r[..., 0], lo, np.zeros(N, dtype=np.float32), last)

    def _cumulative(self, utterances: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """The cumulative log-probabilities ``(N, T + 1)`` of each row's utterance and token."""
        todo = ~self._summed[utterances, tokens]
        if todo.any():
            u, c = utterances[todo], tokens[todo]
            self.cumulative[u, c, 1:] = np.cumsum(self.log_probs[u, c], axis=1, dtype=np.float64)
            self._summed[u, c] = True
        return self.cumulative[utterances, tokens]

    def _window(self, r: np.ndarray, lo: int, peak: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        """``r`` ``(F, 2, N, K)`` (index ``lo`` first) with each column's frames outside its window set to -inf,
        cut to the union of the windows; and the index of its first row."""
        F = r.shape[0]
        if self.threshold == float("inf") or F == 0:
            return r, lo
        mass = _logaddexp(r[:, 0], r[:, 1])  # (F, N, K)
        if peak is None:
            peak = mass.max(0)
        keep = (mass >= (peak - self.threshold)[None]) & (peak > NEG_INF)[None]
        index = np.arange(F)[:, None, None]
        first = np.where(keep, index, F).min(0)  # (N, K) each column's window
        last = np.where(keep, index, -1).max(0)
        inside = (index >= first[None]) & (index <= last[None])
        r = np.where(inside[:, None], r, np.float32(NEG_INF))
        if not keep.any():
            return r[:0], lo
        a, b = int(first.min()), int(last.max()) + 1
        return r[a:b], lo + a

    def score(self, state: _CTCState, ys: np.ndarray, candidates: np.ndarray | None) -> tuple[np.ndarray, Any]:
        """``psi(g + c) - psi(g)`` ``(N, K)`` for the candidates ``c`` of each prefix ``g`` (``<sos/eos>`` ends it)."""
        if candidates is None:
            raise ValueError("the CTC prefix scorer scores candidate tokens only")
        with np.errstate(invalid="ignore", divide="ignore"):
            return self._score(state, ys, candidates)

    def _score(self, state: _CTCState, ys: np.ndarray, candidates: np.ndarray) -> tuple[np.ndarray, _CTCPending]:
        utt = state.utterances
        N, K = candidates.shape
        lengths = self.lengths[utt]
        T = int(lengths.max())
        lo, hi = state.lo, state.lo + state.r.shape[0]
        start = max(ys.shape[1] - 1, lo)
        stop = min(hi, T)
        peak = np.full((N, K), NEG_INF, dtype=np.float32)
        psi = np.full((N, K), NEG_INF, dtype=np.float32)
        t = start
        if start < stop:  # (else g's window ended before h could start: h is impossible)
            # Row j of z holds (phi_{t-1}, r_{t-1}^n(h), r_{t-1}^b(h)) at index t = start + j: both recursions are
            # one log-add-exp of two overlapping slices, (r^n, r^b)_t = logaddexp((r^n, r^b)_{t-1}, (phi,
            # r^n)_{t-1}) + x_t. Rows are filled block by block, as far as the windows go.
            z = np.empty((T - start + 1, 3, N, K), dtype=np.float32)
            x = np.empty((T - start, 2, N, K), dtype=np.float32)  # x_t(c), x_t(blank) at frame t = start + j
            mass = np.empty((T - start + 1, N, K), dtype=np.float32)  # log(r^n + r^b) of row j
            F_phi = stop - start
            r_n, r_b = state.r[start - lo : stop - lo, 0], state.r[start - lo : stop - lo, 1]
            np.copyto(z[:F_phi, 0], _logaddexp(r_n, r_b)[:, :, None])
            np.copyto(z[:F_phi, 0], r_b[:, :, None], where=(candidates == state.last[:, None])[None])
            z[0, 1:] = NEG_INF  # h not emitted yet
            scratch = np.empty((2, 2, N, K), dtype=np.float32)
            lp = self.log_probs
            while t < T:
                end = min(max(stop, t + WINDOW_BLOCK), T)
                a, b = t - start, end - start
                z[max(a + 1, F_phi) : b + 1, 0] = NEG_INF  # phi past g's window
                x[a:b, 0] = lp[utt[:, None], candidates, t:end].transpose(2, 0, 1)
                x[a:b, 1] = lp[utt, BLANK_ID, t:end].T[:, :, None]
                for i in range(a, b):
                    out = z[i + 1, 1:]
                    _logaddexp(z[i, 1:], z[i, :2], out, scratch)
                    mass[i] = out[1]  # r^b's log-add-exp is row i's mass
                    out += x[i]
                _logaddexp(z[b, 1], z[b, 2], mass[b], scratch[0])
                past_end = np.arange(t, end)[:, None] >= lengths[None, :]  # (F, N)
                if past_end.any():  # (frames past an utterance's end are never read unmasked: masked in place)
                    z[a + 1 : b + 1, 1:][past_end[:, None, :].repeat(2, 1)] = NEG_INF
                    mass[a + 1 : b + 1][past_end] = NEG_INF
                np.maximum(peak, mass[a + 1 : b + 1].max(0), out=peak)
                t = end
                # Past g's window the forward variables only fall: done once every column is below its threshold.
                alive = (mass[b] >= peak - self.threshold) & (peak > NEG_INF)
                if t >= stop and self.threshold != float("inf") and not alive.any():
                    break
            part = z[:F_phi, 0] + x[:F_phi, 0]
            part[np.arange(start, stop)[:, None] >= lengths[None, :]] = NEG_INF
            psi = _logsumexp(part, 0)
        self.frames_computed = t - start
        psi = np.where(candidates == self.eos, self._end_scores(state, lengths)[:, None], psi)
        delta = np.where(state.psi[:, None] > NEG_INF, psi - state.psi[:, None], np.float32(NEG_INF))
        r = z[1 : t - start + 1, 1:].copy() if t > start else np.full((0, 2, N, K), NEG_INF, dtype=np.float32)
        return delta, _CTCPending(candidates, r, start + 1, peak, psi)

    def _end_scores(self, state: _CTCState, lengths: np.ndarray) -> np.ndarray:
        """``log(r^n + r^b)`` of each prefix at its utterance's last frame ``(N,)`` (its ``<sos/eos>`` score),
        carried on in closed form from the window's last frame where the window ended before it (see the torch
        scorer's ``_end_scores``)."""
        N = lengths.shape[0]
        F = state.r.shape[0]
        if F == 0:
            return np.full(N, NEG_INF, dtype=np.float32)
        rows = np.arange(N)
        mass = _logaddexp(state.r[:, 0], state.r[:, 1])  # (F, N)
        last = np.where(mass > NEG_INF, np.arange(F)[:, None], -1).max(0)  # each row's last frame in its window
        offset = lengths - state.lo
        inside = (offset >= 0) & (offset <= last)
        direct = _logsumexp(state.r[offset.clip(0, F - 1), :, rows], 1)
        # Carried on from index e = lo + last (frame e - 1) to index L = lengths (frame L - 1): frames e..L-1.
        e = np.minimum(state.lo + last.clip(min=0), self.T)
        n_e = state.r[last.clip(min=0), 0, rows].astype(np.float64)
        b_e = state.r[last.clip(min=0), 1, rows].astype(np.float64)
        token = np.where(state.last >= 0, state.last, BLANK_ID)
        cum_c = self._cumulative(state.utterances, token)
        cum_b = self.cumulative[state.utterances, BLANK_ID]
        s0, s1 = int(e.min()), max(int(lengths.max()), int(e.min()) + 1)  # the frames any row switches at
        s = np.arange(s0, s1)[None, :]
        outside = (s < e[:, None]) | (s >= lengths[:, None])
        switch = _logsumexp(np.where(outside, NEG_INF, cum_c[:, s0:s1] - cum_b[:, s0:s1]), 1)
        stay = n_e + cum_c[rows, lengths] - cum_c[rows, e]
        blank = _logaddexp(
            b_e + cum_b[rows, lengths] - cum_b[rows, e], n_e - cum_c[rows, e] + cum_b[rows, lengths] + switch
        )
        # (After a -inf log-probability, a broken model's, differences of sums are NaN: counted as impossible.)
        carried = _logaddexp(stay, blank)
        carried = np.where(np.isnan(carried), NEG_INF, carried).astype(np.float32)
        carried = np.where((last >= 0) & (offset > last), carried, np.float32(NEG_INF))
        return np.where(inside, direct, carried)

    def select(self, state: _CTCState, rows: np.ndarray, tokens: np.ndarray | None, pending: Any) -> _CTCState:
        """The forward variables of the chosen extensions (or of ``rows`` unchanged, ``tokens`` None), cut to their
        windows."""
        utterances = state.utterances[rows]
        if tokens is None:
            return _CTCState(utterances, state.r[:, :, rows], state.lo, state.psi[rows], state.last[rows])
        column = (pending.candidates[rows] == tokens[:, None]).argmax(1)
        r = pending.r[:, :, rows, column]
        with np.errstate(invalid="ignore"):
            r, lo = self._window(r[..., None], pending.lo, pending.peak[rows, column][:, None])
        return _CTCState(utterances, r[..., 0], lo, pending.psi[rows, column], tokens)
