"""Time to first transcript for a new user: the README's steps from a fresh clone, each timed, in one table.

    python benchmarks/first_transcript.py                 # clones this checkout into a temporary folder
    python benchmarks/first_transcript.py --repo URL_OR_PATH --work-dir /tmp/ttft --keep

Steps: ``git clone``, ``make setup`` (a new .venv; apt-get only for missing system packages), ``espeak-ng -w
hello.wav ...`` (something to transcribe), then ``srupp-asr transcribe hello.wav`` twice with an empty torch
extension cache (``TORCH_EXTENSIONS_DIR``), so the first run builds the C++ recurrence as a new user's does. Prints
one markdown row per step (seconds, exit status) and the total, and the transcript.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SENTENCE = "the quick brown fox jumps over the lazy dog"


def run_step(argv: list[str], cwd: Path, env: dict[str, str], log: Path) -> tuple[float, int, str]:
    """Seconds, exit status and stdout of ``argv`` (stderr goes to ``log``)."""
    begin = time.perf_counter()
    with open(log, "a", encoding="utf-8") as err:
        done = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    return time.perf_counter() - begin, done.returncode, done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", default=str(REPO), help="what to clone (default: this checkout)")
    parser.add_argument("--work-dir", help="where to clone (default: a new temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the clone and its .venv afterwards")
    args = parser.parse_args()

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="first_transcript_"))
    work.mkdir(parents=True, exist_ok=True)
    clone = work / "srupp-asr"
    if clone.exists():
        sys.exit(f"{clone}: exists; give another --work-dir")
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(work / "torch_extensions")}
    log = work / "steps.log"
    steps = [
        (["git", "clone", "-q", args.repo, str(clone)], work),
        (["make", "setup"], clone),
        (["espeak-ng", "-w", "hello.wav", SENTENCE], clone),
        ([".venv/bin/srupp-asr", "transcribe", "hello.wav"], clone),
        ([".venv/bin/srupp-asr", "transcribe", "hello.wav"], clone),
    ]
    rows, total, text = [], 0.0, ""
    for argv, cwd in steps:
        seconds, status, out = run_step(argv, cwd, env, log)
        total += seconds
        shown = " ".join(a if " " not in a else f'"{a}"' for a in argv).replace(str(work) + "/", "")
        rows.append(f"| `{shown}` | {seconds:.1f} | {status} |")
        text = out.strip() or text
        if status != 0:
            break
    print(f"time to first transcript ({os.cpu_count()} CPUs; log: {log})\n")
    print("| step | seconds | exit status |\n|---|---|---|")
    print("\n".join(rows))
    print(f"| **total** | **{total:.1f}** | |\n\ntranscript: {text!r}")
    if not args.keep and not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if len(rows) == len(steps) and rows[-1].endswith("| 0 |") else 1


if __name__ == "__main__":
    sys.exit(main())
