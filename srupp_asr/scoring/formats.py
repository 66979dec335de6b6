"""Reading and writing transcripts: Kaldi ``text``, sclite ``trn`` and JSON lines.

- Kaldi ``text``: ``UTT_ID word word ...`` per line (an id alone is an empty transcript).
- trn: ``word word ... (UTT_ID)`` per line; the speaker is the id up to its first ``-`` (else its first ``_``),
  as ``sclite -i rm`` reads it.
- JSON lines: one object per line with ``"id"`` (or ``"utt_id"``), ``"text"`` and optionally ``"speaker"``.
- STM (segment time marks, sclite's reference of long recordings): ``file channel speaker start end [<labels>]
  text`` per line; CTM (conversation time marks, its hypotheses): ``file channel start duration word
  [confidence]`` per word, alternations written as ``<ALT_BEGIN>`` ... ``<ALT>`` ... ``<ALT_END>`` lines.
  :func:`read_stm` and :func:`read_ctm` read them for ``srupp-asr sclite``.
- ``;;`` starts a comment line in trn, STM and CTM files, as in sclite.
- lines (``score --no-ids``): plain text, one utterance per line and no ids: line N is utterance ``line-N`` (a
  blank line is an empty transcript), so a reference and a hypothesis are paired by line number.

Blank lines are skipped in the formats with ids. Every problem is a :class:`~srupp_asr.errors.UserError` naming
the file and line.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from srupp_asr.errors import UserError
from srupp_asr.fileio import MAX_LIST_BYTES, atomic_write_text, read_bytes, read_lines

FORMATS = ("auto", "kaldi", "trn", "jsonl", "lines")
# What a Kaldi-looking file that is really plain text (its first words taken as ids) is told.
NO_IDS_HINT = "plain text with one utterance per line and no ids? score it with --no-ids"
_ID_KEYS = ("id", "utt_id")
MAX_TRANSCRIPT_CHARS = 1_000_000  # one line's (about 150,000 words); longer is refused before it is split


@dataclass(frozen=True)
class UtteranceText:
    """One utterance's text, with its speaker when the file says it."""

    utt_id: str
    text: str
    speaker: str | None = None


def detect_format(path: str | os.PathLike, first_line: str) -> str:
    """Guess the format from the file name, else from the first non-blank line."""
    name = Path(path).name
    if name.endswith(".jsonl") or first_line.lstrip().startswith("{"):
        return "jsonl"
    if name.endswith(".trn") or (first_line.rstrip().endswith(")") and "(" in first_line):
        return "trn"
    return "kaldi"


def speaker_of_trn_id(utt_id: str) -> str | None:
    """The speaker part of a trn id (``spk-utt`` or ``spk_utt``, as ``sclite -i rm``), or None."""
    for sep in "-_":
        head, found, _ = utt_id.partition(sep)
        if found and head:
            return head
    return None


def read_transcripts(path: str | os.PathLike, fmt: str = "auto", what: str = "transcript file") -> list[UtteranceText]:
    """The transcripts of a Kaldi text / trn / JSON-lines file, in file order (ids unique, file not empty)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown transcript format {fmt!r}; expected one of {FORMATS}")
    lines = read_lines(path, what, max_line_chars=MAX_TRANSCRIPT_CHARS)  # a 100 MB line is not one utterance
    numbered = [(i, line) for i, line in enumerate(lines, start=1) if line.strip() and not is_comment(line)]
    if not numbered:
        raise UserError(f"{path}: {what} holds no transcripts")
    if fmt == "lines":
        return [UtteranceText(f"line-{i}", " ".join(line.split())) for i, line in enumerate(lines, start=1)]
    detected = fmt == "auto"
    if detected:
        fmt = detect_format(path, numbered[0][1])
    parse = {"kaldi": _parse_kaldi, "trn": _parse_trn, "jsonl": _parse_jsonl}[fmt]
    seen: dict[str, int] = {}
    out = []
    for number, line in numbered:
        where = f"{path}:{number}"
        item = parse(line, where)
        if item.utt_id in seen:
            hint = f" ({NO_IDS_HINT})" if detected and fmt == "kaldi" else ""
            raise UserError(f"{where}: utterance id {item.utt_id!r} already on line {seen[item.utt_id]}{hint}")
        seen[item.utt_id] = number
        out.append(item)
    return out


def is_comment(line: str) -> bool:
    """A sclite comment line (``;;`` first): trn, STM and CTM files may hold them anywhere."""
    return line.lstrip().startswith(";;")


def split_trn_id(line: str) -> tuple[str, str | None]:
    """(text, utterance id) of a trn line: the id is inside its last ``(...)``; None when there is none."""
    body = line.rstrip()
    start = body.rfind("(")
    if not body.endswith(")") or start < 0:
        return body, None
    return body[:start], body[start + 1 : -1].strip()


@dataclass(frozen=True)
class StmSegment:
    """One STM line: a stretch of a recording channel with its speaker and reference text."""

    file: str
    channel: str
    speaker: str
    start: float
    end: float
    labels: str
    text: str


@dataclass(frozen=True)
class CtmToken:
    """One CTM line: a timed hypothesis word, or an alternation mark (``<ALT_BEGIN>``, ``<ALT>``, ``<ALT_END>``,
    whose times are ``*`` and read as None)."""

    file: str
    channel: str
    start: float | None
    duration: float | None
    word: str
    confidence: float | None = None


def read_stm(path: str | os.PathLike, encoding: str = "utf-8") -> list[StmSegment]:
    """The segments of an STM file, in file order (comments and blank lines skipped)."""
    out = []
    for number, line in data_lines(path, "STM file", encoding):
        parts = line.split(maxsplit=5)
        if len(parts) < 5:
            raise UserError(f"{path}:{number}: an STM line is 'FILE CHANNEL SPEAKER START END [<LABELS>] TEXT'")
        start, end = _time(parts[3], path, number), _time(parts[4], path, number)
        rest = parts[5] if len(parts) > 5 else ""
        labels = ""
        if rest.startswith("<") and ">" in rest:
            labels, _, rest = rest[1:].partition(">")
        out.append(StmSegment(parts[0], parts[1], parts[2], start, end, labels, " ".join(rest.split())))
    return out


def read_ctm(path: str | os.PathLike, encoding: str = "utf-8") -> list[CtmToken]:
    """The words of a CTM file, in file order (comments and blank lines skipped)."""
    out = []
    for number, line in data_lines(path, "CTM file", encoding):
        parts = line.split()
        if len(parts) < 5:
            raise UserError(f"{path}:{number}: a CTM line is 'FILE CHANNEL START DURATION WORD [CONFIDENCE]'")
        if parts[4].upper().startswith("<ALT"):
            out.append(CtmToken(parts[0], parts[1], None, None, parts[4].upper()))
            continue
        start, duration = _time(parts[2], path, number), _time(parts[3], path, number)
        confidence = _confidence(parts[5], path, number) if len(parts) > 5 else None
        out.append(CtmToken(parts[0], parts[1], start, duration, parts[4], confidence))
    return out


def data_lines(path: str | os.PathLike, what: str, encoding: str) -> list[tuple[int, str]]:
    """(line number, line) of a sclite input file's non-blank, non-comment lines, decoded as ``encoding``."""
    text = read_bytes(path, what, MAX_LIST_BYTES).decode(encoding, errors="replace")
    lines = text.removeprefix("\ufeff").split("\n")
    return [(i, line.rstrip("\r")) for i, line in enumerate(lines, start=1) if line.strip() and not is_comment(line)]


def _time(text: str, path: str | os.PathLike, number: int) -> float:
    try:
        return float(text)
    except ValueError:
        raise UserError(f"{path}:{number}: expected a time in seconds, got {text[:40]!r}") from None


def _confidence(text: str, path: str | os.PathLike, number: int) -> float:
    """A CTM word's confidence (sclite warns of values outside 0-1 and clips them; so does ``srupp-asr sclite``)."""
    try:
        return float(text)
    except ValueError:
        raise UserError(f"{path}:{number}: a CTM confidence is a number, got {text[:40]!r}") from None


def read_utt2spk(path: str | os.PathLike) -> dict[str, str]:
    """A Kaldi ``utt2spk`` file as {utterance id: speaker}."""
    out = {}
    for number, line in enumerate(read_lines(path, "utt2spk file"), start=1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2:
            raise UserError(f"{path}:{number}: expected 'UTT_ID SPEAKER', got {line.strip()[:80]!r}")
        out[parts[0]] = parts[1]
    if not out:
        raise UserError(f"{path}: utt2spk file is empty")
    return out


def trn_line(item: UtteranceText) -> str:
    """``text (SPEAKER-UTT_ID)``, the line sclite reads (the speaker prefix only when the id lacks it).

    sclite (``-i rm``) takes the speaker up to the first ``-`` of the id, so a ``-`` inside the speaker is
    written as ``_`` (``sw02001-A`` as ``sw02001_A``): else the speakers ``sw02001-A`` and ``sw02001-B`` would
    both be ``sw02001`` to sclite.
    """
    utt_id = item.utt_id
    if item.speaker is not None and speaker_of_trn_id(utt_id) != item.speaker:
        utt_id = f"{item.speaker.replace('-', '_')}-{utt_id}"
    return f"{item.text} ({utt_id})" if item.text else f"({utt_id})"


def write_trn(path: str | os.PathLike, items: list[UtteranceText]) -> None:
    """Write transcripts as a trn file (atomically)."""
    atomic_write_text(path, "".join(trn_line(t) + "\n" for t in items))


def jsonl_text(items: list[UtteranceText]) -> str:
    """Transcripts as JSON lines ``{"id", "speaker", "text"}``."""
    rows = ({"id": t.utt_id, "speaker": t.speaker, "text": t.text} for t in items)
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def write_jsonl(path: str | os.PathLike, items: list[UtteranceText]) -> None:
    """Write transcripts as JSON lines (:func:`jsonl_text`), atomically."""
    atomic_write_text(path, jsonl_text(items))


def _parse_kaldi(line: str, where: str) -> UtteranceText:
    utt_id, *text = line.split(maxsplit=1)
    return UtteranceText(utt_id, " ".join(text[0].split()) if text else "")


def _parse_trn(line: str, where: str) -> UtteranceText:
    body = line.rstrip()
    start = body.rfind("(")
    if not body.endswith(")") or start < 0:
        raise UserError(f"{where}: a trn line ends with its utterance id in parentheses, got {body[-80:]!r}")
    utt_id = body[start + 1 : -1].strip()
    if not utt_id or any(c.isspace() for c in utt_id):
        raise UserError(f"{where}: bad utterance id {utt_id!r} (one word expected)")
    return UtteranceText(utt_id, " ".join(body[:start].split()), speaker_of_trn_id(utt_id))


def _parse_jsonl(line: str, where: str) -> UtteranceText:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise UserError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(row, dict):
        raise UserError(f"{where}: expected a JSON object, got {type(row).__name__}")
    key = next((k for k in _ID_KEYS if k in row), None)
    if key is None or not isinstance(row[key], str) or not row[key].strip():
        raise UserError(f"{where}: needs a non-empty string field 'id' (or 'utt_id')")
    text = row.get("text")
    if not isinstance(text, str):
        raise UserError(f"{where}: needs a string field 'text'")
    speaker = row.get("speaker")
    if speaker is not None and not isinstance(speaker, str):
        raise UserError(f"{where}: field 'speaker' must be a string")
    return UtteranceText(row[key].strip(), " ".join(text.split()), speaker or None)
