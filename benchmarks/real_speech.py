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

    python benchmarks/real_speech.py                                  # the built-in model, all four dev sets
    python benchmarks/real_speech.py --model exp/a/model exp/b/model --sets ljspeech32 fsdd
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
    """Import each set's ``manifest.tsv`` with the table importer into ``out_dir/<set>/<split>_cuts.jsonl.gz``;
    returns {set: {split: manifest}}. A row that does not import is an error: these tables are known good."""
    from srupp_asr.errors import UserError
    from srupp_asr.prepare import import_table, save_splits

    manifests = {}
    for name in sets:
        problems: list[str] = []
        splits = import_table(real_dev / name / "manifest.tsv", problems)
        if problems:
            raise UserError(f"{real_dev / name}: {len(problems)} rows did not import; the first: {problems[0]}")
        paths = save_splits(splits, out_dir / name)
        manifests[name] = dict(zip(splits, paths, strict=True))
    return manifests


def score_model(
    model: str | Path, cuts: Path, out_dir: Path, decoding: str | None = None, device: str = "cpu"
) -> tuple[float, float]:
    """(WER %, real-time factor) of ``model`` on ``cuts`` with ``srupp-asr evaluate`` (report in ``out_dir``)."""
    from srupp_asr.scoring.evaluate import evaluate
    from srupp_asr.transcribe import DEFAULT_DECODING

    result, speed = evaluate(model, cuts, out_dir, decoding=decoding or DEFAULT_DECODING, device=device, errors=[])
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
    args = p.parse_args()
    from srupp_asr.errors import UserError
    from srupp_asr.transcribe import DEFAULT_DECODING, default_model_dir

    try:
        real_dev = find_real_dev(args.real_dev)
        if real_dev is None:
            print(skip_note("real_speech"))
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
