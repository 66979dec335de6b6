"""Import corpora in other toolkits' formats as lhotse cut manifests (``.jsonl.gz``).

- :func:`import_kaldi_dir`: a Kaldi data directory (``wav.scp``, ``text``, optional ``segments`` and ``utt2spk``);
- :func:`import_nemo_manifest`: a NeMo JSON-lines manifest (``audio_filepath``, ``text``, optional ``duration``
  and ``offset``).

Every audio file is opened to check that it exists, decodes, and covers the utterance; an entry that fails a
check (missing or unreadable audio, malformed line, no transcript, a segment outside its recording) is reported
and skipped, and the rest are imported. Transcripts are stored raw: normalisation happens where text is used
(:func:`srupp_asr.text.normalize_text`). Audio keeps its own sampling rate; batches are resampled on the fly.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import soundfile as sf
from lhotse import AudioSource, CutSet, Recording, SupervisionSegment
from lhotse.cut import Cut
from lhotse.utils import fastcopy

from srupp_asr.data import save_cuts
from srupp_asr.errors import UserError
from srupp_asr.fileio import read_lines

log = logging.getLogger(__name__)

# How far a segment may run past the end of its audio (rounded times in the source) before it is an error;
# within this it is clipped to the audio.
END_TOLERANCE = 0.1
# The same for a Kaldi ``segments`` line: Kaldi's extract-segments truncates a segment that overshoots its audio by
# less than its --max-overshoot (default 0.5 s) and rejects the others.
KALDI_MAX_OVERSHOOT = 0.5


class _Skip(Exception):
    """One entry cannot be imported; the message says where and why."""


@dataclass
class _Report:
    """Collects the problems of one import: each one is an entry (or a line of a side file) left out."""

    problems: list[str] | None

    def skip(self, message: str) -> None:
        if self.problems is None:
            log.warning("skipped: %s", message)
        else:
            self.problems.append(message)


def _read_table(path: Path, report: _Report, fields: int | None = None) -> dict[str, list[str] | None]:
    """Read a Kaldi table: per line a key and ``fields`` more fields (None: the rest of the line as one field).

    A malformed line maps its key to None (the entry is unusable); a duplicate key is reported and ignored.
    """
    table: dict[str, list[str] | None] = {}
    for lineno, line in enumerate(read_lines(path), 1):
        if not line.strip():
            continue
        if fields is None:
            key, *rest = line.split(maxsplit=1)
            values: list[str] | None = [rest[0].strip() if rest else ""]
        else:
            key, *values = line.split()
            if len(values) != fields:
                values = None
        if key in table:
            report.skip(f"{path}:{lineno}: duplicate id {key!r}")
        else:
            table[key] = values
    return table


def _command_recording(recording_id: str, command: str) -> Recording:
    """A recording read from a Kaldi pipe command, which is run once here to learn its length and rate."""
    done = subprocess.run(command, shell=True, capture_output=True, check=False)
    if done.returncode != 0 or not done.stdout:
        stderr = done.stderr.decode(errors="replace").strip().splitlines()
        detail = stderr[-1] if stderr else f"exit status {done.returncode}, no output"
        raise _Skip(f"command failed ({detail})")
    try:
        audio, rate = sf.read(io.BytesIO(done.stdout), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError) as err:
        raise _Skip(f"command output is not audio ({err})") from None
    return Recording(
        id=recording_id,
        sources=[AudioSource(type="command", channels=list(range(audio.shape[1])), source=command)],
        sampling_rate=rate,
        num_samples=audio.shape[0],
        duration=audio.shape[0] / rate,
    )


def _file_recording(recording_id: str, path: Path) -> Recording:
    if not path.is_file():
        raise _Skip(f"audio file not found: {path}")
    try:
        recording = Recording.from_file(path, recording_id=recording_id)
    except Exception as err:  # lhotse tries several decoders; any failure means the file is unusable
        detail = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise _Skip(f"cannot read audio {path} ({detail})") from None
    if recording.num_samples == 0:
        raise _Skip(f"audio file is empty: {path}")
    return recording


def _cut(
    recording: Recording,
    cut_id: str,
    start: float,
    end: float | None,
    text: str,
    speaker: str | None,
    tolerance: float = END_TOLERANCE,
) -> Cut:
    """The cut of ``recording`` from ``start`` to ``end`` (None: its end) with one supervision; an end less than
    ``tolerance`` past the audio's end is clipped to it."""
    if end is None:
        end = recording.duration
    if end > recording.duration + tolerance:
        raise _Skip(f"ends at {end:.2f} s, after the audio's end at {recording.duration:.2f} s")
    end = min(end, recording.duration)
    if not 0 <= start < end:
        raise _Skip(f"empty or negative time span {start:.2f}-{end:.2f} s")
    cut = recording.to_cut()
    if start > 0 or end < recording.duration:
        cut = cut.truncate(offset=start, duration=end - start, preserve_id=True)
    supervision = SupervisionSegment(
        id=cut_id,
        recording_id=recording.id,
        start=0.0,
        duration=cut.duration,
        channel=cut.channel,
        text=text,
        speaker=speaker,
    )
    return fastcopy(cut, id=cut_id, supervisions=[supervision])


def import_kaldi_dir(
    data_dir: str | os.PathLike, problems: list[str] | None = None, allow_commands: bool = False
) -> CutSet:
    """Read a Kaldi data directory as cuts; entries that cannot be imported are appended to ``problems``.

    ``wav.scp`` lines hold a path (relative paths are taken from the current directory, as Kaldi does) or a
    command ending in ``|`` whose standard output is a WAV/FLAC stream. Commands are shell code: unless
    ``allow_commands`` (only for data you trust) a ``wav.scp`` holding one is a UserError and nothing runs;
    allowed, a command is run once here and again each time the cut is loaded. ``text`` is required; ``segments``
    (times in seconds, end ``-1`` = end of the recording; an end less than 0.5 s past the audio's end is clipped
    to it, as Kaldi's extract-segments does) and ``utt2spk`` are optional. Without ``problems`` the
    problems are logged as warnings.
    """
    data_dir = Path(data_dir)
    report = _Report(problems)
    if not data_dir.is_dir():
        raise UserError(f"{data_dir}: not a directory")
    for name in ("wav.scp", "text"):
        if not (data_dir / name).is_file():
            raise UserError(f"{data_dir / name}: not found (a Kaldi data directory needs wav.scp and text)")
    wav_scp = _read_table(data_dir / "wav.scp", report)
    commands = [rec_id for rec_id, fields in wav_scp.items() if fields and fields[0].endswith("|")]
    if commands and not allow_commands:
        raise UserError(
            f"{data_dir / 'wav.scp'}: {len(commands)} entries are shell commands (the first: {commands[0]}); "
            "nothing was run. If you trust this data, pass --allow-command-sources"
        )
    texts = _read_table(data_dir / "text", report)
    speakers: dict[str, list[str] | None] = {}
    if (data_dir / "utt2spk").is_file():
        speakers = _read_table(data_dir / "utt2spk", report, fields=1)
        for utt in [utt for utt, fields in speakers.items() if fields is None]:
            report.skip(f"{data_dir / 'utt2spk'}: {utt}: malformed line (expected: utterance speaker); no speaker")
    if (data_dir / "segments").is_file():
        where = data_dir / "segments"
        segments = _read_table(where, report, fields=3)
    else:
        where = data_dir / "wav.scp"
        segments = {rec_id: [rec_id, "0", "-1"] for rec_id in wav_scp}

    recordings: dict[str, Recording | _Skip] = {}  # opened on first use; a failure is reported per utterance
    cuts = []
    for utt, fields in segments.items():
        try:
            if fields is None:
                raise _Skip("malformed line (expected: utterance recording start end)")
            rec_id, start, end = fields[0], _seconds(fields[1]), _seconds(fields[2])
            if end < 0 and end != -1:  # Kaldi: only -1 means the end of the recording; other negatives are errors
                raise _Skip(f"negative end time {fields[2]!r} (only -1 means the end of the recording)")
            if rec_id not in recordings:
                recordings[rec_id] = _open_kaldi_recording(rec_id, wav_scp)
            recording = recordings[rec_id]
            if isinstance(recording, _Skip):
                raise recording
            if utt not in texts:
                raise _Skip(f"no transcript in {data_dir / 'text'}")
            text = texts[utt][0]
            speaker = speakers.get(utt)
            end_time = None if end == -1 else end
            speaker_id = speaker[0] if speaker else None
            cuts.append(_cut(recording, utt, start, end_time, text, speaker_id, KALDI_MAX_OVERSHOOT))
        except _Skip as err:
            report.skip(f"{where}: {utt}: {err}")
    for utt in sorted(texts.keys() - segments.keys()):
        report.skip(f"{data_dir / 'text'}: {utt}: no audio (not in {where.name})")
    return CutSet.from_cuts(cuts)


def _seconds(field: str) -> float:
    try:
        return float(field)
    except ValueError:
        raise _Skip(f"time is not a number: {field!r}") from None


def _open_kaldi_recording(rec_id: str, wav_scp: dict[str, list[str] | None]) -> Recording | _Skip:
    """The recording of a ``wav.scp`` entry, or the reason it cannot be used."""
    if rec_id not in wav_scp:
        return _Skip(f"recording {rec_id!r} is not in wav.scp")
    source = wav_scp[rec_id][0] if wav_scp[rec_id] else ""
    try:
        if not source:
            raise _Skip("no audio path or command after the recording id")
        if source.endswith("|"):
            return _command_recording(rec_id, source[:-1].strip())
        return _file_recording(rec_id, Path(os.path.abspath(source)))
    except _Skip as err:
        return err


def import_nemo_manifest(path: str | os.PathLike, problems: list[str] | None = None) -> CutSet:
    """Read a NeMo JSON-lines manifest as cuts; entries that cannot be imported are appended to ``problems``.

    Each line is an object with ``audio_filepath`` (relative paths are resolved against the manifest's
    directory), ``text``, and optionally ``duration`` (default: to the end of the file) and ``offset``
    (default 0). A cut is named after its audio file's stem, with ``_START_END`` (centiseconds) added when it
    covers only part of the file. Without ``problems`` the problems are logged as warnings.
    """
    path = Path(path)
    report = _Report(problems)
    lines = read_lines(path)
    base = path.parent
    recordings: dict[Path, Recording | _Skip] = {}
    recording_ids: set[str] = set()
    cuts: dict[str, Cut] = {}
    first_line: dict[str, int] = {}
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as err:
            report.skip(f"{where}: not valid JSON ({err.msg})")
            continue
        try:
            audio, text, offset, duration = _nemo_fields(entry)
        except _Skip as err:
            report.skip(f"{where}: {err}")
            continue
        audio = Path(os.path.abspath(base / audio))
        if audio not in recordings:
            rec_id = _unique(audio.stem, recording_ids)
            try:
                recordings[audio] = _file_recording(rec_id, audio)
                recording_ids.add(rec_id)
            except _Skip as err:
                recordings[audio] = err
        recording = recordings[audio]
        if isinstance(recording, _Skip):
            report.skip(f"{where}: {recording}")
            continue
        end = None if duration is None else offset + duration
        stop = recording.duration if end is None else min(end, recording.duration)
        whole = offset == 0 and abs(stop - recording.duration) <= END_TOLERANCE
        cut_id = recording.id if whole else f"{recording.id}_{round(offset * 100):06d}_{round(stop * 100):06d}"
        if cut_id in cuts:
            report.skip(f"{where}: duplicate of line {first_line[cut_id]} ({cut_id})")
            continue
        try:
            cuts[cut_id] = _cut(recording, cut_id, offset, end, text, None)
        except _Skip as err:
            report.skip(f"{where}: {audio}: {err}")
            continue
        first_line[cut_id] = lineno
    return CutSet.from_cuts(cuts.values())


def _nemo_fields(entry: object) -> tuple[str, str, float, float | None]:
    """audio path, text, offset and duration of a NeMo manifest entry (``_Skip`` if malformed)."""
    if not isinstance(entry, dict):
        raise _Skip(f"expected a JSON object, got {type(entry).__name__}")
    audio = entry.get("audio_filepath")
    if not isinstance(audio, str) or not audio:
        raise _Skip("no 'audio_filepath'")
    text = entry.get("text")
    if not isinstance(text, str):
        raise _Skip("no 'text'")
    numbers = {}
    for key in ("offset", "duration"):
        value = entry.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value)):
            raise _Skip(f"'{key}' is not a number: {value!r}")
        numbers[key] = value
    duration = numbers["duration"]
    if duration is not None and duration <= 0:
        raise _Skip(f"'duration' must be positive, got {duration}")
    return audio, text, float(numbers["offset"] or 0.0), None if duration is None else float(duration)


def _unique(name: str, taken: set[str]) -> str:
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}-{n}"
    return candidate


def prepare_command(args: argparse.Namespace) -> int:
    """``srupp-asr prepare kaldi|nemo SRC OUT``: import, write the manifest, report; exit 1 if entries were skipped."""
    problems: list[str] = []
    if args.format == "kaldi":
        cuts = import_kaldi_dir(args.source, problems, args.allow_command_sources)
    else:
        cuts = import_nemo_manifest(args.source, problems)
    for problem in problems:
        print(f"skipped: {problem}", file=sys.stderr)
    if len(cuts) == 0:
        raise UserError(f"{args.source}: nothing could be imported ({len(problems)} entries skipped)")
    save_cuts(cuts, args.out)
    print(f"wrote {len(cuts)} cuts to {args.out}; skipped {len(problems)}")
    return 1 if problems else 0


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the ``prepare`` sub-command (``prepare kaldi`` and ``prepare nemo``)."""
    p = subparsers.add_parser("prepare", help="import a Kaldi data dir or NeMo manifest as a lhotse cut manifest")
    formats = p.add_subparsers(dest="format", metavar="FORMAT", required=True)
    kaldi = formats.add_parser("kaldi", help="a Kaldi data directory (wav.scp, text, [segments], [utt2spk])")
    kaldi.add_argument("source", metavar="DATA_DIR")
    kaldi.add_argument(
        "--allow-command-sources",
        action="store_true",
        help="run the wav.scp entries that are shell commands ('... |'); only for data you trust",
    )
    nemo = formats.add_parser("nemo", help="a NeMo JSON-lines manifest (audio_filepath, text, [duration, offset])")
    nemo.add_argument("source", metavar="MANIFEST")
    for sub in (kaldi, nemo):
        sub.add_argument("out", metavar="OUT", help="cut manifest to write (.jsonl.gz)")
        sub.set_defaults(func=prepare_command)
    return p
