"""Training-time augmentation of the audio: the channel (``data.channel_augment``) and the room (reverberation).

:class:`SeededReverb` reverberates cuts (``data.reverb_prob``) with rooms lhotse simulates, seeded from the batch.
Each training cut (real or synthetic) may pass through, in this order and each with its own probability:

- **pitch**: sox ``pitch`` by a number of cents drawn from ``pitch_range_cents`` (duration kept);
- **VTLP** (vocal tract length perturbation, Jaitly & Hinton 2013): the short-time spectrum's frequency axis is
  warped piecewise-linearly, ``f -> alpha * f`` below a knee and linear from there to Nyquist, with ``alpha`` drawn
  from ``vtlp_range``; the phase follows each bin's instantaneous frequency (a phase vocoder), so a sine at ``f``
  comes out at ``alpha * f``;
- **EQ**, a random microphone/loudspeaker response: gains drawn in ``[-eq_gain_db, eq_gain_db]`` at
  ``EQ_POINTS`` log-spaced frequencies (interpolated in dB over log frequency), and with probability 1/2 each a
  2nd-order low cut (corner in ``LOW_CUT_HZ``) and high cut (corner in ``HIGH_CUT_HZ``); applied as a zero-phase
  filter;
- **codec**: a round trip through one of ``codecs``, encoded and decoded by sox: ``gsm`` (GSM 06.10 full rate,
  13 kbit/s at 8 kHz), ``amr-nb`` (AMR narrow band at a drawn mode, 4.75-12.2 kbit/s at 8 kHz), ``vorbis`` (Ogg
  Vorbis at its lowest quality, -1, at 16 kHz); the decoded audio is aligned to the input (the codec's delay
  removed) and keeps its length. (MP3 and Opus are not among them: this sox has no encoder for either.)

Every choice is drawn from the ``numpy`` generator the caller passes (the data pipeline seeds it per cut from the
batch seed), always the same number of draws, so the same seed gives the same audio. VTLP and EQ keep the RMS level
of their input; the result is scaled down only if it would clip.
"""

from __future__ import annotations

import random
import subprocess
from dataclasses import asdict, dataclass, fields

import numpy as np
import torch
from lhotse import CutSet
from lhotse.dataset import ReverbWithImpulseResponse

from srupp_asr.errors import UserError

SAMPLE_RATE = 16000
VTLP_KNEE = 0.8  # the warp is linear up to 0.8 * Nyquist * min(alpha, 1) / alpha, then joins (Nyquist, Nyquist)
EQ_POINTS = 6
EQ_RANGE_HZ = (100.0, 6400.0)  # the control points: log-spaced over this range, the gain held flat outside it
LOW_CUT_HZ = (80.0, 400.0)
HIGH_CUT_HZ = (3000.0, 7000.0)
CODECS = ("gsm", "amr-nb", "vorbis")
# The delay each round trip adds (sox 14.4 with its GSM, opencore AMR and libvorbis coders): the lag of the best
# cross-correlation with the input, the same on LJ Speech sentences for every AMR mode.
CODEC_DELAY_S = {"gsm": 0.0, "amr-nb": 79 / 16000, "vorbis": 0.0}
_STFT = {"n_fft": 512, "hop_length": 128}
_SOX = ["sox", "-R", "-D", "-V1"]
_RAW = ["-t", "raw", "-e", "floating-point", "-b", "32", "-L", "-c", "1"]


@dataclass(frozen=True)
class ChannelAugment:
    """Probabilities and ranges of the augmentations (all off by default); see the module docstring."""

    pitch_prob: float = 0.0
    pitch_range_cents: tuple[float, float] = (-300.0, 300.0)
    vtlp_prob: float = 0.0
    vtlp_range: tuple[float, float] = (0.85, 1.15)
    eq_prob: float = 0.0
    eq_gain_db: float = 10.0
    codec_prob: float = 0.0
    codecs: tuple[str, ...] = CODECS

    def __post_init__(self) -> None:
        for name in ("pitch_prob", "vtlp_prob", "eq_prob", "codec_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise UserError(f"channel_augment: {name} must be within [0, 1], got {getattr(self, name)}")
        low, high = self.vtlp_range
        if not 0.5 <= low <= high <= 2.0:
            raise UserError(f"channel_augment: vtlp_range must be within [0.5, 2], low first, got {self.vtlp_range}")
        if self.pitch_range_cents[0] > self.pitch_range_cents[1] or self.eq_gain_db < 0:
            raise UserError("channel_augment: pitch_range_cents must be (low, high) and eq_gain_db >= 0")
        unknown = sorted(set(self.codecs) - set(CODECS))
        if unknown or not self.codecs:
            raise UserError(f"channel_augment: codecs must be some of {', '.join(CODECS)}, got {list(self.codecs)}")

    @classmethod
    def from_config(cls, config: dict | None) -> ChannelAugment | None:
        """The augmentation of a ``data.channel_augment`` dict (None when absent or when every probability is 0)."""
        if not config:
            return None
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise UserError(f"channel_augment: unknown keys {unknown} (known: {', '.join(sorted(known))})")
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in config.items()}
        augment = cls(**values)
        return augment if augment.active else None

    @property
    def active(self) -> bool:
        """Whether any step has a probability above 0."""
        return any(p > 0 for p in (self.pitch_prob, self.vtlp_prob, self.eq_prob, self.codec_prob))

    def to_dict(self) -> dict:
        """The settings as a JSON-ready dict."""
        return asdict(self)

    def draw(self, rng: np.random.Generator) -> dict:
        """One utterance's choices: {step: parameters} for the steps drawn (always the same number of draws)."""
        use = rng.random(4) < (self.pitch_prob, self.vtlp_prob, self.eq_prob, self.codec_prob)
        cents = float(rng.uniform(*self.pitch_range_cents))
        alpha = float(rng.uniform(*self.vtlp_range))
        eq = draw_eq(rng, self.eq_gain_db)
        codec = self.codecs[int(rng.integers(len(self.codecs)))]
        amr_mode = int(rng.integers(8))
        steps: dict = {}
        if use[0]:
            steps["pitch"] = round(cents)
        if use[1]:
            steps["vtlp"] = round(alpha, 3)
        if use[2]:
            steps["eq"] = eq
        if use[3]:
            steps["codec"] = (codec, amr_mode)
        return steps

    def __call__(self, audio: np.ndarray, rng: np.random.Generator, rate: int = SAMPLE_RATE) -> np.ndarray:
        """``audio`` (mono float) with the drawn steps applied; float32, same length, within [-1, 1]."""
        steps = self.draw(rng)
        out = np.asarray(audio, dtype=np.float64)
        if len(out) < _STFT["n_fft"] or not np.any(out):
            return np.asarray(audio, dtype=np.float32)
        if "pitch" in steps:
            out = shift_pitch(out, steps["pitch"], rate)
        if "vtlp" in steps:
            out = _same_level(vtlp(out, steps["vtlp"], rate), out)
        if "eq" in steps:
            out = _same_level(equalize(out, steps["eq"], rate), out)
        if "codec" in steps:
            out = codec_round_trip(out, *steps["codec"], rate=rate)
        peak = float(np.abs(out).max())
        if peak > 1.0:
            out /= peak
        return out.astype(np.float32)


def _same_level(samples: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """``samples`` scaled to the RMS of ``reference``."""
    return samples * np.sqrt(np.mean(reference**2)) / max(float(np.sqrt(np.mean(samples**2))), 1e-12)


def _fit_length(samples: np.ndarray, length: int) -> np.ndarray:
    return samples[:length] if len(samples) >= length else np.pad(samples, (0, length - len(samples)))


def _sox(samples: np.ndarray, rate: int, effects: list[str], out_rate: int | None = None) -> np.ndarray:
    """``samples`` through a sox effects chain (float in, float out)."""
    argv = [*_SOX, *_RAW, "-r", str(rate), "-", *_RAW, "-r", str(out_rate or rate), "-", *effects]
    return _run(argv, np.clip(samples, -1.0, 1.0).astype("<f4").tobytes())


def _run(argv: list[str], data: bytes) -> np.ndarray:
    done = subprocess.run(argv, input=data, capture_output=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"sox failed ({done.stderr.decode(errors='replace').strip()})")
    return np.frombuffer(done.stdout, dtype="<f4").astype(np.float64)


def shift_pitch(samples: np.ndarray, cents: float, rate: int = SAMPLE_RATE) -> np.ndarray:
    """Pitch (and formants) moved by ``cents`` with sox ``pitch``; the length kept."""
    return _fit_length(_sox(samples, rate, ["pitch", f"{cents:g}"]), len(samples))


def vtlp_warp(freqs: np.ndarray, alpha: float, rate: int = SAMPLE_RATE) -> np.ndarray:
    """The VTLP warp of ``freqs`` (Hz): ``alpha * f`` below the knee, then a straight line to (Nyquist, Nyquist)."""
    nyquist = rate / 2
    knee = VTLP_KNEE * nyquist * min(alpha, 1.0) / alpha
    freqs = np.asarray(freqs, dtype=np.float64)
    above = alpha * knee + (nyquist - alpha * knee) * (freqs - knee) / (nyquist - knee)
    return np.where(freqs <= knee, alpha * freqs, above)


def vtlp(samples: np.ndarray, alpha: float, rate: int = SAMPLE_RATE) -> np.ndarray:
    """``samples`` with the short-time spectrum's frequency axis warped by :func:`vtlp_warp` (length kept).

    Output bin ``j`` takes the magnitude of the spectrum at the frequency that warps onto it (linear interpolation
    between bins) and advances its phase from frame to frame by the warped instantaneous frequency of the input bin
    nearest that frequency, so stationary components keep a coherent phase at their new frequency."""
    n_fft, hop = _STFT["n_fft"], _STFT["hop_length"]
    window = torch.hann_window(n_fft, dtype=torch.float64)
    wav = torch.from_numpy(np.asarray(samples, dtype=np.float64))
    spec = torch.stft(wav, n_fft, hop, window=window, return_complex=True).numpy()  # (bins, frames)
    bins = spec.shape[0]
    freqs = np.arange(bins) * rate / n_fft
    grid = np.linspace(0.0, rate / 2, 8 * bins)
    source = np.interp(freqs, vtlp_warp(grid, alpha, rate), grid)  # the frequency that lands on each output bin
    position = source * n_fft / rate
    low = np.clip(np.floor(position).astype(int), 0, bins - 1)
    high = np.clip(low + 1, 0, bins - 1)
    frac = (position - low)[:, None]
    magnitude = np.abs(spec)
    warped_mag = (1 - frac) * magnitude[low] + frac * magnitude[high]
    # instantaneous frequency (radians per sample) of each input bin, frame to frame
    expected = 2 * np.pi * np.arange(bins)[:, None] * hop / n_fft
    phase = np.angle(spec)
    delta = np.diff(phase, axis=1, prepend=phase[:, :1] - expected) - expected
    delta = np.mod(delta + np.pi, 2 * np.pi) - np.pi
    inst = (expected + delta) / hop
    nearest = np.clip(np.rint(position).astype(int), 0, bins - 1)
    out_inst = vtlp_warp(inst[nearest] * rate / (2 * np.pi), alpha, rate) * 2 * np.pi / rate
    # A frame's bin k holds a stationary component's phase at the frame centre minus pi * k (the window is
    # centred N/2 samples into the frame): carry the centre phase over and put bin j's own -pi * j back.
    centre = phase[nearest, :1] + np.pi * nearest[:, None]
    shift = np.pi * np.arange(bins)[:, None]
    out_phase = centre + np.cumsum(out_inst * hop, axis=1) - out_inst[:, :1] * hop - shift
    warped = torch.from_numpy(warped_mag * np.exp(1j * out_phase))
    out = torch.istft(warped, n_fft, hop, window=window, length=len(samples))
    return out.numpy()


def draw_eq(rng: np.random.Generator, gain_db: float) -> dict:
    """A random microphone/loudspeaker response (see :func:`eq_response`); always 5 + ``EQ_POINTS`` draws."""
    gains = rng.uniform(-gain_db, gain_db, EQ_POINTS)
    low_cut, high_cut = rng.random(2) < 0.5
    low_hz, high_hz = rng.uniform(*LOW_CUT_HZ), rng.uniform(*HIGH_CUT_HZ)
    return {
        "gains_db": [round(float(g), 1) for g in gains],
        "low_cut_hz": round(float(low_hz)) if low_cut else None,
        "high_cut_hz": round(float(high_hz)) if high_cut else None,
    }


def eq_response(freqs: np.ndarray, eq: dict) -> np.ndarray:
    """The amplitude response of ``eq`` at ``freqs`` (Hz): the control gains interpolated in dB over log frequency,
    times 2nd-order Butterworth low cut and high cut magnitudes when present."""
    freqs = np.maximum(np.asarray(freqs, dtype=np.float64), 1e-3)
    points = np.geomspace(*EQ_RANGE_HZ, EQ_POINTS)
    response = 10 ** (np.interp(np.log(freqs), np.log(points), eq["gains_db"]) / 20)
    if eq.get("low_cut_hz"):
        response /= np.sqrt(1 + (eq["low_cut_hz"] / freqs) ** 4)
    if eq.get("high_cut_hz"):
        response /= np.sqrt(1 + (freqs / eq["high_cut_hz"]) ** 4)
    return response


def equalize(samples: np.ndarray, eq: dict, rate: int = SAMPLE_RATE) -> np.ndarray:
    """``samples`` filtered by :func:`eq_response` (zero phase, applied on the zero-padded signal's spectrum)."""
    size = 1 << (2 * len(samples) - 1).bit_length()
    spectrum = np.fft.rfft(samples, size)
    spectrum *= eq_response(np.fft.rfftfreq(size, 1 / rate), eq)
    return np.fft.irfft(spectrum, size)[: len(samples)]


def codec_round_trip(samples: np.ndarray, codec: str, amr_mode: int = 7, rate: int = SAMPLE_RATE) -> np.ndarray:
    """``samples`` encoded with ``codec`` and decoded back to ``rate`` by sox, the codec's delay
    (:data:`CODEC_DELAY_S`) removed and the result cut or padded to the input length."""
    if codec == "vorbis":
        coded_rate, fmt, options = rate, "vorbis", ["-C", "-1"]
    elif codec == "gsm":
        coded_rate, fmt, options = 8000, "gsm", []
    elif codec == "amr-nb":
        coded_rate, fmt, options = 8000, "amr-nb", ["-C", str(amr_mode)]
    else:
        raise ValueError(f"unknown codec {codec!r}")
    pcm = np.clip(samples, -1.0, 1.0).astype("<f4").tobytes()
    encode = [*_SOX, *_RAW, "-r", str(rate), "-", "-t", fmt, *options, "-r", str(coded_rate), "-c", "1", "-"]
    done = subprocess.run(encode, input=pcm, capture_output=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"sox failed to encode {codec} ({done.stderr.decode(errors='replace').strip()})")
    decoded = _run([*_SOX, "-t", fmt, "-", *_RAW, "-r", str(rate), "-", "rate", "-v", str(rate)], done.stdout)
    return _fit_length(decoded[round(CODEC_DELAY_S[codec] * rate) :], len(samples))


class SeededReverb(ReverbWithImpulseResponse):
    """lhotse's reverberation transform with the generated impulse response drawn from ``randgen`` too.

    lhotse's own passes no seed for the room it simulates, and ``Cut.reverb_rir`` then seeds it from ``uuid4()``:
    the same batch, with the same seed, was reverberated differently every time, so no two runs (an uninterrupted
    one and a resumed one, or two uninterrupted ones) trained alike. Here each reverberated cut's room and source
    seed is drawn from ``randgen`` (the batch's seeded generator) after the choice to reverberate it."""

    def __call__(self, cuts: CutSet) -> CutSet:
        if self.random is None:
            self.random = random.Random()
        out = []
        for cut in cuts:
            if self.random.random() > self.p:
                out.append(cut)
                continue
            rir = self.random.choice(self.rir_recordings) if self.rir_recordings else None
            seed = self.random.randrange(2**63) if rir is None else None
            out.append(
                cut.reverb_rir(
                    rir_recording=rir,
                    normalize_output=self.normalize_output,
                    early_only=self.early_only,
                    affix_id=not self.preserve_id,
                    rir_channels=self.rir_channels,
                    room_rng_seed=seed,
                    source_rng_seed=seed,
                )
            )
        return CutSet.from_cuts(out)
