"""Checking a cut manifest line by line before training reads it.

lhotse opens manifests lazily, so a bad line deep in a 900,000-cut file would otherwise stop training hours in,
with a traceback. :func:`check_cuts_manifest` reads the whole file once, up front, and raises one
:class:`~srupp_asr.errors.UserError` naming the file, the line and the problem (and how many more there are):

- the line is not JSON, not an object, or not a cut lhotse can build (a missing field, an unknown key);
- a field has the wrong type or an impossible value (a duration that is not a positive number, a text that is not
  a string, a segment past the end of its recording, a supervision with no overlap with its cut: its text would be
  trained on audio that does not hold it; a supervision only partly inside, as lhotse's ``truncate`` keeps, passes);
- two cuts share an id;
- an audio source would run a shell command (lhotse's ``command`` sources, e.g. a Kaldi ``wav.scp`` pipe) and the
  caller did not allow that, or would download (``url``);
- an audio file lies outside the corpus directories the caller names (symbolic links resolved), so a manifest
  from elsewhere cannot make training read arbitrary files.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from srupp_asr.errors import UserError, first_line
from srupp_asr.fileio import check_regular_file

MAX_LINE_BYTES = 16 * 1024 * 1024  # a cut line longer than this is not a cut (a hostile or broken file)
_SOURCE_TYPES = ("file", "command", "url", "memory", "shar")
_END_TOLERANCE_S = 0.05  # rounding of start/duration in manifests written by other tools


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """``(line number, bytes)`` of a ``.jsonl`` or ``.jsonl.gz`` file, blank lines skipped."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        number = 0
        while True:
            line = f.readline(MAX_LINE_BYTES + 1)
            if not line:
                return
            number += 1
            if len(line) > MAX_LINE_BYTES:
                raise UserError(f"{path}:{number}: line longer than {MAX_LINE_BYTES // 2**20} MiB (not a cut)")
            if line.strip():
                yield number, line


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _inside(path: str, roots: Sequence[Path]) -> bool:
    real = Path(os.path.realpath(path))
    return any(real == root or root in real.parents for root in roots)


class _Checker:
    """The checks of one manifest; ``problems`` collects ``(line, message)``."""

    def __init__(self, roots: Sequence[Path] | None, allow_commands: bool) -> None:
        self.roots, self.allow_commands = roots, allow_commands
        self.problems: list[tuple[int, str]] = []
        self.ids: dict[str, int] = {}

    def line(self, number: int, raw: bytes) -> None:
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            self.problems.append((number, f"not valid JSON ({first_line(err)})"))
            return
        if not isinstance(data, dict):
            self.problems.append((number, f"a cut must be a JSON object, not {type(data).__name__}"))
            return
        problem = self.cut(data, number)
        if problem is None:
            problem = self.buildable(json.loads(raw))  # a fresh copy: lhotse pops keys from what it is given
        if problem is not None:
            name = data.get("id")
            self.problems.append((number, f"cut {name}: {problem}" if isinstance(name, str) else problem))

    def cut(self, data: dict[str, Any], number: int) -> str | None:
        """The first problem of a cut's fields (recursing into a MixedCut's tracks), or None."""
        if data.get("type") == "MixedCut":
            for track in data.get("tracks") or []:
                inner = track.get("cut") if isinstance(track, dict) else None
                if isinstance(inner, dict) and inner.get("type") != "PaddingCut":
                    problem = self.cut(inner, -1)
                    if problem:
                        return f"track {inner.get('id')}: {problem}"
            return self.unique(data, number)
        if not isinstance(data.get("id"), str) or not data["id"]:
            return "'id' must be a non-empty string"
        for key in ("start", "duration"):
            if key not in data:
                return f"missing field '{key}'"
            if not _number(data[key]) or data[key] < 0 or (key == "duration" and data[key] == 0):
                sign = "positive" if key == "duration" else "non-negative"
                return f"'{key}' must be a {sign} number, not {data[key]!r}"
        supervisions = data.get("supervisions", [])
        if not isinstance(supervisions, list):
            return "'supervisions' must be a list"
        for sup in supervisions:
            problem = self.supervision(sup, data["duration"])
            if problem:
                return problem
        recording = data.get("recording")
        if recording is not None:
            problem = self.recording(recording, data["start"] + data["duration"])
            if problem:
                return problem
        return self.unique(data, number)

    def unique(self, data: dict[str, Any], number: int) -> str | None:
        if number < 0:  # a track inside a MixedCut
            return None
        name = data.get("id")
        if isinstance(name, str):
            if name in self.ids:
                return f"duplicate cut id (first on line {self.ids[name]})"
            self.ids[name] = number
        return None

    @staticmethod
    def supervision(sup: Any, cut_duration: float) -> str | None:
        if not isinstance(sup, dict):
            return "a supervision must be an object"
        name = f"supervision {sup.get('id')}"
        if "text" in sup and sup["text"] is not None and not isinstance(sup["text"], str):
            return f"{name}: 'text' must be a string, not {type(sup['text']).__name__}"
        for key in ("start", "duration"):
            if key in sup and not _number(sup[key]):
                return f"{name}: '{key}' must be a number, not {sup[key]!r}"
        start, duration = sup.get("start"), sup.get("duration")
        if duration is not None and duration <= 0:  # lhotse's own validation refuses these too
            return f"{name}: 'duration' must be a positive number, not {duration!r}"
        # start is relative to the cut; a missing start or duration is lhotse's error (buildable).
        if start is not None and duration is not None and (start >= cut_duration or start + duration <= 0):
            return (
                f"{name} spans {start:.3f} s to {start + duration:.3f} s, outside its cut (0 to {cut_duration:.3f} s)"
            )
        return None

    def recording(self, rec: Any, cut_end: float) -> str | None:
        if not isinstance(rec, dict):
            return "'recording' must be an object"
        rate, samples, duration = rec.get("sampling_rate"), rec.get("num_samples"), rec.get("duration")
        if not isinstance(rate, int) or isinstance(rate, bool) or rate <= 0:
            return f"recording: 'sampling_rate' must be a positive integer, not {rate!r}"
        if not isinstance(samples, int) or isinstance(samples, bool) or samples < 0:
            return f"recording: 'num_samples' must be a non-negative integer, not {samples!r}"
        if not _number(duration):
            return f"recording: 'duration' must be a number, not {duration!r}"
        if cut_end > duration + _END_TOLERANCE_S:
            return f"ends at {cut_end:.3f} s, past the end of its recording ({duration:.3f} s)"
        sources = rec.get("sources")
        if not isinstance(sources, list) or not sources:
            return "recording: 'sources' must be a non-empty list"
        for source in sources:
            problem = self.source(source)
            if problem:
                return f"recording {rec.get('id')}: {problem}"
        return None

    def source(self, source: Any) -> str | None:
        if not isinstance(source, dict):
            return "an audio source must be an object"
        kind, where = source.get("type"), source.get("source")
        if kind not in _SOURCE_TYPES:
            return f"unknown audio source type {kind!r}"
        if kind == "url":
            return f"audio source {where!r} is a URL (srupp-asr reads local files only; download it first)"
        if kind == "command" and not self.allow_commands:
            return (
                f"audio source runs a shell command ({str(where)[:80]!r}); if you trust this manifest, allow it"
                " (training: data.allow_command_sources true; evaluate, cmvn: --allow-command-sources)"
            )
        if kind == "file":
            if not isinstance(where, str) or not where:
                return "a file source needs a 'source' path"
            if self.roots is not None and not _inside(where, self.roots):
                roots = ", ".join(str(r) for r in self.roots)
                return f"audio file {where} is outside the corpus directories ({roots})"
        return None

    @staticmethod
    def buildable(data: dict[str, Any]) -> str | None:
        """lhotse's own verdict: can it build a cut from this object (unknown or missing keys)? Consumes ``data``."""
        from lhotse.serialization import deserialize_item

        try:
            deserialize_item(data)
        except TypeError as err:
            text = first_line(err)
            if "unexpected keyword argument" in text:
                return f"unknown key {text.rsplit(' ', 1)[-1]} ({text.split('.', 1)[0]})"
            return f"not a lhotse cut ({text})"
        except (KeyError, ValueError, AttributeError, AssertionError) as err:
            detail = f"missing field {err}" if isinstance(err, KeyError) else first_line(err)
            return f"not a lhotse cut ({detail})"
        return None


def check_cuts_manifest(
    path: str | os.PathLike,
    audio_roots: Sequence[str | os.PathLike] | None = None,
    allow_command_sources: bool = False,
) -> int:
    """Check every line of a cut manifest (see the module docstring); returns the number of cuts.

    ``audio_roots``: directories the audio files must lie in (None: anywhere). Raises one UserError
    ``"PATH:LINE: problem (and N more problems)"`` for the first problem found."""
    path = Path(path)
    check_regular_file(path, "cut manifest")
    roots = None if audio_roots is None else [Path(os.path.realpath(r)) for r in audio_roots]
    checker = _Checker(roots, allow_command_sources)
    count = 0
    try:
        for number, raw in _lines(path):
            count += 1
            checker.line(number, raw)
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as err:  # zlib.error: a bit flipped in the data
        raise UserError(f"{path}: cannot read the manifest ({first_line(err)})") from None
    _raise_first(checker, path)
    if count == 0:
        raise UserError(f"{path}: cut manifest is empty")
    return count


def check_cuts(cuts: Iterable[Any], path: str | os.PathLike, allow_command_sources: bool = False) -> int:
    """The checks of :func:`check_cuts_manifest` on cuts already loaded (from a manifest in another format than
    JSON lines); ``PATH:N`` in the error counts cuts. Returns the number of cuts."""
    checker = _Checker(None, allow_command_sources)
    count = 0
    for count, cut in enumerate(cuts, start=1):
        checker.line(count, json.dumps(cut.to_dict()).encode())
    _raise_first(checker, Path(path))
    return count


def _raise_first(checker: _Checker, path: Path) -> None:
    """One UserError for the first problem the checker found (and how many more there are)."""
    if checker.problems:
        number, message = checker.problems[0]
        more = len(checker.problems) - 1
        tail = f" (and {more} more problem{'s' if more > 1 else ''} in this manifest)" if more else ""
        raise UserError(f"{path}:{number}: {message}{tail}")
