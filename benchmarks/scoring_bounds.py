"""What ``srupp-asr score`` does with large inputs: time and peak memory of a scored set and of the inputs its
bounds refuse (a set over ``MAX_SCORED_WORDS``, a 20-million-word line); prints a markdown table.

Each case runs ``srupp-asr score --ref R --hyp H`` in a child process (no report folder) on files written here:
seeded utterances of 5-40 words (``benchmarks/scoring_speed.py``'s corpus, about 15 % word errors). The peak
resident memory is the child's (``getrusage``).

    python benchmarks/scoring_bounds.py [--scored 50000] [--refused 1000000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from scoring_speed import corpus  # the benchmarks folder is not a package


def write_set(folder: Path, n: int) -> tuple[Path, Path, int]:
    """``n`` utterance pairs as Kaldi text files; returns their paths and the number of words in both."""
    refs, hyps = corpus(n)
    ref, hyp = folder / f"ref{n}.txt", folder / f"hyp{n}.txt"
    ref.write_text("".join(f"u{i} {r}\n" for i, r in enumerate(refs)))
    hyp.write_text("".join(f"u{i} {h}\n" for i, h in enumerate(hyps)))
    return ref, hyp, sum(len(t.split()) for t in refs + hyps)


def run(ref: Path, hyp: Path) -> tuple[int, float, float, str]:
    """Exit status, wall seconds, peak RSS in MiB of the child, and its last stderr line."""
    start = time.monotonic()
    cmd = [sys.executable, "-m", "srupp_asr.cli", "score", "--ref", str(ref), "--hyp", str(hyp)]
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak memory
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - start
        out.seek(0)
        lines = out.read().strip().splitlines() or [""]
    return proc.returncode, wall, usage.ru_maxrss / 1024, lines[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scored", type=int, default=50_000, help="utterances of the set that is scored")
    parser.add_argument("--refused", type=int, default=1_000_000, help="utterances of the set over the bound")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for n in (args.scored, args.refused):
            ref, hyp, words = write_set(folder, n)
            rows.append((f"{n:,} utterances", f"{words:,}", *run(ref, hyp)))
            ref.unlink()
            hyp.unlink()
        ref, hyp = folder / "ref_line.txt", folder / "hyp_line.txt"
        ref.write_text("u1 hello world\n")
        with open(hyp, "w") as f:
            f.write("u1 " + "word " * 20_000_000 + "\n")
        rows.append(("one 20,000,000-word hypothesis line (100 MB)", "20,000,002", *run(ref, hyp)))
    print("| input | words | exit | wall s | peak RSS MiB | last line |")
    print("|---|---|---|---|---|---|")
    for name, words, status, wall, rss, last in rows:
        last = last if len(last) < 110 else last[:107] + "..."
        print(f"| {name} | {words} | {status} | {wall:.1f} | {rss:.0f} | {last} |")


if __name__ == "__main__":
    main()
