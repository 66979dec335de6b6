"""WER on real human speech: srupp-asr models beside pocketsphinx on the real English dev sets.

The dev splits of ``--real-dev`` (default ``../shared/data/real_en`` beside the repository, when present; see its
README) are imported with ``srupp-asr prepare table`` (:func:`srupp_asr.prepare.import_table`, as a user imports
a folder of audio plus a table of transcripts), then:

- each ``--model`` (default: the built-in model) decodes every set with ``srupp-asr evaluate`` (transcribe's
  default decoding unless ``--decoding``), audio resampled to 16 kHz as training reads it;
- pocketsphinx 5.1.1 (its bundled en-us model; ``recipes/synth_en/local/pocketsphinx_decode.py``) decodes the same
  cuts, resampled to 16 kHz;
- both are scored by the project's scorer (:func:`srupp_asr.scoring.analysis.score_transcripts`: the shared text
  normalisation lower-cases and drops punctuation, then sclite-compatible word alignment).

Prints a markdown table (WER % per set and system). Without the real data it prints a note and exits 0.

``--ablation``: the synthetic-to-real ablation. Each row fine-tunes the built-in model (``srupp-asr train fit
--model.init_from``, its config ``conf/synth_en_gpu.yaml`` on the CPU, float32) for the same wall-clock budget
(``--minutes``) on one training mix, exports its last weights and is scored on the real dev sets like the built-in
model (the first row, no training). The mixes are made with lhotse ``CutSet.mux`` (interleaved by weight):

- ``real``: the real train splits (Speech Commands: other speakers than its dev split; FSDD: the other takes of
  the same 5 speakers);
- ``real+synth``: those and a synthetic corpus (``--synth DIR``, made by ``srupp-asr synth-corpus``) repeated to an
  equal share of audio.

Validation (for the logs only; the last weights are scored) is the synthetic corpus's dev split.

    python benchmarks/real_speech.py                                  # the built-in model, all four dev sets
    python benchmarks/real_speech.py --model exp/a/model exp/b/model --sets ljspeech32 fsdd
    python benchmarks/real_speech.py --ablation --synth exp/real_ablation/synth --minutes 8
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_REAL_DEV = ROOT.parent / "shared" / "data" / "real_en"
# The real dev sets: folder under --real-dev (each holds manifest.tsv and audio/), in the order the table shows.
REAL_SETS = ("ljspeech32", "pocketsphinx_testdata", "fsdd", "speech_commands")
POCKETSPHINX_DECODE = ROOT / "recipes" / "synth_en" / "local" / "pocketsphinx_decode.py"


def find_real_dev(path: str | Path | None) -> Path | None:
    """The real-speech folder: ``path`` (a UserError when given but missing), else the default when present."""
    from srupp_asr.errors import UserError

    if path is not None:
        if not any((Path(path) / name / "manifest.tsv").is_file() for name in REAL_SETS):
            raise UserError(f"{path}: no real_en sets in it (looked for {', '.join(REAL_SETS)} with manifest.tsv)")
        return Path(path)
    return DEFAULT_REAL_DEV if DEFAULT_REAL_DEV.is_dir() else None


def skip_note(what: str) -> str:
    """The one line printed when the real data is absent."""
    return f"{what}: skipped: no real speech at {DEFAULT_REAL_DEV} (give --real-dev DIR; see its README)"


def import_real_sets(real_dev: Path, out_dir: Path, sets: tuple[str, ...] = REAL_SETS) -> dict[str, dict[str, Path]]:
    """Import each set's ``manifest.tsv`` with the table importer into ``out_dir/<set>/<split>_cuts.jsonl.gz`` (kept
    when newer than the table); returns {set: {split: manifest}}. A row that does not import is an error: these
    tables are known good."""
    from srupp_asr.errors import UserError
    from srupp_asr.prepare import import_table, save_splits

    manifests = {}
    for name in sets:
        table = real_dev / name / "manifest.tsv"
        done = sorted((out_dir / name).glob("*_cuts.jsonl.gz"))
        if done and all(path.stat().st_mtime > table.stat().st_mtime for path in done):  # imported before
            manifests[name] = {path.name.removesuffix("_cuts.jsonl.gz"): path for path in done}
            continue
        problems: list[str] = []
        splits = import_table(table, problems)
        if problems:
            raise UserError(f"{real_dev / name}: {len(problems)} rows did not import; the first: {problems[0]}")
        paths = save_splits(splits, out_dir / name)
        manifests[name] = dict(zip(splits, paths, strict=True))
    return manifests


def score_model(
    model: str | Path, cuts: Path, out_dir: Path, decoding: str | None = None, device: str = "cpu"
) -> tuple[float, float]:
    """(WER %, real-time factor) of ``model`` on ``cuts`` with ``srupp-asr evaluate`` (report in ``out_dir``; a
    report there newer than the model and the cuts, of the same decoding, is reused)."""
    from srupp_asr.scoring.evaluate import evaluate
    from srupp_asr.transcribe import DEFAULT_DECODING

    decoding = decoding or DEFAULT_DECODING
    report = out_dir / "results.json"
    newest = max(Path(cuts).stat().st_mtime, *(f.stat().st_mtime for f in Path(model).iterdir()))
    if report.is_file() and report.stat().st_mtime > newest:
        done = json.loads(report.read_text())
        if f"mode={decoding}" in done["details"]["decoding"]:
            return done["WER"]["error_rate"], float(done["details"]["real-time factor"])
    result, speed = evaluate(model, cuts, out_dir, decoding=decoding, device=device, errors=[])
    return result.total().error_rate, speed.rtf


def score_pocketsphinx(cuts: Path, out_dir: Path, jobs: int = 2) -> tuple[float, float]:
    """(WER %, real-time factor) of pocketsphinx on ``cuts``; its transcripts are kept in ``out_dir`` and reused."""
    from srupp_asr.scoring.analysis import score_transcripts
    from srupp_asr.scoring.formats import read_transcripts

    hyp, ref, info = out_dir / "pocketsphinx.hyp.trn", out_dir / "pocketsphinx.ref.trn", out_dir / "decode_info.json"
    if not hyp.is_file():
        cmd = [sys.executable, str(POCKETSPHINX_DECODE), str(cuts), str(out_dir), "--jobs", str(jobs)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    result = score_transcripts(read_transcripts(ref), read_transcripts(hyp))
    return result.total().error_rate, json.loads(info.read_text())["rtf"]


def pocketsphinx_available() -> bool:
    """Whether this interpreter can import pocketsphinx."""
    try:
        import pocketsphinx  # noqa: F401
    except ImportError:
        return False
    return True


def set_sizes(cuts: Path) -> tuple[int, float]:
    """(utterances, minutes of audio) of a manifest."""
    from srupp_asr.data import load_cuts

    cutset = load_cuts(cuts)
    return len(cutset), sum(c.duration for c in cutset) / 60


def real_dev_table(
    real_dev: Path,
    work: Path,
    models: dict[str, Path],
    sets: tuple[str, ...] = REAL_SETS,
    decoding: str | None = None,
    pocketsphinx: bool = True,
    jobs: int = 2,
    device: str = "cpu",
) -> list[str]:
    """The markdown table of WER % (RTF) per real dev set for each model and pocketsphinx; decoding outputs go
    under ``work``."""
    manifests = import_real_sets(real_dev, work / "manifests", sets)
    if pocketsphinx and not pocketsphinx_available():
        print("real_speech: pocketsphinx is not installed; its column is left out", file=sys.stderr)
        pocketsphinx = False
    systems = [*models, *(["pocketsphinx 5.1.1 (en-us)"] if pocketsphinx else [])]
    lines = [
        "| real dev set | utterances | minutes | " + " | ".join(f"{s} WER % (RTF)" for s in systems) + " |",
        "|---|---|---|" + "---|" * len(systems),
    ]
    for name in sets:
        cuts = manifests[name]["dev"]
        count, minutes = set_sizes(cuts)
        cells = []
        for label, model in models.items():
            begin = time.perf_counter()
            wer, rtf = score_model(model, cuts, work / "decode" / label / name, decoding, device)
            print(f"[{label}] {name}: WER {wer:.1f}% in {time.perf_counter() - begin:.0f} s", file=sys.stderr)
            cells.append(f"{wer:.1f} ({rtf:.3f})")
        if pocketsphinx:
            wer, rtf = score_pocketsphinx(cuts, work / "decode" / "pocketsphinx" / name, jobs)
            print(f"[pocketsphinx] {name}: WER {wer:.1f}%", file=sys.stderr)
            cells.append(f"{wer:.1f} ({rtf:.3f})")
        lines.append(f"| {name} | {count} | {minutes:.1f} | " + " | ".join(cells) + " |")
    return lines


# The ablation's training mixes (see the module docstring), in the order of the table.
MIXES = ("real", "real+synth")
# Fine-tuning on 2 CPU cores: the built-in model's config with a CPU trainer, a short warm-up to a lower peak LR,
# batches of 40 s of audio (a few dozen steps fit a 10-minute budget on a shared 2-core machine), validation every
# 50 batches.
FINE_TUNE_ARGS = [
    "--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.precision", "32-true",
    "--trainer.val_check_interval", "50", "--trainer.log_every_n_steps", "10",
    "--model.lr", "0.0005", "--model.warmup_steps", "10",
    "--data.max_duration", "40", "--data.num_workers", "1",
]  # fmt: skip


def training_mix(mix: str, real_train: list[Path], synth_train: Path | None, out: Path, seed: int = 0) -> Path:
    """Write the cut manifest of the training mix ``mix`` (one of :data:`MIXES`) to ``out``; returns it."""
    from lhotse import CutSet

    from srupp_asr.data import load_cuts, save_cuts

    real = [load_cuts(path) for path in real_train]
    sets = [CutSet.mux(*real, weights=[len(c) for c in real], seed=seed)] if len(real) > 1 else real
    if mix == "real+synth":
        synth = load_cuts(synth_train)
        real_seconds = sum(c.duration for c in sets[0])
        times = max(1, round(real_seconds / sum(c.duration for c in synth)))
        sets.append(synth.repeat(times) if times > 1 else synth)
    elif mix != "real":
        raise ValueError(f"unknown mix {mix!r}")
    seconds = [sum(c.duration for c in cuts) for cuts in sets]
    mixed = CutSet.mux(*sets, weights=seconds, seed=seed) if len(sets) > 1 else sets[0]
    save_cuts(mixed, out)
    return out


def fine_tune(mix_cuts: Path, valid_cuts: Path, exp: Path, minutes: float, base: Path) -> Path:
    """Fine-tune ``base`` on ``mix_cuts`` for ``minutes`` of wall clock into ``exp``; export the last weights to
    ``exp/model`` (reused when present) and return it."""
    model = exp / "model"
    if (model / "config.yaml").is_file():
        return model
    cli = [sys.executable, "-m", "srupp_asr.cli"]
    budget = f"00:00:{int(minutes):02d}:{round(60 * (minutes % 1)):02d}"
    cmd = [*cli, "train", "fit", "--config", str(ROOT / "conf" / "synth_en_gpu.yaml"), *FINE_TUNE_ARGS]
    cmd += ["--trainer.max_time", budget, "--trainer.default_root_dir", str(exp), "--overwrite", "true"]
    cmd += ["--model.init_from", str(base), "--data.tokenizer", str(base / "tokenizer.model")]
    cmd += ["--data.train_cuts", str(mix_cuts), "--data.valid_cuts", str(valid_cuts)]
    exp.mkdir(parents=True, exist_ok=True)
    print(f"[{exp.name}] fine-tuning for {minutes:g} min: {' '.join(cmd)}", file=sys.stderr, flush=True)
    with open(exp / "train.log", "w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
    last = exp / "checkpoints" / "last.ckpt"
    subprocess.run([*cli, "average", "--ckpts", str(last), "--out", str(model)], check=True, capture_output=True)
    return model


def ablation(real_dev: Path, work: Path, synth: Path, minutes: float, sets: tuple[str, ...]) -> list[str]:
    """The ablation table: the built-in model, then one fine-tuned row per mix of :data:`MIXES`."""
    from srupp_asr.transcribe import default_model_dir

    manifests = import_real_sets(real_dev, work / "manifests", tuple(dict.fromkeys([*sets, "speech_commands", "fsdd"])))
    real_train = [manifests[name]["train"] for name in ("speech_commands", "fsdd")]
    synth_manifests = synth / "manifests"
    base = default_model_dir()
    models = {"built-in": base}
    for mix in MIXES:
        cuts = training_mix(mix, real_train, synth_manifests / "train_cuts.jsonl.gz", work / f"mix_{mix}.jsonl.gz")
        models[f"{mix} fine-tune"] = fine_tune(
            cuts, synth_manifests / "dev_cuts.jsonl.gz", work / f"ft_{mix}", minutes, base
        )
    lines = real_dev_table(real_dev, work, models, sets, pocketsphinx=False)
    for mix in MIXES:
        steps, seconds = trained_steps(work / f"ft_{mix}")
        lines.append(
            f"\n{mix} fine-tune: {steps} steps, at most {seconds / 60:.0f} min of audio ({minutes:g} min budget)"
        )
    return lines


def trained_steps(exp: Path) -> tuple[int, float]:
    """(optimizer steps, seconds of audio at most) of a fine-tuning run, from its CSV log."""
    import csv

    rows = [r for path in sorted(exp.glob("csv/version_*/metrics.csv")) for r in csv.DictReader(path.open())]
    steps = max((int(r["step"]) + 1 for r in rows), default=0)
    max_duration = float(FINE_TUNE_ARGS[FINE_TUNE_ARGS.index("--data.max_duration") + 1])
    return steps, steps * max_duration


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--real-dev", type=Path, help=f"real speech folder (default: {DEFAULT_REAL_DEV} when present)")
    p.add_argument("--model", type=Path, nargs="+", help="model directories (default: the built-in model)")
    p.add_argument("--decoding", help="decoding mode (default: transcribe's default)")
    p.add_argument("--sets", nargs="+", choices=REAL_SETS, default=list(REAL_SETS))
    p.add_argument("--exp", type=Path, default=ROOT / "exp" / "real_speech", help="manifests and decoding outputs")
    p.add_argument("--no-pocketsphinx", action="store_true", help="leave pocketsphinx out")
    p.add_argument("--jobs", type=int, default=2, help="pocketsphinx processes")
    p.add_argument("--device", default="cpu")
    p.add_argument("--ablation", action="store_true", help="fine-tune the built-in model on each mix and score it")
    p.add_argument("--synth", type=Path, help="--ablation: a synth-corpus folder (its manifests/ are used)")
    p.add_argument("--minutes", type=float, default=8.0, help="--ablation: training wall clock per row")
    args = p.parse_args()
    from srupp_asr.errors import UserError
    from srupp_asr.transcribe import DEFAULT_DECODING, default_model_dir

    try:
        real_dev = find_real_dev(args.real_dev)
        if real_dev is None:
            print(skip_note("real_speech"))
            return 0
        if args.ablation:
            if args.synth is None or not (args.synth / "manifests" / "train_cuts.jsonl.gz").is_file():
                raise UserError(f"--ablation needs --synth DIR, a synth-corpus folder (got {args.synth})")
            lines = ablation(real_dev, args.exp / "ablation", args.synth, args.minutes, tuple(args.sets))
            print("\n".join(lines))
            return 0
        models = {"built-in": default_model_dir()} if not args.model else {_label(m): m for m in args.model}
        lines = real_dev_table(
            real_dev,
            args.exp,
            models,
            tuple(args.sets),
            args.decoding,
            not args.no_pocketsphinx,
            args.jobs,
            args.device,
        )
    except UserError as err:
        print(f"real_speech: error: {err}", file=sys.stderr)
        return 2
    import platform

    print(
        f"Real speech ({real_dev}); srupp-asr decoding {args.decoding or DEFAULT_DECODING}; "
        f"{time.strftime('%Y-%m-%d')}; {platform.processor() or platform.machine()}"
    )
    print("\n    python benchmarks/real_speech.py " + " ".join(sys.argv[1:]) + "\n")
    print("\n".join(lines))
    return 0


def _label(model: Path) -> str:
    """A short column name for a model directory: its folder, or its parent's when it is called ``model``."""
    model = Path(model).resolve()
    return model.parent.name if model.name == "model" else model.name


if __name__ == "__main__":
    sys.exit(main())
