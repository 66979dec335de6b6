"""srupp_asr.decoding.end_detection: when a beam search stops searching an utterance, and both searches (torch and
numpy) stopping by it: exact without a length bonus, early with one, and with the n-best of a search run to the
maximum length."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import srupp_asr.runtime.search as numpy_search
from srupp_asr.decoding import beam_search as torch_search
from srupp_asr.decoding import scorers as torch_scorers
from srupp_asr.decoding.end_detection import END_MARGIN, finished

INF = math.inf


def test_without_a_bonus_an_utterance_is_done_once_nothing_running_can_overtake_its_nbest() -> None:
    ended = [([1], -5.0), ([2], -7.0)]
    assert finished([-5.0, -4.9], [ended, ended], nbest=1, length_penalty=0.0) == [True, False]
    assert finished([-7.0, -6.9], [ended, ended], nbest=2, length_penalty=0.0) == [True, False]
    assert finished([-9.0], [ended[:1]], nbest=2, length_penalty=-0.5) == [False]  # only 1 of its 2 ended yet
    assert finished([-INF, -INF], [[], ended], nbest=3, length_penalty=0.0) == [True, True]  # nothing running


def test_with_a_bonus_the_best_running_hypothesis_must_fall_the_margin_below() -> None:
    ended = [[([1], -5.0)]] * 3
    running = [-5.0 - END_MARGIN, -4.9 - END_MARGIN, -3.0]
    assert finished(running, ended, nbest=1, length_penalty=1.0) == [True, False, False]
    assert finished([-100.0], ended[:1], nbest=1, length_penalty=1.0, end_margin=INF) == [False]  # to the end
    assert finished([-INF], ended[:1], nbest=1, length_penalty=1.0, end_margin=INF) == [True]
    assert finished([-9.0], ended[:1], nbest=1, length_penalty=1.0, end_margin=2.0) == [True]


class Counting:
    """A scorer that counts the search's steps (its score() calls) for the one it wraps."""

    def __init__(self, scorer) -> None:
        self.scorer, self.full, self.steps = scorer, scorer.full, 0

    def init_state(self, utterances):
        return self.scorer.init_state(utterances)

    def score(self, state, ys, candidates):
        self.steps += 1
        return self.scorer.score(state, ys, candidates)

    def select(self, state, rows, tokens, pending):
        return self.scorer.select(state, rows, tokens, pending)


def spiky_log_probs(B: int, tokens: int, vocab: int, seed: int) -> np.ndarray:
    """float32 CTC log-probabilities ``(B, T, vocab)`` as a trained model's look: blank everywhere but one frame in
    four, where a random token spikes, and silence after the last (10 frames)."""
    rng = np.random.default_rng(seed)
    T = 4 * tokens + 10
    logits = rng.standard_normal((B, T, vocab)).astype(np.float32)
    logits[:, :, 0] += 6.0
    for b in range(B):
        for i in range(tokens):
            logits[b, 2 + 4 * i, 3 + rng.integers(vocab - 3)] += 12.0
    return torch.from_numpy(logits).log_softmax(-1).numpy()


def search(kind: str, log_probs: np.ndarray, bonus: float, margin: float) -> tuple[list, int]:
    """The n-best lists of the ``kind`` search (CTC alone) and its steps."""
    B, T, V = log_probs.shape
    lengths = np.full(B, T)
    if kind == "torch":
        ctc = Counting(torch_scorers.CTCPrefixScorer(torch.from_numpy(log_probs), torch.from_numpy(lengths)))
        found = torch_search.beam_search([(ctc, 1.0)], B, torch.from_numpy(lengths), V, 4, 2, bonus, end_margin=margin)
    else:
        ctc = Counting(numpy_search.CTCPrefixScorer(log_probs, lengths))
        found = numpy_search.beam_search([(ctc, 1.0)], B, lengths, V, 4, 2, bonus, end_margin=margin)
    return found, ctc.steps


@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_a_search_with_a_length_bonus_stops_soon_after_the_speech_with_the_same_nbest(kind: str) -> None:
    """8 spoken tokens in 42 frames: never stopped, the search takes 39 steps (until no hypothesis fits the
    frames); stopped by the margin, a few past the 9th (the end), and it finds the same two best hypotheses with the
    same scores."""
    log_probs = spiky_log_probs(3, 8, 10, seed=0)
    exhaustive, all_steps = search(kind, log_probs, 1.0, INF)
    stopped, steps = search(kind, log_probs, 1.0, END_MARGIN)
    assert steps <= 15 < 30 <= all_steps
    for e, s in zip(exhaustive, stopped, strict=True):
        assert [tokens for tokens, _ in s] == [tokens for tokens, _ in e]
        assert [score for _, score in s] == pytest.approx([score for _, score in e], abs=1e-5)
    assert all(len(hyps[0][0]) == 8 for hyps in stopped)


@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_without_a_bonus_the_margin_plays_no_part(kind: str) -> None:
    log_probs = spiky_log_probs(2, 6, 10, seed=1)
    assert search(kind, log_probs, 0.0, INF) == search(kind, log_probs, 0.0, 0.0)
