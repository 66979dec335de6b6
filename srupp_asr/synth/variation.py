"""Per-utterance variation of synthetic speech: speaking rate, pitch, level, noise, reverberation, telephone band.

:func:`draw_variation` draws one :class:`Variation` from a random generator (the corpus builder seeds it from the
corpus seed and the utterance id, so any subset of a corpus rebuilds identically); :func:`apply_variation` turns a
TTS waveform into the corpus audio. Every value is rounded when drawn and used exactly as recorded in the cut's
``custom`` dict. Noise and room impulse responses are generated from the utterance's seed: no external corpora.

Steps, in order: rate and pitch (sox ``tempo -s`` and ``pitch``, then sox's resampler to 16 kHz; sox runs with
``-R -D`` and writes float, so no random dither enters), reverberation (an exponentially decaying noise tail
after the direct sound, at the drawn RT60 and direct-to-reverberant ratio), additive noise (white, pink or
brown at the drawn SNR against the active speech level), telephone channel (300-3400 Hz band-pass, 8 kHz round
trip with G.711 mu-law), level (peak scaled to the drawn dBFS, so nothing clips).
"""

from __future__ import annotations

import subprocess
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torchaudio.functional as AF

SAMPLE_RATE = 16000
TEMPO_RANGE = (0.85, 1.15)  # speaking-rate factor; tts-voices.md: costs intelligibility almost nothing
PITCH_RANGE_CENTS = (-150, 150)  # +-300 cents pushes some voices out of the human range
PEAK_RANGE_DBFS = (-20.0, -1.0)  # output level: the peak sample, so no utterance clips
NOISE_PROB = 0.5
NOISE_TYPES = ("white", "pink", "brown")
SNR_RANGE_DB = (5.0, 30.0)
REVERB_PROB = 0.3
RT60_RANGE_S = (0.2, 0.9)
DRR_RANGE_DB = (0.0, 12.0)
TELEPHONE_PROB = 0.1
TELEPHONE_BAND_HZ = (300.0, 3400.0)
# A steep Kaiser-windowed sinc (60 dB down above 4 kHz; torchaudio's default leaves -25 dB there).
_TELEPHONE_RESAMPLER = {
    "lowpass_filter_width": 16,
    "rolloff": 0.9,
    "resampling_method": "sinc_interp_kaiser",
    "beta": 8.6,
}
_ACTIVE_FLOOR_DB = -40.0  # frames this far below the loudest count as silence when measuring speech level


@dataclass(frozen=True)
class Variation:
    """The variation of one utterance; None fields mean the step is skipped (no noise, no reverberation)."""

    tempo: float
    pitch_cents: int
    peak_dbfs: float
    noise: str | None
    snr_db: float | None
    rt60_s: float | None
    drr_db: float | None
    telephone: bool
    signal_seed: int  # seeds the noise and the impulse response

    def to_dict(self) -> dict:
        """The fields as a JSON-ready dict (stored in the cut's ``custom``)."""
        return asdict(self)


def variation_settings() -> dict:
    """The distributions variations are drawn from (recorded in corpus.json)."""
    return {
        "tempo_range": TEMPO_RANGE,
        "pitch_range_cents": PITCH_RANGE_CENTS,
        "peak_range_dbfs": PEAK_RANGE_DBFS,
        "noise_prob": NOISE_PROB,
        "noise_types": NOISE_TYPES,
        "snr_range_db": SNR_RANGE_DB,
        "reverb_prob": REVERB_PROB,
        "rt60_range_s": RT60_RANGE_S,
        "drr_range_db": DRR_RANGE_DB,
        "telephone_prob": TELEPHONE_PROB,
        "telephone_band_hz": TELEPHONE_BAND_HZ,
    }


def draw_variation(rng: np.random.Generator) -> Variation:
    """Draw one utterance's variation (always the same number of draws, so later fields never shift)."""
    tempo, pitch, peak, snr, rt60, drr = (
        rng.uniform(*TEMPO_RANGE),
        rng.uniform(*PITCH_RANGE_CENTS),
        rng.uniform(*PEAK_RANGE_DBFS),
        rng.uniform(*SNR_RANGE_DB),
        rng.uniform(*RT60_RANGE_S),
        rng.uniform(*DRR_RANGE_DB),
    )
    noisy, reverberant, telephone = rng.random(3) < (NOISE_PROB, REVERB_PROB, TELEPHONE_PROB)
    noise = NOISE_TYPES[int(rng.integers(len(NOISE_TYPES)))]
    return Variation(
        tempo=round(float(tempo), 3),
        pitch_cents=round(float(pitch)),
        peak_dbfs=round(float(peak), 1),
        noise=noise if noisy else None,
        snr_db=round(float(snr), 1) if noisy else None,
        rt60_s=round(float(rt60), 2) if reverberant else None,
        drr_db=round(float(drr), 1) if reverberant else None,
        telephone=bool(telephone),
        signal_seed=int(rng.integers(2**62)),
    )


def change_rate_and_pitch(samples: np.ndarray, rate: int, tempo: float, pitch_cents: int) -> np.ndarray:
    """Speaking rate and pitch changed by sox and resampled to 16 kHz (float32; deterministic)."""
    pcm = np.clip(samples, -1.0, 1.0).astype("<f4").tobytes()
    argv = ["sox", "-R", "-D", "-V1", "-t", "raw", "-e", "floating-point", "-b", "32", "-L", "-c", "1"]
    argv += ["-r", str(rate), "-", "-t", "raw", "-e", "floating-point", "-b", "32", "-L", "-c", "1"]
    argv += ["-r", str(SAMPLE_RATE), "-", "tempo", "-s", f"{tempo}", "pitch", f"{pitch_cents}"]
    argv += ["rate", "-v", str(SAMPLE_RATE)]
    done = subprocess.run(argv, input=pcm, capture_output=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"sox failed ({done.stderr.decode(errors='replace').strip()})")
    return np.frombuffer(done.stdout, dtype="<f4").astype(np.float32)


def speech_power(samples: np.ndarray, rate: int = SAMPLE_RATE) -> float:
    """Mean power of the active frames (20 ms frames within 40 dB of the loudest one)."""
    frame = rate // 50
    n = max(1, len(samples) // frame)
    energies = np.mean(np.reshape(samples[: n * frame], (n, -1)) ** 2, axis=1) if len(samples) >= frame else None
    if energies is None:
        return float(np.mean(samples**2))
    active = energies[energies >= energies.max() * 10 ** (_ACTIVE_FLOOR_DB / 10)]
    return float(active.mean())


def colored_noise(kind: str, length: int, rng: np.random.Generator) -> np.ndarray:
    """Unit-power noise: white (flat), pink (power 1/f) or brown (power 1/f^2)."""
    if kind == "white":
        noise = rng.standard_normal(length)
    else:
        size = 1 << max(length - 1, 1).bit_length()  # a power of two: the FFT of a prime length is slow
        spectrum = np.fft.rfft(rng.standard_normal(size))
        freqs = np.arange(len(spectrum), dtype=np.float64)
        freqs[0] = 1.0
        spectrum /= freqs ** (0.5 if kind == "pink" else 1.0)
        spectrum[0] = 0.0
        noise = np.fft.irfft(spectrum, n=size)[:length]
    return noise / max(float(np.sqrt(np.mean(noise**2))), 1e-12)


def room_impulse_response(rt60: float, drr_db: float, rng: np.random.Generator, rate: int = SAMPLE_RATE) -> np.ndarray:
    """A synthetic impulse response: a unit direct path and, after 2-10 ms, noise decaying 60 dB in ``rt60``
    seconds, scaled to the direct-to-reverberant ratio ``drr_db``."""
    delay = int(rng.uniform(0.002, 0.010) * rate)
    t = np.arange(int(rt60 * rate)) / rate
    tail = rng.standard_normal(len(t)) * np.exp(-6.908 * t / rt60)  # ln(1000): 60 dB of amplitude decay
    tail *= np.sqrt(1.0 / (np.sum(tail**2) * 10 ** (drr_db / 10)))
    rir = np.zeros(delay + len(tail))
    rir[0] = 1.0
    rir[delay:] += tail
    return rir


def _convolve(samples: np.ndarray, rir: np.ndarray) -> np.ndarray:
    n = len(samples) + len(rir) - 1
    size = 1 << (n - 1).bit_length()
    out = np.fft.irfft(np.fft.rfft(samples, size) * np.fft.rfft(rir, size), size)
    return out[: len(samples)]


def telephone(samples: np.ndarray, rate: int = SAMPLE_RATE) -> np.ndarray:
    """The sound of a telephone line: 300-3400 Hz band-pass, 8 kHz mu-law, back to ``rate``."""
    wav = torch.from_numpy(samples.astype(np.float32))
    low, high = TELEPHONE_BAND_HZ
    for _ in range(2):  # two biquads each way: 24 dB per octave
        wav = AF.highpass_biquad(wav, rate, low)
        wav = AF.lowpass_biquad(wav, rate, high)
    narrow = AF.resample(wav, rate, 8000, **_TELEPHONE_RESAMPLER)
    scale = max(float(narrow.abs().max()), 1e-9)
    coded = AF.mu_law_decoding(AF.mu_law_encoding((narrow / scale).clamp(-1, 1), 256), 256) * scale
    return AF.resample(coded, 8000, rate, **_TELEPHONE_RESAMPLER)[: len(samples)].numpy().astype(np.float64)


def apply_variation(samples: np.ndarray, rate: int, variation: Variation) -> np.ndarray:
    """The corpus audio of one TTS waveform: ``variation`` applied, 16 kHz float32 with its peak at the drawn level."""
    rng = np.random.default_rng(variation.signal_seed)
    rir_rng, noise_rng = rng.spawn(2)
    audio = change_rate_and_pitch(samples, rate, variation.tempo, variation.pitch_cents).astype(np.float64)
    if len(audio) == 0 or not np.any(audio):
        raise RuntimeError("no audio left after the rate and pitch change")
    if variation.rt60_s is not None:
        audio = _convolve(audio, room_impulse_response(variation.rt60_s, variation.drr_db, rir_rng))
    if variation.noise is not None:
        noise = colored_noise(variation.noise, len(audio), noise_rng)
        audio = audio + noise * np.sqrt(speech_power(audio) / 10 ** (variation.snr_db / 10))
    if variation.telephone:
        audio = telephone(audio)
    peak = max(float(np.abs(audio).max()), 1e-9)
    return (audio * (10 ** (variation.peak_dbfs / 20) / peak)).astype(np.float32)
