"""``srupp-asr sclite`` beside NIST's ``sctk sclite`` on the same inputs: wall seconds and peak RSS.

Two inputs, made here with a fixed seed: a trn pair of 100,000 reference words (5,000 utterances of 20 words,
about 10% substitutions, deletions and insertions) and a 2-hour STM/CTM pair (one recording, 720 ten-second
segments, 150 words a minute, word times in the CTM). Each tool scores each pair writing ``.sys``/``.raw``/``.pra``;
the table gives wall seconds, peak RSS and the ratio srupp/sclite, and checks the Sum rows agree.

    python benchmarks/sclite_speed.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VOCAB = [f"w{i}" for i in range(2000)]


def noisy(words: list[str], rng: random.Random) -> list[str]:
    """``words`` with about 10% substitutions, deletions and insertions."""
    out = []
    for word in words:
        roll = rng.random()
        if roll < 0.04:
            out.append(rng.choice(VOCAB))
        elif roll < 0.07:
            continue
        else:
            out.append(word)
        if rng.random() < 0.03:
            out.append(rng.choice(VOCAB))
    return out


def make_trn(folder: Path, rng: random.Random) -> tuple[Path, Path]:
    """100,000 reference words in 5,000 utterances of 20, and their noisy hypotheses."""
    ref, hyp = [], []
    for k in range(5000):
        words = [rng.choice(VOCAB) for _ in range(20)]
        utt = f"spk{k % 50:02d}_{k:05d}"
        ref.append(f"{' '.join(words)} ({utt})\n")
        hyp.append(f"{' '.join(noisy(words, rng))} ({utt})\n")
    (folder / "ref.trn").write_text("".join(ref))
    (folder / "hyp.trn").write_text("".join(hyp))
    return folder / "ref.trn", folder / "hyp.trn"


def make_stm_ctm(folder: Path, rng: random.Random) -> tuple[Path, Path]:
    """Two hours of one recording: 720 segments of 10 s with 25 words each, and a CTM of noisy words in time."""
    stm, ctm = [], []
    for k in range(720):
        start = 10.0 * k
        words = [rng.choice(VOCAB) for _ in range(25)]
        stm.append(f"talk 1 spk{k % 4} {start:.2f} {start + 10:.2f} <o,f0,male> {' '.join(words)}\n")
        said = noisy(words, rng)
        step = 10.0 / max(len(said), 1)
        ctm += [f"talk 1 {start + i * step:.2f} {step * 0.8:.2f} {w}\n" for i, w in enumerate(said)]
    (folder / "ref.stm").write_text("".join(stm))
    (folder / "hyp.ctm").write_text("".join(ctm))
    return folder / "ref.stm", folder / "hyp.ctm"


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one run of ``cmd``."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stderr.read().decode()[-2000:]}")
    return wall, usage.ru_maxrss / 1024


def sum_row(path: Path) -> str:
    """The Sum/Avg row of a .sys file, cells joined by single spaces."""
    line = next(x for x in path.read_text().splitlines() if "Sum/Avg" in x)
    return " ".join(line.replace("|", " ").split())


def main() -> None:
    """Make the inputs, score them with both tools and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per tool and input (the best is shown)")
    args = parser.parse_args()
    peer = shutil.which("sctk")
    if peer is None:
        raise SystemExit("sctk (Debian's package sctk) is not installed: apt-get install sctk")
    ours = [sys.executable, "-m", "srupp_asr.cli"] if shutil.which("srupp-asr") is None else ["srupp-asr"]
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        trn = make_trn(folder, rng)
        stm = make_stm_ctm(folder, rng)
        inputs = {
            "trn, 100,000 words": ["-r", str(trn[0]), "-h", str(trn[1]), "-i", "spu_id"],
            "STM/CTM, 2 hours": ["-r", str(stm[0]), "stm", "-h", str(stm[1]), "ctm"],
        }
        print(
            "| input | sctk sclite s | srupp-asr sclite s | ratio | sclite peak MiB | srupp peak MiB | Sum rows agree |"
        )
        print("|---|---|---|---|---|---|---|")
        for label, base in inputs.items():
            results = {}
            for tool, prefix in (("sctk", [peer, "sclite"]), ("srupp", [*ours, "sclite"])):
                out = folder / tool
                out.mkdir(exist_ok=True)
                cmd = [*prefix, *base, "-o", "sum", "rsum", "pralign", "-O", str(out), "-n", "x", "-f", "0"]
                runs = [timed(cmd) for _ in range(args.repeats)]
                results[tool] = (min(r[0] for r in runs), max(r[1] for r in runs), sum_row(out / "x.sys"))
            (ws, ms, rs), (wo, mo, ro) = results["sctk"], results["srupp"]
            print(f"| {label} | {ws:.2f} | {wo:.2f} | {wo / ws:.2f} | {ms:.0f} | {mo:.0f} | {rs == ro} |")


if __name__ == "__main__":
    main()
