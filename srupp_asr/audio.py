"""Audio loading: decode a file with soundfile, mix down to mono, resample to 16 kHz.

Everything the model hears goes through :func:`prepare_waveform`, so a file given to ``transcribe``
and a lhotse cut seen in training become the same kind of tensor.

:class:`AudioReader` reads any stretch of a file at 16 kHz without decoding the rest: it seeks, decodes
the stretch with enough context on each side for the resampler's filter, and trims, so the samples equal
those of :func:`load_audio` on the whole file while memory stays that of one stretch (a 2-hour recording
is read in pieces). :func:`load_audio` is the reader reading everything.
"""

from __future__ import annotations

import functools
import math
import os
import re
import stat
from collections.abc import Iterator

import numpy as np
import soundfile as sf
import torch
import torchaudio.transforms

from srupp_asr.errors import UserError

SAMPLE_RATE = 16000
# File name endings of the formats soundfile decodes (lower case); directories are searched for these.
AUDIO_EXTENSIONS = (
    ".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aif", ".aiff", ".au", ".w64", ".rf64", ".caf", ".sph",
)  # fmt: skip

# Containers whose frame count libsndfile estimates rather than reads from a header (MP3 without a
# Xing tag, Ogg from the last page found): a short read there is normal, not a sign of truncation.
_ESTIMATED_LENGTH_FORMATS = {"MP3", "OGG"}

# libsndfile fixes up a WAV data chunk that claims more bytes than the file holds and only logs it.
_WAV_DATA_TOO_LONG = re.compile(r"^data : (\d+) \(should be (\d+)\)", re.MULTILINE)
# Writers streaming to a pipe (ffmpeg, sox) cannot seek back and leave these sizes in the header.
_STREAMING_PLACEHOLDER_SIZES = {0xFFFFFFFF, 0x7FFFFFFF}
# torchaudio's resampling defaults (torchaudio.functional.resample), which fix how far its filter reaches.
_LOWPASS_FILTER_WIDTH = 6
_ROLLOFF = 0.99


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
        wav = _resampler(sample_rate, target_rate, wav.device)(wav)
    # Float files may exceed full scale and the resampler can overshoot a little; the features assume
    # 16-bit-like input, so clip as a 16-bit encoder would.
    return wav.clamp_(-1.0, 1.0).contiguous()


@functools.lru_cache(maxsize=16)
def _resampler(sample_rate: int, target_rate: int, device: torch.device) -> torchaudio.transforms.Resample:
    """``torchaudio.functional.resample`` with its filter kernel built once per pair of rates (building it costs more
    than applying it to seconds of audio); float32 kernels, so the output is bit for bit the function's."""
    return torchaudio.transforms.Resample(sample_rate, target_rate, dtype=torch.float32).to(device)


def load_audio(path: str | os.PathLike[str], sample_rate: int = SAMPLE_RATE) -> torch.Tensor:
    """Decode an audio file (wav/flac/ogg/mp3/...) to a float32 mono 1-D waveform in [-1, 1] at ``sample_rate``."""
    with AudioReader(path, sample_rate) as reader:
        return reader.read(0, reader.num_samples)


class AudioReader:
    """An open audio file read in stretches at ``sample_rate``, mono; a stretch equals that part of
    :func:`load_audio`'s waveform. Every problem with the file is a one-line :class:`UserError` naming it."""

    def __init__(self, path: str | os.PathLike[str], sample_rate: int = SAMPLE_RATE) -> None:
        """Open ``path`` and read its header (nothing is decoded yet)."""
        self.path = os.fspath(path)
        self.sample_rate = sample_rate
        _check_openable(self.path)
        try:
            self._file = sf.SoundFile(self.path)
        except sf.LibsndfileError as err:
            raise UserError(f"{self.path}: not a readable audio file ({err.error_string.strip()})") from None
        except sf.SoundFileError as err:
            raise UserError(f"{self.path}: not a readable audio file ({err})") from None
        try:
            self._check_header()
        except BaseException:
            self._file.close()
            raise
        self.file_rate: int = self._file.samplerate
        self.channels: int = self._file.channels
        self.frames: int = self._file.frames
        self._exact_seek = self._file.format not in _ESTIMATED_LENGTH_FORMATS
        self._pos, self._tail = 0, np.zeros((0, self.channels), np.float32)  # sequential decoding's state
        # The resampler gives ceil(frames * new / orig) samples.
        self.num_samples: int = -(-self.frames * sample_rate // self.file_rate)
        gcd = math.gcd(self.file_rate, sample_rate)
        self._step_in, self._step_out = self.file_rate // gcd, sample_rate // gcd  # aligned block, in and out
        width = math.ceil(_LOWPASS_FILTER_WIDTH * self._step_in / (min(self._step_in, self._step_out) * _ROLLOFF))
        self._context_blocks = 0 if self.file_rate == sample_rate else -(-(width + self._step_in) // self._step_in) + 1

    @property
    def duration(self) -> float:
        """Length in seconds (from the header; an estimate for MP3 and some Ogg files)."""
        return self.num_samples / self.sample_rate

    def _check_header(self) -> None:
        f = self._file
        if f.format in ("WAV", "WAVEX", "RF64"):
            match = _WAV_DATA_TOO_LONG.search(f.extra_info)
            if match and int(match.group(1)) not in _STREAMING_PLACEHOLDER_SIZES:
                declared, present = match.groups()
                raise UserError(
                    f"{self.path}: not a readable audio file "
                    f"(truncated: its header declares {declared} bytes of audio, the file holds {present})"
                )
        if f.frames <= 0:
            raise UserError(f"{self.path}: holds no audio samples")

    def read(self, start: int, end: int) -> torch.Tensor:
        """Samples ``[start, end)`` (at ``sample_rate``) as a float32 mono 1-D tensor in [-1, 1]; shorter only where
        a compressed file holds fewer samples than its header estimated."""
        start, end = max(0, start), min(end, self.num_samples)
        if end <= start:
            return torch.zeros(0)
        # Decode whole resampling blocks (their first input sample lands exactly on an output sample) with enough
        # context for the filter on both sides: the trimmed result equals resampling the whole file.
        first_block = max(0, start // self._step_out - self._context_blocks)
        last_block = -(-end // self._step_out) + self._context_blocks
        begin = first_block * self._step_in
        frames = min(last_block * self._step_in, self.frames) - begin
        data = self._decode(begin, frames)
        wav = prepare_waveform(data.T, self.file_rate, self.sample_rate)
        offset = first_block * self._step_out
        return wav[start - offset : end - offset].contiguous()

    def blocks(self, block_samples: int) -> Iterator[tuple[int, torch.Tensor]]:
        """``(start, samples)`` of consecutive stretches of ``block_samples`` covering the file."""
        if block_samples <= 0:
            raise ValueError(f"block_samples must be positive, got {block_samples}")
        for start in range(0, self.num_samples, block_samples):
            wav = self.read(start, start + block_samples)
            if wav.numel() == 0:
                return
            yield start, wav

    def _decode(self, begin: int, frames: int) -> np.ndarray:
        """``frames`` frames from ``begin`` at the file's rate, (frames, channels) float32; checked."""
        f = self._file
        try:
            data = self._read_exact(begin, frames) if self._exact_seek else self._read_sequential(begin, frames)
        except sf.LibsndfileError as err:
            raise UserError(f"{self.path}: not a readable audio file ({err.error_string.strip()})") from None
        except (sf.SoundFileError, RuntimeError) as err:
            raise UserError(f"{self.path}: not a readable audio file ({err})") from None
        if len(data) < frames and f.format not in _ESTIMATED_LENGTH_FORMATS:
            raise UserError(
                f"{self.path}: not a readable audio file "
                f"(truncated: its header declares {f.frames} frames, only {begin + len(data)} could be decoded)"
            )
        if begin == 0 and len(data) == 0:
            raise UserError(f"{self.path}: holds no audio samples")
        if not np.isfinite(data).all():
            raise UserError(f"{self.path}: not a readable audio file (it holds NaN or infinite samples)")
        return data

    def _read_exact(self, begin: int, frames: int) -> np.ndarray:
        self._file.seek(begin)
        return self._file.read(frames, dtype="float32", always_2d=True)

    def _read_sequential(self, begin: int, frames: int) -> np.ndarray:
        """Decode without seeking: libsndfile's Vorbis and MP3 decoders return wrong samples for a while after a
        seek, so these files are decoded from the start, keeping the last stretch for overlapping reads."""
        f = self._file
        tail_start = self._pos - len(self._tail)
        if begin < tail_start:  # before what is kept: start over
            f.seek(0)
            self._pos, self._tail, tail_start = 0, self._tail[:0], 0
        while self._pos < begin:  # skip ahead, a bounded piece at a time
            skipped = len(f.read(min(begin - self._pos, 1 << 20), dtype="float32", always_2d=True))
            if skipped == 0:
                break
            self._pos += skipped
            self._tail = self._tail[:0]
            tail_start = self._pos
        kept = self._tail[max(0, begin - tail_start) : begin + frames - tail_start]
        fresh = f.read(max(0, begin + frames - self._pos), dtype="float32", always_2d=True)
        if len(fresh) == 0:
            return kept
        self._pos += len(fresh)
        self._tail = np.concatenate([kept, fresh]) if len(kept) else fresh
        return self._tail

    def close(self) -> None:
        """Close the file."""
        self._file.close()

    def __enter__(self) -> AudioReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
