"""Scoring whole-talk transcripts (the long-form test): ``srupp-asr corpus score-talks``.

:func:`score_talks` scores ``srupp-asr transcribe`` JSON transcripts of whole recordings against the talk cuts of
:func:`srupp_asr.corpora.tedlium_talks`, leaving out the words said where the STM says not to score, as sclite does
with an STM. A talk without a transcript is scored as all deletions and named on stderr, and the command exits 1;
a missing transcripts folder, or one without a transcript of any talk, is an error (exit 2).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from srupp_asr.errors import UserError
from srupp_asr.fileio import atomic_write_text

if TYPE_CHECKING:
    from lhotse.cut import Cut

log = logging.getLogger(__name__)


def _timed_units(transcript: dict) -> Iterator[tuple[str, float]]:
    """(text, midpoint) of each word of a ``transcribe`` JSON transcript (whole segments when it has no words)."""
    for segment in transcript.get("segments", []):
        words = segment.get("words") or []
        if words:
            for word in words:
                yield word["word"], (word["start"] + word["end"]) / 2
        elif segment.get("text"):
            yield segment["text"], (segment["start"] + segment["end"]) / 2


def scored_hypothesis(transcript: dict, cut: Cut) -> str:
    """The words of a whole-recording transcript that fall (by their midpoint) inside ``cut``'s span of the
    recording and outside its ``custom["unscored"]`` spans."""
    start, end = cut.start, cut.start + cut.duration
    unscored = (cut.custom or {}).get("unscored", [])
    kept = [
        text
        for text, mid in _timed_units(transcript)
        if start <= mid <= end and not any(a <= mid < b for a, b in unscored)
    ]
    return " ".join(kept)


def _some(names: Sequence[str], shown: int = 5) -> str:
    more = f" ... (+{len(names) - shown} more)" if len(names) > shown else ""
    return " ".join(names[:shown]) + more


def score_talks(
    talks: str | os.PathLike,
    transcripts_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    name: str | None = None,
    missing: list[str] | None = None,
):
    """Score ``transcripts_dir/<talk>.json`` (``srupp-asr transcribe -f json`` of each talk's whole recording)
    against the talk cuts of ``talks`` (:func:`srupp_asr.corpora.tedlium_talks`); writes the report (and ``ref.jsonl`` /
    ``hyp.jsonl``) into ``out_dir``.

    The words kept are those sclite would score with the talk's STM, except the words before the talk's first
    scored segment or after its last one, which are left out (sclite counts them as insertions when no
    ``ignore_time_segment_in_scoring`` segment lies there; TED-LIUM's STMs open and close with one). Each talk is
    aligned as one utterance, not segment by segment as sclite does, so a word that drifted over a segment
    boundary still matches: the totals equal sclite's unless errors meet across a boundary (a deletion at the end
    of one segment and an insertion at the start of the next are one substitution here, two errors in sclite).

    A talk without a transcript is scored as an empty hypothesis (all deletions), the report says how many, and
    the transcript file names it lacks go to ``missing`` (a warning in the log when ``missing`` is None). A
    missing folder, or one with no transcript of any talk, is a UserError (nothing is written)."""
    from srupp_asr.fileio import read_text
    from srupp_asr.manifest import cut_text, load_cuts
    from srupp_asr.scoring.analysis import score_transcripts
    from srupp_asr.scoring.formats import UtteranceText, write_jsonl
    from srupp_asr.scoring.report import ReportInfo, write_report

    transcripts_dir = Path(transcripts_dir)
    if not transcripts_dir.exists():
        raise UserError(f"{transcripts_dir}: transcripts folder not found")
    if not transcripts_dir.is_dir():
        raise UserError(f"{transcripts_dir}: not a folder (the transcripts folder of srupp-asr transcribe -f json)")
    refs, hyps, absent = [], [], []
    for cut in load_cuts(talks, allow_command_sources=True):  # texts only: no audio is read
        refs.append(UtteranceText(cut.id, cut_text(cut), cut.recording_id))
        path = transcripts_dir / f"{cut.recording_id}.json"
        if not path.is_file():
            absent.append(path.name)
            continue
        try:
            transcript = json.loads(read_text(path, "transcript"))
        except json.JSONDecodeError as err:
            raise UserError(f"{path}: not a transcribe JSON transcript ({err.msg} at line {err.lineno})") from None
        try:
            hypothesis = scored_hypothesis(transcript, cut)
        except (AttributeError, KeyError, TypeError):
            expected = "segments with start, end and text, words with word, start and end"
            raise UserError(f"{path}: not a transcribe JSON transcript (expected {expected})") from None
        hyps.append(UtteranceText(cut.id, hypothesis, cut.recording_id))
    if not refs:
        raise UserError(f"{talks}: no talks to score")
    if not hyps:
        raise UserError(
            f"{transcripts_dir}: no transcript of any of the {len(refs)} talks of {talks}"
            f" (expected {transcripts_dir / absent[0]}, ...: srupp-asr transcribe -f json)"
        )
    if missing is not None:
        missing += absent
    elif absent:
        log.warning("%s: no transcript for %d of %d talks: %s", transcripts_dir, len(absent), len(refs), _some(absent))
    out = Path(out_dir)
    result = score_transcripts(refs, hyps)
    details = {}
    if absent:
        details["missing transcripts"] = f"{len(absent)} of {len(refs)} talks (scored as all deletions)"
    info = ReportInfo(name or Path(talks).name.split(".")[0], str(talks), str(out / "hyp.jsonl"), True, details)
    write_report(result, out, info)  # first: it checks the folder before writing
    write_jsonl(out / "ref.jsonl", refs)
    write_jsonl(out / "hyp.jsonl", hyps)
    return result


def score_talks_command(args: argparse.Namespace) -> int:
    """``srupp-asr corpus score-talks``: exit 1 when some talks have no transcript (scored as all deletions)."""
    from srupp_asr.scoring.report import score_line
    from srupp_asr.scoring.score import print_summary

    name = args.name or Path(args.talks).name.split(".")[0]
    missing: list[str] = []
    result = score_talks(args.talks, args.transcripts, args.out_dir, name, missing=missing)
    if getattr(args, "stm", None):  # the official way: sclite, the words as a CTM against the corpus STM files
        sclite_talks(args.transcripts, args.stm, args.out_dir)
    if missing:  # loud, not a quiet warning: a recipe must not take this WER for the model's
        talks = len(result.utterances)
        print(
            f"srupp-asr corpus: error: {args.transcripts}: no transcript for {len(missing)} of {talks} talks,"
            f" scored as all deletions: {_some(missing)}",
            file=sys.stderr,
        )
        print(score_line(result, name))  # print_summary's warning would say the same again
        print(f"report: {Path(args.out_dir) / 'report.html'}", file=sys.stderr)
        return 1
    print_summary(result, name, args.out_dir, args.transcripts)
    return 0


def ctm_lines(transcript: dict, recording: str, channel: str = "1") -> list[str]:
    """CTM lines (``REC CHANNEL START DURATION WORD``) of a ``transcribe`` JSON transcript's word timings, for
    ``srupp-asr sclite -r STM stm -h CTM ctm`` (a segment without word timings is one timed token)."""
    out = []
    for segment in transcript.get("segments", []):
        for word in segment.get("words") or [{"word": segment.get("text", ""), **segment}]:
            for token in word["word"].split():
                out.append(f"{recording} {channel} {word['start']:.2f} {word['end'] - word['start']:.2f} {token}\n")
    return out


def sclite_talks(transcripts: str | os.PathLike, stm_dir: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Score whole-talk transcripts as TED-LIUM is officially scored: their words as ``out_dir/hyp.ctm``, the
    ``*.stm`` files of ``stm_dir`` (comment lines dropped, sorted by recording, channel and start) as
    ``out_dir/ref.stm``, and ``srupp-asr sclite`` over the pair into ``out_dir/sclite.sys``, ``.raw`` and ``.pra``;
    returns the ``.sys`` file."""
    from srupp_asr.scoring import sclite

    out = Path(out_dir)
    stms = sorted(Path(stm_dir).glob("*.stm"))
    if not stms:
        raise UserError(f"{stm_dir}: no *.stm files")
    rows = [line for f in stms for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = [line for line in rows if not line.startswith(";;")]

    def key(line: str) -> tuple[str, str, float]:
        fields = line.split()
        return fields[0], fields[1], float(fields[3])

    atomic_write_text(out / "ref.stm", "".join(f"{line}\n" for line in sorted(rows, key=key)))
    write_ctm(transcripts, out / "hyp.ctm")
    argv = ["-r", str(out / "ref.stm"), "stm", "-h", str(out / "hyp.ctm"), "ctm"]
    argv += ["-o", "sum", "rsum", "pralign", "-O", str(out), "-n", "sclite", "-f", "0"]
    if sclite.main(argv) != 0:
        raise UserError(f"{out}: sclite scoring of the talks failed")
    return out / "sclite.sys"


def write_ctm(transcripts: str | os.PathLike, out: str | os.PathLike, channel: str = "1") -> Path:
    """One CTM file of all ``*.json`` transcripts in a folder (recording = file stem, sorted), atomically."""
    files = sorted(Path(transcripts).glob("*.json"))
    if not files:
        raise UserError(f"{transcripts}: no *.json transcripts (transcribe -f json)")
    lines = [line for f in files for line in ctm_lines(json.loads(f.read_text(encoding="utf-8")), f.stem, channel)]
    atomic_write_text(out, "".join(lines))
    return Path(out)
