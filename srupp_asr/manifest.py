"""Cut manifests: reading them (checked line by line first), writing them, and a cut's text and audio.

Manifests are lhotse ``CutSet`` files (``.jsonl.gz``), written by :mod:`srupp_asr.prepare`, ``srupp-asr corpus``,
``srupp-asr synth-corpus`` or any lhotse recipe. This module imports neither Lightning nor the tokenizer, so the
data-preparation commands that read manifests load neither.

lhotse opens manifests lazily, so a bad line deep in a 900,000-cut file would otherwise stop training hours in,
with a traceback. :func:`check_cuts_manifest` (run by :func:`load_cuts`) reads the whole file once, up front, and
raises one :class:`~srupp_asr.errors.UserError` naming the file, the line and the problem (and how many more there
are):

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
import stat
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from lhotse import CutSet
from lhotse.augmentation import AudioTransform, Resample
from lhotse.cut import Cut, MixedCut
from lhotse.utils import fastcopy

from srupp_asr.audio import resampling_rate
from srupp_asr.errors import UserError, first_line
from srupp_asr.fileio import atomic_output, check_regular_file, file_kind, is_inside
from srupp_asr.text import normalize_text

CUT_SUFFIXES = (".jsonl.gz", ".jsonl")  # the manifests read and written line by line
MAX_LINE_BYTES = 16 * 1024 * 1024  # a cut line longer than this is not a cut (a hostile or broken file)
_SOURCE_TYPES = ("file", "command", "url", "memory", "shar")
_END_TOLERANCE_S = 0.05  # rounding of start/duration in manifests written by other tools


# ---- the check ---------------------------------------------------------------------------------------------------


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
            if self.roots is not None and not is_inside(where, self.roots):
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


# ---- reading and writing ----------------------------------------------------------------------------------------


def load_cuts(
    path: str | os.PathLike, lazy: bool = False, allow_command_sources: bool = False, check: bool = True
) -> CutSet:
    """Open a cut manifest after checking every line of it (UserError otherwise, one line naming the file).

    The check (:func:`check_cuts_manifest`) refuses lines that are not cuts, duplicate
    ids, URL sources, and audio sources that run a shell command unless ``allow_command_sources`` (a caller that
    reads only the texts may allow them: nothing runs). Manifests in other formats than ``.jsonl[.gz]`` are
    checked cut by cut after loading. ``check=False`` skips the check (the caller has made its own)."""
    path = Path(path)
    check_regular_file(path, "cut manifest")  # a named pipe would be waited on for ever
    jsonl = path.name.endswith(CUT_SUFFIXES)
    if check and jsonl:
        check_cuts_manifest(path, None, allow_command_sources)
    try:
        if lazy and jsonl:
            cuts = CutSet.from_jsonl_lazy(path)
            first = next(iter(cuts), None)
        else:
            cuts = CutSet.from_file(path)
            first = next(iter(cuts), None)
    except Exception as err:  # gzip, JSON, or lhotse schema errors: all mean "not a readable manifest"
        detail = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UserError(f"{path}: not a readable lhotse cut manifest ({detail})") from None
    if first is None:
        raise UserError(f"{path}: cut manifest is empty")
    if not isinstance(first, Cut):
        raise UserError(f"{path}: holds {type(first).__name__} entries, not cuts (expected a CutSet manifest)")
    if check and not jsonl:
        check_cuts(cuts, path, allow_command_sources)
    return cuts


def load_cut_audio(cut: Cut) -> np.ndarray:
    """A cut's samples as lhotse loads them; any failure is a one-line ``UserError`` naming the audio and the cut.
    An audio file that is not a regular file (a named pipe, which opening waits on for ever; a device such as
    ``/dev/zero``, which never ends) is refused before it is opened, as ``transcribe`` refuses it."""
    for where in _file_sources(cut):
        try:
            info = os.stat(where)
        except OSError:
            continue  # missing or unreadable: lhotse's error below says so
        if not stat.S_ISREG(info.st_mode) and not stat.S_ISDIR(info.st_mode):
            kind = file_kind(info.st_mode)
            raise UserError(f"{where}: cut {cut.id}: not a readable audio file (not a regular file: {kind})")
    try:
        return _with_shared_resampling(cut).load_audio()
    except Exception as err:  # any decoder, command or file error
        source = _first_source(cut)
        where = str(source.source) if source is not None else str(cut.id)
        raise UserError(f"{where}: cut {cut.id}: {_changed_audio(cut, where) or _audio_problem(source, err)}") from None


def _with_shared_resampling(cut: Cut) -> Cut:
    """``cut`` resampling from :func:`srupp_asr.audio.resampling_rate` as transcription does: a recording at a rate
    sharing few factors with 16 kHz (22051 Hz) would otherwise get a kernel of gigabytes from lhotse (52 s and 9 GB
    for 2 s at 16001 Hz, cached for the process's life); common rates, and cuts without such a recording, are
    returned unchanged."""
    if isinstance(cut, MixedCut):  # noise mixed in: each track is a cut of its own recording
        tracks = [fastcopy(track, cut=_with_shared_resampling(track.cut)) for track in cut.tracks]
        return fastcopy(cut, tracks=tracks)
    recording = getattr(cut, "recording", None)
    if recording is None or not recording.transforms:
        return cut
    transforms = [_shared_resample(t) for t in recording.transforms]
    if all(new is old for new, old in zip(transforms, recording.transforms, strict=True)):
        return cut
    return fastcopy(cut, recording=fastcopy(recording, transforms=transforms))


def _shared_resample(transform: AudioTransform | dict) -> AudioTransform | dict:
    """A lhotse ``Resample`` transform from the rate transcription resamples from; other transforms as they are."""
    parsed = AudioTransform.from_dict(transform) if isinstance(transform, dict) else transform
    if not isinstance(parsed, Resample):
        return transform
    source, target = parsed.source_sampling_rate, parsed.target_sampling_rate
    used = resampling_rate(source, target)
    return transform if used == source else Resample(source_sampling_rate=used, target_sampling_rate=target)


def _file_sources(cut: Cut) -> Iterator[str]:
    """The paths of a cut's ``file`` audio sources (a MixedCut's tracks' too)."""
    if isinstance(cut, MixedCut):
        for track in cut.tracks:
            yield from _file_sources(track.cut)
        return
    for source in getattr(getattr(cut, "recording", None), "sources", None) or []:
        if source.type == "file" and isinstance(source.source, str):
            yield source.source


def _first_source(cut: Cut):
    """The first audio source of a cut's recording (None for a cut without one, e.g. a MixedCut)."""
    sources = getattr(getattr(cut, "recording", None), "sources", None) or []
    return sources[0] if sources else None


def _changed_audio(cut: Cut, where: str) -> str | None:
    """How the audio file ``where`` of ``cut`` differs from what its manifest records (samples, rate), or None:
    audio replaced after the manifest was written, which lhotse reports as a possible internal error of its own."""
    import soundfile as sf

    recording = getattr(cut, "recording", None)
    if recording is None or not os.path.isfile(where):
        return None
    try:
        info = sf.info(where)
    except (RuntimeError, sf.LibsndfileError):
        return None
    if (info.frames, info.samplerate) == (recording.num_samples, recording.sampling_rate):
        return None
    return (
        f"its audio changed after the manifest was written: the file holds {info.frames} samples at"
        f" {info.samplerate} Hz, the manifest says {recording.num_samples} at {recording.sampling_rate} Hz (prepare"
        " the manifest again)"
    )


def _audio_problem(source, err: Exception) -> str:
    """One line for a lhotse audio error, which lists every backend's failure and dumps the cut on more lines."""
    if source is not None and source.type == "file" and not os.path.exists(source.source):
        return "audio file not found"
    return f"cannot load its audio ({audio_error_detail(err)})"


def audio_error_detail(err: Exception) -> str:
    """What lhotse's audio error says, in one line of at most 200 characters: it lists every backend's failure
    ("Exception #0 (<backend>): <class ...>: what the first backend said", ...) after a line ending in
    "Details:", and a hint about an environment variable last; the first backend's words are kept."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    detail = next((line.split(">: ", 1)[-1] for line in lines if line.startswith("Exception #0")), None)
    detail = detail or (lines[0] if lines else type(err).__name__)
    return detail if len(detail) <= 200 else detail[:200] + "..."


def save_cuts(cuts: Iterable[Cut], path: str | os.PathLike) -> None:
    """Write ``cuts`` to a ``.jsonl.gz`` (or ``.jsonl``) manifest atomically; the bytes depend on the cuts
    only (the gzip header carries no time stamp or file name), so equal cut sets give identical files."""
    path = Path(path)
    if not path.name.endswith(CUT_SUFFIXES):
        raise UserError(f"{path}: cut manifests are written as .jsonl.gz (or .jsonl)")
    with atomic_output(path) as tmp, open(tmp, "wb") as raw:
        out = gzip.GzipFile("", "wb", 9, raw, mtime=0) if path.name.endswith(".gz") else raw
        with out:
            for cut in cuts:
                out.write((json.dumps(cut.to_dict(), ensure_ascii=False) + "\n").encode("utf-8"))


def cut_text(cut: Cut) -> str:
    """The normalised transcript of ``cut``: its supervisions' texts in time order."""
    sups = sorted(cut.supervisions, key=lambda s: s.start)
    return normalize_text(" ".join(s.text for s in sups if s.text))
