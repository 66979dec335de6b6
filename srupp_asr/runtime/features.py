"""The model's input in numpy, without torch: the Kaldi-compatible log-mel filterbank and global CMVN, each
computing in float32 what its torch counterpart computes (:class:`srupp_asr.frontend.Fbank` in inference,
:class:`srupp_asr.frontend.GlobalCMVN`), so that ``transcribe`` on the CPU runs without importing torch.

The framing and mel constants are defined here, torch-free, and :mod:`srupp_asr.frontend` takes them from here.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from srupp_asr.audio import SAMPLE_RATE

N_MELS = 80
WIN_LENGTH = 400  # 25 ms at 16 kHz
HOP_LENGTH = 160  # 10 ms at 16 kHz
N_FFT = 512  # the window rounded up to a power of two, as Kaldi does
LOW_FREQ = 20.0  # Hz; the top mel bin ends at Nyquist
PREEMPHASIS = 0.97
# Kaldi computes on 16-bit sample values; scaling [-1, 1] audio up keeps its log-mel values, its floor
# and the meaning of its dither (in sample units) identical to `compute-fbank-feats` on the same file.
WAVEFORM_SCALE = 32768.0
LOG_FLOOR = np.finfo(np.float32).eps


def num_frames(num_samples: np.ndarray) -> np.ndarray:
    """Frames of a 25 ms / 10 ms framing with Kaldi's snip_edges=True (int64): ``1 + (S - 400) // 160``, 0 when
    ``S < 400`` (:func:`srupp_asr.frontend.num_frames`)."""
    return np.maximum((np.asarray(num_samples, dtype=np.int64) - WIN_LENGTH) // HOP_LENGTH + 1, 0)


@functools.lru_cache(maxsize=4)
def kaldi_mel_banks(n_mels: int = N_MELS) -> np.ndarray:
    """Kaldi's triangular mel filters, ``(N_FFT // 2 + 1, n_mels)`` float32 with a zero Nyquist row, computed in
    float64 as :func:`srupp_asr.frontend.kaldi_mel_banks` does."""

    def mel(freq: np.ndarray | float) -> np.ndarray:
        return 1127.0 * np.log1p(np.asarray(freq, dtype=np.float64) / 700.0)

    mel_low, mel_high = mel(LOW_FREQ), mel(SAMPLE_RATE / 2)
    delta = (mel_high - mel_low) / (n_mels + 1)
    left = mel_low + delta * np.arange(n_mels, dtype=np.float64)
    center, right = left + delta, left + 2 * delta
    bin_mel = mel(np.arange(N_FFT // 2, dtype=np.float64) * (SAMPLE_RATE / N_FFT))[:, None]
    rising = (bin_mel - left) / (center - left)
    falling = (right - bin_mel) / (right - center)
    weights = np.where(bin_mel <= center, rising, falling)
    weights = np.where((bin_mel > left) & (bin_mel < right), weights, 0.0)
    banks = np.concatenate([weights, np.zeros((1, n_mels))]).astype(np.float32)
    banks.flags.writeable = False
    return banks


@functools.lru_cache(maxsize=1)
def povey_window() -> np.ndarray:
    """Kaldi's default analysis window: a Hann window raised to the power 0.85 (float32, WIN_LENGTH points)."""
    n = np.arange(WIN_LENGTH, dtype=np.float64)
    window = ((0.5 - 0.5 * np.cos(2 * math.pi * n / (WIN_LENGTH - 1))) ** 0.85).astype(np.float32)
    window.flags.writeable = False
    return window


def fbank(wavs: np.ndarray, lengths: np.ndarray, n_mels: int = N_MELS) -> tuple[np.ndarray, np.ndarray]:
    """(B, S) waveforms in [-1, 1] and their lengths in samples -> ((B, T, n_mels) float32 log-mel, (B,) int64 frame
    counts), as :class:`srupp_asr.frontend.Fbank` in inference (no dither): ``T`` frames of the padded width, zeros
    past each utterance's frames."""
    wavs = np.asarray(wavs, dtype=np.float32)
    batch, samples = wavs.shape
    frame_lengths = num_frames(lengths)
    if samples < WIN_LENGTH:
        return np.zeros((batch, 0, n_mels), np.float32), frame_lengths
    # With snip_edges every frame of an utterance lies inside its samples, so padding never leaks in.
    frames = np.lib.stride_tricks.sliding_window_view(wavs * np.float32(WAVEFORM_SCALE), WIN_LENGTH, axis=1)
    frames = frames[:, ::HOP_LENGTH]
    frames = frames - frames.mean(axis=-1, keepdims=True)
    emphasised = np.empty_like(frames)
    emphasised[..., 0] = frames[..., 0] * np.float32(1 - PREEMPHASIS)
    emphasised[..., 1:] = frames[..., 1:] - np.float32(PREEMPHASIS) * frames[..., :-1]
    emphasised *= povey_window()
    spectrum = np.fft.rfft(emphasised, n=N_FFT)
    power = spectrum.real**2 + spectrum.imag**2  # not abs() squared: the sqrt would lose precision
    feats = np.log(np.maximum(power.astype(np.float32) @ kaldi_mel_banks(n_mels), LOG_FLOOR))
    feats[np.arange(feats.shape[1]) >= frame_lengths[:, None]] = 0.0
    return feats, frame_lengths


def apply_cmvn(feats: np.ndarray, frame_lengths: np.ndarray, mean: np.ndarray, istd: np.ndarray) -> np.ndarray:
    """(B, T, F) features normalised as :class:`srupp_asr.frontend.GlobalCMVN` does: ``(x - mean) * istd`` with the
    float32 ``mean`` and ``istd`` buffers of its state dict (``istd`` is ``1 / max(std, STD_FLOOR)``), padded frames
    set to 0."""
    out = (feats - np.asarray(mean, dtype=np.float32)) * np.asarray(istd, dtype=np.float32)
    out[np.arange(out.shape[1]) >= np.asarray(frame_lengths)[:, None]] = 0.0
    return out
