"""Transcribing many files in one ``srupp-asr transcribe`` call: throughput and a memory footprint that stays flat.

``--files`` (default 1000) short utterances are made from sentences that espeak-ng speaks (Gaussian noise bursts
where espeak-ng is missing), each file a copy with its own level (-12 to 0 dB) and leading and trailing silence
(0 to 0.4 s), written as 16 kHz 16-bit WAVs. All of them are then transcribed by one process::

    python -m srupp_asr.cli transcribe --model DIR --threads 2 -q -o OUT DIR_OF_FILES

While it runs the child's resident set size is sampled (``/proc/PID/status``, every 0.1 s) against the number of
transcripts written so far (each is written as soon as its batch is decoded), so the table shows the RSS after
the first 10 % of the files and at the end: a footprint that is bounded stays put between the two instead of
growing with the number of files. Peak RSS is the child's own high-water mark (``VmHWM``; ``ru_maxrss`` from
``os.wait4`` where there is no ``/proc``, which would also count a compiler building the CPU extension). The CPU
extension is built (or found in torch's cache) before the clock starts. The word error rate of the transcripts
against the sentences is a sanity check that the model did the work (with espeak-ng speech).

    python benchmarks/transcribe_load.py --model exp/synth_en/model              # 1000 files, 2 threads
    python benchmarks/transcribe_load.py --files 5 --model DIR --decoding ctc_greedy
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import soundfile as sf
from transcribe_memory import speak  # a sibling script: run from benchmarks/ or with it on sys.path

from srupp_asr.audio import SAMPLE_RATE

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO / "exp" / "synth_en" / "model"
SENTENCES = [
    "the sun is warm today",
    "open the red door and walk into the garden",
    "my dog likes to run along the river in the morning",
    "we ate fresh bread with butter and honey",
    "please call me later when the meeting is over",
    "the train left early and nobody noticed",
    "she reads a long book every winter",
    "birds sing in the trees before the rain",
    "turn off the light when you leave the room",
    "he plays the guitar in a small band",
    "cold water tastes good after a long walk",
    "the children went home after school",
]

WARM_UP = """
from srupp_asr import kernels
try:
    kernels.cpu_extension()
except kernels.BackendUnavailable:
    pass  # transcribe falls back to the PyTorch loop
"""


def make_files(folder: Path, count: int, spoken: list[tuple[np.ndarray, str]], seed: int = 0) -> tuple[dict, float]:
    """``count`` WAVs in ``folder`` (name -> text) and their total length in seconds."""
    rng = np.random.default_rng(seed)
    texts, seconds = {}, 0.0
    for i in range(count):
        samples, text = spoken[i % len(spoken)]
        gain = 10 ** (rng.uniform(-12, 0) / 20)
        before, after = (np.zeros(int(rng.uniform(0, 0.4) * SAMPLE_RATE), np.float32) for _ in range(2))
        audio = np.concatenate([before, gain * samples, after])
        name = f"utt{i:05d}"
        sf.write(folder / f"{name}.wav", audio, SAMPLE_RATE, subtype="PCM_16")
        texts[name] = text
        seconds += len(audio) / SAMPLE_RATE
    return texts, seconds


def _memory_mib(pid: int) -> tuple[float, float] | None:
    """(VmRSS, VmHWM) of a running process in MiB, from /proc (None where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if line.startswith(("VmRSS:", "VmHWM:")))
        return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024
    except (OSError, KeyError, ValueError):
        return None


def run(command: list[str], out_dir: Path) -> dict:
    """Run ``command`` (which writes one transcript per file into ``out_dir``), sampling its RSS against the
    number of transcripts written; wall seconds, peak RSS, the samples and the child's stderr."""
    samples: list[tuple[float, int, float]] = []  # (seconds, transcripts written, RSS MiB)
    high_water = [0.0]
    begin = time.perf_counter()
    with open(out_dir.parent / "stderr.txt", "wb") as err:
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                memory = _memory_mib(child.pid)
                if memory is not None:
                    written = sum(1 for name in os.listdir(out_dir) if name.endswith(".txt")) if out_dir.exists() else 0
                    samples.append((time.perf_counter() - begin, written, memory[0]))
                    high_water[0] = max(high_water[0], memory[1])
                done.wait(0.1)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        done.set()
        watcher.join()
    wall = time.perf_counter() - begin
    peak = high_water[0] or (usage.ru_maxrss / 1024 if sys.platform != "darwin" else usage.ru_maxrss / 2**20)
    stderr = (out_dir.parent / "stderr.txt").read_text(errors="replace")
    return {"code": child.returncode, "wall": wall, "peak": peak, "samples": samples, "stderr": stderr}


def rss_after(samples: list[tuple[float, int, float]], files: int) -> float | None:
    """The RSS sampled when at least ``files`` transcripts had been written (None if never)."""
    return next((rss for _, written, rss in samples if written >= files), None)


def word_error_rate(out_dir: Path, texts: dict[str, str]) -> float | None:
    from srupp_asr.scoring.align import align_batch, word_tokens
    from srupp_asr.text import normalize_text

    pairs = []
    for name, text in texts.items():
        if not text:
            return None
        path = out_dir / f"{name}.txt"
        hyp = path.read_text() if path.exists() else ""
        pairs.append((word_tokens(normalize_text(text)), word_tokens(normalize_text(hyp))))
    errors = sum(a.counts.errors for a in align_batch(pairs))
    return errors / max(1, sum(len(ref) for ref, _ in pairs))


def main(argv: list[str] | None = None) -> dict:
    """Make the files, transcribe them, print the table; returns the numbers."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=1000)
    p.add_argument("--model", type=Path, help=f"model directory (default {DEFAULT_MODEL.relative_to(REPO)})")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--decoding", default=None, help="decoding mode (default: the transcribe command's)")
    p.add_argument("--batch-size", type=int, default=None, help="default: the transcribe command's")
    p.add_argument("--keep", type=Path, help="make the files and transcripts here (kept) instead of a temp folder")
    args = p.parse_args(argv)
    model = args.model or DEFAULT_MODEL
    if not (model / "config.yaml").is_file():
        sys.exit(
            f"no model at {model}: pass --model DIR (a model directory from `srupp-asr average`, "
            "or build the default one offline with `make demo` / recipes/synth_en/run.sh)"
        )

    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        audio_dir, out_dir = work / "audio", work / "out"
        audio_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(out_dir, ignore_errors=True)
        texts, seconds = make_files(audio_dir, args.files, speak(work, SENTENCES))
        # Build (or find) the CPU extension of the recurrence now, so that a first build is not timed.
        subprocess.run([sys.executable, "-c", WARM_UP], check=False)
        options = ["-q", "--model", str(model), "--device", "cpu", "--threads", str(args.threads)]
        options += ["--decoding", args.decoding] if args.decoding else []
        options += ["--batch-size", str(args.batch_size)] if args.batch_size else []
        command = [sys.executable, "-m", "srupp_asr.cli", "transcribe", *options, "-o", str(out_dir), str(audio_dir)]
        result = run(command, out_dir)
        written = len([n for n in os.listdir(out_dir) if n.endswith(".txt")]) if out_dir.exists() else 0
        wer = word_error_rate(out_dir, texts) if written else None

    failures = args.files - written
    early = max(1, args.files // 10)
    # The command exits as soon as its last transcript is written (no teardown), possibly before the 0.1-s sampler
    # saw it: then the last sample taken stands in.
    last = result["samples"][-1][2] if result["samples"] else None
    rss_early = rss_after(result["samples"], early) or last
    rss_end = rss_after(result["samples"], args.files) or last
    cpu = platform.processor() or platform.machine()
    print(
        f"model: {model}; decoding {args.decoding or 'default (ctc_prefix_beam)'}; {args.threads} threads; "
        f"{cpu}, {os.cpu_count()} CPUs; exit code {result['code']}"
    )
    print(f"command: srupp-asr transcribe {' '.join(options)} -o OUT AUDIO_DIR  (one process, {args.files} files)")
    print()

    def mib(value: float | None) -> str:
        return f"{value:,.0f}" if value is not None else "-"

    print(
        f"| files | audio h | wall s | RTF | files/s | peak RSS MiB | RSS after {early} files MiB "
        "| RSS at the end MiB | failures | WER |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    print(
        f"| {args.files} | {seconds / 3600:.2f} | {result['wall']:.1f} | {result['wall'] / seconds:.4f} | "
        f"{args.files / result['wall']:.1f} | {mib(result['peak'])} | {mib(rss_early)} | {mib(rss_end)} | "
        f"{failures} | {f'{100 * wer:.1f} %' if wer is not None else '-'} |",
        flush=True,
    )
    if result["code"] != 0:
        print(f"\nstderr of the transcribe process:\n{result['stderr'][-2000:]}")
    return {
        "files": args.files,
        "seconds": seconds,
        "wall": result["wall"],
        "peak": result["peak"],
        "rss_early": rss_early,
        "rss_end": rss_end,
        "failures": failures,
        "code": result["code"],
        "wer": wer,
    }


if __name__ == "__main__":
    main()
