"""Peak memory of ``srupp-asr transcribe`` against recording length: streamed chunks against the whole file at once.

For each length (default 1, 10 and 60 minutes) a recording is made: espeak-ng sentences with short and long
pauses, tiled to the length (Gaussian noise bursts where espeak-ng is missing), written as a 16 kHz FLAC a block
at a time. Each recording is transcribed in a fresh process, twice:

- ``budget``: the default memory budget (``--max-chunk-seconds``, 600 s): a recording that fits is decoded whole,
  a longer one is read from disk and decoded a chunk at a time;
- ``whole``: ``--max-chunk-seconds`` above the length, so the whole recording is decoded at once (the peer).

Memory is the child's peak resident set size (``os.wait4``'s ``ru_maxrss``); the table also gives it above a
baseline, the same command on a 5 s recording (Python, the libraries and the model), which is what the audio costs.
Each process's address space is capped (``--max-memory-gb``), so a run that needs more fails with an allocation
error (shown in the table) instead of waking the kernel's OOM killer on a shared machine.

The model is ``--model DIR``, or a randomly initialised model of the test suite's overfit size (memory and time
do not depend on the weights' values, only the text does; a random model emits about as many tokens as a trained
one would, or fewer, so ``--model`` with a real model is the honest measure of the alignment's share).

    python benchmarks/transcribe_memory.py                       # 1, 10, 60 min; about 10 min on 2 CPU cores
    python benchmarks/transcribe_memory.py --minutes 1 10 --model exp/synth_en/model --decoding ctc_prefix_beam
    python benchmarks/transcribe_memory.py --engine torch       # transcribe's torch engine (default: auto)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf

from srupp_asr.audio import SAMPLE_RATE, load_audio

SENTENCES = [
    "the sun is warm today",
    "open the red door and walk into the garden",
    "my dog likes to run along the river in the morning",
    "we ate fresh bread with butter and honey",
    "please call me later when the meeting is over",
    "the train left early and nobody noticed",
]
SHORT_PAUSE, LONG_PAUSE = 0.4, 1.5  # seconds between sentences, and after every third
BASELINE_SECONDS = 5.0
BLOCK_SECONDS = 60.0  # the recording is written this much at a time


def speak(folder: Path, sentences: list[str]) -> list[tuple[np.ndarray, str]]:
    """Each sentence spoken by espeak-ng as 16 kHz float32 samples, with its text; without espeak-ng, a Gaussian
    noise burst about as long as the sentence would be, with the text "" (nothing can be recognised in it)."""
    espeak = shutil.which("espeak-ng")
    spoken = []
    for i, text in enumerate(sentences):
        if espeak:
            path = folder / f"sentence{i}.wav"
            subprocess.run([espeak, "-w", str(path), text], check=True, capture_output=True)
            spoken.append((load_audio(path), text))
            path.unlink()
        else:
            noise = 0.1 * np.random.default_rng(i).standard_normal(int(0.07 * len(text) * SAMPLE_RATE))
            spoken.append((noise.astype(np.float32), ""))
    return spoken


def speech_pattern(folder: Path) -> np.ndarray:
    """One cycle of the recording: the sentences spoken with pauses, 16 kHz (noise bursts without espeak-ng)."""
    parts = []
    for i, (speech, _) in enumerate(speak(folder, SENTENCES)):
        pause = LONG_PAUSE if i % 3 == 2 else SHORT_PAUSE
        parts += [speech, np.zeros(int(pause * SAMPLE_RATE), np.float32)]
    return np.concatenate(parts)


def write_recording(path: Path, seconds: float, pattern: np.ndarray) -> None:
    """A FLAC of ``seconds`` seconds: ``pattern`` repeated, written a block at a time (bounded memory)."""
    total, block = int(seconds * SAMPLE_RATE), int(BLOCK_SECONDS * SAMPLE_RATE)
    reps = -(-block // len(pattern)) + 1
    tiled = np.tile(pattern, reps)
    with sf.SoundFile(path, "w", SAMPLE_RATE, 1, format="FLAC") as f:
        for start in range(0, total, block):
            offset = start % len(pattern)
            f.write(tiled[offset : offset + min(block, total - start)])


def random_model(folder: Path) -> Path:
    """A randomly initialised model directory of the overfit test model's size (tests/test_training_acceptance.py),
    made in a child process: this one must not import torch, because a child's peak RSS starts at the size of the
    process it was forked from (Linux counts the parent's pages until the exec)."""
    code = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import transcribe_memory as t; "
    subprocess.run([sys.executable, "-c", code + f"t._make_random_model(t.Path({str(folder)!r}))"], check=True)
    return folder / "model"


def _make_random_model(folder: Path) -> Path:
    """:func:`random_model`'s work, in the child."""
    import torch

    from srupp_asr.model import ASRModel
    from srupp_asr.model_dir import export_model
    from srupp_asr.tokenizer import Tokenizer

    tokenizer = Tokenizer.train(SENTENCES, folder / "tokenizer.model", vocab_size=40, model_type="char")
    torch.manual_seed(0)
    model = ASRModel(
        vocab_size=tokenizer.vocab_size,
        d_model=32,
        encoder="srupp",
        encoder_conf={"d_model": 128, "num_layers": 2, "attn_dim": 64, "num_heads": 2, "attn_every": 2},
        decoder_conf={"d_model": 64, "num_layers": 1, "num_heads": 2, "ffn_dim": 128},
        ctc_weight=0.5,
        specaugment=None,
    )
    return export_model(model.state_dict(), model.config, folder / "tokenizer.model", folder / "model")


def measure(audio: Path, model: Path, out_dir: Path, max_chunk: float, args: argparse.Namespace) -> dict:
    """Transcribe ``audio`` in a fresh process: peak RSS (MiB), wall seconds, the chunks it was cut into and the
    words; ``failed`` says why when the process did not finish (killed for memory, say)."""
    cmd = [sys.executable, "-m", "srupp_asr.cli", "transcribe", "-q", "--model", str(model), "--device", args.device]
    cmd += ["--decoding", args.decoding, "--threads", str(args.threads), "--max-chunk-seconds", str(max_chunk)]
    cmd += ["--engine", args.engine, "-f", "json", "-o", str(out_dir), str(audio)] + (["--vad"] if args.vad else [])
    if args.device == "cpu":
        # An allocation beyond the cap fails in the child instead of calling the OOM killer (set by the shell the
        # child is exec'ed from: no preexec_fn, which is not safe with threads). CUDA reserves far more address
        # space than it uses: no cap there (the GPU's own memory bounds the run).
        cmd = ["bash", "-c", f'ulimit -v {int(args.max_memory_gb * 2**20)} && exec "$@"', "bash", *cmd]
    begin = time.perf_counter()
    child = subprocess.Popen(cmd, stderr=subprocess.PIPE)
    err = child.stderr.read().decode()  # before waiting: a full pipe would block the child
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - begin
    rss = usage.ru_maxrss / 1024 if sys.platform != "darwin" else usage.ru_maxrss / 2**20
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        last = err.strip().splitlines()[-1] if err.strip() else ""
        why = f"killed by signal {-code}" if code < 0 else f"exit code {code}: {last[:100]}"
        return {"rss": rss, "wall": wall, "chunks": 0, "words": 0, "failed": why}
    data = json.loads((out_dir / f"{audio.stem}.json").read_text())
    return {"rss": rss, "wall": wall, "chunks": len(data["chunks"]), "words": len(data["text"].split()), "failed": ""}


def main(argv: list[str] | None = None) -> None:
    """Run the measurements and print the markdown table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, nargs="+", default=[1.0, 10.0, 60.0])
    p.add_argument("--model", type=Path, help="model directory (default: a random model of the overfit size)")
    p.add_argument("--decoding", default="ctc_greedy")
    p.add_argument("--engine", default="auto", choices=["auto", "numpy", "torch"], help="transcribe's --engine")
    p.add_argument("--device", default="cpu", help="cpu or cuda (no address-space cap on cuda)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-chunk-seconds", type=float, default=600.0, help="the budget of the budget rows")
    p.add_argument("--vad", action="store_true", help="cut chunks at silences")
    p.add_argument("--max-memory-gb", type=float, default=12.0, help="address-space cap of each transcribe process")
    p.add_argument("--skip-whole-above", type=float, default=float("inf"), help="minutes; longer: no whole row")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = args.model or random_model(folder)
        pattern = speech_pattern(folder)
        base_audio = folder / "baseline.flac"
        write_recording(base_audio, BASELINE_SECONDS, pattern)
        baseline = measure(base_audio, model, folder / "out", args.max_chunk_seconds, args)["rss"]
        print(
            f"model: {args.model or 'random, overfit-test size'}; decoding {args.decoding}; engine {args.engine}; "
            f"{args.threads} threads; "
            f"budget {args.max_chunk_seconds:g} s{' + VAD' if args.vad else ''}; "
            f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
        )
        floor = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # counted in each child until its exec
        print(f"baseline (a {BASELINE_SECONDS:g} s recording): peak RSS {baseline:,.0f} MiB")
        print(f"this script's own RSS, a floor under every row: {floor:,.0f} MiB\n")
        print("| recording | mode | chunks | words | peak RSS MiB | above baseline MiB | vs whole | wall s | RTF |")
        print("|---|---|---|---|---|---|---|---|---|", flush=True)
        for minutes in args.minutes:
            audio = folder / f"rec_{minutes:g}min.flac"
            write_recording(audio, minutes * 60, pattern)
            modes = [("budget", args.max_chunk_seconds)]
            if minutes <= args.skip_whole_above:
                modes.append(("whole", minutes * 60 + 1))
            results = {name: measure(audio, model, folder / "out", limit, args) for name, limit in modes}
            whole = results.get("whole")
            for name, r in results.items():
                ratio = f"{r['rss'] / whole['rss']:.2f}x" if whole and not whole["failed"] else "-"
                if r["failed"]:
                    print(
                        f"| {minutes:g} min | {name} | - | - | {r['rss']:,.0f} (at the end) | - | - | "
                        f"{r['wall']:.1f} | failed: {r['failed']} |",
                        flush=True,
                    )
                    continue
                print(
                    f"| {minutes:g} min | {name} | {r['chunks']} | {r['words']:,} | {r['rss']:,.0f} | "
                    f"{r['rss'] - baseline:,.0f} | {ratio} | {r['wall']:.1f} | {r['wall'] / (minutes * 60):.4f} |",
                    flush=True,
                )
            audio.unlink()


if __name__ == "__main__":
    main()
