"""The windowed CTC prefix scorer and the key-value cached decoder scorer against their unwindowed, uncached
references: equal hypotheses and scores where the window covers every frame, and where it matters but the best
path lies inside it."""

from __future__ import annotations

import math

import pytest
import torch

from srupp_asr.decoder import TransformerDecoder
from srupp_asr.decoding.beam_search import beam_search
from srupp_asr.decoding.scorers import CTCPrefixScorer, DecoderScorer
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
