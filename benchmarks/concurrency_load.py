"""The user-facing commands under concurrency: several ``transcribe`` and ``evaluate`` processes started at once
on one machine, sharing a fresh CPU-extension cache and output folders; prints a markdown table and the checks.

The processes (all started together; ``transcribe`` with ``--threads 1``):

- ``transcribe-shared-1``, ``transcribe-shared-2``: ``transcribe -o SHARED`` into one folder. Promise: never a
  silent overwrite: each exits 0 with every output, or 2 with the one line naming the folder in use;
- ``transcribe-own``: ``transcribe -o OWN`` into a folder of its own;
- ``evaluate-1``, ``evaluate-2``: ``evaluate`` of one manifest into two report folders.

They share ``TORCH_EXTENSIONS_DIR``, emptied first, so the CPU extension is built while the others wait for it or
import it. Checked afterwards: no traceback on any stderr; the outputs of every transcribe that exited 0 equal
those of a run made alone afterwards (same text files); no temporary file is left in any output folder; the two
evaluate reports hold the same totals; the extension cache holds one build.

Audio: the sentences of ``benchmarks/transcribe_load.py`` spoken by espeak-ng (noise bursts without it), as 16
kHz WAVs; the manifest's references are the sentences. The model is the built-in one unless ``--model``.

    python benchmarks/concurrency_load.py [--model DIR] [--files 12]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import soundfile as sf
from transcribe_load import SENTENCES  # sibling scripts: run from benchmarks/ or with it on sys.path
from transcribe_memory import speak

from srupp_asr.audio import SAMPLE_RATE

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO / "srupp_asr" / "default_model"


def make_inputs(folder: Path, files: int) -> tuple[Path, Path]:
    """``files`` WAVs (sentences in turn) and a lhotse manifest of them with their texts."""
    from lhotse import CutSet, MonoCut, Recording, SupervisionSegment

    audio = folder / "audio"
    audio.mkdir()
    spoken = speak(folder, SENTENCES)
    cuts = []
    for i in range(files):
        samples, text = spoken[i % len(spoken)]
        wav = audio / f"utt{i:03d}.wav"
        sf.write(wav, samples, SAMPLE_RATE, subtype="PCM_16")
        rec = Recording.from_file(wav, recording_id=wav.stem)
        sup = SupervisionSegment(wav.stem, wav.stem, 0.0, rec.duration, text=text or "noise", speaker="spk")
        cuts.append(MonoCut(wav.stem, 0.0, rec.duration, 0, recording=rec, supervisions=[sup]))
    manifest = folder / "cuts.jsonl.gz"
    CutSet.from_cuts(cuts).to_file(manifest)
    return audio, manifest


def start(name: str, args: list[str], env: dict[str, str], folder: Path) -> tuple[str, subprocess.Popen, float]:
    err = open(folder / f"{name}.stderr", "w")  # noqa: SIM115 (closed when the child is reaped)
    proc = subprocess.Popen(
        [sys.executable, "-m", "srupp_asr.cli", *args], stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=REPO
    )
    proc.stderr_file = err  # type: ignore[attr-defined]
    return name, proc, time.monotonic()


def reap(jobs: list[tuple[str, subprocess.Popen, float]], folder: Path) -> dict[str, dict]:
    """Wait for every job; exit status, wall seconds, peak RSS (MiB) and stderr of each."""
    results = {}
    pending = {proc.pid: (name, proc, began) for name, proc, began in jobs}
    while pending:
        pid, status, usage = os.wait4(-1, 0)
        if pid not in pending:
            continue
        name, proc, began = pending.pop(pid)
        proc.returncode = os.waitstatus_to_exitcode(status)
        proc.stderr_file.close()  # type: ignore[attr-defined]
        results[name] = {
            "exit": proc.returncode,
            "wall": time.monotonic() - began,
            "rss": usage.ru_maxrss / 1024,  # with the compiler's for the process that built the extension
            "stderr": (folder / f"{name}.stderr").read_text(errors="replace"),
        }
    return results


def texts(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(folder.glob("*.txt"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(DEFAULT_MODEL), help="model directory (default: the built-in one)")
    parser.add_argument("--files", type=int, default=12, help="utterance files (default 12)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        audio, manifest = make_inputs(folder, args.files)
        env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(folder / "extensions")}  # fresh, shared by all
        shared, own = folder / "shared", folder / "own"
        transcribe = ["transcribe", "--model", args.model, "--threads", "1", "-q", "-f", "txt,json"]
        evaluate = ["evaluate", "--model", args.model, "--cuts", str(manifest), "--device", "cpu"]
        began = time.monotonic()
        jobs = [
            start("transcribe-shared-1", [*transcribe, "-o", str(shared), str(audio)], env, folder),
            start("transcribe-shared-2", [*transcribe, "-o", str(shared), str(audio)], env, folder),
            start("transcribe-own", [*transcribe, "-o", str(own), str(audio)], env, folder),
            start("evaluate-1", [*evaluate, "--out-dir", str(folder / "eval1")], env, folder),
            start("evaluate-2", [*evaluate, "--out-dir", str(folder / "eval2")], env, folder),
        ]
        results = reap(jobs, folder)
        together = time.monotonic() - began
        alone = folder / "alone"
        solo = reap([start("transcribe-alone", [*transcribe, "-o", str(alone), str(audio)], env, folder)], folder)

        checks = {}
        expected = texts(alone)
        lock_line = f"srupp-asr transcribe: error: {shared}: another `srupp-asr transcribe` is writing to this folder"
        for name, r in results.items():
            ok = "Traceback" not in r["stderr"]
            if name.startswith("transcribe"):
                out = shared if "shared" in name else own
                refused = r["exit"] == 2 and r["stderr"].strip().startswith(lock_line) and "shared" in name
                ok &= refused or (r["exit"] == 0 and texts(out) == expected)
                r["outcome"] = "refused: folder in use" if refused else f"{len(texts(out))} outputs = alone's"
            else:
                report = folder / ("eval1" if name == "evaluate-1" else "eval2") / "results.json"
                ok &= r["exit"] == 0 and report.is_file()
                r["outcome"] = "report written" if report.is_file() else "no report"
            checks[name] = ok
        shared_runs = [results[n]["exit"] for n in ("transcribe-shared-1", "transcribe-shared-2")]
        checks["one shared-folder run wrote, none overwrote silently"] = 0 in shared_runs and set(shared_runs) <= {0, 2}
        totals = [json.loads((folder / d / "results.json").read_text()).get("WER") for d in ("eval1", "eval2")]
        checks["both evaluate reports hold the same totals"] = totals[0] == totals[1] is not None
        temps = [p.name for d in (shared, own, folder / "eval1", folder / "eval2") for p in d.glob(".*")]
        checks["no temporary file left in an output folder"] = not temps
        builds = [p for p in (folder / "extensions").glob("*") if p.is_dir()]
        checks["one CPU-extension build in the shared cache"] = len(builds) == 1
        checks["the run alone exited 0"] = solo["transcribe-alone"]["exit"] == 0

    cpu = platform.processor() or platform.machine()
    print(f"{args.files} files, model {args.model}, {os.cpu_count()} CPUs ({cpu}); 5 processes started at once")
    alone_wall = solo["transcribe-alone"]["wall"]
    print(f"all five done in {together:.1f} s; the same transcribe alone afterwards: {alone_wall:.1f} s\n")
    print("| process | exit | wall s | peak RSS MiB | outcome | check |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        verdict = "ok" if checks[name] else "FAILED"
        print(f"| {name} | {r['exit']} | {r['wall']:.1f} | {r['rss']:.0f} | {r['outcome']} | {verdict} |")
    print()
    for name, ok in checks.items():
        if not name.startswith(("transcribe", "evaluate")):
            print(f"- {name}: {'ok' if ok else 'FAILED'}")
    failed = [name for name, ok in checks.items() if not ok]
    if failed:
        for name in failed:
            if name in results:
                print(f"\n{name} stderr:\n{results[name]['stderr'][-2000:]}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
