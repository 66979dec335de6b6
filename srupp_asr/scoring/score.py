"""``srupp-asr score``: WER/CER of hypothesis transcripts against references, with sclite's counts.

``score(ref, hyp, out_dir=...)`` reads both files (Kaldi ``text``, trn or JSON lines), normalises them as
training does, aligns words and characters as sclite does, and writes the report files
(:func:`srupp_asr.scoring.report.write_report`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from srupp_asr.errors import UserError
from srupp_asr.scoring.analysis import ScoreResult, score_transcripts
from srupp_asr.scoring.formats import FORMATS, NO_IDS_HINT, read_transcripts, read_utt2spk
from srupp_asr.scoring.report import WORST, ReportInfo, score_line, warnings_of, write_report


def dataset_name(path: str | os.PathLike) -> str:
    """A default dataset name: the file's folder for Kaldi-style ``text`` files, else the file's stem."""
    p = Path(path)
    stem = p.name.split(".")[0]
    if stem in ("text", "hyp", "ref"):
        return p.resolve().parent.name or stem
    return stem


def score(
    ref: str | os.PathLike,
    hyp: str | os.PathLike,
    out_dir: str | os.PathLike | None = None,
    fmt: str = "auto",
    normalize: bool = True,
    utt2spk: str | os.PathLike | None = None,
    train_log: str | os.PathLike | None = None,
    name: str | None = None,
    worst: int = WORST,
) -> ScoreResult:
    """Score the transcripts in ``hyp`` against ``ref``; with ``out_dir``, write the report files there."""
    refs = read_transcripts(ref, fmt, "reference file")
    hyps = read_transcripts(hyp, fmt, "hypothesis file")
    if fmt == "auto" and refs and hyps and not {r.utt_id for r in refs} & {h.utt_id for h in hyps}:
        # Nothing pairs up: scored, every reference would be all deletions. Most often plain text, whose first
        # words were taken as ids.
        raise UserError(f"{hyp}: no utterance id of the hypotheses is in {ref} ({NO_IDS_HINT})")
    result = score_transcripts(refs, hyps, normalize, read_utt2spk(utt2spk) if utt2spk else None)
    if out_dir is not None:
        info = ReportInfo(name or dataset_name(hyp), str(ref), str(hyp), normalize)
        write_report(result, out_dir, info, train_log, worst)
    return result


def print_summary(
    result: ScoreResult, name: str, out_dir: str | os.PathLike | None, where: str | os.PathLike | None = None
) -> None:
    """The console output of ``score`` and ``evaluate``: warnings on stderr (naming the file ``where`` the
    hypotheses came from), one summary line on stdout."""
    prefix = f"{where}: " if where is not None else ""
    for line in warnings_of(result):
        print(f"warning: {prefix}{line}", file=sys.stderr)
    print(score_line(result, name))
    if out_dir is not None:
        print(f"report: {Path(out_dir) / 'report.html'}", file=sys.stderr)


def score_command(args: argparse.Namespace) -> int:
    """Run ``srupp-asr score`` from parsed arguments."""
    result = score(
        args.ref,
        args.hyp,
        out_dir=args.out_dir,
        fmt=args.format,
        normalize=not args.no_normalize,
        utt2spk=args.utt2spk,
        train_log=args.train_log,
        name=args.name,
        worst=args.worst,
    )
    print_summary(result, args.name or dataset_name(args.hyp), args.out_dir, args.hyp)
    return 0


def add_report_arguments(p: argparse.ArgumentParser) -> None:
    """Options shared by ``score`` and ``evaluate``: report name, training log, number of worst utterances."""
    p.add_argument("--name", help="dataset name in results.md and the report (default: from the file names)")
    p.add_argument("--train-log", metavar="METRICS_CSV", help="Lightning CSVLogger metrics.csv: plot training curves")
    p.add_argument("--worst", type=_count, default=WORST, metavar="N", help=f"worst utterances shown (default {WORST})")


def _count(text: str) -> int:
    """argparse type: a whole number >= 0."""
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {text!r}")
    return int(text)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the ``score`` sub-command."""
    p = subparsers.add_parser(
        "score",
        help="score hypotheses against references (sclite-compatible counts)",
        description="WER and CER of hypotheses against references, counted as sclite counts them. Files: Kaldi "
        "text ('UTT_ID words...'), trn ('words... (SPK-UTT_ID)') or JSON lines ({\"id\", \"text\", "
        '"speaker"}). A reference without a hypothesis counts as an empty hypothesis; extra hypotheses are '
        "ignored (both with a warning).",
    )
    p.add_argument("--ref", required=True, help="reference transcripts")
    p.add_argument("--hyp", required=True, help="hypothesis transcripts")
    p.add_argument("--format", choices=FORMATS, default="auto", help="file format of both (default: auto-detect)")
    p.add_argument(
        "--no-ids",
        dest="format",
        action="store_const",
        const="lines",
        help="plain text, one utterance per line, no ids: paired by line number (= --format lines)",
    )
    p.add_argument("--out-dir", help="write results.md, report.html, alignments and plots here")
    p.add_argument("--utt2spk", help="Kaldi utt2spk file giving the speakers (Kaldi text files have none)")
    p.add_argument("--no-normalize", action="store_true", help="score the texts as they are (no normalize_text)")
    add_report_arguments(p)
    p.set_defaults(func=score_command)
    return p
