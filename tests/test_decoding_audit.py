"""Audit of srupp_asr.decoding against independent references: brute-force enumeration of every label path and
every token sequence in float64, torchaudio's forced_align; and what decoding does with a model whose outputs
hold NaN (a broken checkpoint, an overflow), which must neither hang nor crash nor spill onto the rest of a batch."""

from __future__ import annotations

import contextlib
import copy
import itertools
import math
import signal
import types
from collections.abc import Iterator

import pytest
import torch
import torchaudio.functional as taf

from srupp_asr.decoding import DecodingOptions, decode_encoded
from srupp_asr.decoding.alignment import align_hypothesis, token_spans
from srupp_asr.model import BLANK_ID, SOS_EOS_ID, ASRModel

TOKENIZER = types.SimpleNamespace(decode=lambda ids: " ".join(map(str, ids)), id_to_piece=str)


@contextlib.contextmanager
def within(seconds: float) -> Iterator[None]:
    """Raise TimeoutError in the block after ``seconds`` (a hung search fails the test instead of the run)."""

    def expire(*_):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def tiny_model(vocab: int = 8, seed: int = 0) -> ASRModel:
    """A small untrained model with a CTC head and a one-layer decoder, in eval mode."""
    torch.manual_seed(seed)
    decoder = {"d_model": 32, "num_layers": 1}
    return ASRModel(vocab, d_model=32, encoder_conf={"num_layers": 1, "attn_dim": 16}, decoder_conf=decoder).eval()


NAN_OPTIONS = [
    DecodingOptions("ctc_greedy"),
    DecodingOptions("ctc_prefix_beam", beam=3),
    DecodingOptions("joint", beam=3, ctc_weight=0.5),
    DecodingOptions("joint", beam=3, ctc_weight=0.0),
    DecodingOptions("rescoring", beam=3, ctc_weight=0.5),
]


@pytest.mark.parametrize("options", NAN_OPTIONS, ids=lambda o: f"{o.mode}-{o.ctc_weight}")
def test_a_nan_model_output_ends_every_mode_and_leaves_the_rest_of_the_batch_alone(options) -> None:
    # Was: one NaN encoder frame of utterance 0 (so NaN CTC log-probabilities at that frame and NaN attention
    # scores throughout) made `joint` with ctc_weight=0 loop forever (a NaN row is never ended, so the search ran
    # past its maximum length for ever), `joint` with ctc_weight=0.5 raise RuntimeError "upper bound and lower
    # bound inconsistent with step sign" in the CTC prefix scorer once it ran past the frames, `ctc_prefix_beam`
    # and `rescoring` return an empty n-best list (`decode` then raised IndexError), and `ctc_greedy` return score
    # NaN with word confidence NaN and a token taken from the NaN frame (or, on other inputs, raise IndexError in
    # forced_align, as below).
    model = tiny_model()
    enc = torch.randn(2, 6, model.encoder.output_size, generator=torch.Generator().manual_seed(1))
    enc[0, 2] = float("nan")
    lens = torch.tensor([6, 5])
    with within(20), torch.inference_mode():
        batch = decode_encoded(model, TOKENIZER, enc, lens, options)
        alone = decode_encoded(model, TOKENIZER, enc[1:, :5], lens[1:], options)[0]
    assert [(h.tokens, h.token_times) for h in batch[1]] == [(h.tokens, h.token_times) for h in alone]
    assert [h.score for h in batch[1]] == pytest.approx([h.score for h in alone], abs=1e-5)
    (hyp,) = batch[0]  # one hypothesis, never none; no possible labelling has a finite score
    assert hyp.score == float("-inf")
    if options.mode != "ctc_greedy":
        assert hyp.tokens == [] and hyp.words == []
    # ctc_greedy keeps the best path of the other frames; no path emits it, so its times are spread, unsure.
    assert len(hyp.token_times) == len(hyp.tokens)
    assert all(0.0 <= t < 6 * 0.04 for t in hyp.token_times)
    assert all(w.confidence == 0.0 for w in hyp.words)


def test_forced_alignment_of_an_impossible_hypothesis_is_none_and_times_are_spread() -> None:
    # Was: with no finite path, forced_align returns a path read from memory it never wrote: for a frame whose
    # log-probabilities are all -inf (a NaN output, once decoding maps it to -inf) spans through that frame
    # (starts [0, 2, 4], ends [2, 3, 8], peak posteriors up to 0.39), for a token whose log-probability is -inf at
    # every frame IndexError "index 32718 is out of bounds for dimension 1 with size 5" (the values vary by run).
    g = torch.Generator().manual_seed(3)
    log_probs = (torch.randn(8, 5, generator=g) * 2).log_softmax(-1)
    tokens = [3, 4, 4]
    blocked = log_probs.clone()
    blocked[4] = float("-inf")
    assert token_spans(blocked, tokens) is None
    never = log_probs.clone()
    never[:, 3] = float("-inf")
    assert token_spans(never, tokens) is None
    times, words = align_hypothesis(never, tokens, TOKENIZER, frame_shift=0.04, num_frames=8)
    assert times == pytest.approx([0.0, 0.08, 0.2])  # 8 frames spread over 3 tokens: frames 0, 2, 5
    assert [(w.text, w.confidence) for w in words] == [("3 4 4", 0.0)]
    # -inf where the best path does not go changes nothing: the spans of forced_align on the original.
    other = log_probs.clone()
    other[:, 1] = float("-inf")
    path, scores = taf.forced_align(other[None], torch.tensor([tokens], dtype=torch.int32), blank=BLANK_ID)
    spans = taf.merge_tokens(path[0], scores[0].exp())
    starts, ends, peaks = token_spans(other, tokens)
    assert (starts, ends) == ([s.start for s in spans], [s.end for s in spans])
    assert peaks == pytest.approx([float(scores[0, s.start : s.end].exp().max()) for s in spans])


def ctc_labelling_log_probs(log_probs: torch.Tensor) -> dict[tuple[int, ...], float]:
    """log P_ctc of every labelling, by summing over every one of the ``V ** T`` frame paths (float64)."""
    T, V = log_probs.shape
    lp = log_probs.double()
    totals: dict[tuple[int, ...], list[float]] = {}
    for path in itertools.product(range(V), repeat=T):
        labels = tuple(k for t, k in enumerate(path) if k != BLANK_ID and (t == 0 or path[t - 1] != k))
        totals.setdefault(labels, []).append(float(sum(lp[t, k] for t, k in enumerate(path))))
    return {y: torch.tensor(s, dtype=torch.float64).logsumexp(0).item() for y, s in totals.items()}


def attention_log_prob(decoder64: torch.nn.Module, memory: torch.Tensor, tokens: tuple[int, ...]) -> float:
    """log P_att(tokens + <sos/eos>) by one teacher-forced pass of a float64 copy of the decoder."""
    ys = torch.tensor([[SOS_EOS_ID, *tokens]])
    log_probs = decoder64(memory.double(), torch.tensor([memory.shape[1]]), ys, torch.tensor([ys.shape[1]]))
    log_probs = log_probs[0].log_softmax(-1)
    return sum(float(log_probs[i, t]) for i, t in enumerate([*tokens, SOS_EOS_ID]))


@pytest.mark.parametrize(
    ("ctc_weight", "length_penalty", "maxlen_ratio"),
    [(0.3, 0.0, 0.0), (0.5, 0.8, 0.0), (0.0, -0.5, 0.0), (1.0, 0.0, 0.0), (0.7, 0.3, 2.0)],
)
def test_joint_search_with_a_wide_beam_returns_the_brute_force_nbest(ctc_weight, length_penalty, maxlen_ratio) -> None:
    """Every token sequence up to the maximum length, scored from scratch in float64 (attention by a teacher-forced
    float64 decoder, CTC by summing all frame paths): a beam that holds them all returns the 4 best, in order,
    with their scores; utterances of 3 and 2 frames padded into one batch."""
    V = 5  # blank, <unk>, <sos/eos> and two more: the search's candidates are 1, 3 and 4
    model = tiny_model(V, seed=2)
    with torch.no_grad():  # peakier outputs than an untrained model's, so that the ranking is not a near-tie
        model.decoder.output.weight.mul_(8)
        model.ctc.weight.mul_(8)
    decoder64 = copy.deepcopy(model.decoder).double()
    enc = torch.randn(2, 3, model.encoder.output_size, generator=torch.Generator().manual_seed(4))
    lens = torch.tensor([3, 2])
    options = DecodingOptions(
        "joint", beam=40, nbest=4, ctc_weight=ctc_weight, length_penalty=length_penalty, maxlen_ratio=maxlen_ratio
    )
    with torch.inference_mode():
        found = decode_encoded(model, TOKENIZER, enc, lens, options)
        log_probs = model.ctc_log_probs(enc)
    candidates = [t for t in range(V) if t not in (BLANK_ID, SOS_EOS_ID)]
    for b, T in enumerate(lens.tolist()):
        ctc = ctc_labelling_log_probs(log_probs[b, :T])
        max_len = max(1, int(maxlen_ratio * T)) if maxlen_ratio else T
        scores = {}
        with torch.no_grad():
            for n in range(max_len + 1):
                for y in itertools.product(candidates, repeat=n):
                    c = ctc.get(y, -math.inf) if ctc_weight > 0 else 0.0
                    if c > -math.inf:  # (CTC cannot emit more tokens than frames)
                        att = attention_log_prob(decoder64, enc[b : b + 1, :T], y)
                        scores[y] = (1 - ctc_weight) * att + ctc_weight * c + length_penalty * n
        best = sorted(scores, key=lambda y: -scores[y])[:4]
        assert [tuple(h.tokens) for h in found[b]] == best, b
        assert [h.score for h in found[b]] == pytest.approx([scores[y] for y in best], abs=1e-4), b
