"""Transcripts and their output formats: txt, json, srt, vtt, tsv.

A :class:`Transcript` is what ``transcribe`` makes of one file: its text, its segments (runs of at most
``max_words`` words, broken where the speaker pauses) with their words, and how it was decoded. The
writers render it; :func:`write_transcript` writes the chosen formats atomically. Times are seconds from
the start of the file; the formats round them to milliseconds:

- ``srt``: numbered cues, ``hh:mm:ss,mmm --> hh:mm:ss,mmm``;
- ``vtt``: ``WEBVTT`` then cues, ``hh:mm:ss.mmm --> hh:mm:ss.mmm``;
- ``tsv``: ``start<TAB>end<TAB>text`` in integer milliseconds with a header line, as Whisper writes it;
- ``txt``: one segment per line;
- ``json``: everything, words with start, end and confidence included (strict JSON: never NaN or Infinity).

In the text formats a segment's text is one line (line breaks, tabs and other control characters become spaces),
so a word holding a line break cannot end a cue or add a line; subtitle cues are at least a millisecond long and
never start before the previous one ends, whatever the segments' times.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from srupp_asr.errors import UserError
from srupp_asr.fileio import check_writable_folder, write_files_together

FORMATS = ("txt", "json", "srt", "vtt", "tsv")
MAX_SEGMENT_WORDS = 12  # subtitle-sized segments: a line or two on screen
SEGMENT_PAUSE = 0.8  # seconds of silence between two words that end a segment
# Control characters (Unicode category Cc) and the line and paragraph separators: what can end or rewrite a line.
_LINE_BREAKING = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# What JSON writes unescaped that still breaks a line for str.splitlines: NEL and the line and paragraph separators.
_JSON_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


class TimedWord(Protocol):
    """A recognised word with its time span (seconds) and confidence in [0, 1] (``srupp_asr.decoding.Word``)."""

    text: str
    start: float
    end: float
    confidence: float


@dataclass
class Segment:
    """A stretch of the transcript: its span (seconds), text and words (empty when the model gave no times)."""

    start: float
    end: float
    text: str
    words: list[Any] = field(default_factory=list)


@dataclass
class Transcript:
    """The transcription of one audio file and how it was made."""

    path: str
    duration: float  # seconds of audio
    text: str
    segments: list[Segment]
    model: str = ""  # the model directory
    decoding: dict[str, Any] = field(default_factory=dict)  # the decoding options
    chunks: list[tuple[float, float]] = field(default_factory=list)  # (start, end) of each decoded piece
    processing_seconds: float = 0.0  # wall time spent on this file


def segment_words(
    words: Sequence[TimedWord], max_words: int = MAX_SEGMENT_WORDS, pause: float = SEGMENT_PAUSE
) -> list[Segment]:
    """Group words into segments of at most ``max_words``, starting a new one after a silence of ``pause``
    seconds or more."""
    if max_words < 1:
        raise ValueError(f"max_words must be at least 1, got {max_words}")
    groups: list[list[TimedWord]] = []
    for word in words:
        if not groups or len(groups[-1]) >= max_words or word.start - groups[-1][-1].end >= pause:
            groups.append([])
        groups[-1].append(word)
    return [Segment(g[0].start, g[-1].end, " ".join(w.text for w in g), list(g)) for g in groups]


def transcript_text(segments: Iterable[Segment]) -> str:
    """The whole text of ``segments`` on one line."""
    return " ".join(s.text for s in segments if s.text)


# ------------------------------------------------------------------------------------------ time stamps


def format_timestamp(seconds: float, decimal_marker: str = ".") -> str:
    """``hh:mm:ss.mmm`` (SubRip uses ``,`` as ``decimal_marker``); hours grow past two digits when needed."""
    if seconds < 0:
        raise ValueError(f"a time stamp cannot be negative, got {seconds}")
    return _format_millis(round(seconds * 1000), decimal_marker)


def _format_millis(millis: int, decimal_marker: str) -> str:
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal_marker}{millis:03d}"


def one_line(text: str) -> str:
    """``text`` as one line: control characters (newline, carriage return, tab, ...) and the Unicode line and
    paragraph separators become spaces, and runs of white space one space."""
    return " ".join(_LINE_BREAKING.sub(" ", text).split())


def _lines(transcript: Transcript) -> list[tuple[Segment, str]]:
    """The segments that have text, each with its text on one line."""
    lines = [(s, one_line(s.text)) for s in transcript.segments]
    return [(s, line) for s, line in lines if line]


def _cues(transcript: Transcript, marker: str) -> list[tuple[str, str]]:
    """``(timing line, text)`` per segment with text. Times are rounded to milliseconds; a cue lasts at least one
    and starts no earlier than the previous cue ends (a player shows cues in order, each for a while)."""
    cues = []
    previous_end = 0
    for segment, line in _lines(transcript):
        start = max(round(segment.start * 1000), previous_end)
        end = max(round(segment.end * 1000), start + 1)
        cues.append((f"{_format_millis(start, marker)} --> {_format_millis(end, marker)}", line))
        previous_end = end
    return cues


# ------------------------------------------------------------------------------------------ the formats


def to_txt(transcript: Transcript) -> str:
    """One segment per line."""
    return "".join(f"{line}\n" for _, line in _lines(transcript))


def to_srt(transcript: Transcript) -> str:
    """SubRip subtitles: numbered cues with ``hh:mm:ss,mmm`` times. SubRip has no escapes: ``-->`` in the text, which
    readers take for a timing line, is written ``->`` (as Whisper does)."""
    cues = _cues(transcript, ",")
    return "\n".join(f"{i}\n{timing}\n{text.replace('-->', '->')}\n" for i, (timing, text) in enumerate(cues, start=1))


def to_vtt(transcript: Transcript) -> str:
    """WebVTT subtitles with ``hh:mm:ss.mmm`` times."""
    body = "".join(f"{timing}\n{_vtt_escape(text)}\n\n" for timing, text in _cues(transcript, "."))
    return f"WEBVTT\n\n{body}"


def _vtt_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def to_tsv(transcript: Transcript) -> str:
    """``start<TAB>end<TAB>text`` per segment, times in integer milliseconds, with a header line (as Whisper)."""
    rows = ["start\tend\ttext"]
    for s, line in _lines(transcript):  # one line: no tab or newline inside a field
        rows.append(f"{round(s.start * 1000)}\t{round(max(s.end, s.start) * 1000)}\t{line}")
    return "\n".join(rows) + "\n"


def _unit(value: float) -> float:
    """A confidence as a number in [0, 1]: NaN (no strict JSON reader takes it) is 0, no confidence."""
    value = float(value)
    return min(max(value, 0.0), 1.0) if not math.isnan(value) else 0.0


def to_dict(transcript: Transcript) -> dict[str, Any]:
    """The transcript as plain JSON-ready data (times in seconds rounded to milliseconds)."""
    return {
        "audio": transcript.path,
        "duration": round(transcript.duration, 3),
        "text": transcript.text,
        "segments": [
            {
                "id": i,
                "start": round(s.start, 3),
                "end": round(s.end, 3),
                "text": s.text,
                "words": [
                    {
                        "word": w.text,
                        "start": round(w.start, 3),
                        "end": round(w.end, 3),
                        "confidence": round(_unit(w.confidence), 4),
                    }
                    for w in s.words
                ],
            }
            for i, s in enumerate(transcript.segments)
        ],
        "model": transcript.model,
        "decoding": transcript.decoding,
        "chunks": [[round(a, 3), round(b, 3)] for a, b in transcript.chunks],
        "processing_seconds": round(transcript.processing_seconds, 3),
        "real_time_factor": round(transcript.processing_seconds / transcript.duration, 4) if transcript.duration else 0,
    }


def to_json(transcript: Transcript, indent: int | None = 2) -> str:
    """:func:`to_dict` as JSON text (``indent=None``: one line); strict JSON (a NaN or Infinity left in the data is a
    ValueError, not a file that JSON readers refuse)."""
    text = json.dumps(to_dict(transcript), ensure_ascii=False, indent=indent, allow_nan=False)
    # JSON leaves these unescaped, but Python's str.splitlines (and JavaScript) break lines at them: escaped, a
    # JSON line (indent=None) stays one line whatever a file name or a text holds.
    return text.translate(_JSON_LINE_BREAKS) + "\n"


WRITERS: dict[str, Callable[[Transcript], str]] = {
    "txt": to_txt,
    "json": to_json,
    "srt": to_srt,
    "vtt": to_vtt,
    "tsv": to_tsv,
}


def parse_formats(spec: str | Sequence[str]) -> list[str]:
    """``"txt,srt"``, ``"all"`` or a list of names -> the formats in a fixed order; unknown names are a UserError."""
    names = spec.split(",") if isinstance(spec, str) else list(spec)
    names = [n.strip().lower() for n in names if n.strip()]
    if "all" in names:
        return list(FORMATS)
    unknown = [n for n in names if n not in FORMATS]
    if unknown or not names:
        raise UserError(
            f"unknown output format {', '.join(unknown) or repr(spec)} (choose from {', '.join(FORMATS)}, all)"
        )
    return [f for f in FORMATS if f in names]


def output_names(paths: Sequence[str | os.PathLike[str]]) -> list[str]:
    """A distinct output name (without extension) per input, from its stem: ``talk``, then ``talk-2``, ``talk-3``
    for later inputs with the same stem (compared case-insensitively, as some file systems do)."""
    names: list[str] = []
    taken: set[str] = set()
    for path in paths:
        stem = Path(path).stem or "audio"
        name, k = stem, 1
        while name.casefold() in taken:
            k += 1
            name = f"{stem}-{k}"
        taken.add(name.casefold())
        names.append(name)
    return names


def printable(text: str) -> str:
    """``text`` as it can be printed or written as UTF-8: the bytes of a file name that are not UTF-8 (which Python
    holds as lone surrogates) become ``\\xNN``, as the one-line errors show them."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a lone surrogate that no file name decodes to
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def printable_line(text: str) -> str:
    """:func:`printable` ``text`` with its control characters (newline, tab, escape, ...) and Unicode line separators
    escaped as Python's ``repr`` writes them (``\\n``, ``\\t``, ``\\x1b``, ``\\u2028``): a file name printed in an
    error or a ``PATH<TAB>text`` line can neither break that line nor fake another."""
    return _LINE_BREAKING.sub(lambda match: repr(match.group())[1:-1], printable(text))


def printable_transcript(transcript: Transcript) -> Transcript:
    """``transcript`` with a path that can be written as UTF-8 (the transcript itself keeps the real name)."""
    path = printable(transcript.path)
    return transcript if path == transcript.path else replace(transcript, path=path)


def write_transcript(
    transcript: Transcript, out_dir: str | os.PathLike[str], name: str, formats: Sequence[str]
) -> list[Path]:
    """Write ``out_dir/name.<format>`` for each format, all or nothing (:func:`~srupp_asr.fileio.write_files_together`):
    a file that cannot be written (a full disk, a name too long) is a UserError naming it, and every previous file
    of the set is left as it was; returns the paths."""
    shown = printable_transcript(transcript)
    files = {Path(out_dir) / f"{name}.{fmt}": WRITERS[fmt](shown).encode("utf-8") for fmt in formats}
    write_files_together(files)
    return list(files)


_output_locks: dict[str, list[int]] = {}  # real path of an output folder -> [descriptor, claims in this process]


class OutputDirLock:
    """This process's claim on an output folder (``transcribe -o DIR``): a ``flock`` on the folder itself (no lock
    file is left in it), so that two runs writing same-stem outputs into one folder cannot overwrite each other's
    files unnoticed. A second process is refused with a one-line UserError naming the folder; calls in one
    process share the claim. Released by :meth:`release`, when the object is collected, or when the process ends
    (however it ends: the kernel drops a dead process's locks). Where the file system cannot lock a folder
    (some network file systems), nothing is locked."""

    def __init__(self, folder: str | os.PathLike[str] | None) -> None:
        import fcntl

        self.key: str | None = None
        if folder is None:
            return
        check_writable_folder(folder)  # before any decoding whose outputs it could not take
        try:
            key = os.path.realpath(folder)
            if key not in _output_locks:
                fd = os.open(key, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    raise UserError(
                        f"{folder}: another `srupp-asr transcribe` is writing to this folder; wait for it to finish"
                        " or give this run its own --output-dir"
                    ) from None
                except OSError:  # the file system cannot lock folders: go on unlocked
                    os.close(fd)
                    return
                _output_locks[key] = [fd, 0]
        except OSError as err:
            raise UserError(f"{folder}: cannot use the output folder ({err.strerror or err})") from None
        _output_locks[key][1] += 1
        self.key = key

    def release(self) -> None:
        """Give up this claim; the lock goes with the process's last claim on the folder."""
        if self.key is None:
            return
        held = _output_locks[self.key]
        held[1] -= 1
        if held[1] == 0:
            os.close(held[0])
            del _output_locks[self.key]
        self.key = None

    def __del__(self) -> None:
        self.release()
