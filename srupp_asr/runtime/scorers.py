"""The beam search's full scorers in numpy, without torch: the attention decoder and the SRU++ language model, as
:class:`srupp_asr.decoding.scorers.DecoderScorer` and :class:`~srupp_asr.decoding.scorers.LMScorer` score (same
rows, same scores, NaN passed on), over numpy arrays.

A :class:`Scorer` gives each hypothesis (a row: a prefix ``ys`` that starts with ``<sos/eos>``) a log score for the
next token; it owns its per-hypothesis state, which :meth:`Scorer.select` reorders when the search keeps some rows
and extends them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from srupp_asr.runtime.decoder import TransformerDecoder


class Scorer(Protocol):
    """One source of next-token scores for the beam search (the protocol of the torch ``Scorer``, over numpy)."""

    #: True: :meth:`score` scores the whole vocabulary ``(N, V)``; False: only the candidates given ``(N, K)``.
    full: bool

    def init_state(self, utterances: np.ndarray) -> Any:
        """The state of ``N`` hypotheses that are the bare ``<sos/eos>`` prefix; ``utterances`` ``(N,)`` int64 says
        which utterance each row belongs to."""
        ...

    def score(self, state: Any, ys: np.ndarray, candidates: np.ndarray | None) -> tuple[np.ndarray, Any]:
        """float32 log scores of the next token after ``ys`` ``(N, i)`` (every token, or ``candidates`` ``(N, K)``),
        and whatever :meth:`select` needs to extend the hypotheses."""
        ...

    def select(self, state: Any, rows: np.ndarray, tokens: np.ndarray | None, pending: Any) -> Any:
        """The state of hypotheses ``rows`` ``(M,)`` extended by ``tokens`` ``(M,)`` (``pending`` from the last
        :meth:`score`); with ``tokens`` None, the rows as they are (the search dropping finished utterances)."""
        ...


class StepLM(Protocol):
    """What :class:`LMScorer` needs of a language model (:class:`srupp_asr.runtime.lm.SRUppLM`)."""

    vocab_size: int

    def step(self, tokens: np.ndarray, states: Any | None) -> tuple[np.ndarray, Any]: ...

    def select(self, states: Any, rows: np.ndarray) -> Any: ...


@dataclass
class _DecoderState:
    utterances: np.ndarray  # (N,)
    memory_kv: list[tuple[np.ndarray, np.ndarray]]  # per layer, each group's cross-attention keys and values
    memory_bias: np.ndarray  # (n, 1, 1, T) 0 for each group's frames, -inf past them
    cache: list[np.ndarray] | None  # per layer, the self-attention keys and values so far
    order: np.ndarray | None = None  # the rows of the cache that are the hypotheses' (None: all, in order)


class DecoderScorer:
    """The attention decoder as a full scorer, decoding incrementally over a key-value cache (see
    :meth:`TransformerDecoder.step`). The memory's cross-attention keys and values are projected once per utterance,
    and each utterance's hypotheses (consecutive rows, as the beam search keeps them) attend to one copy of them
    together (a matrix product, not one per row)."""

    full = True

    def __init__(self, decoder: TransformerDecoder, memory: np.ndarray, memory_lens: np.ndarray) -> None:
        """``memory`` ``(B, T, memory_dim)`` the encoder output, ``memory_lens`` ``(B,)`` its frame counts."""
        self.decoder, self.memory_lens = decoder, np.asarray(memory_lens, dtype=np.int64)
        self.memory_kv = decoder.memory_kv(memory)
        self.frames = memory.shape[1]

    def init_state(self, utterances: np.ndarray) -> _DecoderState:
        """Each group's memory keys and values, and no cache yet."""
        return self._grouped(utterances, None)

    def _grouped(self, utterances: np.ndarray, cache: list | None, order: np.ndarray | None = None) -> _DecoderState:
        """The state of rows ``utterances``: grouped by utterance where they come in equal runs (else one group per
        row), with the groups' memory keys and values and memory masks."""
        starts = np.flatnonzero(np.r_[True, utterances[1:] != utterances[:-1]]) if len(utterances) else utterances
        counts = np.diff(np.r_[starts, len(utterances)])
        groups = utterances[starts] if len(counts) and (counts == counts[0]).all() else utterances
        kv = [(k[groups], v[groups]) for k, v in self.memory_kv]
        # Frames past each memory's length count for nothing (a memory with no frames attends everywhere).
        valid = np.arange(self.frames)[None, :] < self.memory_lens[groups][:, None]
        valid |= ~valid.any(1, keepdims=True)
        bias = np.where(valid, np.float32(0.0), np.float32(-np.inf))[:, None, None, :]
        return _DecoderState(utterances, kv, bias, cache, order)

    def score(self, state: _DecoderState, ys: np.ndarray, candidates: np.ndarray | None) -> tuple[np.ndarray, Any]:
        """``log P_att(token | ys, memory)`` ``(N, V)`` and the cache with ``ys``'s last position added."""
        return self.decoder.step(
            ys[:, -1], ys.shape[1] - 1, state.memory_kv, state.memory_bias, state.cache, state.order
        )

    def select(self, state: _DecoderState, rows: np.ndarray, tokens: np.ndarray | None, pending: Any) -> _DecoderState:
        """Reorder the cache (gathered at the next step) and, when rows move between utterances, the memory keys and
        values by ``rows``."""
        cache, order = (pending, None) if tokens is not None else (state.cache, state.order)
        order = None if cache is None else rows if order is None else order[rows]
        utterances = state.utterances[rows]
        if np.array_equal(utterances, state.utterances):  # reordered within utterances only: the same groups
            return _DecoderState(utterances, state.memory_kv, state.memory_bias, cache, order)
        return self._grouped(utterances, cache, order)


class LMScorer:
    """A language model as a full scorer (shallow fusion): ``log P_lm(token | ys)``.

    Its state is the LM's states after reading every token of ``ys`` but the last; :meth:`score` feeds the last one.
    The LM's ``<sos/eos>`` probability scores the end of a hypothesis."""

    full = True

    def __init__(self, lm: StepLM) -> None:
        self.lm = lm

    def init_state(self, utterances: np.ndarray) -> None:
        """Nothing read yet (the first :meth:`score` feeds ``<sos/eos>``)."""
        return None

    def score(self, state: Any | None, ys: np.ndarray, candidates: np.ndarray | None) -> tuple[np.ndarray, Any]:
        """``(N, V)`` next-token log-probabilities after ``ys``; the states with ``ys``'s last token read."""
        return self.lm.step(ys[:, -1], state)

    def select(self, state: Any | None, rows: np.ndarray, tokens: np.ndarray | None, pending: Any) -> Any | None:
        """The states of ``rows`` (with their last token read when the hypotheses were extended)."""
        source = pending if tokens is not None else state
        return None if source is None else self.lm.select(source, rows)
