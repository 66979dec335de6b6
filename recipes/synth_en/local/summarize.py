"""Collect the scoring reports of recipes/synth_en into one table (stage 7): per system (each srupp-asr decoding
mode, pocketsphinx) and test set, WER with its error types, CER, sentence errors and the decoding real-time factor.

    python recipes/synth_en/local/summarize.py EXP --sets test_seen test_unseen [--out EXP/RESULTS.md]

Reads EXP/decode_<system>/<set>/results.json (written by ``srupp-asr evaluate`` / ``srupp-asr score``) and, for
pocketsphinx, decode_info.json beside it. Prints the table and writes it (atomically) with --out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _rtf(folder: Path, results: dict) -> str:
    rtf = results.get("details", {}).get("real-time factor")
    info = folder / "decode_info.json"
    if rtf is None and info.is_file():
        rtf = json.loads(info.read_text(encoding="utf-8")).get("rtf")
    return "-" if rtf is None else str(rtf)


def table(exp: Path, sets: list[str]) -> str:
    """The markdown table of every EXP/decode_*/<set>/results.json found."""
    lines = [
        "| system | test set | Snt | Wrd | WER % | Sub | Del | Ins | CER % | S.Err % | RTF |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for folder in sorted(exp.glob("decode_*")):
        system = folder.name.removeprefix("decode_")
        for name in sets:
            path = folder / name / "results.json"
            if not path.is_file():
                continue
            r = json.loads(path.read_text(encoding="utf-8"))
            w, c = r["WER"], r["CER"]
            cells = [
                system, name, str(w["sentences"]), str(w["tokens"]), _rate(w["error_rate"]),
                str(w["substitutions"]), str(w["deletions"]), str(w["insertions"]), _rate(c["error_rate"]),
                _rate(w["sentence_error_rate"]), _rtf(folder / name, r),
            ]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    """Print (and with --out write) the summary table; exit code 1 when no report was found."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("exp", type=Path)
    parser.add_argument("--sets", nargs="+", required=True)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    text = table(args.exp, args.sets)
    if text.count("\n") <= 2:
        print(
            f"summarize.py: error: no results.json under {args.exp}/decode_*/{{{','.join(args.sets)}}}", file=sys.stderr
        )
        return 1
    print(text, end="")
    if args.out:
        from srupp_asr.fileio import atomic_write_text

        atomic_write_text(args.out, f"# synth_en results ({args.exp})\n\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
