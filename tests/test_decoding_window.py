"""The windowed CTC prefix scorer and the key-value cached decoder scorer against their unwindowed, uncached
references: equal hypotheses and scores where the window covers every frame, and where it matters but the best
path lies inside it."""

from __future__ import annotations

import math

import pytest
import torch

from srupp_asr.decoder import TransformerDecoder
from srupp_asr.decoding import scorers
from srupp_asr.decoding.beam_search import beam_search
from srupp_asr.decoding.scorers import CTCPrefixScorer, DecoderScorer, forward_block
from srupp_asr.model import BLANK_ID, SOS_EOS_ID


def random_log_probs(B: int, T: int, V: int, scale: float, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(B, T, V, generator=gen)).log_softmax(-1)


def spoken_log_probs(tokens: list[int], V: int, seed: int, pause_at: int = -1, pause: int = 0) -> torch.Tensor:
    """A confident model's outputs for ``tokens``: each token spikes at one frame, blanks around it, with noise;
    a pause of ``pause`` blank frames after token ``pause_at``."""
    gen = torch.Generator().manual_seed(seed)
    frames = []
    for i, token in enumerate(tokens):
        gap = 3 + int(torch.randint(0, 3, (1,), generator=gen)) + (pause if i == pause_at else 0)
        frames += [BLANK_ID] * gap + [token]
    frames += [BLANK_ID] * 4
    logits = 2.0 * torch.randn(len(frames), V, generator=gen)
    logits[torch.arange(len(frames)), torch.tensor(frames)] += 9.0
    return logits.log_softmax(-1)[None]


def search(log_probs: torch.Tensor, lengths: torch.Tensor, threshold: float, beam: int = 4, **kwargs):
    """CTC-only label-synchronous search (every token a candidate) and the most frames one step computed."""
    scorer = CTCPrefixScorer(log_probs, lengths, window_threshold=threshold)
    widest = []
    score = scorer.score

    def counted(*args):
        out = score(*args)
        widest.append(scorer.frames_computed)
        return out

    scorer.score = counted
    B, _, V = log_probs.shape
    hyps = beam_search([(scorer, 1.0)], B, lengths, V, beam, nbest=beam, **kwargs)
    return hyps, max(widest)


@pytest.mark.parametrize("seed", range(4))
def test_window_covering_every_frame_gives_the_unwindowed_search(seed: int) -> None:
    """Short, uncertain outputs: every prefix' forward variables stay within the threshold over the whole
    utterance, so the window is every frame and the n-best lists equal the unwindowed ones."""
    log_probs = random_log_probs(3, 12, 6, scale=1.0, seed=seed)
    lengths = torch.tensor([12, 9, 5])
    exact, _ = search(log_probs, lengths, math.inf)
    windowed, _ = search(log_probs, lengths, 40.0)
    for e, w in zip(exact, windowed, strict=True):
        assert [y for y, _ in w] == [y for y, _ in e]
        assert [s for _, s in w] == pytest.approx([s for _, s in e], abs=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_window_that_matters_keeps_the_best_paths(seed: int) -> None:
    """A long confident utterance with a long pause: each step computes the frames of a few tokens (and the pause
    where a prefix ends in it), far fewer than the utterance's, and the n-best lists and scores are the unwindowed
    ones."""
    gen = torch.Generator().manual_seed(100 + seed)
    tokens = [int(t) for t in torch.randint(2, 12, (120,), generator=gen)]
    log_probs = spoken_log_probs(tokens, 12, seed, pause_at=60, pause=60)
    T = log_probs.shape[1]
    lengths = torch.tensor([T])
    exact, exact_widest = search(log_probs, lengths, math.inf)
    windowed, widest = search(log_probs, lengths, 40.0)
    assert exact_widest >= T - 10  # the unwindowed scorer walks the rest of the utterance at every step
    # The window: the pause (60 frames) and the frames of the few tokens (of about 5 frames each) around a prefix'
    # end within the threshold, whatever the length of the utterance.
    assert widest < 160 < T / 4
    assert [y for y, _ in windowed[0]] == [y for y, _ in exact[0]]
    assert [s for _, s in windowed[0]] == pytest.approx([s for _, s in exact[0]], rel=1e-5)


def test_a_prefix_whose_window_ended_still_ends_with_its_unwindowed_score() -> None:
    """Ending after the first tokens of a long confident utterance (as the maximum length forces): the prefix'
    forward variables at the last frame lie far below their peak, outside its window; carried on from the window
    in closed form they give a finite ``<eos>`` score no higher than the unwindowed one, and the next token's
    score is the same."""
    tokens = [3, 4, 5, 6, 7, 8, 9, 10, 3, 4, 5]
    log_probs = spoken_log_probs(tokens, 12, 0, pause_at=5, pause=30)
    lengths = torch.tensor([log_probs.shape[1]])
    for prefix in ([3], [3, 4], [3, 4, 5, 6, 7, 8]):
        out = {}
        for threshold in (math.inf, 40.0):
            scorer = CTCPrefixScorer(log_probs, lengths, window_threshold=threshold)
            state, ys = scorer.init_state(torch.tensor([0])), torch.tensor([[SOS_EOS_ID]])
            for token in prefix:
                _, pending = scorer.score(state, ys, torch.tensor([[token, SOS_EOS_ID]]))
                state = scorer.select(state, torch.tensor([0]), torch.tensor([token]), pending)
                ys = torch.cat([ys, torch.tensor([[token]])], 1)
            delta, _ = scorer.score(state, ys, torch.tensor([[tokens[len(prefix)], SOS_EOS_ID]]))
            out[threshold] = delta[0].tolist()
            if threshold != math.inf:
                assert state.lo + state.r.shape[0] < lengths[0]  # the window ended before the last frame
        assert out[math.inf][1] < -40.0, prefix  # ending here is unlikely
        assert out[40.0][0] == pytest.approx(out[math.inf][0], rel=1e-5), prefix
        # Ending: possible, but without the paths the windows pruned (each e^-40 below its prefix' best frame,
        # which here is about the ending probability itself): less likely, never more.
        assert -math.inf < out[40.0][1] <= out[math.inf][1] + 1e-4, prefix


def reference_block(carry, phi, x, x_blank):
    """The two recursions frame by frame in float64 with Python's math, one column at a time."""

    def lae(a: float, b: float) -> float:
        if a == -math.inf and b == -math.inf:
            return -math.inf
        m = max(a, b)
        return m + math.log(math.exp(a - m) + math.exp(b - m))

    F, N, K = x.shape
    out = torch.empty(F, 2, N, K, dtype=torch.float64)
    for n in range(N):
        for k in range(K):
            r_n, r_b = float(carry[0, n, k]), float(carry[1, n, k])
            for t in range(F):
                p = float(phi[t, n, k]) if t < phi.shape[0] else -math.inf
                r_n, r_b = lae(r_n, p) + float(x[t, n, k]), lae(r_b, r_n) + float(x_blank[t, n, k])
                out[t, 0, n, k], out[t, 1, n, k] = r_n, r_b
    return out


def block_inputs(P: int):
    """Random inputs of :func:`forward_block` (30 frames, 3 rows, 4 candidates, ``P`` frames of phi) with -inf where
    a broken model or an impossible prefix puts them."""
    gen = torch.Generator().manual_seed(P)
    F, N, K = 30, 3, 4
    logits = 3.0 * torch.randn(F, N, K + 1, generator=gen)
    probs = logits.log_softmax(-1)
    x, x_blank = probs[..., :K].contiguous(), probs[..., K:].expand(F, N, K).contiguous()
    x[4:9, 1, 2] = -math.inf  # one candidate impossible for five frames: only paths that start after them live
    x[:, 2, 3] = -math.inf  # and one never possible
    phi = (torch.randn(P, N, K, generator=gen).cumsum(0) - 15.0).clamp(max=0.0)
    phi[:, 0, 0] = -math.inf
    carry = torch.randn(2, N, K, generator=gen) - 8.0
    carry[0, 0, 1] = -math.inf
    carry[:, 0, 0] = -math.inf  # (with phi -inf too: the whole column is impossible)
    return carry, phi, x, x_blank


@pytest.mark.parametrize("P", [0, 5, 30])
def test_both_ways_of_running_the_frames_give_the_float64_recursion(P: int) -> None:
    """The loop and the closed form (cumulative log-sum-exps) of :func:`forward_block` against the recursions
    run frame by frame in float64: within float32 rounding, -inf exactly where the reference is, also where a
    log-probability is -inf (a broken model's) and where the carry or phi is."""
    carry, phi, x, x_blank = block_inputs(P)
    F, N, K = x.shape
    expected = reference_block(carry, phi, x, x_blank)
    for recursion in ("loop", "scan"):
        got = forward_block(carry, phi, x, x_blank, recursion)
        assert got.dtype == torch.float32 and got.shape == (F, 2, N, K)
        assert torch.equal(got.isneginf(), expected.isneginf()), recursion
        finite = expected.isfinite()
        assert finite[:, :, 0, 0].sum() == 0 and finite.sum() > F * 2 * N * K // 2
        assert torch.allclose(got[finite].double(), expected[finite], rtol=1e-6, atol=1e-4), recursion
    with pytest.raises(ValueError, match="recursion"):
        forward_block(carry, phi, x, x_blank, "unrolled")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("P", [0, 5, 30])
def test_the_scan_on_a_gpu_gives_the_float64_recursion(P: int) -> None:
    """What a GPU's search runs (the scan, float64 on the device) against the same reference."""
    carry, phi, x, x_blank = block_inputs(P)
    expected = reference_block(carry, phi, x, x_blank)
    got = forward_block(*(t.cuda() for t in (carry, phi, x, x_blank)), "scan").cpu()
    assert torch.equal(got.isneginf(), expected.isneginf())
    finite = expected.isfinite()
    assert torch.allclose(got[finite].double(), expected[finite], rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize("seed", range(2))
def test_the_search_gives_the_same_hypotheses_with_either_way_of_running_the_frames(monkeypatch, seed: int) -> None:
    """The whole windowed search (a long confident utterance with a pause) with the CTC frames looped and in
    closed form: the same n-best lists, the scores within float32 rounding."""
    gen = torch.Generator().manual_seed(200 + seed)
    tokens = [int(t) for t in torch.randint(2, 12, (60,), generator=gen)]
    log_probs = spoken_log_probs(tokens, 12, seed, pause_at=30, pause=40)
    lengths = torch.tensor([log_probs.shape[1]])
    out = {}
    for recursion in ("loop", "scan"):
        monkeypatch.setattr(scorers, "CTC_RECURSION", recursion)
        out[recursion], _ = search(log_probs, lengths, 40.0)
    assert [y for y, _ in out["scan"][0]] == [y for y, _ in out["loop"][0]]
    assert [s for _, s in out["scan"][0]] == pytest.approx([s for _, s in out["loop"][0]], rel=1e-5)


def test_bad_window_threshold_is_refused() -> None:
    with pytest.raises(ValueError, match="window_threshold"):
        CTCPrefixScorer(torch.zeros(1, 2, 3), torch.tensor([2]), window_threshold=0.0)


def test_cached_decoder_scorer_equals_the_decoders_score_step() -> None:
    """Token by token with reordered rows, the key-value cached scorer gives the decoder's own incremental scores."""
    torch.manual_seed(0)
    decoder = TransformerDecoder(20, d_model=32, num_layers=2, num_heads=4, ffn_dim=64, memory_dim=24).eval()
    memory, memory_lens = torch.randn(2, 15, 24), torch.tensor([15, 9])
    scorer = DecoderScorer(decoder, memory, memory_lens)
    utterances = torch.tensor([0, 0, 1, 1])
    state = scorer.init_state(utterances)
    ys = torch.full((4, 1), SOS_EOS_ID)
    gen = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        for _ in range(6):
            log_probs, pending = scorer.score(state, ys, None)
            expected, _ = decoder.score_step(memory[utterances], memory_lens[utterances], ys)
            assert torch.allclose(log_probs, expected, atol=1e-5)
            rows = torch.tensor([1, 0, 2, 2])  # reorder within each utterance, one row twice
            tokens = torch.randint(3, 20, (4,), generator=gen)
            state = scorer.select(state, rows, tokens, pending)
            ys = torch.cat([ys[rows], tokens[:, None]], 1)
            utterances = utterances[rows]
