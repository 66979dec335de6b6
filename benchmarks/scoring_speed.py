"""Speed of ``srupp-asr score``'s alignment against its peers on the same corpus; prints a markdown table.

A seeded corpus (``--utterances`` pairs, references of 5-40 words from a 2,000-word vocabulary, hypotheses with
about 15% word errors) is aligned by words and by characters with :func:`srupp_asr.scoring.align.align_batch`,
by jiwer (``process_words`` / ``process_characters``, unit-cost Levenshtein in C++) and, when installed, by the
sclite binary (``-o sum``; it also reads and writes files). Times are medians of ``--repeats`` runs; the last
column is the time relative to ours. Word totals are printed too: ours equal sclite's, jiwer's may differ.

    python benchmarks/scoring_speed.py [--utterances 10000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import jiwer

from srupp_asr.scoring.align import Counts, align_batch, char_tokens, word_tokens


def corpus(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """``n`` reference and hypothesis strings with about 15% word errors."""
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(2000)]
    refs, hyps = [], []
    for _ in range(n):
        ref = [rng.choice(vocab) for _ in range(rng.randint(5, 40))]
        hyp = []
        for w in ref:
            r = rng.random()
            hyp += [] if r < 0.05 else [rng.choice(vocab)] if r < 0.1 else [w, rng.choice(vocab)] if r < 0.15 else [w]
        refs.append(" ".join(ref))
        hyps.append(" ".join(hyp))
    return refs, hyps


def ours(refs: list[str], hyps: list[str], chars: bool) -> Counts:
    tokens = char_tokens if chars else word_tokens
    return sum(
        (a.counts for a in align_batch([(tokens(r), tokens(h)) for r, h in zip(refs, hyps, strict=True)])), Counts()
    )


def with_jiwer(refs: list[str], hyps: list[str], chars: bool) -> Counts:
    if chars:  # without spaces, as sclite -c and ours
        out = jiwer.process_characters(["".join(r.split()) for r in refs], ["".join(h.split()) for h in hyps])
    else:
        out = jiwer.process_words(refs, hyps)
    tokens = out.hits + out.substitutions + out.deletions
    return Counts(len(refs), 0, tokens, out.hits, out.substitutions, out.deletions, out.insertions)


def sclite_runner(folder: Path) -> Callable[[list[str], list[str], bool], Counts] | None:
    binary = shutil.which("sclite") or (
        "/usr/lib/sctk/bin/sclite" if Path("/usr/lib/sctk/bin/sclite").is_file() else None
    )
    if binary is None:
        return None

    def run(refs: list[str], hyps: list[str], chars: bool) -> Counts:
        for name, texts in (("ref.trn", refs), ("hyp.trn", hyps)):
            (folder / name).write_text("".join(f"{t} (s-{i:06d})\n" for i, t in enumerate(texts)), encoding="utf-8")
        cmd = [binary, "-r", "ref.trn", "trn", "-h", "hyp.trn", "trn", "-i", "rm", "-s", "-o", "rsum", "stdout"]
        out = subprocess.run(cmd + (["-c"] if chars else []), cwd=folder, capture_output=True, text=True, check=True)
        row = next(line for line in out.stdout.splitlines() if line.strip().startswith("| Sum"))
        snt, tokens, cor, sub, dele, ins, _err, serr = map(int, row.replace("|", " ").split()[1:])
        return Counts(snt, serr, tokens, cor, sub, dele, ins)

    return run


def median_time(fn: Callable[[], Counts], repeats: int) -> tuple[float, Counts]:
    times, result = [], Counts()
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--utterances", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    refs, hyps = corpus(args.utterances)
    with tempfile.TemporaryDirectory() as tmp:
        scorers = {"srupp-asr (numpy)": ours, "jiwer (C++)": with_jiwer}
        if (run := sclite_runner(Path(tmp))) is not None:
            scorers["sclite (binary)"] = run
        print(f"{args.utterances} utterances, {sum(len(r.split()) for r in refs)} reference words\n")
        print("| level | scorer | seconds | utterances / s | sub | del | ins | time vs srupp-asr |")
        print("|---|---|---|---|---|---|---|---|")
        for level, chars in (("words", False), ("chars", True)):
            base = None
            for name, fn in scorers.items():
                seconds, c = median_time(lambda fn=fn, chars=chars: fn(refs, hyps, chars), args.repeats)
                base = base or seconds
                print(
                    f"| {level} | {name} | {seconds:.2f} | {args.utterances / seconds:,.0f} | {c.substitutions} | "
                    f"{c.deletions} | {c.insertions} | {seconds / base:.2f}x |"
                )


if __name__ == "__main__":
    main()
