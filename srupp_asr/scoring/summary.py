"""``srupp-asr summarize``: one markdown table of the scored test sets of an experiment folder (a recipe's last stage).

Per system and test set it reads ``EXP/decode_<system>/<set>/results.json``, as ``srupp-asr evaluate`` and
``srupp-asr score`` write it (the system is the folder's name less ``decode_``: a decoding mode, ``joint_lm``,
``longform_ctc_greedy``, ``pocketsphinx`` ...), and makes a row of the WER with its error types, the CER, the
sentence error rate and the decoding real-time factor (from the report's details, else from a ``decode_info.json``
beside it, as recipes/synth_en's pocketsphinx decoder writes). A system without a report for a set has no row
for it; a set that no system has a report for is named on stderr and the command exits 1 (the table of the others
is still printed and written); a report that cannot be read is an error naming the file::

    srupp-asr summarize EXP --sets test_clean test_other [--out EXP/RESULTS.md] [--title TEXT] [--quiet]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from srupp_asr.errors import UserError
from srupp_asr.fileio import atomic_write_text, read_text
from srupp_asr.scoring.align import fmt_rate

HEADER = (
    "| system | test set | Snt | Wrd | WER % | Sub | Del | Ins | CER % | S.Err % | RTF |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|\n"
)


def _read_json(path: Path, what: str) -> dict[str, Any]:
    """The JSON object in ``path``; a missing, unreadable or malformed file is a UserError naming it."""
    text = read_text(path, what)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(f"{path}: {what} is not valid JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(doc, dict):
        raise UserError(f"{path}: {what} does not hold a JSON object")
    return doc


def _rtf(folder: Path, results: dict[str, Any]) -> str:
    """The real-time factor of the report in ``folder``: its details', else its decode_info.json's, else ``-``."""
    details = results.get("details")
    rtf = details.get("real-time factor") if isinstance(details, dict) else None
    info = folder / "decode_info.json"
    if rtf is None and info.is_file():
        rtf = _read_json(info, "decoding info file").get("rtf")
    return "-" if rtf is None else str(rtf)


def row(system: str, name: str, path: Path) -> list[str]:
    """The table cells of the report ``path`` (a results.json) of ``system`` on the test set ``name``."""
    r = _read_json(path, "results file")
    try:
        w, c = r["WER"], r["CER"]
        cells = [
            system, name, str(w["sentences"]), str(w["tokens"]), fmt_rate(w["error_rate"]),
            str(w["substitutions"]), str(w["deletions"]), str(w["insertions"]), fmt_rate(c["error_rate"]),
            fmt_rate(w["sentence_error_rate"]),
        ]  # fmt: skip
    except KeyError as err:
        raise UserError(f"{path}: results file has no {err} (not written by srupp-asr evaluate or score?)") from None
    except (TypeError, ValueError) as err:
        raise UserError(f"{path}: results file is malformed ({err})") from None
    return [*cells, _rtf(path.parent, r)]


def table(exp: str | os.PathLike, sets: list[str]) -> str:
    """The markdown table of every ``EXP/decode_*/<set>/results.json`` found, systems sorted by name and test sets
    in the order of ``sets``; just the header when there is none."""
    lines = [HEADER]
    for folder in sorted(Path(exp).glob("decode_*")):
        system = folder.name.removeprefix("decode_")
        for name in sets:
            path = folder / name / "results.json"
            if path.is_file():
                lines.append("| " + " | ".join(row(system, name, path)) + " |\n")
    return "".join(lines)


def sets_without_results(exp: str | os.PathLike, sets: list[str]) -> list[str]:
    """The test sets of ``sets`` that no system of ``exp`` has a ``decode_*/<set>/results.json`` for."""
    systems = sorted(Path(exp).glob("decode_*"))
    return [name for name in sets if not any((folder / name / "results.json").is_file() for folder in systems)]


def summarize(
    exp: str | os.PathLike, sets: list[str], out: str | os.PathLike | None = None, title: str | None = None
) -> str:
    """The summary table of ``exp`` (see :func:`table`); with ``out``, also written there (atomically) under the
    heading ``# <title>`` (default ``Results (<exp>)``). A UserError when ``exp`` is no folder or holds no report,
    or when a set is named twice; sets with no report are left out (:func:`sets_without_results` names them)."""
    if not Path(exp).is_dir():
        raise UserError(f"{exp}: experiment folder not found")
    twice = next((name for k, name in enumerate(sets) if name in sets[:k]), None)
    if twice is not None:
        raise UserError(f"--sets: {twice} given twice")
    text = table(exp, sets)
    if text == HEADER:
        raise UserError(f"no results.json under {exp}/decode_*/{{{','.join(sets)}}}")
    if out is not None:
        try:
            atomic_write_text(out, f"# {title or f'Results ({exp})'}\n\n{text}")
        except OSError as err:
            raise UserError(f"{out}: cannot write the summary ({err.strerror or err})") from None
    return text


def summarize_command(args: argparse.Namespace) -> int:
    """Run ``srupp-asr summarize`` from parsed arguments: print the table (unless --quiet), write it with --out;
    exit code 1 when some of the sets have no report (named on stderr)."""
    text = summarize(args.exp, args.sets, out=args.out, title=args.title)
    if not args.quiet:
        print(text, end="")
    empty = sets_without_results(args.exp, args.sets)
    if empty:
        print(
            f"srupp-asr summarize: error: no results.json under {args.exp}/decode_*/ for {len(empty)} of"
            f" {len(args.sets)} test sets (left out of the table): {' '.join(empty)}",
            file=sys.stderr,
        )
        return 1
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the ``summarize`` sub-command."""
    p = subparsers.add_parser(
        "summarize",
        help="collect the scoring reports of an experiment into one results table",
        description="Collect EXP/decode_<system>/<set>/results.json (srupp-asr evaluate / score) into one markdown "
        "table: per system and test set the WER with substitutions, deletions and insertions, the CER, the "
        "sentence error rate and the real-time factor.",
    )
    p.add_argument("exp", help="the experiment folder (holding decode_<system>/<set>/results.json)")
    p.add_argument("--sets", nargs="+", required=True, metavar="SET", help="the test sets, in the table's order")
    p.add_argument("--out", help="also write the table here (markdown, under a heading)")
    p.add_argument("--title", help="the heading of --out (default: 'Results (EXP)')")
    p.add_argument("-q", "--quiet", action="store_true", help="do not print the table")
    p.set_defaults(func=summarize_command)
    return p
