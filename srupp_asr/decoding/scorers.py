"""Scorers for label-synchronous beam search: the attention decoder and the CTC prefix scorer, behind one interface.

A :class:`Scorer` gives each hypothesis (a row: a prefix ``ys`` that starts with ``<sos/eos>``) a log score for
the next token. *Full* scorers (the attention decoder, the SRU++ language model) score the whole vocabulary
cheaply; *partial* scorers (CTC) score only the candidate tokens the full scorers preselected. The search owns the
hypotheses; a scorer owns its per-hypothesis state and reorders it when the search keeps some rows and extends
them.

The CTC prefix scorer follows the hybrid CTC/attention paper (Watanabe et al., 2017, Algorithm 2), vectorised
over hypotheses, candidate tokens and frames. For a prefix ``g`` it keeps the forward variables ``r_t^n(g)`` and
``r_t^b(g)``: the log-probability of the paths over frames ``0..t`` that emit ``g`` and end in its last token,
or in a blank. For a candidate ``h = g + c``, with ``x_t`` the CTC log-probabilities and
``phi_t = r_t^b(g)`` if ``c`` is ``g``'s last token else ``logaddexp(r_t^n(g), r_t^b(g))``::

    r_t^n(h) = logaddexp(r_{t-1}^n(h), phi_{t-1}) + x_t(c)
    r_t^b(h) = logaddexp(r_{t-1}^b(h), r_{t-1}^n(h)) + x_t(blank)
    psi(h)   = logsumexp_t (phi_{t-1} + x_t(c))                (prefix probability: every path that starts with h)
    psi(g + <eos>) = logaddexp(r_{T-1}^n(g), r_{T-1}^b(g))     (the probability of exactly g)

with ``r_{-1}^b(<sos>) = 0`` and every other ``r_{-1} = -inf``. The frames run from the first frame at which the
new prefix can have been emitted, over all hypotheses and candidates at once, in one of two ways that give the same
numbers (see :func:`forward_block`): on the CPU a Python loop (one log-add-exp and one add per frame), on a GPU a
closed form of a fixed number of operations however many frames (each a kernel launch there, and launches are what a
GPU search waits on). ``psi`` is one reduction over frames. The score of ``c`` is ``psi(g + c) - psi(g)``, so a
hypothesis' accumulated CTC score is ``psi`` of its prefix.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from srupp_asr import kv_cache
from srupp_asr.decoder import TransformerDecoder
from srupp_asr.decoding.lexicon import LexiconScorer, LexiconTable
from srupp_asr.encoders import sinusoidal_positions
from srupp_asr.lm import SRUppLM
from srupp_asr.model import BLANK_ID, SOS_EOS_ID
from srupp_asr.sru import LayerState

NEG_INF = float("-inf")


class Scorer(Protocol):
    """One source of next-token scores for :func:`srupp_asr.decoding.beam_search.beam_search`."""

    #: True: :meth:`score` scores the whole vocabulary ``(N, V)``; False: only the candidates given ``(N, K)``.
    full: bool

    def init_state(self, utterances: torch.Tensor) -> Any:
        """The state of ``N`` hypotheses that are the bare ``<sos/eos>`` prefix; ``utterances`` ``(N,)`` says which
        utterance each row belongs to."""
        ...

    def score(self, state: Any, ys: torch.Tensor, candidates: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        """Log scores of the next token after ``ys`` ``(N, i)`` (every token, or ``candidates`` ``(N, K)``), and
        whatever :meth:`select` needs to extend the hypotheses."""
        ...

    def select(self, state: Any, rows: torch.Tensor, tokens: torch.Tensor | None, pending: Any) -> Any:
        """The state of hypotheses ``rows`` ``(M,)`` extended by ``tokens`` ``(M,)`` (``pending`` from the last
        :meth:`score`); with ``tokens`` None, the rows as they are (the search dropping finished utterances)."""
        ...


@dataclass
class _DecoderState:
    utterances: torch.Tensor  # (N,)
    groups: torch.Tensor  # (n,) the utterance of each group of N / n consecutive rows
    memory_kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer, each group's cross-attention keys and values
    memory_bias: torch.Tensor  # (n, 1, 1, T) 0 for each group's frames, -inf past them
    self_kv: list[tuple[torch.Tensor, torch.Tensor]] | None  # per layer, the self-attention keys and values so far
    order: torch.Tensor | None = None  # the rows of self_kv that are the hypotheses' (None: all, in order)


class DecoderScorer:
    """The attention decoder as a full scorer, decoding incrementally: each step runs the last position only, with
    every layer's self-attention keys and values of the earlier positions kept (a key-value cache, so a step costs
    the same at any prefix length but for the attention itself); the encoder memory's cross-attention keys and
    values are projected once per utterance, not at every step, and each utterance's hypotheses (consecutive rows,
    as the beam search keeps them) attend to one copy of them together (a matrix product, not one per row).

    It computes what :meth:`~srupp_asr.decoder.TransformerDecoder.score_step` computes (a test compares them):
    in the pre-LayerNorm decoder a layer's keys and values at a position depend only on the positions up to it."""

    full = True

    def __init__(self, decoder: TransformerDecoder, memory: torch.Tensor, memory_lens: torch.Tensor) -> None:
        self.decoder, self.memory_lens = decoder, memory_lens.to(memory.device)
        self.memory_kv = decoder.memory_kv(memory)
        self.frames = memory.shape[1]

    def init_state(self, utterances: torch.Tensor) -> _DecoderState:
        """Each group's memory keys and values, and no cache yet."""
        return self._grouped(utterances, None)

    def _grouped(
        self, utterances: torch.Tensor, self_kv: list | None, order: torch.Tensor | None = None
    ) -> _DecoderState:
        """The state of rows ``utterances``: grouped by utterance where they come in equal runs (else one group per
        row), with the groups' memory keys and values and memory masks."""
        values, counts = torch.unique_consecutive(utterances, return_counts=True)
        groups = values if len(counts) and bool((counts == counts[0]).all()) else utterances
        kv = [(k.index_select(0, groups), v.index_select(0, groups)) for k, v in self.memory_kv]
        # Frames past each memory's length count for nothing (a memory with no frames attends everywhere).
        valid = torch.arange(self.frames, device=utterances.device)[None, :] < self.memory_lens[groups][:, None]
        bias = torch.zeros(valid.shape, device=utterances.device, dtype=kv[0][0].dtype)
        bias = bias.masked_fill(~(valid | ~valid.any(1, keepdim=True)), NEG_INF)[:, None, None, :]
        return _DecoderState(utterances, groups, kv, bias, self_kv, order)

    def score(
        self, state: _DecoderState, ys: torch.Tensor, candidates: torch.Tensor | None
    ) -> tuple[torch.Tensor, Any]:
        """``log P_att(token | ys, memory)`` ``(N, V)`` and the self-attention keys and values with ``ys``'s last
        position added."""
        dec = self.decoder
        N, u = ys.shape
        positions = sinusoidal_positions(u, dec.d_model, ys.device)[-1:]
        x = dec.embed(ys[:, -1:]) * math.sqrt(dec.d_model)
        x = x + positions.to(x.dtype)
        n = state.groups.shape[0]
        past = state.self_kv if state.self_kv is not None else [None] * len(dec.layers)
        self_kv = []
        for layer, cached, kv in zip(dec.layers, past, state.memory_kv, strict=True):
            attn = layer.self_attn
            normed = layer.norm_self(x)
            q = attn._split(attn.wq(normed))
            k, v = attn.project_kv(normed)
            if cached is not None:
                k, v = kv_cache.extend(cached[0], state.order, k), kv_cache.extend(cached[1], state.order, v)
            self_kv.append((k, v))
            h = x + attn.wo(_attend(q, k, v).transpose(1, 2).reshape(N, 1, dec.d_model))
            cross = layer.cross_attn
            q = cross.wq(layer.norm_cross(h)).view(n, N // n, cross.num_heads, -1).transpose(1, 2)  # (n, H, W, d)
            a = _attend(q, *kv, state.memory_bias).transpose(1, 2)  # (n, W, H, d)
            h = h + cross.wo(a.reshape(N, 1, dec.d_model))
            x = h + layer.ffn(layer.norm_ffn(h))
        return dec.output(dec.final_norm(x[:, -1])).log_softmax(-1).float(), self_kv

    def select(
        self, state: _DecoderState, rows: torch.Tensor, tokens: torch.Tensor | None, pending: Any
    ) -> _DecoderState:
        """Reorder the cache (gathered at the next step: :mod:`srupp_asr.kv_cache`) and, when rows move between
        utterances, the memory keys and values by ``rows``."""
        self_kv, order = (pending, None) if tokens is not None else (state.self_kv, state.order)
        order = None if self_kv is None else kv_cache.reorder(order, rows)
        utterances = state.utterances[rows]
        if utterances.shape == state.utterances.shape and torch.equal(utterances, state.utterances):
            # reordered within utterances only: the same groups
            return _DecoderState(utterances, state.groups, state.memory_kv, state.memory_bias, self_kv, order)
        return self._grouped(utterances, self_kv, order)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Scaled dot-product attention of a few queries ``q`` ``(N, heads, W, d)`` over ``k``, ``v``
    ``(N, heads, L, d)`` (``bias`` added to the scores), as two batched matrix products: on CPU, several times
    faster for so few queries than ``scaled_dot_product_attention`` with a mask."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    if bias is not None:
        scores = scores + bias
    return torch.matmul(scores.softmax(-1), v)


class LMScorer:
    """An :class:`~srupp_asr.lm.SRUppLM` as a full scorer (shallow fusion): ``log P_lm(token | ys)``.

    Its state is the LM's layer states after reading every token of ``ys`` but the last; :meth:`score` feeds the
    last one. The LM's ``<sos/eos>`` probability scores the end of a hypothesis."""

    full = True

    def __init__(self, lm: SRUppLM) -> None:
        self.lm = lm

    def init_state(self, utterances: torch.Tensor) -> list[LayerState] | None:
        """Nothing read yet (the first :meth:`score` feeds ``<sos/eos>``)."""
        return None

    def score(
        self, state: list[LayerState] | None, ys: torch.Tensor, candidates: torch.Tensor | None
    ) -> tuple[torch.Tensor, Any]:
        """``(N, V)`` next-token log-probabilities after ``ys``; the layer states with ``ys``'s last token read."""
        return self.lm.step(ys[:, -1], state)

    def select(
        self, state: list[LayerState] | None, rows: torch.Tensor, tokens: torch.Tensor | None, pending: Any
    ) -> list[LayerState] | None:
        """The states of ``rows`` (with their last token read when the hypotheses were extended)."""
        source = pending if tokens is not None else state
        return None if source is None else [s.select(rows) for s in source]


class WordListScorer:
    """The LM's word list (:class:`srupp_asr.decoding.lexicon.LexiconScorer`, which works on the host in numpy) as
    a partial scorer of the torch search: the candidates go to the host and the scores come back, one transfer a
    step more on a GPU."""

    full = False

    def __init__(self, table: LexiconTable) -> None:
        self.scorer = LexiconScorer(table)

    def init_state(self, utterances: torch.Tensor) -> Any:
        """No word begun, for each row."""
        return self.scorer.init_state(utterances.cpu().numpy())

    def score(self, state: Any, ys: torch.Tensor, candidates: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        """``(N, K)`` scores of ``candidates``: -1 for each word a candidate takes out of the list."""
        scores, _ = self.scorer.score(state, None, candidates.cpu().numpy())
        return torch.from_numpy(scores).to(candidates.device), None

    def select(self, state: Any, rows: torch.Tensor, tokens: torch.Tensor | None, pending: Any) -> Any:
        """The states of ``rows``, extended by ``tokens``."""
        host = None if tokens is None else tokens.cpu().numpy()
        return self.scorer.select(state, rows.cpu().numpy(), host, None)


@dataclass
class _CTCState:
    utterances: torch.Tensor  # (N,)
    r: torch.Tensor  # (hi - lo, 2, N): r_{t-1}^n, r_{t-1}^b of each prefix at index t = lo..hi-1 (-inf elsewhere)
    lo: int  # the window: index t (frame t - 1) of the first column of r
    psi: torch.Tensor  # (N,) log prefix probability of each prefix
    last: torch.Tensor  # (N,) each prefix's last token, -1 for the bare <sos/eos>


@dataclass
class _CTCPending:
    candidates: torch.Tensor  # (N, K)
    r: torch.Tensor  # (F, 2, N, K): r_{t-1}^n, r_{t-1}^b of each extension at index t = lo..lo+F-1
    lo: int
    peak: torch.Tensor  # (N, K) the largest log(r^n + r^b) of each extension over its frames
    psi: torch.Tensor  # (N, K)


WINDOW_THRESHOLD = 40.0  # nats below its own peak at which a prefix's forward variables count as zero
# Frames computed between two checks of whether every extension's window has ended (a host sync each): few where
# each frame costs operations (the loop), more where a block costs the same operations at any length (the scan).
WINDOW_BLOCK = {"loop": 8, "scan": 32}
#: How the CTC forward variables run over a block of frames: "loop" (a log-add-exp and an add per frame, fastest on
#: the CPU), "scan" (a closed form in a fixed number of operations, for GPUs, with longer blocks and the rows' last
#: frame read once, not per step) or "auto" (scan on a GPU). A module setting, not an option: both give the same
#: scores; benchmarks set it to compare the two on one device.
CTC_RECURSION = "auto"
_SCAN_FLOOR = -1e10  # log-probabilities clamped here in the scan, so that no sum of them is -inf (see forward_block)


def forward_block(
    carry: torch.Tensor, phi: torch.Tensor, x: torch.Tensor, x_blank: torch.Tensor, recursion: str = "loop"
) -> torch.Tensor:
    """The CTC forward variables of extensions over ``F`` frames: ``(F, 2, N, K)``, ``(r^n, r^b)`` after each
    frame, from ``carry`` ``(2, N, K)`` before the first, ``phi`` ``(P, N, K)`` the prefix' ``phi_{t-1}`` of the
    first ``P <= F`` frames (-inf after them) and ``x``, ``x_blank`` ``(F, N, K)`` the log-probabilities of each
    candidate and of the blank.

    ``loop`` runs the recursions frame by frame. ``scan`` solves them in closed form: with ``C_i`` the summed
    ``x`` of the frames before frame ``i`` (and ``B_i`` the same of the blank), ``r^n_i - C_i`` is a cumulative
    log-sum-exp of ``carry^n`` and ``phi_j - C_j`` (``j < i``), and then ``r^b_i - B_i`` one of ``carry^b`` and
    ``r^n_j - B_j``; two cumulative log-sum-exps and two cumulative sums, however many frames. The sums grow with
    the frames and cancel at the end, so it runs in float64 (float32 would lose ``|C| * 6e-8``), with the
    log-probabilities clamped at -1e10 so that a -inf (a broken model's) cannot make ``inf - inf``; a variable below
    -1e9 (only a path through a clamped frame) is -inf again. The two agree to float32 rounding."""
    F = x.shape[0]
    P = phi.shape[0]
    if recursion == "loop":
        z = torch.full((F + 1, 3, *x.shape[1:]), NEG_INF, device=x.device)
        z[0, 1:] = carry
        z[:P, 0] = phi
        # One buffer per frame t holds (phi_{t-1}, r_{t-1}^n, r_{t-1}^b), so that both recursions are one
        # log-add-exp of two adjacent slices: (r^n, r^b)_t = logaddexp((r^n, r^b)_{t-1}, (phi, r^n)_{t-1}) + x_t.
        both_x = torch.stack([x, x_blank], 1).unbind(0)
        rs, phis = z[:, 1:].unbind(0), z[:, :2].unbind(0)  # views made once, not per frame
        for i in range(F):
            torch.logaddexp(rs[i], phis[i], out=rs[i + 1])
            rs[i + 1].add_(both_x[i])
        return z[1:, 1:]
    if recursion != "scan":
        raise ValueError(f"recursion must be 'loop' or 'scan', got {recursion!r}")
    sums = torch.stack([x, x_blank]).double().clamp_(min=_SCAN_FLOOR).cumsum(1)
    sums = torch.nn.functional.pad(sums, (0, 0, 0, 0, 1, 0))  # (2, F + 1, N, K): index i sums frames before i
    a = torch.cat([carry[:1].double(), phi.double() - sums[0, :P], sums.new_full((F - P, *x.shape[1:]), NEG_INF)])
    r_n = a.logcumsumexp(0).add_(sums[0])  # (F + 1, N, K): index 0 is the carry
    b = torch.cat([carry[1:].double(), r_n[:F] - sums[1, :F]])
    r_b = b.logcumsumexp(0).add_(sums[1])
    r = torch.stack([r_n[1:], r_b[1:]], 1)
    return r.masked_fill_(r < _SCAN_FLOOR / 10, NEG_INF).float()


class CTCPrefixScorer:
    """CTC prefix scores of candidate tokens (a partial scorer), all hypotheses and candidates at once, each prefix
    computed over a window of frames only.

    The window of a prefix is the stretch of frames where its forward variables ``r^n + r^b`` lie within
    ``window_threshold`` nats of their largest value (a beam over frames, as a Viterbi beam prunes states): the
    frames where the prefix can have ended. An extension's frames start where its prefix' window starts and run on
    while its own forward variables have not fallen that far below their peak. Past the prefix' window no new
    emission feeds them, so from there they can only fall (each frame multiplies them by at most
    ``P(c) + P(blank) <= 1``): the first frame below the threshold ends the window for good. Frames before the
    window and after it count as probability 0 (-inf). So a step costs the width of the window (a few frames per
    token on speech, the length of a pause in a pause), not the length of the utterance, and what is pruned is at
    least ``e^-window_threshold`` times smaller than the prefix' best frame. ``window_threshold=inf`` keeps every
    frame (the exact, unwindowed scorer)."""

    full = False

    def __init__(
        self,
        log_probs: torch.Tensor,
        lengths: torch.Tensor,
        eos: int = SOS_EOS_ID,
        window_threshold: float = WINDOW_THRESHOLD,
    ) -> None:
        _, T, _ = log_probs.shape
        if not window_threshold > 0:  # (nan too)
            raise ValueError(f"window_threshold must be > 0, got {window_threshold}")
        self.eos, self.T, self.threshold = eos, T, float(window_threshold)
        self.lengths = lengths.to(log_probs.device)
        self.log_probs = log_probs.float()
        # Cumulative log-probabilities over frames (index t: the sum over frames before t), in float64 so that
        # differences of large sums stay exact: the ending score of a prefix whose window ended (see _end_scores).
        self.cumulative = torch.nn.functional.pad(log_probs.double().cumsum(1), (0, 0, 1, 0))
        #: frames computed by the last score() (one per frame, however many hypotheses): for tests and benchmarks
        self.frames_computed = 0

    @functools.cached_property
    def _longest(self) -> int:
        """The last frame any row can need: for the scan (a GPU's way) read once rather than at each step for the rows
        left (a host sync each); frames past a row's own length are -inf, so its window ends there all the same."""
        return int(self.lengths.max()) if self.lengths.numel() else 0

    def init_state(self, utterances: torch.Tensor) -> _CTCState:
        """The bare prefix: all-blank paths, ``r_{t-1}^b`` the blank's cumulative log-probability, prefix
        probability 1 (windowed like any prefix)."""
        N, device = utterances.shape[0], utterances.device
        r = torch.full((self.T + 1, 2, N), NEG_INF, device=device)
        r[0, 1] = 0.0
        r[1:, 1] = self.log_probs[utterances, :, BLANK_ID].cumsum(1).T
        past_end = torch.arange(self.T + 1, device=device)[:, None] > self.lengths[utterances][None, :]
        r[:, 1].masked_fill_(past_end, NEG_INF)
        r, lo = self._window(r[:, :, :, None], 0)
        psi = torch.zeros(N, device=device)
        return _CTCState(utterances, r[..., 0], lo, psi, torch.full((N,), -1, dtype=torch.long, device=device))

    def _window(self, r: torch.Tensor, lo: int, peak: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
        """``r`` ``(F, 2, N, K)`` (index ``lo`` first) with each column's frames outside its window set to -inf,
        cut to the union of the windows; and the index of its first row."""
        if self.threshold == float("inf") or r.shape[0] == 0:
            return r, lo
        mass = torch.logaddexp(r[:, 0], r[:, 1])  # (F, N, K)
        if peak is None:
            peak = mass.amax(0)
        keep = mass >= (peak - self.threshold)[None]
        keep &= peak[None] > NEG_INF
        index = torch.arange(r.shape[0], device=r.device)[:, None, None]
        first = torch.where(keep, index, r.shape[0]).amin(0)  # (N, K) each column's window
        last = torch.where(keep, index, -1).amax(0)
        inside = (index >= first[None]) & (index <= last[None])
        r = r.masked_fill(~inside[:, None], NEG_INF)
        if first.numel() == 0:  # no hypothesis
            return r[:0], lo
        a, b = torch.stack([first.min(), last.max() + 1]).tolist()  # one host sync; a == F: no frame kept
        if a >= r.shape[0]:
            return r[:0], lo
        return r[a:b], lo + a

    def score(self, state: _CTCState, ys: torch.Tensor, candidates: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        """``psi(g + c) - psi(g)`` ``(N, K)`` for the candidates ``c`` of each prefix ``g`` (``<sos/eos>`` ends it)."""
        if candidates is None:
            raise ValueError("the CTC prefix scorer scores candidate tokens only")
        utt = state.utterances
        N, K = candidates.shape
        device = utt.device
        lengths = self.lengths[utt]
        recursion = CTC_RECURSION if CTC_RECURSION != "auto" else ("scan" if device.type == "cuda" else "loop")
        T = self._longest if recursion == "scan" else int(lengths.max())  # no row needs frames past T
        lo, hi = state.lo, state.lo + state.r.shape[0]  # g's window: indices lo..hi-1
        # h = g + c has len(g) + 1 tokens: r_t^n(h) = -inf before frame len(g), r_t^b(h) one frame later, and
        # phi_{t-1} = -inf before frame len(g) and outside g's window: only frames from there on are computed.
        start = max(ys.shape[1] - 1, lo)
        stop = min(hi, T)  # phi is -inf from index hi on
        same = (candidates == state.last[:, None])[None]
        if start < stop:
            r_n, r_b = state.r[start - lo : stop - lo, 0], state.r[start - lo : stop - lo, 1]
            phi = torch.where(same, r_b[:, :, None], torch.logaddexp(r_n, r_b)[:, :, None])  # phi_{t-1}: (F, N, K)
        else:
            phi = torch.full((0, N, K), NEG_INF, device=device)
        blocks, psi_parts = [], []
        carry = torch.full((2, N, K), NEG_INF, device=device)  # (r^n, r^b) at index start: h not emitted yet
        peak = torch.full((N, K), NEG_INF, device=device)
        t = start
        while t < T and start < stop:  # (g's window ended before h could start: h is impossible)
            block = WINDOW_BLOCK[recursion]
            end = min(max(stop, t + block), T) if t < stop else min(t + block, T)
            frames = torch.arange(t, end, device=device)
            x = self.log_probs[utt[None, :, None], frames[:, None, None], candidates[None, :, :]]  # (F, N, K)
            x_blank = self.log_probs[utt[None, :], frames[:, None], BLANK_ID][:, :, None].expand_as(x)
            block_phi = phi[t - start : end - start] if t < stop else None
            z = forward_block(carry, phi[:0] if block_phi is None else block_phi, x, x_blank, recursion)
            past_end = frames[:, None] >= lengths[None, :]  # (F, N)
            if block_phi is not None:
                F_phi = block_phi.shape[0]
                psi_parts.append((block_phi + x[:F_phi]).masked_fill(past_end[:F_phi, :, None], NEG_INF))
            r = z.masked_fill(past_end[:, None, :, None], NEG_INF)  # indices t+1..end
            blocks.append(r)
            mass = torch.logaddexp(r[:, 0], r[:, 1])
            peak = torch.maximum(peak, mass.amax(0))
            carry = z[-1]
            t = end
            # Past g's window the forward variables only fall: done once every column is below its threshold.
            alive = (mass[-1] >= peak - self.threshold) & (peak > NEG_INF)
            if t >= stop and self.threshold != float("inf") and not bool(alive.any()):
                break
        self.frames_computed = t - start
        psi = torch.full((N, K), NEG_INF, device=device)
        if psi_parts:
            psi = torch.logsumexp(torch.cat(psi_parts), 0)
        # <sos/eos>: the probability of exactly g, read at each utterance's last frame (index lengths).
        psi_end = self._end_scores(state, lengths)
        psi = torch.where(candidates == self.eos, psi_end[:, None], psi)
        delta = torch.where(state.psi[:, None] > NEG_INF, psi - state.psi[:, None], NEG_INF)
        r = torch.cat(blocks) if blocks else torch.full((0, 2, N, K), NEG_INF, device=device)
        return delta, _CTCPending(candidates, r, start + 1, peak, psi)

    def _end_scores(self, state: _CTCState, lengths: torch.Tensor) -> torch.Tensor:
        """``log(r^n + r^b)`` of each prefix at its utterance's last frame ``(N,)``: the probability of exactly the
        prefix (its ``<sos/eos>`` score).

        Where the prefix' window ended before the last frame, its forward variables are carried on from the window's
        last frame ``e`` with no new emission (as the window prunes them), in closed form: staying in the last token
        ``c`` to the end, or in it up to a frame ``s`` and blank from there on::

            r_L^n = r_e^n + X_c(e, L)
            r_L^b = logaddexp(r_e^b + X_blank(e, L), logsumexp_{e <= s < L} (r_e^n + X_c(e, s) + X_blank(s, L)))

        with ``X_k(a, b)`` the summed log-probability of ``k`` over frames ``a..b-1`` (differences of the float64
        cumulative sums). So a hypothesis can always end (the search's maximum length forces it to), with the
        score the unwindowed scorer gives it up to what the window pruned."""
        N, device = lengths.shape[0], lengths.device
        F = state.r.shape[0]
        if F == 0:
            return torch.full((N,), NEG_INF, device=device)
        rows = torch.arange(N, device=device)
        mass = torch.logaddexp(state.r[:, 0], state.r[:, 1])  # (F, N)
        index = torch.arange(F, device=device)[:, None]
        last = torch.where(mass > NEG_INF, index, -1).amax(0)  # each row's last frame in its window, -1: none
        offset = lengths - state.lo  # where the last frame lies in the window
        inside = (offset >= 0) & (offset <= last)
        at_end = state.r[offset.clamp(0, F - 1), :, rows]  # (N, 2)
        direct = torch.logsumexp(at_end, 1)
        # Carried on from index e = lo + last (frame e - 1) to index L = lengths (frame L - 1): frames e..L-1.
        e = (state.lo + last.clamp(min=0)).clamp(max=self.T)
        n_e, b_e = state.r[last.clamp(min=0), 0, rows].double(), state.r[last.clamp(min=0), 1, rows].double()
        token = torch.where(state.last >= 0, state.last, BLANK_ID)
        frames = torch.arange(self.T + 1, device=device)[None, :]
        cum_c = self.cumulative[state.utterances[:, None], frames, token[:, None]]  # (N, T + 1)
        cum_b = self.cumulative[state.utterances, :, BLANK_ID]
        at = lambda c, t: c.gather(1, t[:, None])[:, 0]  # noqa: E731
        stay = n_e + at(cum_c, lengths) - at(cum_c, e)
        s = torch.arange(self.T + 1, device=device)[None, :]
        switch = (cum_c - cum_b).masked_fill((s < e[:, None]) | (s >= lengths[:, None]), NEG_INF).logsumexp(1)
        blank = torch.logaddexp(
            b_e + at(cum_b, lengths) - at(cum_b, e), n_e - at(cum_c, e) + at(cum_b, lengths) + switch
        )
        # (After a -inf log-probability, a broken model's, differences of sums are NaN: counted as impossible.)
        carried = torch.logaddexp(stay, blank).nan_to_num(nan=NEG_INF).float()
        carried = torch.where((last >= 0) & (offset > last), carried, NEG_INF)
        return torch.where(inside, direct, carried)

    def select(self, state: _CTCState, rows: torch.Tensor, tokens: torch.Tensor | None, pending: Any) -> _CTCState:
        """The forward variables of the chosen extensions (or of ``rows`` unchanged, ``tokens`` None), cut to their
        windows."""
        utterances = state.utterances[rows]
        if tokens is None:
            return _CTCState(utterances, state.r.index_select(2, rows), state.lo, state.psi[rows], state.last[rows])
        column = (pending.candidates[rows] == tokens[:, None]).int().argmax(1)
        r = pending.r[:, :, rows, column]
        peak = pending.peak[rows, column]
        r, lo = self._window(r[..., None], pending.lo, peak[:, None])
        return _CTCState(utterances, r[..., 0], lo, pending.psi[rows, column], tokens)
