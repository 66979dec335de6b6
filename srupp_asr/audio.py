"""Audio loading: decode a file with soundfile, mix down to mono, resample to 16 kHz.

Everything the model hears goes through :func:`prepare_waveform`, so a file given to ``transcribe``
and a lhotse cut seen in training become the same kind of tensor.
"""

from __future__ import annotations

import os
import re
import stat

import numpy as np
import soundfile as sf
import torch
import torchaudio.functional as AF

from srupp_asr.errors import UserError

SAMPLE_RATE = 16000

# Containers whose frame count libsndfile estimates rather than reads from a header (MP3 without a
# Xing tag, Ogg from the last page found): a short read there is normal, not a sign of truncation.
_ESTIMATED_LENGTH_FORMATS = {"MP3", "OGG"}

# libsndfile fixes up a WAV data chunk that claims more bytes than the file holds and only logs it.
_WAV_DATA_TOO_LONG = re.compile(r"^data : (\d+) \(should be (\d+)\)", re.MULTILINE)
# Writers streaming to a pipe (ffmpeg, sox) cannot seek back and leave these sizes in the header.
_STREAMING_PLACEHOLDER_SIZES = {0xFFFFFFFF, 0x7FFFFFFF}


def prepare_waveform(
    samples: np.ndarray | torch.Tensor, sample_rate: int, target_rate: int = SAMPLE_RATE
) -> torch.Tensor:
    """Float32 mono 1-D waveform in [-1, 1] at ``target_rate`` from (channels, samples) or (samples,) audio."""
    if sample_rate <= 0 or target_rate <= 0:
        raise ValueError(f"sample rates must be positive, got {sample_rate} and {target_rate}")
    wav = torch.as_tensor(samples, dtype=torch.float32)
    if wav.dim() == 2:
        wav = wav.mean(dim=0)
    elif wav.dim() != 1:
        raise ValueError(f"expected (channels, samples) or (samples,) audio, got shape {tuple(wav.shape)}")
    if sample_rate != target_rate:
        wav = AF.resample(wav, sample_rate, target_rate)
    # Float files may exceed full scale and the resampler can overshoot a little; the features assume
    # 16-bit-like input, so clip as a 16-bit encoder would.
    return wav.clamp_(-1.0, 1.0).contiguous()


def load_audio(path: str | os.PathLike[str], sample_rate: int = SAMPLE_RATE) -> torch.Tensor:
    """Decode an audio file (wav/flac/ogg/mp3/...) to a float32 mono 1-D waveform in [-1, 1] at ``sample_rate``."""
    name = os.fspath(path)
    _check_openable(name)
    try:
        with sf.SoundFile(name) as f:
            data = f.read(dtype="float32", always_2d=True)
            problem = _truncation(f, len(data))
            rate = f.samplerate
    except sf.LibsndfileError as err:
        raise UserError(f"{name}: not a readable audio file ({err.error_string.strip()})") from None
    except sf.SoundFileError as err:
        raise UserError(f"{name}: not a readable audio file ({err})") from None
    if problem:
        raise UserError(f"{name}: not a readable audio file ({problem})")
    if data.shape[0] == 0:
        raise UserError(f"{name}: holds no audio samples")
    if not np.isfinite(data).all():
        raise UserError(f"{name}: not a readable audio file (it holds NaN or infinite samples)")
    return prepare_waveform(data.T, rate, sample_rate)


def _check_openable(name: str) -> None:
    """Turn the usual reasons a path cannot be read into one-line errors before libsndfile sees it."""
    try:
        info = os.stat(name)
        if stat.S_ISDIR(info.st_mode):
            raise UserError(f"{name}: not a readable audio file (it is a directory)")
        # Opening it ourselves gives the OS's reason (permissions, ...) instead of libsndfile's "System error".
        with open(name, "rb"):
            pass
    except FileNotFoundError:
        raise UserError(f"{name}: no such file") from None
    except OSError as err:
        raise UserError(f"{name}: not a readable audio file ({err.strerror or err})") from None
    if info.st_size == 0:
        raise UserError(f"{name}: not a readable audio file (the file is empty)")


def _truncation(f: sf.SoundFile, frames_read: int) -> str | None:
    """Why the open file looks cut short, or None: libsndfile decodes what is there without complaint."""
    if f.format in ("WAV", "WAVEX", "RF64"):
        match = _WAV_DATA_TOO_LONG.search(f.extra_info)
        if match and int(match.group(1)) not in _STREAMING_PLACEHOLDER_SIZES:
            declared, present = match.groups()
            return f"truncated: its header declares {declared} bytes of audio, the file holds {present}"
    if f.format not in _ESTIMATED_LENGTH_FORMATS and frames_read < f.frames:
        return f"truncated: its header declares {f.frames} frames, only {frames_read} could be decoded"
    return None
