"""What a user waits for before any audio is decoded: ``--help``, imports, loading the model, a short file end to end.

Each row is a fresh interpreter (the start-up is what is measured), run ``--repeats`` times; the table prints the
median and the range, with what the process imported that inference should not need::

    python benchmarks/startup.py                      # every command's --help, imports, load_model(), a 3-s file
    python benchmarks/startup.py --repeats 5 --no-help
    python benchmarks/startup.py --baseline OLD --model srupp_asr/default_model   # before/after, interleaved

``--baseline OLD`` measures a second source tree too (``OLD/srupp_asr``, e.g. ``git archive COMMIT srupp_asr |
tar -x -C OLD``), each row's repeats alternating between the two so that both see the same load; the table then
gives both medians and their ratio. ``--model`` makes both load the same model directory.

- ``COMMAND --help``: ``srupp-asr COMMAND --help`` from start to exit (the goal: 1 s or less); not ``sclite``,
  whose command line is sclite's own (``-h`` names the hypothesis file).
- ``import MODULE``: ``python -c "import MODULE"``; the heavy packages it brought in are listed (Lightning,
  matplotlib and lhotse have no business on the inference path).
- ``load_model()``: ``import srupp_asr; srupp_asr.load_model()`` (the built-in model), from start to exit.
- ``transcribe 3-s file``: ``srupp-asr transcribe FILE`` on a 3-s espeak-ng sentence (noise without espeak-ng),
  start to exit, and the decoding's real-time factor that ``transcribe`` reports (decoding time / audio time, the
  load left out).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "srupp_asr.cli"]
HEAVY = ("lightning", "pytorch_lightning", "matplotlib", "lhotse")
SENTENCE = "the quick brown fox jumps over the lazy dog near the river bank"
AUDIO_SECONDS = 3.0
SAMPLE_RATE = 16000


def timed(cmd: list[str], tree: Path = REPO) -> tuple[float, str]:
    """Wall seconds of ``cmd`` from start to exit with ``tree``'s srupp_asr first on the path, and its output; a
    failure stops the benchmark."""
    env = {**os.environ, "PYTHONPATH": str(tree)}  # run in the tree too: python -c / -m put the cwd first
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return seconds, done.stdout + done.stderr


def three_second_file(folder: Path) -> Path:
    """A 3-s 16 kHz WAV: espeak-ng's sentence padded or cut to 3 s (noise where espeak-ng is missing)."""
    path = folder / "three_seconds.wav"
    n = int(AUDIO_SECONDS * SAMPLE_RATE)
    espeak = shutil.which("espeak-ng")
    if espeak:
        subprocess.run([espeak, "-w", str(path), SENTENCE], check=True, capture_output=True)
        samples, rate = sf.read(path, dtype="float32")
        samples = np.interp(np.arange(int(len(samples) * SAMPLE_RATE / rate)) * rate / SAMPLE_RATE,
                            np.arange(len(samples)), samples).astype(np.float32)  # fmt: skip
    else:
        samples = 0.1 * np.random.default_rng(0).standard_normal(n).astype(np.float32)
    samples = np.pad(samples[:n], (0, max(0, n - len(samples))))
    sf.write(path, samples, SAMPLE_RATE, subtype="PCM_16")
    return path


def heavy_imports(module: str, tree: Path) -> str:
    """The HEAVY packages that ``import module`` loads, comma-separated, or '-'."""
    code = f"import sys, {module}; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    _, out = timed([sys.executable, "-c", code], tree)
    return out.strip() or "-"


def commands(args: argparse.Namespace, folder: Path) -> list[tuple[str, list[str], str]]:
    """(what, command, module whose heavy imports to note) for every row."""
    from srupp_asr.cli import COMMANDS

    rows = []
    if not args.no_help:
        for command in ["", *(c for c in COMMANDS if c != "sclite")]:  # sclite has its own -h (the hypothesis)
            rows.append((f"{command or 'srupp-asr'} --help", [*CLI, *([command] if command else []), "--help"], ""))
    for module in ("srupp_asr.transcribe", "srupp_asr.scoring.evaluate", "srupp_asr.api"):
        rows.append((f"import {module}", [sys.executable, "-c", f"import {module}"], module))
    model = repr(args.model) if args.model else ""
    load = f"import srupp_asr; srupp_asr.load_model({model})"
    rows.append(("load_model() (process)", [sys.executable, "-c", load], ""))
    audio = three_second_file(folder)
    model_option = ["--model", args.model] if args.model else []
    transcribe = [*CLI, "transcribe", str(audio), "--threads", str(args.threads), *model_option]
    rows.append(("transcribe 3-s file", transcribe, ""))
    return rows


def measure(cmd: list[str], trees: list[Path], repeats: int) -> tuple[list[list[float]], list[str]]:
    """Each tree's wall seconds of ``cmd`` (repeats alternating between the trees) and the real-time factors that
    transcribe reported."""
    seconds: list[list[float]] = [[] for _ in trees]
    rtfs: list[str] = []
    for _ in range(repeats):
        for k, tree in enumerate(trees):
            wall, out = timed(cmd, tree)
            seconds[k].append(wall)
            rtfs += re.findall(r"real-time factor ([0-9.]+)", out)
    return seconds, rtfs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per row (default 3)")
    parser.add_argument("--threads", type=int, default=2, help="transcribe --threads (default 2)")
    parser.add_argument("--no-help", action="store_true", help="leave out the --help rows")
    parser.add_argument("--baseline", type=Path, help="a second source tree to measure beside this one")
    parser.add_argument("--model", help="model directory for load_model() and transcribe (default: the built-in one)")
    args = parser.parse_args()
    args.model = str(Path(args.model).resolve()) if args.model else None
    trees = [REPO] + ([args.baseline.resolve()] if args.baseline else [])
    print(f"# {time.strftime('%Y-%m-%d')}  {platform.machine()}  {platform.python_version()}  repeats {args.repeats}")
    head = "median s (min-max)"
    if args.baseline:
        print(f"{'what':<32} {'this tree: ' + head:>32} {'baseline: ' + head:>32} {'ratio':>6}  note")
    else:
        print(f"{'what':<32} {head:>22}  note")
    with tempfile.TemporaryDirectory() as tmp:
        for what, cmd, module in commands(args, Path(tmp)):
            seconds, rtfs = measure(cmd, trees, args.repeats)
            cells = [f"{statistics.median(s):.2f} ({min(s):.2f}-{max(s):.2f})" for s in seconds]
            note = " ".join(f"heavy: {heavy_imports(module, t)}" for t in trees) if module else ""
            note += f"reported RTF {'/'.join(rtfs)}" if rtfs else ""
            if args.baseline:
                ratio = statistics.median(seconds[0]) / statistics.median(seconds[1])
                print(f"{what:<32} {cells[0]:>32} {cells[1]:>32} {ratio:>6.2f}  {note}", flush=True)
            else:
                print(f"{what:<32} {cells[0]:>22}  {note}", flush=True)


if __name__ == "__main__":
    main()
