"""Audio loading: decode a file with soundfile (or PyAV for what libsndfile cannot read), mix down to mono,
resample to 16 kHz.

Files libsndfile cannot open whose first bytes name a container FFmpeg reads and libsndfile does not (MP4/M4A/3GP,
Matroska/WebM, AAC, WMA, AMR, AC-3; Ogg with other codecs) are decoded with PyAV (``av``, FFmpeg's libraries in
its wheel), whole, into memory: :class:`_AvFile`. Anything else keeps libsndfile's one-line error, so random bytes
are never "decoded" by FFmpeg's lenient probing.

Everything the model hears goes through :func:`prepare_waveform`, so a file given to ``transcribe``
and a lhotse cut seen in training become the same float32 numpy array (this module imports no torch: inference on
the CPU runs without it, :mod:`srupp_asr.runtime`).

:class:`AudioReader` reads any stretch of a file at 16 kHz without decoding the rest: it seeks, decodes
the stretch with enough context on each side for the resampler's filter, and trims, so the samples equal
those of :func:`load_audio` on the whole file while memory stays that of one stretch (a 2-hour recording
is read in pieces). :func:`load_audio` is the reader reading everything.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import stat
import struct
import sys
import threading
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np
import soundfile as sf

from srupp_asr.errors import UserError, first_line

SAMPLE_RATE = 16000
# File name endings of the formats soundfile decodes (lower case); directories are searched for these.
AUDIO_EXTENSIONS = (
    ".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aif", ".aiff", ".au", ".w64", ".rf64", ".caf", ".sph",
    ".m4a", ".m4b", ".mp4", ".3gp", ".mov", ".webm", ".mka", ".mkv", ".aac", ".wma", ".amr", ".ac3",  # PyAV
)  # fmt: skip

# Containers whose frame count libsndfile estimates rather than reads from a header (MP3 without a
# Xing tag, Ogg from the last page found): a short read there is normal, not a sign of truncation.
_ESTIMATED_LENGTH_FORMATS = {"MP3", "OGG"}

# libsndfile fixes up a WAV data chunk that claims more bytes than the file holds and only logs it.
_WAV_DATA_TOO_LONG = re.compile(r"^data : (\d+) \(should be (\d+)\)", re.MULTILINE)
# libsndfile reads a WAV whose header says 7 (or 12, 15, ...) bits per sample as 8-bit (16-bit) samples, and
# garbage comes out; sox refuses them. The sample sizes each subtype really has:
_WAV_BIT_WIDTH = re.compile(r"^\s*Bit Width\s*:\s*(\d+)", re.MULTILINE)
_SUBTYPE_BITS = {"PCM_U8": 8, "PCM_S8": 8, "PCM_16": 16, "PCM_24": 24, "PCM_32": 32, "FLOAT": 32, "DOUBLE": 64}
# Writers streaming to a pipe (ffmpeg, sox) cannot seek back and leave these sizes in the header.
_STREAMING_PLACEHOLDER_SIZES = {0xFFFFFFFF, 0x7FFFFFFF}
# torchaudio's resampling defaults (torchaudio.functional.resample), which fix how far its filter reaches.
_LOWPASS_FILTER_WIDTH = 6
_ROLLOFF = 0.99
# The largest resampling kernel built (elements). torchaudio's kernel has (target / gcd) x (source / gcd) taps, so
# a rate sharing few factors with 16 kHz (22051 Hz: 6 GB and 9 s for 2 s of audio) is resampled from the nearest
# rate under this bound instead (22050 Hz: a 45 ppm change of speed). Every common rate is far below it.
_MAX_KERNEL = 1 << 20
MIN_FILE_RATE = 1000  # Hz; below this a header is damaged or not speech (1 Hz would be upsampled 16000 times)
# Hz; above this a header or a sample_rate argument is wrong (the highest audio rates are 768 kHz): 10^12 Hz asked
# torchaudio for a 26 GB resampling kernel.
MAX_FILE_RATE = 1_000_000
# Frames decoded per call at most: a damaged MP3 header can promise 10^12 frames, which must not become one allocation.
_READ_PIECE = 1 << 24
# A peak beyond this many times full scale (float audio is expected within +-1) is warned about: clipped to +-1,
# such audio (a float file written at integer scale, say) gives a wrong transcript. Modest overs (1.2) are common.
LOUD_PEAK = 2.0
# An Ogg page header: "OggS", version, flags, granule position, stream serial number, page number, CRC, segments.
_OGG_PAGE = struct.Struct("<4sBBqIIIB")
_OGG_BEGIN_OF_STREAM, _OGG_END_OF_STREAM = 0x02, 0x04
# Where an MP3's Xing/Info tag starts after its first frame header, by MPEG version and channels (the side
# information's length): MPEG-2 mono, MPEG-1 mono or MPEG-2 stereo, MPEG-1 stereo.
_XING_OFFSETS = (13, 21, 36)
_XING_FRAMES, _XING_BYTES = 0x1, 0x2  # the flags telling which counts the tag holds
# An MP3 holding fewer bytes than its Xing tag declares, beyond this fraction, is truncated (libmpg123's own
# tolerance before it warns that the "Xing stream size [is] off").
_XING_SIZE_TOLERANCE = 0.01


def prepare_waveform(samples: object, sample_rate: int, target_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Float32 mono 1-D waveform in [-1, 1] at ``target_rate`` from (channels, samples) or (samples,) audio (a
    numpy array, or a torch tensor on any device)."""
    if sample_rate <= 0 or target_rate <= 0:
        raise ValueError(f"sample rates must be positive, got {sample_rate} and {target_rate}")
    given = _as_array(samples)
    wav = given.astype(np.float32, copy=False)
    if wav.ndim == 2:
        wav = wav.mean(axis=0, dtype=np.float32)
    elif wav.ndim != 1:
        raise ValueError(f"expected (channels, samples) or (samples,) audio, got shape {tuple(wav.shape)}")
    sample_rate = resampling_rate(sample_rate, target_rate)
    if sample_rate != target_rate and wav.size > 0:
        wav = resample(wav, sample_rate, target_rate)
    # Float files may exceed full scale and the resampler can overshoot a little; the features assume
    # 16-bit-like input, so clip as a 16-bit encoder would.
    if np.may_share_memory(wav, given) or not wav.flags.c_contiguous:  # the caller's: clip a copy
        return np.ascontiguousarray(np.clip(wav, -1.0, 1.0), dtype=np.float32)
    return np.clip(wav, -1.0, 1.0, out=wav)


def _as_array(samples: object) -> np.ndarray:
    """``samples`` as a numpy array: a torch tensor (from any device) is copied to the host; torch is never imported
    here (a caller holding a tensor has imported it)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(samples, torch.Tensor):
        tensor = samples.detach().cpu()
        # integer samples keep their type (SamplesReader scales them); bfloat16, which numpy lacks, becomes float32
        return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()
    return np.asarray(samples)


def _kernel_size(sample_rate: int, target_rate: int) -> int:
    """Elements of torchaudio's resampling kernel from ``sample_rate`` to ``target_rate``."""
    gcd = math.gcd(sample_rate, target_rate)
    orig, new = sample_rate // gcd, target_rate // gcd
    width = math.ceil(_LOWPASS_FILTER_WIDTH * orig / (min(orig, new) * _ROLLOFF))
    return new * (orig + 2 * width)


@functools.lru_cache(maxsize=256)
def resampling_rate(sample_rate: int, target_rate: int = SAMPLE_RATE) -> int:
    """The rate audio at ``sample_rate`` is resampled from: itself, unless its kernel would exceed ``_MAX_KERNEL``
    elements; then the nearest rate whose kernel fits (beyond 10^9 Hz, the nearest multiple of the target rate)."""
    if sample_rate == target_rate or _kernel_size(sample_rate, target_rate) <= _MAX_KERNEL:
        return sample_rate
    for distance in range(1, target_rate // 2 + 1):
        for rate in (sample_rate - distance, sample_rate + distance):
            if rate > 0 and _kernel_size(rate, target_rate) <= _MAX_KERNEL:
                return rate
    return max(target_rate, round(sample_rate / target_rate) * target_rate)


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
    elements (rates reduced by their gcd): callers pick ``sample_rate`` with :func:`resampling_rate`."""
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


def load_audio(path: str | os.PathLike[str], sample_rate: int = SAMPLE_RATE) -> np.ndarray:
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
            # As bytes: soundfile encodes a str name strictly, which fails on a non-UTF-8 name (surrogateescape).
            with _native_stderr_silenced():
                self._file = sf.SoundFile(os.fsencode(self.path))
        except sf.LibsndfileError as err:
            if not _ffmpeg_container(self.path):
                raise UserError(f"{self.path}: not a readable audio file ({_libsndfile_reason(err)})") from None
            self._file = _AvFile(self.path)  # MP4/M4A, WebM, AAC, ...: FFmpeg's decoders through PyAV
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
        self.peak = 0.0  # the largest absolute sample value decoded so far (before clipping to +-1)
        rate = resampling_rate(self.file_rate, sample_rate)  # the header's rate unless it is a costly one
        # The resampler gives ceil(frames * new / orig) samples.
        self.num_samples: int = -(-self.frames * sample_rate // rate)
        gcd = math.gcd(rate, sample_rate)
        self._step_in, self._step_out = rate // gcd, sample_rate // gcd  # aligned block, in and out
        width = math.ceil(_LOWPASS_FILTER_WIDTH * self._step_in / (min(self._step_in, self._step_out) * _ROLLOFF))
        self._context_blocks = 0 if rate == sample_rate else -(-(width + self._step_in) // self._step_in) + 1

    @property
    def duration(self) -> float:
        """Length in seconds (from the header; an estimate for MP3 and some Ogg files)."""
        return self.num_samples / self.sample_rate

    def level_warning(self) -> str | None:
        """A one-line warning naming the file when what was decoded so far reaches beyond :data:`LOUD_PEAK` times
        full scale (it is clipped to +-1, which garbles the speech); None otherwise."""
        if self.peak <= LOUD_PEAK:
            return None
        return (
            f"{self.path}: its samples reach {self.peak:.3g} times full scale (audio should lie within +-1); "
            "clipped, they may give a wrong transcript (a float file written at integer scale?)"
        )

    def _check_header(self) -> None:
        f = self._file
        truncation = self._truncation()
        if truncation is not None:
            raise UserError(f"{self.path}: not a readable audio file (truncated: {truncation})")
        if f.format in ("WAV", "WAVEX", "RF64") and f.subtype in _SUBTYPE_BITS:
            width = _WAV_BIT_WIDTH.search(f.extra_info)
            if width and int(width.group(1)) != _SUBTYPE_BITS[f.subtype]:
                raise UserError(
                    f"{self.path}: not a readable audio file (its header says {width.group(1)} bits per sample, an"
                    f" unsupported sample size that would be misread as {_SUBTYPE_BITS[f.subtype]}-bit)"
                )
        if f.frames <= 0:
            raise UserError(f"{self.path}: holds no audio samples")
        if not MIN_FILE_RATE <= f.samplerate <= MAX_FILE_RATE:
            raise UserError(
                f"{self.path}: not a readable audio file (its sample rate, {f.samplerate} Hz, is outside "
                f"{MIN_FILE_RATE}-{MAX_FILE_RATE} Hz: a damaged header or not speech)"
            )

    def _truncation(self) -> str | None:
        """How the file shows it was cut short, for the formats whose header or framing tells (None: it does not):
        a WAV data chunk, or an MP3 Xing tag, declaring more bytes than the file holds; an Ogg stream whose last
        page is cut or missing. FLAC and the other formats are caught when decoding runs short of the header's
        length; an MP3 without a Xing/Info tag (libsndfile estimates its length from the file size) cannot be."""
        f = self._file
        if f.format in ("WAV", "WAVEX", "RF64"):
            match = _WAV_DATA_TOO_LONG.search(f.extra_info)
            if match and int(match.group(1)) not in _STREAMING_PLACEHOLDER_SIZES:
                return _declared_more(*map(int, match.groups()))
            return None
        if f.format not in _ESTIMATED_LENGTH_FORMATS:
            return None
        try:
            with open(self.path, "rb") as raw:
                return _ogg_truncation(raw) if f.format == "OGG" else _mp3_truncation(raw)
        except OSError:  # libsndfile has it open: a failure here is for decoding to report
            return None

    def read(self, start: int, end: int) -> np.ndarray:
        """Samples ``[start, end)`` (at ``sample_rate``) as a float32 mono 1-D array in [-1, 1]; shorter only where
        a compressed file holds fewer samples than its header estimated."""
        start, end = max(0, start), min(end, self.num_samples)
        if end <= start:
            return np.zeros(0, np.float32)
        # Decode whole resampling blocks (their first input sample lands exactly on an output sample) with enough
        # context for the filter on both sides: the trimmed result equals resampling the whole file.
        first_block = max(0, start // self._step_out - self._context_blocks)
        last_block = -(-end // self._step_out) + self._context_blocks
        begin = first_block * self._step_in
        frames = min(last_block * self._step_in, self.frames) - begin
        data = self._decode(begin, frames)
        wav = prepare_waveform(data.T, self.file_rate, self.sample_rate)
        offset = first_block * self._step_out
        return np.ascontiguousarray(wav[start - offset : end - offset])

    def blocks(self, block_samples: int) -> Iterator[tuple[int, np.ndarray]]:
        """``(start, samples)`` of consecutive stretches of ``block_samples`` covering the file."""
        if block_samples <= 0:
            raise ValueError(f"block_samples must be positive, got {block_samples}")
        for start in range(0, self.num_samples, block_samples):
            wav = self.read(start, start + block_samples)
            if wav.size == 0:
                return
            yield start, wav

    def _decode(self, begin: int, frames: int) -> np.ndarray:
        """``frames`` frames from ``begin`` at the file's rate, (frames, channels) float32; checked."""
        f = self._file
        try:
            with _native_stderr_silenced(f.format == "MP3"):
                data = self._read_exact(begin, frames) if self._exact_seek else self._read_sequential(begin, frames)
        except sf.LibsndfileError as err:
            raise UserError(f"{self.path}: not a readable audio file ({_libsndfile_reason(err)})") from None
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
        if len(data):
            self.peak = max(self.peak, float(data.max()), -float(data.min()))
        return data

    def _read_exact(self, begin: int, frames: int) -> np.ndarray:
        self._file.seek(begin)
        return self._read_frames(frames)

    def _read_frames(self, frames: int) -> np.ndarray:
        """Up to ``frames`` frames from the current position, decoded ``_READ_PIECE`` at a time: a header that
        overstates the length costs what the file holds, not what it claims."""
        pieces = []
        while frames > 0:
            want = min(frames, _READ_PIECE)
            piece = self._file.read(want, dtype="float32", always_2d=True)
            pieces.append(piece)
            frames -= len(piece)
            if len(piece) < want:
                break
        if len(pieces) == 1:
            return pieces[0]
        return np.concatenate(pieces) if pieces else np.zeros((0, self.channels), np.float32)

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
        if self._pos < begin:  # the stream ended before ``begin`` (its header overstated the length)
            return self._tail[:0]
        kept = self._tail[max(0, begin - tail_start) : begin + frames - tail_start]
        fresh = self._read_frames(max(0, begin + frames - self._pos))
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


# Integer sample types and their full scale (a 16-bit recording as numpy gives it: int16, +-32768).
_INTEGER_SCALES = {"int8": 128.0, "int16": 32768.0, "int32": 2147483648.0}


class SamplesReader:
    """Samples already in memory (a numpy array or torch tensor) read like :class:`AudioReader` reads a file: the
    same mono 16 kHz float32 waveform (:func:`prepare_waveform`), the same checks, the same one-line errors naming
    ``name``. ``samples`` is (samples,) or (channels, samples), float in [-1, 1] or int8/int16/int32 at full scale,
    at ``sample_rate`` Hz (required: a wrong rate gives a wrong transcript, so it is never assumed)."""

    def __init__(
        self, samples: object, sample_rate: int | None, name: str = "samples", target_rate: int = SAMPLE_RATE
    ) -> None:
        self.path = name
        self.sample_rate = target_rate
        if sample_rate is None:
            raise UserError(f"{name}: audio given as samples needs its sample_rate (e.g. sample_rate=16000)")
        if isinstance(sample_rate, bool) or not isinstance(sample_rate, int | np.integer):
            raise UserError(f"{name}: sample_rate must be a whole number of Hz, got {sample_rate!r}")
        if not MIN_FILE_RATE <= sample_rate <= MAX_FILE_RATE:
            raise UserError(
                f"{name}: sample_rate {sample_rate} Hz is outside {MIN_FILE_RATE}-{MAX_FILE_RATE} Hz (not speech audio)"
            )
        data = _as_array(samples)
        if data.dtype.name in _INTEGER_SCALES:
            data = data.astype(np.float32) / _INTEGER_SCALES[data.dtype.name]
        elif data.dtype.kind != "f":
            raise UserError(f"{name}: samples must be float or int8/int16/int32, got {data.dtype}")
        if data.ndim == 2 and data.shape[0] > data.shape[1]:
            raise UserError(
                f"{name}: samples of shape {data.shape} look like (samples, channels); give (channels, samples): "
                "samples.T"
            )
        if data.ndim not in (1, 2):
            raise UserError(f"{name}: samples must be (samples,) or (channels, samples), got shape {data.shape}")
        if data.size == 0:
            raise UserError(f"{name}: holds no audio samples")
        if not np.isfinite(data).all():
            raise UserError(f"{name}: not usable audio (it holds NaN or infinite samples)")
        self.file_rate, self.channels = int(sample_rate), 1 if data.ndim == 1 else data.shape[0]
        self.peak = float(np.abs(data).max())
        self._wav = prepare_waveform(data, self.file_rate, target_rate)
        self.num_samples: int = self._wav.size

    duration = AudioReader.duration
    level_warning = AudioReader.level_warning
    blocks = AudioReader.blocks

    def read(self, start: int, end: int) -> np.ndarray:
        """Samples ``[start, end)`` of the 16 kHz waveform (a copy: the caller may change it)."""
        start, end = max(0, start), min(end, self.num_samples)
        return self._wav[start:end].copy() if end > start else np.zeros(0, np.float32)

    def close(self) -> None:
        """Nothing to close (the samples stay readable)."""

    def __enter__(self) -> SamplesReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# First bytes of containers FFmpeg reads and libsndfile does not: (offset, bytes).
_FFMPEG_MAGIC = (
    (4, b"ftyp"),  # ISO base media: MP4, M4A, 3GP, MOV
    (0, b"\x1a\x45\xdf\xa3"),  # Matroska, WebM
    (0, b"\xff\xf1"),  # AAC in ADTS frames (MPEG-4)
    (0, b"\xff\xf9"),  # AAC in ADTS frames (MPEG-2)
    (0, b"\x30\x26\xb2\x75\x8e\x66\xcf\x11"),  # ASF: WMA
    (0, b"#!AMR"),  # AMR
    (0, b"\x0b\x77"),  # AC-3
    (0, b"OggS"),  # Ogg with a codec libsndfile lacks (Speex, FLAC in Ogg on old builds)
)


def _ffmpeg_container(path: str) -> bool:
    """Whether ``path`` begins like a container that :class:`_AvFile` should try (see :data:`_FFMPEG_MAGIC`)."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError:
        return False
    return any(head[at : at + len(magic)] == magic for at, magic in _FFMPEG_MAGIC)


class _AvFile:
    """An audio file decoded whole by PyAV (FFmpeg), read through the subset of ``soundfile.SoundFile`` that
    :class:`AudioReader` uses (``samplerate``, ``channels``, ``frames``, ``format``, ``seek``, ``read``): the first
    audio stream, as float32 at its own rate. Every problem is a one-line UserError naming the file. Memory: the
    whole decoded stream (an hour of 48 kHz stereo is 1.4 GB)."""

    format = "FFMPEG"
    extra_info = ""

    def __init__(self, path: str) -> None:
        try:
            import av
        except ImportError:  # a broken install: av is in install_requires
            raise UserError(f"{path}: not a readable audio file (its format needs PyAV: pip install av)") from None
        self.name = path
        pieces: list[np.ndarray] = []
        try:
            with av.open(path, metadata_errors="ignore") as container:
                stream = next((s for s in container.streams if s.type == "audio"), None)
                if stream is None:
                    raise UserError(f"{path}: not a readable audio file (it holds no audio stream)")
                self.samplerate = int(stream.rate or 0)
                self.channels = int(stream.channels or 0)
                resampler = None
                for frame in container.decode(stream):
                    if frame.sample_rate != self.samplerate or len(frame.layout.channels) != self.channels:
                        raise UserError(f"{path}: not a readable audio file (its sample rate or channels change)")
                    if resampler is None:  # to planar float32 at the stream's own rate and layout
                        resampler = av.AudioResampler(format="fltp", layout=frame.layout, rate=self.samplerate)
                    pieces.extend(f.to_ndarray() for f in resampler.resample(frame))
                if resampler is not None:
                    pieces.extend(f.to_ndarray() for f in resampler.resample(None))
                declared = _declared_frames(stream, container, self.samplerate)
        except UserError:
            raise
        except (av.FFmpegError, ValueError, EOFError, OSError) as err:
            reason = getattr(err, "strerror", None) or first_line(err)  # FFmpeg's words without errno and path
            raise UserError(f"{path}: not a readable audio file ({reason})") from None
        data = np.concatenate(pieces, axis=1).T if pieces else np.zeros((0, max(self.channels, 1)), np.float32)
        self._data = np.ascontiguousarray(data, dtype=np.float32)
        self.frames = len(self._data)
        if declared is not None and self.frames < declared * _AV_TRUNCATED_SHARE:
            raise UserError(
                f"{path}: not a readable audio file (truncated: its header declares {declared} frames, only "
                f"{self.frames} could be decoded)"
            )
        self._pos = 0

    def seek(self, frame: int) -> None:
        self._pos = max(0, min(frame, self.frames))

    def read(self, frames: int, dtype: str = "float32", always_2d: bool = True) -> np.ndarray:
        out = self._data[self._pos : self._pos + frames]
        self._pos += len(out)
        return out

    def close(self) -> None:
        self._data = self._data[:0]


# An FFmpeg-decoded stream shorter than this share of the length its container declares was cut short (encoders'
# priming and padding make the two differ by a few thousand samples, never by a tenth).
_AV_TRUNCATED_SHARE = 0.9


def _declared_frames(stream: object, container: object, rate: int) -> int | None:
    """The stream's length in frames as its header declares it: the stream's duration, else the container's
    (Matroska/WebM; an estimate from the bit rate for raw AAC); None where neither is declared."""
    duration, base = getattr(stream, "duration", None), getattr(stream, "time_base", None)
    if duration and base is not None and rate > 0:
        return int(duration * base * rate)
    total = getattr(container, "duration", None)  # in microseconds (FFmpeg's AV_TIME_BASE)
    return int(total * rate / 1_000_000) if total and rate > 0 else None


def is_samples(audio: object) -> bool:
    """Whether ``audio`` is samples in memory (a numpy array or torch tensor) rather than a path or a list."""
    torch = sys.modules.get("torch")
    return isinstance(audio, np.ndarray) or (torch is not None and isinstance(audio, torch.Tensor))


def _declared_more(declared: int, present: int) -> str:
    """The reason given for a file whose header declares more bytes of audio than it holds."""
    return f"its header declares {declared} bytes of audio, the file holds {present}"


def _ogg_truncation(raw: BinaryIO) -> str | None:
    """Walk the Ogg pages of ``raw``: the last one cut short, or a logical stream without its end-of-stream page,
    means the file was truncated (libsndfile decodes what is there and says nothing). Junk after the last page
    ends the walk (libsndfile ignores it too)."""
    size = os.fstat(raw.fileno()).st_size
    unfinished: set[int] = set()  # serial numbers of streams begun and not yet ended
    offset = 0
    while offset < size:
        raw.seek(offset)
        head = raw.read(_OGG_PAGE.size)
        if head[:4] != b"OggS"[: len(head)]:
            break
        if len(head) < _OGG_PAGE.size:
            return "its last Ogg page is cut short"
        _, _, flags, _, serial, _, _, segments = _OGG_PAGE.unpack(head)
        lacing = raw.read(segments)
        end = offset + _OGG_PAGE.size + segments + sum(lacing)
        if len(lacing) < segments or end > size:
            return "its last Ogg page is cut short"
        if flags & _OGG_BEGIN_OF_STREAM:
            unfinished.add(serial)
        if flags & _OGG_END_OF_STREAM:
            unfinished.discard(serial)
        offset = end
    return "its Ogg stream ends without an end-of-stream page" if unfinished else None


def _mp3_truncation(raw: BinaryIO) -> str | None:
    """Compare the stream size in an MP3's Xing/Info tag (written by LAME, libsndfile and ffmpeg) with the bytes the
    file holds from its first frame on. The tag's frame count is not used: a damaged count is read for what the
    file holds, and only the byte count tells a short file from a wrong header."""
    size = os.fstat(raw.fileno()).st_size
    head = raw.read(10)
    start = 0
    if len(head) == 10 and head.startswith(b"ID3"):  # an ID3v2 tag first: 10 bytes, a synchsafe size, a footer
        start = 10 + sum((b & 0x7F) << (7 * (3 - i)) for i, b in enumerate(head[6:10])) + 10 * bool(head[5] & 0x10)
    raw.seek(start)
    frame = raw.read(max(_XING_OFFSETS) + 16)
    if len(frame) < 2 or frame[0] != 0xFF or frame[1] & 0xE0 != 0xE0:  # no frame sync where the audio should begin
        return None
    for at in _XING_OFFSETS:
        tag = frame[at : at + 16]
        if len(tag) == 16 and tag[:4] in (b"Xing", b"Info"):
            flags = int.from_bytes(tag[4:8], "big")
            if not flags & _XING_BYTES:
                return None
            field = 8 + 4 * bool(flags & _XING_FRAMES)
            declared, present = int.from_bytes(tag[field : field + 4], "big"), size - start
            return _declared_more(declared, present) if present < declared * (1 - _XING_SIZE_TOLERANCE) else None
    return None


def _check_openable(name: str) -> None:
    """Turn the usual reasons a path cannot be read into one-line errors before libsndfile sees it."""
    try:
        info = os.stat(name)
        if stat.S_ISDIR(info.st_mode):
            raise UserError(f"{name}: not a readable audio file (it is a directory)")
        if not stat.S_ISREG(info.st_mode):  # before opening: a pipe's open waits for a writer, /dev/zero is endless
            kind = "a pipe" if stat.S_ISFIFO(info.st_mode) else "a device" if stat.S_ISCHR(info.st_mode) else "special"
            raise UserError(f"{name}: not a readable audio file (not a regular file: {kind}; save the audio to a file)")
        # Opening it ourselves gives the OS's reason (permissions, ...) instead of libsndfile's "System error".
        with open(name, "rb"):
            pass
    except FileNotFoundError:
        raise UserError(f"{name}: no such file") from None
    except OSError as err:
        raise UserError(f"{name}: not a readable audio file ({err.strerror or err})") from None
    if info.st_size == 0:
        raise UserError(f"{name}: not a readable audio file (the file is empty)")


def _libsndfile_reason(err: sf.LibsndfileError) -> str:
    """libsndfile's reason, except its "File does not exist or is not a regular file" for a file that exists and
    was opened (what its MP3 decoder answers when it finds no MPEG audio in a file)."""
    reason = err.error_string.strip()
    return "no decodable audio stream found" if reason.startswith("File does not exist or is not a regular") else reason


_silence_lock = threading.Lock()
_silence = {"depth": 0, "saved": -1}  # how many blocks want stderr silenced; the real stderr meanwhile


@contextlib.contextmanager
def _native_stderr_silenced(active: bool = True) -> Iterator[None]:
    """The process's stderr (file descriptor 2) sent to the null device for the block: libmpg123, libsndfile's MP3
    decoder, prints notes and warnings about damaged streams there itself ("Note: Illegal Audio-MPEG-Header ...",
    a dozen lines for one file), which would bury the one-line error that names the file. Blocks may nest and run
    in several threads: the first to enter switches, the last to leave switches back."""
    if not active:
        yield
        return
    with _silence_lock:
        if _silence["depth"] == 0:
            with contextlib.suppress(AttributeError, ValueError, OSError):
                sys.stderr.flush()  # what Python has buffered goes out before the switch
            try:
                _silence["saved"] = os.dup(2)
                null = os.open(os.devnull, os.O_WRONLY)
                try:
                    os.dup2(null, 2)
                finally:
                    os.close(null)
            except OSError:  # no stderr to silence (or no null device): leave it as it is
                if _silence["saved"] >= 0:
                    os.close(_silence["saved"])
                _silence["saved"] = -1
        _silence["depth"] += 1
    try:
        yield
    finally:
        with _silence_lock:
            _silence["depth"] -= 1
            if _silence["depth"] == 0 and _silence["saved"] >= 0:
                os.dup2(_silence["saved"], 2)
                os.close(_silence["saved"])
                _silence["saved"] = -1
