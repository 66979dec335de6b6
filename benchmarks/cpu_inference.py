"""CPU inference beside whisper tiny.en and pocketsphinx: model load, decoding speed, wall time, peak memory, WER.

    python benchmarks/cpu_inference.py                       # the ljspeech32 dev set of ../shared/data/real_en
    python benchmarks/cpu_inference.py --sets ljspeech32 fsdd --systems defaults whisper --short
    python benchmarks/cpu_inference.py a.wav b.flac          # any files (no WER without references)

Each system decodes the same files with the same CPU threads (``--threads``, default 2) in a fresh process, one
after the other, and the table gives per system:

- decoding RTF: seconds reading and decoding the audio per second of audio (the model loaded);
- model load: ``srupp-asr transcribe``'s "model load and setup" (importing the libraries, reading the weights,
  finding the files); for the peers, building the recogniser from its files (libraries imported before);
- wall: the whole command, from the process's start to its exit;
- peak RSS: the process's largest resident set (``wait4``; for pocketsphinx's worker processes the largest one);
- WER: the project's scorer (:mod:`srupp_asr.scoring`) on transcripts normalised by
  :func:`srupp_asr.text.normalize_text` (whisper writes digits, "10 of clubs", which count as errors);
- ratios against whisper tiny.en measured in the same run (the machine may be shared: ratios, not seconds).

srupp-asr runs as the command a user types (``srupp-asr transcribe FILES --threads N --device cpu``); the peers
(``benchmarks/peers.py``, ``pip install -e '.[peers]'``) run through this script's ``--peer`` child mode. A peer
that is not installed is left out with one line saying so. ``--short`` adds a run of each system on the one file
nearest 3 s long (its peak RSS: what a short file costs). Real sets missing: one line, exit 0.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import peers  # this folder is on sys.path when a script here runs

from srupp_asr.errors import UserError
from srupp_asr.writers import output_names

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_REAL_DEV = ROOT.parent / "shared" / "data" / "real_en"
SRUPP = Path(sys.executable).with_name("srupp-asr")
# srupp-asr modes: row label -> extra transcribe arguments
MODES = {
    "defaults": [],  # float32 on the numpy runtime (no torch)
    "torch": ["--engine", "torch"],  # the same model and search in torch
    "batch4": ["--batch-size", "4"],  # half the default batch: less memory in flight
    "beam20": ["--beam", "20"],  # twice the default beam: a point better on read speech, 1.5x the time
    # the defaults before 2026-12-01: the LM without its word list and length bonus, beam 10
    "before": ["--beam", "10", "--lexicon-weight", "0", "--length-penalty", "0"],
    "int8": ["--compute-type", "int8"],
    "bfloat16": ["--compute-type", "bfloat16"],
    "ctc_greedy": ["--decoding", "ctc_greedy"],
    "ctc_greedy_int8": ["--decoding", "ctc_greedy", "--compute-type", "int8"],
}
PEERS = {"whisper": "whisper tiny.en, faster-whisper int8, beam 5", "pocketsphinx": "pocketsphinx, bundled en-us"}
SUMMARY = re.compile(r"decoding ([\d.]+) s, real-time factor [\d.]+; model load and setup ([\d.]+) s")


@dataclass
class Utterance:
    """One file to decode, its length and its reference transcript (None: unknown)."""

    utt_id: str
    path: Path
    seconds: float
    text: str | None


@dataclass
class Run:
    """One system's measurements on one list of files."""

    system: str
    decode_seconds: float
    load_seconds: float
    wall_seconds: float
    peak_rss_bytes: int
    hypotheses: dict[str, str]


def read_sets(real_dev: Path, names: list[str]) -> list[Utterance]:
    """The dev utterances of the real_en sets ``names`` (each ``NAME/manifest.tsv``), in manifest order."""
    utterances = []
    for name in names:
        table = real_dev / name / "manifest.tsv"
        if not table.is_file():
            raise UserError(f"{table}: no such real_en set")
        with open(table, newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f, delimiter="\t"):
                if row["split"] == "dev":
                    path = real_dev / name / row["path"]
                    # the path within the set: Speech Commands repeats a stem in each word's folder
                    utt_id = f"{name}/{Path(row['path']).with_suffix('')}"
                    utterances.append(Utterance(utt_id, path, float(row["duration_s"]), row["text"]))
    return utterances


def read_files(paths: list[str]) -> list[Utterance]:
    """Utterances of plain files (no references): ids are the paths, lengths read from the audio."""
    import soundfile as sf

    return [Utterance(p, Path(p), sf.info(p).duration, None) for p in paths]


def _measured(cmd: list[str], **kwargs) -> tuple[float, int, str]:
    """Run ``cmd``; its wall seconds, peak RSS in bytes and stderr. A failure stops the benchmark (a bug here)."""
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, **kwargs)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        stderr = err.read()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{stderr[-2000:]}")
    return wall, usage.ru_maxrss * 1024, stderr


def run_srupp(mode: str, utterances: list[Utterance], threads: int, work: Path) -> Run:
    """``srupp-asr transcribe`` on the files in a fresh process, with the mode's arguments."""
    out = work / re.sub(r"\W+", "_", mode)
    names = [str(u.path) for u in utterances]
    cmd = [str(SRUPP), "transcribe", *names, "--threads", str(threads), "--device", "cpu", "-o", str(out)]
    wall, rss, stderr = _measured([*cmd, *MODES[mode]])
    found = SUMMARY.search(stderr)
    if found is None:
        raise RuntimeError(f"no summary line in transcribe's output:\n{stderr[-2000:]}")
    hyps = read_hypotheses(out, utterances)
    return Run(f"srupp-asr {mode}", float(found[1]), float(found[2]), wall, rss, hyps)


def read_hypotheses(out: Path, utterances: list[Utterance]) -> dict[str, str]:
    """The text ``srupp-asr transcribe -o out`` wrote for each utterance, under transcribe's own output names
    (``talk``, then ``talk-2`` for a later file with the same stem)."""
    names = output_names([str(u.path) for u in utterances])
    texts = [(out / f"{name}.txt").read_text(encoding="utf-8").strip() for name in names]
    return {u.utt_id: text for u, text in zip(utterances, texts, strict=True)}


def run_peer(peer: str, utterances: list[Utterance], threads: int, work: Path) -> Run:
    """A peer on the files in a fresh process (this script's ``--peer`` mode)."""
    listing, result = work / f"{peer}.list.json", work / f"{peer}.result.json"
    listing.write_text(json.dumps([[u.utt_id, str(u.path)] for u in utterances]))
    cmd = [sys.executable, __file__, "--peer", peer, "--threads", str(threads), str(listing), str(result)]
    wall, rss, _ = _measured(cmd)
    got = json.loads(result.read_text())
    return Run(PEERS[peer], got["decode_seconds"], got["load_seconds"], wall, rss, got["hypotheses"])


def peer_child(peer: str, threads: int, listing: Path, result: Path) -> int:
    """The ``--peer`` child: decode the listed files, write hypotheses and seconds as JSON."""
    utterances = [tuple(item) for item in json.loads(listing.read_text())]
    if peer == "whisper":
        got = peers.whisper_tiny_en(utterances, threads=threads)
    else:
        got = peers.pocketsphinx(utterances, jobs=threads)
    result.write_text(json.dumps(vars(got)))
    return 0


def wer(run: Run, utterances: list[Utterance]) -> float | None:
    """Word error rate in percent by the project's scorer (None without references)."""
    from srupp_asr.scoring.analysis import score_transcripts
    from srupp_asr.scoring.formats import UtteranceText
    from srupp_asr.text import normalize_text

    if any(u.text is None for u in utterances):
        return None
    refs = [UtteranceText(u.utt_id, normalize_text(u.text), None) for u in utterances]
    hyps = [UtteranceText(u.utt_id, normalize_text(run.hypotheses[u.utt_id]), None) for u in utterances]
    return score_transcripts(refs, hyps).total().error_rate


def table(runs: list[Run], utterances: list[Utterance], title: str) -> str:
    """The markdown table of ``runs``, with ratios against whisper's row when there is one."""
    audio = sum(u.seconds for u in utterances)
    base = next((r for r in runs if r.system == PEERS["whisper"]), None)

    def ratio(value: float, of: float | None) -> str:
        return f" ({value / of:.2f}x)" if of else ""

    lines = [
        f"{title}: {len(utterances)} files, {audio / 60:.1f} min of audio"
        + (" (x: ratio to whisper tiny.en in this run)" if base else ""),
        "",
        "| system | decoding RTF | model load | wall, whole command | peak RSS | WER |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in runs:
        rtf = r.decode_seconds / audio
        error = wer(r, utterances)
        cells = [
            r.system,
            f"{rtf:.3f}" + ratio(rtf, base and base.decode_seconds / audio),
            f"{r.load_seconds:.1f} s" + ratio(r.load_seconds, base and base.load_seconds),
            f"{r.wall_seconds:.1f} s" + ratio(r.wall_seconds, base and base.wall_seconds),
            f"{r.peak_rss_bytes / 1e9:.2f} GB" + ratio(r.peak_rss_bytes, base and base.peak_rss_bytes),
            "-" if error is None else f"{error:.1f}%",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def wer_by_set(runs: list[Run], utterances: list[Utterance]) -> str | None:
    """A markdown table of each system's WER on each real set of ``utterances`` (ids ``SET/...``), and the change
    from the first system's; None with fewer than two sets or without references."""
    sets = list(dict.fromkeys(u.utt_id.split("/")[0] for u in utterances if "/" in u.utt_id))
    if len(sets) < 2 or any(u.text is None for u in utterances):
        return None
    by_set = {name: [u for u in utterances if u.utt_id.startswith(f"{name}/")] for name in sets}
    rates = [[wer(r, by_set[name]) for name in sets] for r in runs]
    lines = [
        f"WER by set (in brackets: points from {runs[0].system})",
        "",
        "| system | " + " | ".join(f"{name} ({len(by_set[name])})" for name in sets) + " |",
        "| --- |" + " --- |" * len(sets),
    ]
    for r, row in zip(runs, rates, strict=True):
        change = [f" ({e - first:+.1f})" if r is not runs[0] else "" for e, first in zip(row, rates[0], strict=True)]
        cells = [f"{e:.1f}%{c}" for e, c in zip(row, change, strict=True)]
        lines.append(f"| {r.system} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def measure(systems: list[str], utterances: list[Utterance], threads: int, work: Path) -> list[Run]:
    """Each system in turn on ``utterances``; a peer that is not installed is left out with one line."""
    runs = []
    for system in systems:
        print(f"running {system} on {len(utterances)} files ...", file=sys.stderr, flush=True)
        if system in PEERS:
            try:
                peers.whisper_model_dir() if system == "whisper" else peers._pocketsphinx_decoder()
            except peers.PeerMissing as err:
                print(f"cpu_inference.py: leaving out {system}: {err}", file=sys.stderr)
                continue
            runs.append(run_peer(system, utterances, threads, work))
        else:
            runs.append(run_srupp(system, utterances, threads, work))
    return runs


def main(argv: list[str] | None = None) -> int:
    """Measure and print the table(s); returns the exit code."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="*", help="audio files to decode (default: the real dev sets of --sets)")
    p.add_argument("--real-dev", type=Path, default=DEFAULT_REAL_DEV, help="the real_en folder")
    p.add_argument("--sets", nargs="+", default=["ljspeech32"], help="real_en sets whose dev split is decoded")
    choices = [*MODES, *PEERS]
    default_systems = ["defaults", "torch", "int8", "ctc_greedy", "whisper", "pocketsphinx"]
    p.add_argument("--systems", nargs="+", default=default_systems, help=f"of {', '.join(choices)}")
    p.add_argument("--threads", type=int, default=2, help="CPU threads of every system (default 2)")
    p.add_argument("--short", action="store_true", help="also run each system on the file nearest 3 s long")
    p.add_argument("--peer", choices=list(PEERS), help=argparse.SUPPRESS)  # the child mode of run_peer
    args = p.parse_args(argv)
    if args.peer:
        return peer_child(args.peer, args.threads, Path(args.files[0]), Path(args.files[1]))
    unknown = [s for s in args.systems if s not in choices]
    if unknown:
        p.error(f"unknown system {unknown[0]!r} (choose from {', '.join(choices)})")
    try:
        if args.files:
            utterances, title = read_files(args.files), "the given files"
        elif not args.real_dev.is_dir():
            print(f"cpu_inference.py: {args.real_dev} is absent: no real sets to measure on (give files)")
            return 0
        else:
            utterances, title = read_sets(args.real_dev, args.sets), " + ".join(args.sets)
    except UserError as err:
        print(f"cpu_inference.py: error: {err}", file=sys.stderr)
        return 2
    stamp = time.strftime("%Y-%m-%d %H:%M")
    print(f"{stamp}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, threads {args.threads}")
    with tempfile.TemporaryDirectory() as work:
        runs = measure(args.systems, utterances, args.threads, Path(work))
        print(table(runs, utterances, title))
        by_set = wer_by_set(runs, utterances)
        if by_set:
            print()
            print(by_set)
        if args.short:
            short = min(utterances, key=lambda u: abs(u.seconds - 3.0))
            (Path(work) / "short").mkdir()
            runs = measure(args.systems, [short], args.threads, Path(work) / "short")
            print()
            print(table(runs, [short], f"one short file ({short.utt_id}, {short.seconds:.1f} s)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
