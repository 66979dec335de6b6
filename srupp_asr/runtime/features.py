"""The model's input in numpy, without torch: resampling, the Kaldi-compatible log-mel filterbank and global CMVN,
each computing in float32 what its torch counterpart computes (torchaudio's ``Resample``, which
:func:`srupp_asr.audio.prepare_waveform` used; :class:`srupp_asr.frontend.Fbank` in inference;
:class:`srupp_asr.frontend.GlobalCMVN`), so that ``transcribe`` on the CPU runs without importing torch.

The constants are :mod:`srupp_asr.frontend`'s, repeated here because that module imports torch (the tests check
that both agree).
"""

from __future__ import annotations

import functools
import math

import numpy as np

SAMPLE_RATE = 16000
N_MELS = 80
WIN_LENGTH = 400  # 25 ms at 16 kHz
HOP_LENGTH = 160  # 10 ms at 16 kHz
N_FFT = 512
LOW_FREQ = 20.0
PREEMPHASIS = 0.97
WAVEFORM_SCALE = 32768.0
LOG_FLOOR = np.finfo(np.float32).eps
# torchaudio's resampling defaults (audio.py's resampler keeps them).
_LOWPASS_FILTER_WIDTH = 6
_ROLLOFF = 0.99


@functools.lru_cache(maxsize=16)
def _sinc_kernel(orig: int, new: int) -> tuple[np.ndarray, int]:
    """torchaudio's ``_get_sinc_resample_kernel`` (Hann window) for rates reduced by their gcd, in float32 and in
    its order of operations: ``(orig + 2 * width, new)`` taps (one column per output phase) and ``width``."""
    base_freq = min(orig, new) * _ROLLOFF
    width = math.ceil(_LOWPASS_FILTER_WIDTH * orig / base_freq)
    idx = np.arange(-width, width + orig, dtype=np.float32) / np.float32(orig)
    t = np.arange(0, -new, -1, dtype=np.float32)[:, None] / np.float32(new) + idx
    t *= np.float32(base_freq)
    np.clip(t, -_LOWPASS_FILTER_WIDTH, _LOWPASS_FILTER_WIDTH, out=t)
    window = np.cos(t * np.float32(math.pi) / np.float32(_LOWPASS_FILTER_WIDTH) / np.float32(2)) ** 2
    t *= np.float32(math.pi)
    with np.errstate(invalid="ignore", divide="ignore"):
        kernel = np.where(t == 0, np.float32(1.0), np.sin(t) / t)
    kernel *= window * np.float32(base_freq / orig)
    kernel = np.ascontiguousarray(kernel.T)
    kernel.flags.writeable = False
    return kernel, width


def resample(wav: np.ndarray, sample_rate: int, target_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Mono float32 ``wav`` resampled from ``sample_rate`` to ``target_rate`` as torchaudio's ``Resample`` (float32
    kernel, the defaults) does: windowed-sinc taps over ``wav`` zero padded at both ends, ``ceil(len * new / orig)``
    samples; ``wav`` itself when the rates are equal or it is empty. The kernel has ``new * (orig + 2 * width)``
    elements (rates reduced by their gcd): callers pick ``sample_rate`` with :func:`srupp_asr.audio.resampling_rate`."""
    wav = np.asarray(wav, dtype=np.float32)
    if wav.ndim != 1:
        raise ValueError(f"expected a 1-D waveform, got shape {wav.shape}")
    if sample_rate <= 0 or target_rate <= 0:
        raise ValueError(f"sample rates must be positive, got {sample_rate} and {target_rate}")
    if sample_rate == target_rate or wav.size == 0:
        return wav
    gcd = math.gcd(sample_rate, target_rate)
    orig, new = sample_rate // gcd, target_rate // gcd
    kernel, width = _sinc_kernel(orig, new)
    taps = kernel.shape[0]
    blocks = wav.size // orig + 1  # input blocks of `orig` samples, each giving `new` output samples
    padded = np.zeros((blocks - 1) * orig + taps, np.float32)
    padded[width : width + wav.size] = wav
    # Output block k, phase j: the taps of column j over padded[k * orig : k * orig + taps].
    windows = np.lib.stride_tricks.as_strided(padded, (blocks, taps), (orig * 4, 4), writeable=False)
    out = (windows @ kernel).reshape(-1)
    return out[: -(-wav.size * new // orig)]


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
