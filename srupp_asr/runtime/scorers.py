"""The beam search's full scorers in numpy, without torch: the attention decoder and the SRU++ language model, as
:class:`srupp_asr.decoding.scorers.DecoderScorer` and :class:`~srupp_asr.decoding.scorers.LMScorer` score (same
rows, same scores, NaN passed on), over numpy arrays: the :class:`srupp_asr.runtime.search.Scorer` protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from srupp_asr.runtime.decoder import TransformerDecoder

if TYPE_CHECKING:
    from srupp_asr.runtime.lm import SRUppLM
    from srupp_asr.runtime.ops import StepCache
    from srupp_asr.runtime.sru import LayerState


@dataclass
class _DecoderState:
    utterances: np.ndarray  # (N,)
    memory_kv: list[tuple[np.ndarray, np.ndarray]]  # per layer, each group's cross-attention keys and values
    memory_bias: np.ndarray  # (n, 1, 1, T) 0 for each group's frames, -inf past them
    cache: list[StepCache] | None  # per layer, the self-attention keys and values so far
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
        if np.array_equal(groups, np.arange(len(self.memory_lens))):  # every utterance in order: no copy
            kv = self.memory_kv
        else:
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
    """An :class:`~srupp_asr.runtime.lm.SRUppLM` as a full scorer (shallow fusion): ``log P_lm(token | ys)``.

    Its state is the LM's layer states after reading every token of ``ys`` but the last; :meth:`score` feeds the last
    one. The LM's ``<sos/eos>`` probability scores the end of a hypothesis."""

    full = True

    def __init__(self, lm: SRUppLM) -> None:
        self.lm = lm

    def init_state(self, utterances: np.ndarray) -> list[LayerState] | None:
        """Nothing read yet (the first :meth:`score` feeds ``<sos/eos>``)."""
        return None

    def score(
        self, state: list[LayerState] | None, ys: np.ndarray, candidates: np.ndarray | None
    ) -> tuple[np.ndarray, Any]:
        """``(N, V)`` next-token log-probabilities after ``ys``; the layer states with ``ys``'s last token read."""
        return self.lm.step(ys[:, -1], state)

    def select(
        self, state: list[LayerState] | None, rows: np.ndarray, tokens: np.ndarray | None, pending: Any
    ) -> list[LayerState] | None:
        """The states of ``rows`` (with their last token read when the hypotheses were extended)."""
        return self.lm.select(pending if tokens is not None else state, rows)
