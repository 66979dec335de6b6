"""Accuracy, speed and memory of ``srupp-asr transcribe``'s default decoding against joint and prefix beam search,
on audio this script makes itself: short sentences, and recordings of minutes made of the same sentences.

The sentences are written for this benchmark (not from the synthetic corpus' text sources). Each is spoken by
espeak-ng with one of several English voices and rates; the short set is the sentences one file each, and a
long recording (``--minutes``) tiles the same spoken sentences with pauses of 0.4-1.2 s. Each (set, mode) runs in
a fresh process with ``--threads`` compute threads (default 2), through :func:`srupp_asr.transcribe.transcribe`:

- WER: the recognised text of each file against the sentences it holds (:mod:`srupp_asr.scoring`, which is
  checked against sclite);
- RTF: decoding time (reading and decoding the audio: the transcripts' ``processing_seconds``) over audio time,
  the model load excluded (given apart);
- peak RSS of the process (``ru_maxrss``).

Modes: ``default`` (``transcribe`` with no ``--decoding``: what a user gets, with the model directory's own LM
when it carries one), ``default_beam20`` (the same at ``--beam 20``), ``default_no_lm`` (the same with
``--no-lm``), ``default_before`` (the defaults before 2026-12-01: the LM without its word list and its length bonus:
``--lexicon-weight 0 --length-penalty 0 --beam 10``),
``joint``, ``ctc_prefix_beam``.

``--compute-types float32 int8 bfloat16`` runs each mode in each compute type (``transcribe --compute-type``).
``--device cuda`` decodes on a GPU (``transcribe --device``; default ``auto``, as ``transcribe``); ``--warmup``
decodes each set once before the timed pass (the CUDA context, the recurrence kernel's compilation and the
allocator's first blocks then count as load time, not decoding: how a GPU's steady state is measured).
``--ctc-recursions loop scan`` runs each mode with each way of running the CTC prefix scorer's frames
(``srupp_asr.decoding.scorers.CTC_RECURSION``: a loop per frame, or a closed form; ``auto``, the default, picks the
scan on a GPU; the torch engine only, so on the CPU with ``--device cpu`` and ``transcribe``'s numpy engine it
changes nothing). ``--batch-size N`` is ``transcribe``'s (default its own: 8 on a CPU, 32 on a GPU).

Language model: ``--lm DIR`` fuses DIR in every mode but ``default_no_lm`` (as ``transcribe --lm``), and
``--lm-weights W ...`` repeats each such mode for each weight (0: no LM; without ``--lm``, the model directory's own
LM at that weight). ``--sentences FILE`` speaks FILE's lines instead of the benchmark's own sentences: to choose a
weight on a dev set that is not the benchmark's text (how the built-in model's LM weight was chosen).

    python benchmarks/decoding_defaults.py                          # short sentences and 3 min; ~10 min, 2 cores
    python benchmarks/decoding_defaults.py --minutes 3 20 --modes default joint ctc_prefix_beam
    python benchmarks/decoding_defaults.py --minutes 30 120 --modes default --no-short   # memory at length
    python benchmarks/decoding_defaults.py --modes default default_no_lm                # the shipped LM's effect
    python benchmarks/decoding_defaults.py --modes default --compute-types float32 int8 # int8 against float32
    python benchmarks/decoding_defaults.py --device cuda --warmup --modes default joint ctc_prefix_beam  # a GPU
    python benchmarks/decoding_defaults.py --device cuda --warmup --minutes --modes default --ctc-recursions loop scan
    python benchmarks/decoding_defaults.py --sentences dev.txt --minutes --modes joint --lm LM --lm-weights 0 0.2 0.4
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

from srupp_asr.compute_types import COMPUTE_TYPES

SENTENCES = [
    "a small boat drifted slowly past the old stone bridge",
    "she packed three apples and a book for the long journey",
    "the library closes at nine on most weekday evenings",
    "my neighbour painted his fence a bright shade of green",
    "we could hear the rain tapping against the kitchen window",
    "the children built a tall tower out of wooden blocks",
    "he forgot his umbrella on the bus this morning",
    "the baker opens the shop before the sun comes up",
    "please write your name at the top of every page",
    "a cold wind blew across the empty football field",
    "the museum has a new exhibit about ancient maps",
    "they planted tomatoes and beans behind the house",
    "the old clock in the hall stopped working last winter",
    "our teacher read us a story about a clever fox",
    "the road to the village was covered with fallen leaves",
    "i usually drink a glass of water after my run",
    "the farmer counted his sheep twice before dinner",
    "a bright star appeared just above the dark hills",
    "the musicians tuned their instruments before the concert",
    "you can find fresh fish at the market on friday",
]
VOICES = [("en-us", 165), ("en-gb", 150), ("en-gb-x-rp", 175), ("en-us", 140), ("en-029", 160)]
PAUSES = (0.4, 0.7, 1.2)  # seconds of silence after a sentence in a long recording, in turn
RATE = 16000
MODES = ("default", "default_beam20", "default_no_lm", "default_before", "joint", "ctc_prefix_beam")


def speak(folder: Path, sentences: list[str]) -> list[tuple[np.ndarray, str]]:
    """Each sentence spoken by espeak-ng (voice and rate in turn) as 16 kHz float32 samples, with its text."""
    from srupp_asr.audio import load_audio

    espeak = shutil.which("espeak-ng")
    if espeak is None:
        sys.exit("decoding_defaults: espeak-ng is needed to make the audio (apt-get install espeak-ng)")
    spoken = []
    for i, text in enumerate(sentences):
        voice, speed = VOICES[i % len(VOICES)]
        path = folder / f"sentence{i:02d}.wav"
        subprocess.run([espeak, "-v", voice, "-s", str(speed), "-w", str(path), "--", text], check=True)
        spoken.append((load_audio(path), text))
    return spoken


def make_sets(
    folder: Path, minutes: list[float], short: bool, sentences: list[str]
) -> dict[str, list[tuple[Path, str]]]:
    """``{set name: [(audio file, reference text)]}``: ``short`` (one file per sentence) and ``N min`` recordings."""
    spoken = speak(folder, sentences)
    sets: dict[str, list[tuple[Path, str]]] = {}
    if short:
        files = []
        for i, (wav, text) in enumerate(spoken):
            path = folder / f"short{i:02d}.flac"
            sf.write(path, wav, RATE)
            files.append((path, text))
        sets["short"] = files
    for length in minutes:
        target, pieces, words, k = length * 60 * RATE, [], [], 0
        total = 0
        while total < target:
            wav, text = spoken[k % len(spoken)]
            pause = np.zeros(int(PAUSES[k % len(PAUSES)] * RATE), dtype=np.float32)
            pieces += [wav, pause]
            words.append(text)
            total += len(wav) + len(pause)
            k += 1
        path = folder / f"long{length:g}min.flac"
        sf.write(path, np.concatenate(pieces), RATE)
        sets[f"{length:g} min"] = [(path, " ".join(words))]
    return sets


def run_child(
    files: list[tuple[Path, str]],
    mode: str,
    threads: int,
    model: str | None,
    lm: str | None,
    lm_weight: float | None,
    compute_type: str = "float32",
    device: str = "auto",
    warmup: bool = False,
    ctc_recursion: str = "auto",
    batch_size: int | None = None,
) -> dict:
    """Transcribe ``files`` in this process (the child): WER counts, audio, decoding and load seconds, peak RSS (no
    torch imported here: the default engine on the CPU runs without it). With ``warmup`` the files are transcribed
    once untimed first, the same way (its time is in the load seconds)."""
    from srupp_asr.errors import UserError
    from srupp_asr.scoring.analysis import score_transcripts
    from srupp_asr.scoring.formats import UtteranceText
    from srupp_asr.transcribe import transcribe

    if ctc_recursion != "auto":  # (imports torch: only when asked)
        from srupp_asr.decoding import scorers

        scorers.CTC_RECURSION = ctc_recursion
    begin = time.perf_counter()
    kwargs: dict = {"no_lm": True} if mode == "default_no_lm" else {"lm": lm, "lm_weight": lm_weight}
    if mode == "default_before":
        kwargs.update(lexicon_weight=0.0, length_penalty=0.0, beam=10)
    elif mode == "default_beam20":
        kwargs.update(beam=20)
    elif mode not in ("default", "default_no_lm"):
        kwargs["decoding"] = mode
    paths = [str(p) for p, _ in files]
    kwargs.update(threads=threads, compute_type=compute_type, device=device, batch_size=batch_size)
    if warmup:
        transcribe(paths, model, **kwargs)
    out = transcribe(paths, model, **kwargs)
    wall = time.perf_counter() - begin
    refs = [UtteranceText(str(p), text) for p, text in files]
    hyps = [UtteranceText(t.path, t.text) for t in out]
    try:
        total = score_transcripts(refs, hyps).total("WER")
        errors, words = total.errors, total.tokens
    except UserError:  # one alignment too large for the scorer (30 min and more): memory and speed only
        errors, words = None, sum(len(text.split()) for _, text in files)
    decoding = sum(t.processing_seconds for t in out)
    return {
        "errors": errors,
        "words": words,
        "audio": sum(t.duration for t in out),
        "decoding": decoding,
        "load": wall - decoding,
        "decoding_mode": out[0].decoding["mode"] if out else mode,
        "lm_weight": out[0].decoding.get("lm_weight", 0.0) if out else 0.0,
        "lm": "/".join(Path(out[0].decoding["lm"]).parts[-2:]) if out and out[0].decoding.get("lm") else "",
        "rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, nargs="*", default=[3.0], help="long recordings to make (default 3)")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--no-short", action="store_true", help="leave out the short sentences")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model", help="model directory (default: the built-in model)")
    p.add_argument("--lm", metavar="DIR", help="fuse this LM directory (default: the model directory's own, if any)")
    p.add_argument("--lm-weights", type=float, nargs="+", metavar="W", help="run each mode at each LM weight")
    p.add_argument("--sentences", type=Path, metavar="FILE", help="speak these lines instead of the benchmark's")
    p.add_argument(
        "--compute-types", nargs="+", default=["float32"], choices=COMPUTE_TYPES, help="run each mode in each"
    )
    p.add_argument("--device", default="auto", help="transcribe's --device (default auto: a GPU when there is one)")
    p.add_argument("--warmup", action="store_true", help="decode each set once untimed first (for a GPU)")
    p.add_argument(
        "--ctc-recursions",
        nargs="+",
        default=["auto"],
        choices=["auto", "loop", "scan"],
        help="run each mode with each way of running the CTC frames (default auto)",
    )
    p.add_argument("--batch-size", type=int, help="transcribe's --batch-size (default its own)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        spec = json.loads(args.child)
        files = [(Path(a), b) for a, b in spec["files"]]
        child = (files, spec["mode"], args.threads, args.model, args.lm, spec["lm_weight"], spec["compute_type"])
        child += (args.device, args.warmup, spec.get("ctc_recursion", "auto"), args.batch_size)
        print(json.dumps(run_child(*child)))
        return
    sentences = SENTENCES
    if args.sentences is not None:
        try:
            sentences = [line.strip() for line in args.sentences.read_text().splitlines() if line.strip()]
        except (OSError, UnicodeDecodeError) as err:
            sys.exit(f"decoding_defaults: {args.sentences}: cannot be read ({err})")
        if not sentences:
            sys.exit(f"decoding_defaults: {args.sentences}: holds no sentence")
    weights = {m: [None] if m == "default_no_lm" or not args.lm_weights else args.lm_weights for m in args.modes}
    runs = [(m, w, c) for m in args.modes for w in weights[m] for c in args.compute_types]
    runs = [(*run, r) for run in runs for r in args.ctc_recursions]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        sets = make_sets(Path(tmp), args.minutes, not args.no_short, sentences)
        for name, files in sets.items():
            for mode, weight, compute_type, recursion in runs:
                listed = [(str(a), b) for a, b in files]
                spec = {"files": listed, "mode": mode, "lm_weight": weight, "compute_type": compute_type}
                spec = json.dumps(spec | {"ctc_recursion": recursion})
                cmd = [sys.executable, __file__, "--child", spec, "--threads", str(args.threads)]
                cmd += ["--device", args.device] + (["--warmup"] if args.warmup else [])
                cmd += ["--batch-size", str(args.batch_size)] if args.batch_size else []
                if args.model:
                    cmd += ["--model", args.model]
                if args.lm:
                    cmd += ["--lm", args.lm]
                done = subprocess.run(
                    cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONWARNINGS="ignore")
                )
                if done.returncode:
                    rows.append((name, mode, f"failed: {done.stderr.strip().splitlines()[-1:]}"))
                    continue
                r = json.loads(done.stdout.strip().splitlines()[-1])
                lm = f"LM {r['lm']} weight {r['lm_weight']:g}" if r["lm"] else "no LM"
                label = f"{mode} ({r['decoding_mode']}, {lm})" if mode.startswith("default") else f"{mode} ({lm})"
                label += f", {compute_type}" if compute_type != "float32" else ""
                label += f", CTC {recursion}" if recursion != "auto" else ""
                rows.append((name, label, r))
                print(name, label, r, file=sys.stderr, flush=True)
    print(f"command: python benchmarks/decoding_defaults.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(
        f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"machine: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, threads {args.threads}, device {args.device}{' (warmed up)' if args.warmup else ''}"
    )
    print()
    print("| set | mode | WER % (errors / words) | audio s | decoding RTF (load excl.) | load s | peak RSS GB |")
    print("|---|---|---|---|---|---|---|")
    for name, label, r in rows:
        print(table_row(name, label, r))


def table_row(name: str, label: str, r: dict | str) -> str:
    """One markdown row of the table: a child's result, or why it failed. The RTF has 4 decimals below 0.01 (a
    GPU's)."""
    if isinstance(r, str):
        return f"| {name} | {label} | {r} | | | | |"
    wer = "-" if r["errors"] is None else f"{100.0 * r['errors'] / max(r['words'], 1):.1f}"
    rtf = r["decoding"] / r["audio"] if r["audio"] else float("nan")
    rtf_text = f"{rtf:.4f}" if rtf < 0.01 else f"{rtf:.3f}"
    return (
        f"| {name} | {label} | {wer} ({r['errors']} / {r['words']}) | {r['audio']:.0f} | {rtf_text} | "
        f"{r['load']:.1f} | {r['rss_gb']:.2f} |"
    )


if __name__ == "__main__":
    main()
