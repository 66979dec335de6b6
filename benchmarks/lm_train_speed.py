"""What ``srupp-asr train-lm`` costs: its own loop (an older tree) against the Lightning loop, on the same text.

Each row is a fresh ``python -m srupp_asr.cli train-lm`` process (2 threads) training the built-in model's LM shape
(d_model 256, 3 layers, attention 128, the shipped tokenizer) for ``--epochs`` epochs on sentences made from the
repository's own docs (offline, the same every run), validating at each epoch's end and logging every step. The
table gives the wall time from start to exit, the seconds per training step (between the first and the last step's
log lines: start-up, text reading and validation left out), their medians over ``--repeats`` interleaved runs, and
the ratio to the baseline::

    git archive 27170b9 srupp_asr | tar -x -C /tmp/own_loop     # the last tree with train-lm's own loop
    python benchmarks/lm_train_speed.py --baseline /tmp/own_loop --repeats 3
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOKENIZER = REPO / "srupp_asr" / "default_model" / "tokenizer.model"
SHAPE = ["--d-model", "256", "--num-layers", "3", "--attn-dim", "128", "--num-heads", "4"]
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) train-lm: (.*)$")


def sentences(count: int, seed: int = 0) -> list[str]:
    """``count`` pseudo-sentences of 5-20 words drawn from the words of docs/*.md and README.md."""
    words: list[str] = []
    for path in sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")]):
        words += re.findall(r"[a-z]+", path.read_text(encoding="utf-8").lower())
    rng = random.Random(seed)
    return [" ".join(rng.choices(words, k=rng.randint(5, 20))) for _ in range(count)]


def run(tree: Path, texts: tuple[Path, Path], out: Path, epochs: int, threads: int) -> tuple[float, float, int]:
    """Wall seconds, seconds per training step (validation left out) and steps of one train-lm run with ``tree``'s
    srupp_asr."""
    train, valid = texts
    cmd = [sys.executable, "-m", "srupp_asr.cli", "train-lm", "--tokenizer", str(TOKENIZER)]
    cmd += ["--train-text", str(train), "--valid-text", str(valid), "--out-dir", str(out), *SHAPE]
    cmd += ["--max-epochs", str(epochs), "--log-every", "1"]
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(threads)}
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{tree}: train-lm failed ({done.returncode}): {done.stderr.strip()[-600:]}")
    stamps = [
        (datetime.datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f"), m[2])
        for m in map(STAMP.match, done.stderr.splitlines())
        if m
    ]
    steps = int(re.search(r"after (\d+) steps", done.stdout)[1])
    # per epoch: the first step's line to the last one's (an epoch's validation comes after its last step)
    seconds, counted = 0.0, 0
    for epoch in range(epochs):
        times = [t for t, text in stamps if re.match(rf"epoch {epoch} step \d+ train ppl", text)]
        seconds += (times[-1] - times[0]).total_seconds()
        counted += len(times) - 1
    return wall, seconds / max(counted, 1), steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="a source tree with train-lm's own loop")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--sentences", type=int, default=3000)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    trees = {"Lightning loop (this tree)": REPO, "own loop (baseline)": args.baseline.resolve()}
    results: dict[str, list[tuple[float, float, int]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        texts = (Path(tmp, "train.txt"), Path(tmp, "valid.txt"))
        texts[0].write_text("\n".join(sentences(args.sentences)) + "\n")
        texts[1].write_text("\n".join(sentences(args.sentences // 10, seed=1)) + "\n")
        for k in range(args.repeats):
            for name, tree in trees.items() if k % 2 == 0 else reversed(trees.items()):
                results[name].append(run(tree, texts, Path(tmp, f"lm{k}{len(name)}"), args.epochs, args.threads))
    print(f"train-lm, {args.sentences} sentences x {args.epochs} epochs, built-in LM shape, {args.threads} threads;")
    print(f"{datetime.date.today()}; {platform.machine()}, {os.cpu_count()} CPUs; median (range) of {args.repeats}")
    print()
    print("| loop | steps | s / training step | ratio | wall s, start to exit | ratio |")
    print("| --- | --- | --- | --- | --- | --- |")
    base = [statistics.median(r[k] for r in results["own loop (baseline)"]) for k in (1, 0)]
    for name, rows in results.items():
        step, wall = [r[1] for r in rows], [r[0] for r in rows]
        cells = []
        for values, ref, digits in ((step, base[0], 3), (wall, base[1], 1)):
            median = statistics.median(values)
            cells += [f"{median:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})", f"{median / ref:.2f}"]
        print(f"| {name} | {rows[0][2]} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
