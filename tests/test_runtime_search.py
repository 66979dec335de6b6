"""The numpy beam search and CTC prefix scorer of srupp_asr.runtime.search against their torch references
(srupp_asr.decoding): the same scores, hypotheses and ties, and no torch imported."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

import srupp_asr.runtime.search as runtime
from srupp_asr.decoding import beam_search as torch_search
from srupp_asr.decoding import scorers as torch_scorers

V = 12  # vocabulary of the random tests: blank, unk, <sos/eos> and 9 tokens


class NumpyBigram:
    """A stand-in full scorer: ``log P(token | last token)`` from a fixed table."""

    full = True

    def __init__(self, table: np.ndarray) -> None:
        self.table = table

    def init_state(self, utterances: np.ndarray) -> None:
        return None

    def score(self, state: None, ys: np.ndarray, candidates: np.ndarray | None) -> tuple[np.ndarray, None]:
        return self.table[ys[:, -1]], None

    def select(self, state: None, rows: np.ndarray, tokens: np.ndarray | None, pending: None) -> None:
        return None


class TorchBigram(NumpyBigram):
    """:class:`NumpyBigram` over tensors."""

    def __init__(self, table: np.ndarray) -> None:
        self.table = torch.from_numpy(table)


def random_log_probs(B: int, T: int, scale: float, seed: int) -> np.ndarray:
    """float32 log-softmax of Gaussian logits times ``scale`` (computed by torch, as the reference sees them)."""
    logits = scale * np.random.default_rng(seed).standard_normal((B, T, V)).astype(np.float32)
    return torch.from_numpy(logits).log_softmax(-1).numpy()


def search_both(
    log_probs: np.ndarray,
    lengths: np.ndarray,
    table: np.ndarray | None,
    beam: int,
    max_lengths: np.ndarray | None = None,
    **options,
) -> tuple[list, list]:
    """The n-best lists of the torch and the numpy search, CTC alone (``table`` None) or CTC and the bigram."""
    ctc_weight = 1.0 if table is None else 0.4
    reference = [(torch_scorers.CTCPrefixScorer(torch.from_numpy(log_probs), torch.from_numpy(lengths)), ctc_weight)]
    ported = [(runtime.CTCPrefixScorer(log_probs, lengths), ctc_weight)]
    if table is not None:
        reference.append((TorchBigram(table), 0.6))
        ported.append((NumpyBigram(table), 0.6))
    max_lengths = lengths if max_lengths is None else max_lengths
    B, _, vocab = log_probs.shape
    expected = torch_search.beam_search(reference, B, torch.from_numpy(max_lengths), vocab, beam, **options)
    got = runtime.beam_search(ported, B, max_lengths, vocab, beam, **options)
    return expected, got


def assert_same_nbest(expected: list, got: list) -> None:
    for e, g in zip(expected, got, strict=True):
        assert [tokens for tokens, _ in g] == [tokens for tokens, _ in e]
        assert [score for _, score in g] == pytest.approx([score for _, score in e], abs=1e-4)


def test_runtime_search_imports_no_torch() -> None:
    code = "import sys, srupp_asr.runtime.search; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_constants_are_the_torch_ones() -> None:
    assert runtime.PRE_BEAM_RATIO == torch_search.PRE_BEAM_RATIO
    assert runtime.WINDOW_THRESHOLD == torch_scorers.WINDOW_THRESHOLD
    assert torch_scorers.WINDOW_BLOCK["loop"] == runtime.WINDOW_BLOCK  # (the numpy port runs the loop)
    assert (runtime.BLANK_ID, runtime.SOS_EOS_ID) == (torch_scorers.BLANK_ID, torch_scorers.SOS_EOS_ID)


def test_topk_orders_as_torch_topk_ties_included() -> None:
    """Rows of few distinct values (ties everywhere), NaN and infinities, in both of torch's regimes (a partial
    sort where 64 k <= n, else nth_element and a sort): the same indices, but where the value is -inf."""
    rng = np.random.default_rng(0)
    for n in (1, 3, 5, 17, 40, 160, 641, 2550):
        for k in sorted({k for k in (1, 2, 10, 17, n if n <= 160 else 40) if k <= n}):
            for levels in (1, 3, 50):
                values = rng.integers(0, levels, (4, n)).astype(np.float32)
                u = rng.random((4, n))
                values[u < 0.15] = -np.inf
                values[u > 0.95] = np.nan
                values[(u > 0.9) & (u < 0.92)] = np.inf
                expected = torch.from_numpy(values).topk(k, dim=1)
                got = runtime._topk(values, k)
                np.testing.assert_array_equal(np.take_along_axis(values, got, 1), expected.values.numpy())
                chosen = expected.values.numpy() > -np.inf
                chosen |= np.isnan(expected.values.numpy())
                np.testing.assert_array_equal(got[chosen], expected.indices.numpy()[chosen])


@pytest.mark.parametrize("threshold", [40.0, 3.0, math.inf])
@pytest.mark.parametrize("seed", range(2))
def test_ctc_prefix_scorer_matches_torch(threshold: float, seed: int) -> None:
    """20 steps over 3 utterances of different lengths (one of 3 frames: shorter than the prefixes, one with a NaN
    frame), 4 rows each, candidates a top-k of random scores and <sos/eos>, rows reordered and duplicated by each
    select and an utterance dropped halfway: equal scores (-inf and NaN in the same places), windows and frames."""
    rng = np.random.default_rng(seed)
    B, T, W, K = 3, 30, 4, 6
    log_probs = random_log_probs(B, T, scale=3.0, seed=seed)
    log_probs[0, 7] = np.nan
    lengths = np.array([T, 17, 3])
    reference = torch_scorers.CTCPrefixScorer(
        torch.from_numpy(log_probs), torch.from_numpy(lengths), window_threshold=threshold
    )
    ported = runtime.CTCPrefixScorer(log_probs, lengths, window_threshold=threshold)
    utterances = np.repeat(np.arange(B), W)
    expected_state, state = reference.init_state(torch.from_numpy(utterances)), ported.init_state(utterances)
    ys = np.full((B * W, 1), runtime.SOS_EOS_ID)
    for step in range(20):
        N = ys.shape[0]
        top = np.argsort(-rng.random((N, V - 3)), 1)[:, : K - 1] + 3
        candidates = np.concatenate([top, np.full((N, 1), runtime.SOS_EOS_ID)], 1)
        expected, expected_pending = reference.score(expected_state, torch.from_numpy(ys), torch.from_numpy(candidates))
        got, pending = ported.score(state, ys, candidates)
        expected = expected.numpy()
        assert got.dtype == np.float32
        np.testing.assert_array_equal(np.isneginf(got), np.isneginf(expected))
        np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
        finite = np.isfinite(expected)
        np.testing.assert_allclose(got[finite], expected[finite], rtol=0, atol=1e-4)
        assert ported.frames_computed == reference.frames_computed
        rows = rng.integers(0, N, N)
        tokens = candidates[rows, rng.integers(0, K, N)]
        ys = np.concatenate([ys[rows], tokens[:, None]], 1)
        expected_state = reference.select(
            expected_state, torch.from_numpy(rows), torch.from_numpy(tokens), expected_pending
        )
        state = ported.select(state, rows, tokens, pending)
        if step == 10:  # the search dropping the rows of utterance 1
            rows = np.flatnonzero(state.utterances != 1)
            ys = ys[rows]
            expected_state = reference.select(expected_state, torch.from_numpy(rows), None, None)
            state = ported.select(state, rows, None, None)
        assert (state.lo, state.r.shape) == (expected_state.lo, tuple(expected_state.r.shape))
        np.testing.assert_array_equal(state.utterances, expected_state.utterances.numpy())


def test_ctc_prefix_scorer_scores_candidates_only() -> None:
    scorer = runtime.CTCPrefixScorer(random_log_probs(1, 4, 1.0, 0), np.array([4]))
    with pytest.raises(ValueError, match="candidate tokens only"):
        scorer.score(scorer.init_state(np.array([0])), np.full((1, 1), runtime.SOS_EOS_ID), None)


# (n-best, length penalty, maximum length): each search runs them all
OPTIONS = [(1, 0.0, None), (3, -0.3, 4), (3, 0.5, None), (1, 0.5, 3)]


@pytest.mark.parametrize("beam", [1, 4, 10])
@pytest.mark.parametrize("B", [1, 5])
@pytest.mark.parametrize("with_bigram", [False, True])
def test_beam_search_matches_torch(with_bigram: bool, B: int, beam: int) -> None:
    """Random log-probabilities of utterances of different lengths (one with a NaN frame), with CTC alone and with
    CTC and a bigram (one of whose scores is NaN): the same n-best lists and scores."""
    rng = np.random.default_rng(beam + 10 * B)
    T = 16
    log_probs = random_log_probs(B, T, scale=2.0, seed=beam + B)
    lengths = np.concatenate([[T], rng.integers(1, T + 1, B - 1)])
    log_probs[-1, lengths[-1] // 2] = np.nan
    table = None
    if with_bigram:
        table = torch.from_numpy(rng.standard_normal((V, V)).astype(np.float32)).log_softmax(-1).numpy()
        table[4, 5] = np.nan
    for nbest, length_penalty, max_length in OPTIONS:
        max_lengths = None if max_length is None else np.minimum(lengths, max_length)
        expected, got = search_both(
            log_probs, lengths, table, beam, max_lengths, nbest=nbest, length_penalty=length_penalty
        )
        assert_same_nbest(expected, got)


@pytest.mark.parametrize("beam", [1, 4, 10])
@pytest.mark.parametrize("B", [1, 3])
@pytest.mark.parametrize("kind", ["uniform", "uniform with bigram", "twin tokens with bigram"])
def test_beam_search_breaks_ties_as_torch(kind: str, B: int, beam: int, monkeypatch) -> None:
    """Exact ties: every token equally likely at every frame (every prefix of a length ties with its permutations),
    and two tokens whose CTC columns and bigram scores are the same (not with CTC alone: there torch's own scores
    of the twins differ in the last bit, its vectorised and scalar log-add-exp rounding differently). The same
    n-best lists in the same order, from the same choices among tied hypotheses (index order fails every case).

    Every selection the numpy search makes is torch.topk's on the same values. The twins' scores pass through
    float32 exp and log1p, which numpy and torch may round differently in the last bit on some CPUs (numpy 2.4 on
    AVX2 does), and a bit decides which scores tie: there the two n-best lists are the same hypotheses up to the
    twins' symmetry (exchanging tokens 3 and 4 changes no score)."""
    T = 10
    rng = np.random.default_rng(B + beam)
    if kind.startswith("uniform"):
        log_probs = np.full((B, T, V), -math.log(V), dtype=np.float32)
        table = np.full((V, V), -math.log(V), dtype=np.float32) if kind.endswith("bigram") else None
    else:
        logits = 2.0 * rng.standard_normal((B, T, V)).astype(np.float32)
        logits[:, :, 3] += 2.0  # (so that the twins compete for the best places)
        logits[:, :, 4] = logits[:, :, 3]
        log_probs = torch.from_numpy(logits).log_softmax(-1).numpy()
        table = rng.standard_normal((V, V)).astype(np.float32)
        table[:, 3] = table.max(1) + 0.5  # (the twins are the bigram's favourites)
        table[:, 4], table[4] = table[:, 3], table[3]
        table = torch.from_numpy(table).log_softmax(-1).numpy()
    emulated, original = [], runtime._libstdcxx_topk
    monkeypatch.setattr(runtime, "_libstdcxx_topk", lambda *a: emulated.append(1) or original(*a))
    selections, topk = [], runtime._topk
    monkeypatch.setattr(runtime, "_topk", lambda values, k: selections.append((values, k)) or topk(values, k))
    expected, got = search_both(log_probs, np.full(B, T), table, beam, nbest=3)
    for values, k in selections:
        np.testing.assert_array_equal(topk(values, k), torch.from_numpy(values).topk(k, dim=1).indices.numpy())
    if kind.startswith("twin"):
        twin = np.arange(V)
        twin[4] = 3
        expected, got = ([[(twin[t].tolist(), s) for t, s in hyps] for hyps in nbest] for nbest in (expected, got))
    assert_same_nbest(expected, got)
    assert emulated  # the ties reached torch's order
