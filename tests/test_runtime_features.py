"""srupp_asr.runtime.features against the torch implementations it replaces: torchaudio's resampler (as audio.py
built it: ``Resample`` with a float32 kernel), ``frontend.Fbank`` in eval mode and ``frontend.GlobalCMVN``, on random
noise and espeak-ng speech; and that the module loads without torch."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio

from srupp_asr import audio, frontend
from srupp_asr.runtime import features

RATES = (8000, 11025, 22050, 44100, 48000)


def torch_resample(wav: np.ndarray, rate: int) -> np.ndarray:
    return torchaudio.transforms.Resample(rate, 16000, dtype=torch.float32)(torch.from_numpy(wav)).numpy()


def torch_fbank(wavs: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    feats, frames = frontend.Fbank().eval()(torch.from_numpy(wavs), torch.from_numpy(lengths))
    return feats.numpy(), frames.numpy()


def test_the_module_loads_without_torch() -> None:
    code = "import sys, srupp_asr.runtime.features; print(sorted(m for m in sys.modules if m.startswith('torch')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_window_and_mel_filters_are_kaldis() -> None:
    assert features.LOG_FLOOR == frontend.LOG_FLOOR and features.SAMPLE_RATE == audio.SAMPLE_RATE
    for n_mels in (80, 40):  # torchaudio's Kaldi filters (in float32; no Nyquist row)
        reference, _ = torchaudio.compliance.kaldi.get_mel_banks(n_mels, 512, 16000.0, 20.0, 0.0, 100.0, -500.0, 1.0)
        np.testing.assert_allclose(features.kaldi_mel_banks(n_mels)[:-1], reference.T.numpy(), atol=5e-5)  # float32
        assert not features.kaldi_mel_banks(n_mels)[-1].any()
    n = np.arange(400)
    np.testing.assert_allclose(features.povey_window(), (0.5 - 0.5 * np.cos(2 * np.pi * n / 399)) ** 0.85, atol=1e-7)


@pytest.mark.parametrize("rate", RATES)
@pytest.mark.parametrize("seconds", [1 / 8000, 3 / 8000, 7 / 8000, 0.1, 60.0])
def test_resample_equals_torchaudio(rate: int, seconds: float) -> None:
    wav = np.random.default_rng(rate).uniform(-1, 1, max(1, round(seconds * rate))).astype(np.float32)
    got, want = audio.resample(wav, rate), torch_resample(wav, rate)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-5


def test_resample_leaves_16k_and_empty_audio_as_they_are() -> None:
    wav = np.arange(5, dtype=np.float32)
    assert audio.resample(wav, 16000) is wav
    assert audio.resample(np.zeros(0, np.float32), 44100).shape == (0,)
    with pytest.raises(ValueError, match="1-D"):
        audio.resample(np.zeros((2, 5), np.float32), 44100)


def test_a_stretch_read_with_context_equals_the_whole_resampled(synthesize_speech) -> None:
    """AudioReader resamples aligned blocks with context and trims: the numpy resampler keeps that exact."""
    speech, rate = sf.read(synthesize_speech(), dtype="float32")
    assert rate == 22050
    whole = audio.resample(speech, rate)
    assert np.abs(whole - torch_resample(speech, rate)).max() <= 1e-5
    step_in, step_out = 441, 320  # 22050 / 16000 reduced by their gcd
    begin, end = 10 * step_in, 60 * step_in
    piece = audio.resample(speech[begin:end], rate)
    inner = slice(5 * step_out, 40 * step_out)  # at least the filter's width away from the piece's edges
    assert np.abs(piece[inner] - whole[10 * step_out :][inner]).max() <= 1e-5


def test_fbank_equals_the_frontend_on_speech_and_noise_of_different_lengths(synthesize_speech) -> None:
    speech, rate = sf.read(synthesize_speech(), dtype="float32")
    speech = audio.resample(speech, rate).clip(-1, 1)
    rng = np.random.default_rng(0)
    pieces = [speech, rng.normal(0, 0.1, 16000 * 3 + 77), speech[:400], speech[:399], np.zeros(0), np.zeros(8000)]
    lengths = np.array([len(p) for p in pieces])
    wavs = np.zeros((len(pieces), lengths.max()), np.float32)
    for row, piece in zip(wavs, pieces, strict=True):  # noise in the padding, which must not leak into the frames
        row[: len(piece)] = piece
        row[len(piece) :] = rng.normal(0, 0.1, len(row) - len(piece))
    got, frames = features.fbank(wavs, lengths)
    want, want_frames = torch_fbank(wavs, lengths)
    assert got.dtype == np.float32 and frames.dtype == np.int64 and got.shape == want.shape
    np.testing.assert_array_equal(frames, want_frames)
    assert list(frames[2:5]) == [1, 0, 0]
    assert np.abs(got - want).max() <= 1e-3
    assert not got[1, frames[1] :].any() and not got[4].any()


def test_fbank_of_a_batch_shorter_than_a_window_has_no_frames() -> None:
    got, frames = features.fbank(np.zeros((2, 399), np.float32), np.array([399, 10]))
    assert got.shape == (2, 0, 80) and list(frames) == [0, 0]


def test_apply_cmvn_equals_global_cmvn() -> None:
    rng = np.random.default_rng(1)
    feats = rng.normal(5, 3, (3, 50, 80)).astype(np.float32)
    lengths = np.array([50, 17, 0])
    mean, std = rng.normal(0, 2, 80).astype(np.float32), rng.uniform(0, 3, 80).astype(np.float32)
    std[:5] = [0.0, 1e-4, 0.005, 0.01, 0.011]  # below, at and above the floor
    cmvn = frontend.GlobalCMVN(torch.from_numpy(mean), torch.from_numpy(std))
    want = cmvn(torch.from_numpy(feats), torch.from_numpy(lengths)).numpy()
    state = {k: v.numpy() for k, v in cmvn.state_dict().items()}
    got = features.apply_cmvn(feats, lengths, state["mean"], state["istd"])
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)
    assert not got[1, 17:].any() and not got[2].any()
