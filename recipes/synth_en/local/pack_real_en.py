#!/usr/bin/env python3
"""Pack the real speech a GPU lease trains on (``../shared/data/real_en``) small enough to travel with the working
tree: every clip re-encoded as Ogg Opus, the corpus folders, manifests and licence files laid out as the original,
so ``benchmarks/real_speech.py --real-dev PACK`` reads it like the original.

::

    python recipes/synth_en/local/pack_real_en.py ../shared/data/real_en exp/real_en_pack --max-mib 28

A lease's call sends at most 64 MiB: the checkout with the built-in model is 35 MiB, so the 4.1 hours of the
``read+real+long+synth`` mix (the sets of :data:`SETS`: 134 MiB as FLAC and Vorbis) must fit in the rest. Opus at
``--level 0.98`` (libsndfile's compression level: about 15 kbit/s with the containers of 8,500 clips) packs them
into 26.9 MiB (0.97: 30.8 MiB);
the run fails, naming the size, when the pack is over ``--max-mib``. Lossy on lossy (the ARCTIC and LibriSpeech
clips are Vorbis already): what the model hears differs from the original as a codec's round trip does, which the
training mix already draws as an augmentation. Every clip's length in samples is kept (Opus's pre-skip is taken
off by libsndfile), and the manifests' durations with it. The pack is made once; a folder that is complete (its
``PACKED`` file) is reused. Not the audio of the dev sets scored here (``ljspeech32``, ``pocketsphinx_testdata``):
scoring stays on the CPU."""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

# The sets the +read mix and its validation set read (benchmarks/real_speech.py: READ_TRAIN, speech_commands and
# fsdd, VALID_SETS).
SETS = ("arctic_cathy", "arctic_axb", "vctk_train", "librispeech_pseudo", "speech_commands", "fsdd", "vctk_dev")
DONE = "PACKED"


def encode(job: tuple[str, str, float]) -> None:
    """Encode one clip (source, target, compression level) as Ogg Opus."""
    import soundfile as sf

    source, target, level = job
    samples, rate = sf.read(source, dtype="float32", always_2d=False)
    if samples.ndim > 1:
        samples = samples.mean(axis=1)
    os.makedirs(os.path.dirname(target), exist_ok=True)  # speech_commands keeps a folder per word
    tmp = f"{target}.tmp"
    with sf.SoundFile(tmp, "w", rate, 1, format="OGG", subtype="OPUS", compression_level=level) as out:
        out.write(samples)
    os.replace(tmp, target)


def pack_set(source: Path, target: Path, level: float, jobs: int) -> tuple[int, int]:
    """Pack one corpus folder; returns (clips, bytes)."""
    with open(source / "manifest.tsv", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    if not rows or "path" not in rows[0]:
        raise SystemExit(f"pack_real_en: {source / 'manifest.tsv'}: no rows with a path column")
    (target / "audio").mkdir(parents=True, exist_ok=True)
    work = []
    for row in rows:
        new = str(Path(row["path"]).with_suffix(".opus"))
        work.append((str(source / row["path"]), str(target / new), level))
        row["path"] = new
    with ProcessPoolExecutor(jobs) as pool:
        for _ in pool.map(encode, work, chunksize=32):  # each result re-raises a failed clip's error
            pass
    for extra in source.iterdir():  # the licence and notice files travel with the audio
        if extra.is_file() and extra.name != "manifest.tsv":
            shutil.copy2(extra, target / extra.name)
    with open(target / "manifest.tsv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter="\t", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    size = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
    return len(rows), size


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", type=Path, help="the real_en folder (../shared/data/real_en)")
    p.add_argument("target", type=Path, help="the pack to write (an ignored folder, e.g. exp/real_en_pack)")
    p.add_argument("--sets", nargs="+", default=list(SETS), help=f"corpus folders to pack (default: {' '.join(SETS)})")
    p.add_argument("--level", type=float, default=0.98, help="Opus compression level, 0-1 (default 0.98)")
    p.add_argument("--max-mib", type=float, default=28.0, help="fail when the pack is larger (default 28)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = p.parse_args(argv)
    if not args.source.is_dir():
        print(f"pack_real_en: {args.source}: no such folder (the shared real speech is not here)", file=sys.stderr)
        return 2
    if (args.target / DONE).is_file():
        print((args.target / DONE).read_text(), end="")
        return 0
    missing = [name for name in args.sets if not (args.source / name / "manifest.tsv").is_file()]
    if missing:
        print(f"pack_real_en: {args.source}: no {missing[0]}/manifest.tsv", file=sys.stderr)
        return 2
    lines, total = [], 0
    readme = args.source / "README.md"
    args.target.mkdir(parents=True, exist_ok=True)
    if readme.is_file():
        shutil.copy2(readme, args.target / "README.md")
    for name in args.sets:
        clips, size = pack_set(args.source / name, args.target / name, args.level, args.jobs)
        total += size
        lines.append(f"{name}: {clips} clips, {size / 2**20:.1f} MiB")
        print(lines[-1], flush=True)
    summary = f"packed {args.source} into {args.target}: {total / 2**20:.1f} MiB (Opus, level {args.level:g})"
    if total > args.max_mib * 2**20:
        print(f"pack_real_en: {summary}, over --max-mib {args.max_mib:g}: raise --level", file=sys.stderr)
        return 1
    (args.target / DONE).write_text("\n".join([*lines, summary]) + "\n")
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
