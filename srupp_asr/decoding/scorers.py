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

with ``r_{-1}^b(<sos>) = 0`` and every other ``r_{-1} = -inf``. The frames run in a Python loop (one
log-add-exp and one add per frame over all hypotheses and candidates at once), from the first frame at which the
new prefix can have been emitted; ``psi`` is one reduction over frames. (A closed form with cumulative
log-sum-exps exists, but it needs float64 to cancel its large cumulative sums and is slower on CPU than the loop.)
The score of ``c`` is ``psi(g + c) - psi(g)``, so a hypothesis' accumulated CTC score is ``psi`` of its prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from srupp_asr.decoder import TransformerDecoder
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
    memory_kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer, each row's cross-attention keys and values
    memory_lens: torch.Tensor  # (N,)
    cache: list[torch.Tensor] | None  # TransformerDecoder.score_step's cache


class DecoderScorer:
    """The attention decoder as a full scorer, decoding incrementally with its layer cache; the encoder memory's
    cross-attention keys and values are projected once per utterance, not at every step."""

    full = True

    def __init__(self, decoder: TransformerDecoder, memory: torch.Tensor, memory_lens: torch.Tensor) -> None:
        self.decoder, self.memory_lens = decoder, memory_lens.to(memory.device)
        self.memory_kv = decoder.memory_kv(memory)

    def init_state(self, utterances: torch.Tensor) -> _DecoderState:
        """Each row's copy of its utterance's memory keys and values, and no cache yet."""
        kv = [(k[utterances], v[utterances]) for k, v in self.memory_kv]
        return _DecoderState(utterances, kv, self.memory_lens[utterances], None)

    def score(
        self, state: _DecoderState, ys: torch.Tensor, candidates: torch.Tensor | None
    ) -> tuple[torch.Tensor, Any]:
        """``log P_att(token | ys, memory)`` ``(N, V)`` and the decoder's new cache."""
        log_probs, cache = self.decoder.score_step(None, state.memory_lens, ys, state.cache, state.memory_kv)
        return log_probs.float(), cache

    def select(
        self, state: _DecoderState, rows: torch.Tensor, tokens: torch.Tensor | None, pending: Any
    ) -> _DecoderState:
        """Reorder the cache (and, when rows move between utterances, the memory keys and values) by ``rows``."""
        cache = pending if tokens is not None else state.cache
        utterances = state.utterances[rows]
        if utterances.shape == state.utterances.shape and torch.equal(utterances, state.utterances):
            kv, memory_lens = state.memory_kv, state.memory_lens  # reordered within utterances only
        else:
            kv, memory_lens = [(k[rows], v[rows]) for k, v in state.memory_kv], state.memory_lens[rows]
        return _DecoderState(utterances, kv, memory_lens, None if cache is None else [c[rows] for c in cache])


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


@dataclass
class _CTCState:
    utterances: torch.Tensor  # (N,)
    r: torch.Tensor  # (T + 1, 2, N): r_{t-1}^n, r_{t-1}^b of each prefix at index t = 0..T
    psi: torch.Tensor  # (N,) log prefix probability of each prefix
    last: torch.Tensor  # (N,) each prefix's last token, -1 for the bare <sos/eos>


@dataclass
class _CTCPending:
    candidates: torch.Tensor  # (N, K)
    r: torch.Tensor  # (T + 1, 2, N, K)
    psi: torch.Tensor  # (N, K)


class CTCPrefixScorer:
    """CTC prefix scores of candidate tokens (a partial scorer), all hypotheses and candidates at once."""

    full = False

    def __init__(self, log_probs: torch.Tensor, lengths: torch.Tensor, eos: int = SOS_EOS_ID) -> None:
        _, T, _ = log_probs.shape
        self.eos, self.T = eos, T
        self.lengths = lengths.to(log_probs.device)
        self.log_probs = log_probs.float()

    def init_state(self, utterances: torch.Tensor) -> _CTCState:
        """The bare prefix: all-blank paths, ``r_{t-1}^b`` the blank's cumulative log-probability, prefix
        probability 1."""
        N, device = utterances.shape[0], utterances.device
        r = torch.full((self.T + 1, 2, N), NEG_INF, device=device)
        r[0, 1] = 0.0
        r[1:, 1] = self.log_probs[utterances, :, BLANK_ID].cumsum(1).T
        psi = torch.zeros(N, device=device)
        return _CTCState(utterances, r, psi, torch.full((N,), -1, dtype=torch.long, device=device))

    def score(self, state: _CTCState, ys: torch.Tensor, candidates: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        """``psi(g + c) - psi(g)`` ``(N, K)`` for the candidates ``c`` of each prefix ``g`` (``<sos/eos>`` ends it)."""
        if candidates is None:
            raise ValueError("the CTC prefix scorer scores candidate tokens only")
        utt = state.utterances
        N, K = candidates.shape
        lengths = self.lengths[utt]
        T = int(lengths.max())  # frames past every row's utterance are never needed
        # h = g + c has len(g) + 1 tokens: r_t^n(h) = -inf before frame len(g), r_t^b(h) one frame later, and
        # phi_{t-1} = -inf before frame len(g) too: only frames from len(g) on are computed.
        start = ys.shape[1] - 1
        frames = torch.arange(start, T, device=utt.device)
        x = self.log_probs[utt[None, :, None], frames[:, None, None], candidates[None, :, :]]  # x_t(c): (F, N, K)
        x_blank = self.log_probs[utt[None, :], frames[:, None], BLANK_ID][:, :, None].expand_as(x)
        r_n, r_b = state.r[start:T, 0], state.r[start:T, 1]  # r_{t-1}(g): index t holds frame t - 1
        same = (candidates == state.last[:, None])[None]
        phi = torch.where(same, r_b[:, :, None], torch.logaddexp(r_n, r_b)[:, :, None])  # phi_{t-1}: (F, N, K)
        # One buffer per frame t holds (phi_{t-1}, r_{t-1}^n(h), r_{t-1}^b(h)), so that both recursions are one
        # log-add-exp of two adjacent slices: (r^n, r^b)_t = logaddexp((r^n, r^b)_{t-1}, (phi, r^n)_{t-1}) + x_t.
        z = torch.full((self.T + 1, 3, N, K), NEG_INF, device=utt.device)
        z[start:T, 0] = phi
        both_x = torch.stack([x, x_blank], 1).unbind(0)
        rs, phis = [zt[1:] for zt in z], [zt[:2] for zt in z]  # views made once, not per frame
        for t in range(start, T):
            torch.logaddexp(rs[t], phis[t], out=rs[t + 1])
            rs[t + 1].add_(both_x[t - start])
        past_end = frames[:, None] >= lengths[None, :]  # (F, N)
        psi = torch.logsumexp((phi + x).masked_fill(past_end[:, :, None], NEG_INF), 0)
        # <sos/eos>: the probability of exactly g, read at each utterance's last frame.
        end = lengths[None, None, :].expand(2, 1, N)
        psi_end = torch.logsumexp(state.r.permute(1, 0, 2).gather(1, end), 0)  # (1, N)
        psi = torch.where(candidates == self.eos, psi_end.T, psi)
        delta = torch.where(state.psi[:, None] > NEG_INF, psi - state.psi[:, None], NEG_INF)
        return delta, _CTCPending(candidates, z[:, 1:], psi)

    def select(self, state: _CTCState, rows: torch.Tensor, tokens: torch.Tensor | None, pending: Any) -> _CTCState:
        """The forward variables of the chosen extensions (or of ``rows`` unchanged, ``tokens`` None)."""
        utterances = state.utterances[rows]
        if tokens is None:
            return _CTCState(utterances, state.r[:, :, rows], state.psi[rows], state.last[rows])
        column = (pending.candidates[rows] == tokens[:, None]).int().argmax(1)
        return _CTCState(utterances, pending.r[:, :, rows, column], pending.psi[rows, column], tokens)
