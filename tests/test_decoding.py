"""Decoding a model trained in the session fixture (``overfit_model_dir``: a small SRU++ model that memorised 20
espeak-ng sentences): every mode gives the references, batches agree with single utterances, the modes agree with
each other where theory says they must, and the timestamps and words are consistent; the command line's decoding
settings. The last section checks decoding against independent references: brute-force enumeration of every label
path and every token sequence in float64, torchaudio's forced_align; and what decoding does with a model whose
outputs hold NaN (a broken checkpoint, an overflow), which must neither hang nor crash nor spill onto the rest of a
batch."""

from __future__ import annotations

import argparse
import contextlib
import copy
import itertools
import math
import signal
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import torchaudio.functional as taf

from srupp_asr.audio import load_audio
from srupp_asr.decoding import MODES, DecodingOptions, Hypothesis, decode, decode_encoded
from srupp_asr.decoding.alignment import align_hypothesis, token_spans
from srupp_asr.decoding.prefix_beam import ctc_prefix_beam_search
from srupp_asr.decoding.settings import add_decoding_arguments, batch_size_for, check_batch_size
from srupp_asr.errors import UserError
from srupp_asr.model import BLANK_ID, SOS_EOS_ID, ASRModel
from srupp_asr.model_dir import load_model_dir
from srupp_asr.text import normalize_text

# The fixture model is trained with ctc_weight 0.5 and stops as soon as greedy CTC is exact, when its attention
# decoder alone still slips on a few doubled letters; joint decoding and rescoring use the training weight.
TRAINED_CTC_WEIGHT = 0.5


@pytest.fixture(scope="module")
def overfit(overfit_model_dir: tuple[Path, list[tuple[Path, str]]]):
    """(model, tokenizer, padded audio, audio lengths, reference texts) of the overfit model's utterances."""
    model_dir, utterances = overfit_model_dir
    model, tokenizer = load_model_dir(model_dir)
    waves = [torch.from_numpy(load_audio(path)) for path, _ in utterances]  # numpy arrays, for the torch model
    lens = torch.tensor([w.numel() for w in waves])
    audio = torch.zeros(len(waves), int(lens.max()))
    for i, w in enumerate(waves):
        audio[i, : w.numel()] = w
    return model, tokenizer, audio, lens, [text for _, text in utterances]


def options_for(mode: str, **kwargs) -> DecodingOptions:
    """The test's options for ``mode``: the default beam (10), the training's CTC weight."""
    return DecodingOptions(mode=mode, ctc_weight=TRAINED_CTC_WEIGHT, **kwargs)


@pytest.fixture(scope="module")
def batched(overfit) -> dict[str, list[Hypothesis]]:
    """Every mode's hypotheses for all utterances decoded as one batch."""
    model, tokenizer, audio, lens, _ = overfit
    return {mode: decode(model, tokenizer, audio, lens, options_for(mode)) for mode in MODES}


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_transcribes_the_memorised_utterances_exactly(batched, overfit, mode: str) -> None:
    """Each mode's text is the reference for all 20 utterances."""
    texts = overfit[4]
    wrong = [(ref, h.text) for ref, h in zip(texts, batched[mode], strict=True) if h.text != normalize_text(ref)]
    assert not wrong


@pytest.mark.parametrize("mode", MODES)
def test_batched_decoding_equals_one_utterance_at_a_time(batched, overfit, mode: str) -> None:
    """Decoding each utterance alone gives the same tokens, scores (1e-4) and token times as the padded batch."""
    model, tokenizer, audio, lens, _ = overfit
    for b in range(audio.shape[0]):
        alone = decode(model, tokenizer, audio[b : b + 1, : lens[b]], lens[b : b + 1], options_for(mode))[0]
        together = batched[mode][b]
        assert alone.tokens == together.tokens
        assert alone.score == pytest.approx(together.score, abs=1e-4)
        assert alone.token_times == together.token_times


def test_joint_search_with_ctc_weight_1_finds_the_prefix_beam_search_best(overfit) -> None:
    """Joint search scored by CTC alone ends with the prefix beam search's best labelling, scored by its exact
    total CTC probability (the prefix beam's own score can only miss paths it pruned)."""
    model, tokenizer, audio, lens, _ = overfit
    joint = decode(model, tokenizer, audio, lens, DecodingOptions(mode="joint", ctc_weight=1.0))
    prefix = decode(model, tokenizer, audio, lens, DecodingOptions(mode="ctc_prefix_beam"))
    assert [h.tokens for h in joint] == [h.tokens for h in prefix]
    with torch.inference_mode():
        enc, enc_lens = model.encode(audio, lens)
        log_probs = model.ctc_log_probs(enc)
    for b, (j, p) in enumerate(zip(joint, prefix, strict=True)):
        exact = -F.ctc_loss(
            log_probs[b, : enc_lens[b], None], torch.tensor([j.tokens]), enc_lens[b : b + 1],
            torch.tensor([len(j.tokens)]), reduction="sum",
        ).item()  # fmt: skip
        assert j.score == pytest.approx(exact, abs=1e-4)
        assert p.score <= exact + 1e-4


def greedy_attention(model: ASRModel, enc: torch.Tensor, enc_lens: torch.Tensor) -> tuple[list[int], float]:
    """Greedy attention decoding of one utterance, naively: the full teacher-forced decoder pass at every step;
    at the maximum length (one token per encoder frame) the hypothesis is ended by <sos/eos>."""
    ys, score = [SOS_EOS_ID], 0.0
    while True:
        logits = model.decoder(enc, enc_lens, torch.tensor([ys]), torch.tensor([len(ys)]))
        log_probs = logits[0, -1].log_softmax(-1)
        token = SOS_EOS_ID if len(ys) - 1 == int(enc_lens[0]) else int(log_probs.argmax())
        score += float(log_probs[token])
        if token == SOS_EOS_ID:
            return ys[1:], score
        ys.append(token)


def test_joint_search_with_beam_1_and_no_ctc_is_greedy_attention_decoding(overfit) -> None:
    """With one hypothesis and ``ctc_weight=0`` the search is the decoder's argmax at every step."""
    model, tokenizer, audio, lens, _ = overfit
    with torch.inference_mode():
        enc, enc_lens = model.encode(audio, lens)
        hyps = decode_encoded(model, tokenizer, enc, enc_lens, DecodingOptions(mode="joint", beam=1, ctc_weight=0.0))
        for b, nbest in enumerate(hyps):
            tokens, score = greedy_attention(model, enc[b : b + 1, : enc_lens[b]], enc_lens[b : b + 1])
            assert nbest[0].tokens == tokens
            assert nbest[0].score == pytest.approx(score, abs=1e-4)


def test_prefix_beam_search_agrees_with_flashlight_on_the_model_outputs(overfit) -> None:
    """On the model's CTC log-probabilities flashlight-text's lexicon-free decoder finds the same best labellings."""
    from torchaudio.models.decoder import ctc_decoder

    model, _, audio, lens, _ = overfit
    with torch.inference_mode():
        enc, enc_lens = model.encode(audio, lens)
        log_probs = model.ctc_log_probs(enc)
    V = log_probs.shape[-1]
    tokens = ["<blank>"] + [f"t{i}" for i in range(1, V)] + ["|"]  # pieces may repeat; ids are what count
    flashlight = ctc_decoder(
        lexicon=None, tokens=tokens, lm=None, beam_size=10, beam_size_token=V, beam_threshold=1e9, log_add=True,
        blank_token="<blank>", sil_token="|",
    )  # fmt: skip
    emissions = torch.cat([log_probs, torch.full((*log_probs.shape[:2], 1), -1e10)], -1)
    theirs = [[t for t in hyps[0].tokens.tolist() if t != V] for hyps in flashlight(emissions, enc_lens.int())]
    ours = [hyps[0][0] for hyps in ctc_prefix_beam_search(log_probs, enc_lens, beam=10)]
    assert ours == theirs


@pytest.mark.parametrize("mode", MODES)
def test_timestamps_are_ordered_inside_the_audio_and_words_spell_the_text(batched, overfit, mode: str) -> None:
    """Token times rise, words lie inside the audio in order with confidences in [0, 1], and the words joined by
    spaces are the hypothesis text."""
    lens = overfit[3]
    for hyp, samples in zip(batched[mode], lens.tolist(), strict=True):
        duration = samples / 16000
        assert len(hyp.token_times) == len(hyp.tokens)
        assert hyp.token_times == sorted(hyp.token_times) and len(set(hyp.token_times)) == len(hyp.token_times)
        assert " ".join(w.text for w in hyp.words) == hyp.text
        previous_end = 0.0
        for word in hyp.words:
            assert previous_end <= word.start < word.end <= duration
            assert 0.5 < word.confidence <= 1.0  # a memorised utterance: confident
            previous_end = word.end


def test_alignment_gives_token_spans_word_times_and_peak_posterior_confidence(overfit) -> None:
    """On log-probabilities built around a known path, tokens start where the path first emits them, words span
    their first token's start to their last token's end, and a word's confidence is the mean of its tokens' peak
    posteriors along the path."""
    tokenizer = overfit[1]
    tokens = tokenizer.encode("the sun")
    assert [tokenizer.id_to_piece(t) for t in tokens] == ["▁", "t", "h", "e", "▁", "s", "u", "n"]
    # Frames (label, probability of that label): blanks between, "e" held for two frames with different peaks.
    path = [(0, 0.9), *[(t, 0.9) for t in tokens[:3]], (0, 0.9), (tokens[3], 0.6), (tokens[3], 0.7), (0, 0.9)]
    path += [(t, 0.8) for t in tokens[4:]] + [(0, 0.9)] * 2
    V, T = tokenizer.vocab_size, len(path)
    probs = torch.full((T, V), 0.0)
    for t, (label, p) in enumerate(path):
        probs[t] = (1 - p) / (V - 1)
        probs[t, label] = p
    times, words = align_hypothesis(probs.log().numpy(), tokens, tokenizer, frame_shift=0.04, num_frames=T)
    starts = [1, 2, 3, 5, 8, 9, 10, 11]
    assert times == pytest.approx([0.04 * f for f in starts])
    assert [w.text for w in words] == ["the", "sun"]
    assert (words[0].start, words[0].end) == pytest.approx((0.04, 0.04 * 7))
    assert (words[1].start, words[1].end) == pytest.approx((0.04 * 8, 0.04 * 12))
    assert words[0].confidence == pytest.approx((0.9 * 3 + 0.7) / 4, abs=1e-5)
    assert words[1].confidence == pytest.approx(0.8, abs=1e-5)


def test_nbest_lists_are_distinct_and_best_first(overfit) -> None:
    """With ``nbest=3`` every beam mode returns three different hypotheses, sorted by score."""
    model, tokenizer, audio, lens, _ = overfit
    with torch.inference_mode():
        enc, enc_lens = model.encode(audio[:4], lens[:4])
    for mode in ("ctc_prefix_beam", "joint", "rescoring"):
        for nbest in decode_encoded(model, tokenizer, enc, enc_lens, options_for(mode, nbest=3)):
            assert len(nbest) == 3
            assert len({tuple(h.tokens) for h in nbest}) == 3
            assert [h.score for h in nbest] == sorted((h.score for h in nbest), reverse=True)


def test_joint_search_stops_at_the_maximum_length(overfit) -> None:
    """With ``maxlen_ratio`` no hypothesis has more than that share of the encoder frames in tokens."""
    model, tokenizer, audio, lens, _ = overfit
    with torch.inference_mode():
        enc, enc_lens = model.encode(audio[:3], lens[:3])
    options = DecodingOptions(mode="joint", ctc_weight=TRAINED_CTC_WEIGHT, maxlen_ratio=0.1)
    for nbest, frames in zip(decode_encoded(model, tokenizer, enc, enc_lens, options), enc_lens.tolist(), strict=True):
        assert 0 < len(nbest[0].tokens) <= int(0.1 * frames)


@pytest.mark.parametrize("mode", MODES)
def test_audio_too_short_for_one_frame_decodes_to_nothing(overfit, mode: str) -> None:
    """An utterance with no encoder frames, batched with a real one, gets the empty hypothesis; the other is intact."""
    model, tokenizer, audio, lens, texts = overfit
    short = torch.tensor([lens[0].item(), 300])
    hyps = decode(model, tokenizer, audio[:2, : lens[0]], short, options_for(mode))
    assert hyps[0].text == normalize_text(texts[0])
    assert hyps[1].tokens == [] and hyps[1].text == "" and hyps[1].words == [] and hyps[1].token_times == []


def tiny_model(**kwargs) -> ASRModel:
    """A small untrained model."""
    conf = {"d_model": 32, "num_layers": 1, "attn_dim": 16, "num_heads": 1}
    decoder = {"d_model": 16, "num_layers": 1, "num_heads": 1, "ffn_dim": 32}
    return ASRModel(vocab_size=8, d_model=32, encoder_conf=conf, decoder_conf=decoder, **kwargs).eval()


@pytest.mark.parametrize(("subsampling", "seconds"), [(4, 0.04), (6, 0.06), (8, 0.08)])
def test_frame_shift_follows_the_models_subsampling(subsampling: int, seconds: float) -> None:
    """10 ms filterbank frames times the subsampling factor."""
    assert tiny_model(subsampling=subsampling).frame_shift == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("model_ctc_weight", "options", "missing"),
    [
        (1.0, DecodingOptions(mode="joint", ctc_weight=0.3), "decoder"),
        (1.0, DecodingOptions(mode="rescoring"), "decoder"),
        (0.0, DecodingOptions(mode="ctc_greedy"), "CTC"),
        (0.0, DecodingOptions(mode="joint", ctc_weight=0.3), "CTC"),
    ],
)
def test_a_mode_needing_a_head_the_model_lacks_is_refused(model_ctc_weight, options, missing) -> None:
    """A model trained without a decoder (or a CTC head) cannot decode with it: a ValueError says which."""
    model = tiny_model(ctc_weight=model_ctc_weight)
    with pytest.raises(ValueError, match=missing):
        decode(model, None, torch.zeros(1, 16000), torch.tensor([16000]), options)


def test_attention_only_model_decodes_with_joint_search_and_spread_times(overfit) -> None:
    """``joint`` with ``ctc_weight=0`` runs on a model without a CTC head; its tokens get evenly spread times."""
    tokenizer = overfit[1]
    model = tiny_model(ctc_weight=0.0)
    model.decoder.output.bias.data[3] = 50.0  # token 3 at every step; the length bonus keeps it to the limit
    options = DecodingOptions("joint", ctc_weight=0.0, length_penalty=1.0)
    hyp = decode(model, tokenizer, torch.zeros(1, 8000), torch.tensor([8000]), options)[0]
    frames = int(model.encode(torch.zeros(1, 8000), torch.tensor([8000]))[1])
    assert hyp.tokens == [3] * frames
    assert hyp.token_times == pytest.approx([0.04 * f for f in range(frames)])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", MODES)
def test_cuda_decoding_equals_cpu_decoding(batched, overfit, mode: str) -> None:
    """On the GPU every mode gives the CPU's hypotheses, and with float32 arithmetic throughout (cuDNN's TF32
    convolutions turned off: they round the subsampling's inputs to 10 mantissa bits) the scores agree to float32
    rounding summed over the frames: 1e-5 per frame. With TF32 on, an H100 gave a greedy score 1.26e-3 away from
    the CPU's on a ~100-frame utterance (2026-11-25 and 2026-11-28)."""
    model, tokenizer, audio, lens, _ = overfit
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        gpu = decode(model.to("cuda"), tokenizer, audio, lens, options_for(mode))
    model.to("cpu")
    frames = int(lens.max()) / 16000 / model.frame_shift  # encoder frames of the longest utterance
    assert [h.tokens for h in gpu] == [h.tokens for h in batched[mode]]
    assert [h.score for h in gpu] == pytest.approx([h.score for h in batched[mode]], rel=1e-5, abs=1e-5 * frames)


# ------------------------------------------------------- the command line's settings (srupp_asr.decoding.settings)


def test_the_cli_offers_every_decoding_mode():
    parser = argparse.ArgumentParser()
    add_decoding_arguments(parser, batch_help="utterances decoded together")
    choices = next(a.choices for a in parser._actions if a.dest == "decoding")
    assert tuple(choices) == MODES


def test_the_batch_size_defaults_to_the_devices_and_is_checked(monkeypatch):
    """No --batch-size: 8 recordings a batch on a CPU, 32 on a GPU (where a step costs its launches whatever the
    batch); a given one is kept on either; below 1 is one line. transcribe() resolves it on its loaded device."""
    parser = argparse.ArgumentParser()
    add_decoding_arguments(parser, batch_help="utterances decoded together")
    assert parser.parse_args([]).batch_size is None
    assert batch_size_for(None, torch.device("cpu")) == 8 and batch_size_for(None, "cpu") == 8
    assert batch_size_for(None, torch.device("cuda", 0)) == 32 == batch_size_for(None, "cuda")
    assert batch_size_for(3, "cuda") == 3 == batch_size_for(3, "cpu")
    check_batch_size(None)
    with pytest.raises(UserError, match="--batch-size must be at least 1, got 0"):
        check_batch_size(0)


# ---------------------------- against independent references: brute force in float64, torchaudio; NaN outputs


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


def untrained_model(vocab: int = 8, seed: int = 0) -> ASRModel:
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
    model = untrained_model()
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
    assert token_spans(blocked.numpy(), tokens) is None
    never = log_probs.clone()
    never[:, 3] = float("-inf")
    assert token_spans(never.numpy(), tokens) is None
    times, words = align_hypothesis(never.numpy(), tokens, TOKENIZER, frame_shift=0.04, num_frames=8)
    assert times == pytest.approx([0.0, 0.08, 0.2])  # 8 frames spread over 3 tokens: frames 0, 2, 5
    assert [(w.text, w.confidence) for w in words] == [("3 4 4", 0.0)]
    # -inf where the best path does not go changes nothing: the spans of forced_align on the original.
    other = log_probs.clone()
    other[:, 1] = float("-inf")
    path, scores = taf.forced_align(other[None], torch.tensor([tokens], dtype=torch.int32), blank=BLANK_ID)
    spans = taf.merge_tokens(path[0], scores[0].exp())
    starts, ends, peaks = token_spans(other.numpy(), tokens)
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
    model = untrained_model(V, seed=2)
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
