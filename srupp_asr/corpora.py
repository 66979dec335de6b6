"""The paper's corpora as cut manifests: LibriSpeech, TED-LIUM 3 and AISHELL-1 (``srupp-asr corpus``).

Downloading and reading each corpus's own layout is lhotse's (``lhotse.recipes``); what is added here is what the
recipes (``recipes/<corpus>/run.sh``) need on top, as functions callable from Python and from the shell:

- :func:`download_corpus`: lhotse's download, with one clear line when the machine is offline;
- :func:`prepare_corpus`: lhotse's recordings and supervisions -> one normalised, sorted CutSet per set, written as
  ``<set>_cuts.jsonl.gz``, as ESPnet prepares them:

  * LibriSpeech: ``train`` is ``train-clean-100`` (subset ``100``) or all three training parts (``960``); ``dev``
    is dev-clean + dev-other (ESPnet's validation set); ``dev_clean``, ``dev_other``, ``test_clean``,
    ``test_other`` for scoring. Transcripts stay as the corpus writes them (upper case; normalisation happens
    where text is used, :func:`srupp_asr.text.normalize_text`).
  * TED-LIUM 3 (the ``legacy`` distribution: TED-LIUM 2's dev and test talks): one cut per STM segment, without
    the ``ignore_time_segment_in_scoring`` ones; transcripts cleaned as Kaldi's and ESPnet's
    ``prepare_data.sh`` do (:func:`normalize_tedlium_text`); training segments widened by 0.15 s before and
    0.1 s after (Kaldi's ``extend_segment_times.py``: the corpus's segmentation cuts speech short). Plus
    ``dev_talks`` / ``test_talks``: one cut per whole talk, for the long-form test (:func:`tedlium_talks`).
  * AISHELL-1: ``train``, ``dev``, ``test``, the spaces between the transcript's words removed (character
    modelling; lhotse does it).

- :func:`speed_perturbed`: the training set at speeds 0.9, 1.0 and 1.1 (ESPnet's three copies), lazily: lhotse
  resamples when a cut is loaded, no audio is written.

``srupp-asr corpus score-talks`` scores whole-talk transcripts against the talks (:mod:`srupp_asr.scoring.talks`).
"""

from __future__ import annotations

import argparse
import http.client
import logging
import math
import os
import re
import shutil
from collections.abc import Iterable, Iterator, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from srupp_asr.errors import UserError

if TYPE_CHECKING:
    from lhotse import CutSet, RecordingSet, SupervisionSet
    from lhotse.cut import Cut

log = logging.getLogger(__name__)

CORPORA = ("librispeech", "tedlium3", "aishell1")
LIBRISPEECH_TRAIN = {
    "100": ("train-clean-100",),
    "960": ("train-clean-100", "train-clean-360", "train-other-500"),
}
LIBRISPEECH_EVAL = ("dev-clean", "dev-other", "test-clean", "test-other")
TEDLIUM_SPLITS = ("train", "dev", "test")
AISHELL_SPLITS = ("train", "dev", "test")
SPEED_FACTORS = (0.9, 1.0, 1.1)
TEDLIUM_TRAIN_PADDING = (0.15, 0.1)  # seconds added before and after each training segment (Kaldi, ESPnet)
TEDLIUM_UNSCORED = "ignore_time_segment_in_scoring"
# Where lhotse's downloads unpack, relative to the download folder, and where they come from.
CORPUS_FOLDERS = {"librispeech": "LibriSpeech", "tedlium3": "TEDLIUM_release-3", "aishell1": "aishell"}
SOURCES = {
    "librispeech": "http://www.openslr.org/resources/12",
    "tedlium3": "http://www.openslr.org/resources/51",
    "aishell1": "http://www.openslr.org/resources/33",
}


def manifest_path(out_dir: str | os.PathLike, name: str) -> Path:
    """Where :func:`prepare_corpus` writes the set ``name``: ``OUT_DIR/<name>_cuts.jsonl.gz``."""
    return Path(out_dir) / f"{name}_cuts.jsonl.gz"


def set_names(corpus: str) -> tuple[str, ...]:
    """The manifests :func:`prepare_corpus` writes for ``corpus`` (without the ``_cuts.jsonl.gz``)."""
    return {
        "librispeech": ("train", "dev", "dev_clean", "dev_other", "test_clean", "test_other"),
        "tedlium3": ("train", "dev", "test", "dev_talks", "test_talks"),
        "aishell1": AISHELL_SPLITS,
    }[_check_corpus(corpus)]


def _check_corpus(corpus: str) -> str:
    if corpus not in CORPORA:
        raise UserError(f"unknown corpus {corpus!r} (choose from {', '.join(CORPORA)})")
    return corpus


def _check_subset(subset: str) -> str:
    if subset not in LIBRISPEECH_TRAIN:
        raise UserError(f"unknown LibriSpeech subset {subset!r} (choose from {', '.join(LIBRISPEECH_TRAIN)})")
    return subset


# ---- download ---------------------------------------------------------------------------------------------------


def download_corpus(corpus: str, target_dir: str | os.PathLike, subset: str = "960") -> Path:
    """Download and unpack ``corpus`` into ``target_dir`` with lhotse (parts already unpacked are skipped) and
    return the corpus folder; no connection is a UserError saying to point at an existing copy instead."""
    from lhotse.recipes import download_aishell, download_librispeech, download_tedlium

    target_dir = Path(target_dir)
    what = {"librispeech": f"LibriSpeech ({subset} h)", "tedlium3": "TED-LIUM 3", "aishell1": "AISHELL-1"}
    if _check_corpus(corpus) == "librispeech":
        parts = LIBRISPEECH_TRAIN[_check_subset(subset)] + LIBRISPEECH_EVAL
        fetch = lambda: download_librispeech(target_dir, dataset_parts=list(parts))  # noqa: E731
    elif corpus == "tedlium3":
        fetch = lambda: download_tedlium(target_dir)  # noqa: E731
    else:
        fetch = lambda: download_aishell(target_dir)  # noqa: E731
    before = set(target_dir.iterdir()) if target_dir.is_dir() else set()
    try:
        fetch()
    except (OSError, http.client.HTTPException) as err:  # URLError, socket and SSL errors are OSErrors
        for path in set(target_dir.iterdir()) - before:  # the empty archive lhotse opened before connecting
            if path.is_file() and path.stat().st_size == 0:
                path.unlink()
        reason = getattr(err, "reason", None) or err
        raise UserError(
            f"cannot download {what[corpus]} from {SOURCES[corpus]} (offline? {reason}): "
            "pass --corpus-dir DIR pointing at an existing copy"
        ) from None
    return target_dir / CORPUS_FOLDERS[corpus]


# ---- preparation ------------------------------------------------------------------------------------------------


def prepare_corpus(
    corpus: str, corpus_dir: str | os.PathLike, out_dir: str | os.PathLike, subset: str = "960", jobs: int = 1
) -> dict[str, Path]:
    """Write the cut manifests of ``corpus`` (read from ``corpus_dir``) into ``out_dir``; returns {set: path}."""
    from srupp_asr.manifest import save_cuts

    corpus_dir = Path(corpus_dir)
    if not corpus_dir.is_dir():
        raise UserError(f"{corpus_dir}: corpus folder not found")
    if _check_corpus(corpus) == "librispeech":
        sets = prepare_librispeech(corpus_dir, subset, jobs)
    elif corpus == "tedlium3":
        sets = prepare_tedlium3(corpus_dir, jobs)
    else:
        sets = prepare_aishell1(corpus_dir)
    written = {}
    for name, cuts in sets.items():
        written[name] = manifest_path(out_dir, name)
        save_cuts(cuts, written[name])
    return written


def _sorted_cuts(recordings: RecordingSet, supervisions: SupervisionSet) -> list[Cut]:
    """One cut per recording with its supervisions, in id order (lhotse lists files in file-system order)."""
    from lhotse import CutSet
    from lhotse.utils import fastcopy

    cuts = CutSet.from_manifests(recordings=recordings, supervisions=supervisions)
    return sorted((fastcopy(c, id=c.recording_id) for c in cuts), key=lambda c: c.id)


def _need(path: Path, what: str) -> None:
    if not path.exists():
        raise UserError(f"{path}: not found ({what})")


def prepare_librispeech(corpus_dir: str | os.PathLike, subset: str = "960", jobs: int = 1) -> dict[str, CutSet]:
    """LibriSpeech's sets (see the module doc) from ``corpus_dir`` (the ``LibriSpeech`` folder)."""
    from lhotse import CutSet
    from lhotse.recipes import prepare_librispeech as lhotse_prepare

    corpus_dir = Path(corpus_dir)
    train_parts = LIBRISPEECH_TRAIN[_check_subset(subset)]
    for part in train_parts + LIBRISPEECH_EVAL:
        _need(corpus_dir / part, f"LibriSpeech part {part}: is --corpus-dir the LibriSpeech folder?")
    manifests = lhotse_prepare(corpus_dir, dataset_parts=list(train_parts + LIBRISPEECH_EVAL), num_jobs=jobs)
    parts = {part: _sorted_cuts(m["recordings"], m["supervisions"]) for part, m in manifests.items()}
    sets = {"train": [c for part in train_parts for c in parts[part]]}
    sets["dev"] = parts["dev-clean"] + parts["dev-other"]
    for part in LIBRISPEECH_EVAL:
        sets[part.replace("-", "_")] = parts[part]
    return {name: CutSet.from_cuts(cuts) for name, cuts in sets.items()}


def normalize_tedlium_text(text: str) -> str:
    """A TED-LIUM STM transcript as Kaldi's and ESPnet's ``prepare_data.sh`` clean it, minus the non-speech tags.

    Removed: pronunciation variants ``(2)``, a trailing ``(utterance-id)``, and every tag in ``<...>``, ``{...}`` or
    ``[...]`` (``<sil>``, ``<unk>``, ``{NOISE}``): ESPnet keeps ``[unk]`` and ``[NOISE]`` as tokens, which
    :func:`srupp_asr.text.normalize_text` would turn into the words "unk" and "noise". Split contractions are
    joined (``it 's`` -> ``it's``), as ``join_suffix.py`` does, and a lone apostrophe goes with the next word
    (``roll ' cause`` -> ``roll 'cause``; ``join_suffix.py`` would join it to the word before: ``roll' cause``).
    ``join_suffix.py`` joins suffixes before the tags are mapped, so a suffix after a tag is part of the tag
    (``<unk> 's`` -> ``<unk>'s``) and goes with it.
    ``<sil>`` is removed first, as ESPnet's ``prepare_data.sh`` does (``it <sil> 's`` -> ``it's``).
    """
    text = re.sub(r"\(\d+\)", " ", text)
    text = re.sub(r"\([^ ()]*\)\s*$", " ", text)
    text = text.replace("<sil>", " ")
    text = re.sub(r"(?:<[^>]*>|\{[^}]*\}|\[[^\]]*\])(?:\s*'\w\S*)?", " ", text)
    text = " ".join(text.split())
    text = re.sub(r"(\S) '(\w)", r"\1'\2", text)
    text = re.sub(r"(^|\s)' (\w)", r"\1'\2", text)
    return text


def _unscored_regions(stm_dir: Path) -> dict[str, list[tuple[float, float]]]:
    """The spans (seconds) of each talk whose hypothesis words are not scored, as sclite decides with the STM.

    sclite gives a hypothesis word to the first STM segment that ends after the word's midpoint (the last segment
    when none does), so an ``ignore_time_segment_in_scoring`` segment also takes the words said in the unsegmented
    gap before it: each span runs from the end of the segment before it (0 for the first) to its own end.
    """
    regions: dict[str, list[tuple[float, float]]] = {}
    for stm in sorted(stm_dir.glob("*.stm")):
        segments: dict[str, list[tuple[float, float, bool]]] = {}
        for line in stm.read_text(encoding="utf-8").split("\n"):  # as lhotse reads the STM: at "\n" only
            fields = line.split()
            if len(fields) < 6 or fields[0].startswith(";;"):
                continue
            unscored = fields[6:7] == [TEDLIUM_UNSCORED]
            segments.setdefault(fields[0], []).append((float(fields[3]), float(fields[4]), unscored))
        for talk, spans in segments.items():
            previous_end = 0.0
            for start, end, unscored in sorted(spans):
                if unscored:
                    regions.setdefault(talk, []).append((min(previous_end, start), end))
                previous_end = max(previous_end, end)
    return regions


def _sph_backend():
    """lhotse reads ``.sph`` through the ``sph2pipe`` program; without it, libsndfile reads TED-LIUM's PCM
    SPHERE files (the recipe sets ``LHOTSE_AUDIO_BACKEND=LibsndfileBackend`` for the same reason)."""
    from lhotse.audio.backend import audio_backend

    if shutil.which("sph2pipe") or os.environ.get("LHOTSE_AUDIO_BACKEND"):
        return nullcontext()
    return audio_backend("LibsndfileBackend")


def prepare_tedlium3(corpus_dir: str | os.PathLike, jobs: int = 1) -> dict[str, CutSet]:
    """TED-LIUM 3's sets (see the module doc) from ``corpus_dir`` (the ``TEDLIUM_release-3`` folder)."""
    from lhotse import CutSet, SupervisionSet
    from lhotse.recipes import prepare_tedlium
    from lhotse.utils import fastcopy

    corpus_dir = Path(corpus_dir)
    for split in TEDLIUM_SPLITS:
        for sub in ("sph", "stm"):
            _need(corpus_dir / "legacy" / split / sub, "is --corpus-dir the TEDLIUM_release-3 folder?")
    with _sph_backend():
        manifests = prepare_tedlium(corpus_dir, dataset_parts=list(TEDLIUM_SPLITS), num_jobs=jobs)
    sets: dict[str, CutSet] = {}
    for split in TEDLIUM_SPLITS:
        recordings = manifests[split]["recordings"]
        durations = {r.id: r.duration for r in recordings}
        segments = []
        for sup in manifests[split]["supervisions"]:
            text = normalize_tedlium_text(sup.text or "")
            if not text:
                continue
            if split == "train":
                before, after = TEDLIUM_TRAIN_PADDING
                start = max(0.0, sup.start - before)
                end = min(durations[sup.recording_id], sup.end + after)
                sup = fastcopy(sup, start=round(start, 3), duration=round(end - start, 3))
            segments.append(fastcopy(sup, text=text))
        supervisions = SupervisionSet.from_segments(segments)
        talks = CutSet.from_manifests(recordings=recordings, supervisions=supervisions)
        cuts = talks.trim_to_supervisions(keep_overlapping=False)
        sets[split] = CutSet.from_cuts(sorted(cuts, key=lambda c: c.id))
        if split != "train":
            unscored = _unscored_regions(corpus_dir / "legacy" / split / "stm")
            sets[f"{split}_talks"] = tedlium_talks(_sorted_cuts(recordings, supervisions), unscored)
    return sets


def tedlium_talks(talks: Iterable[Cut], unscored: dict[str, list[tuple[float, float]]]) -> CutSet:
    """Whole talks for the long-form test: each cut spans its talk from the first scored segment's start to the
    last one's end, holds every scored segment as a supervision, and lists in ``custom["unscored"]`` the spans
    (recording time) whose words :func:`srupp_asr.scoring.talks.score_talks` leaves out: the
    ``ignore_time_segment_in_scoring`` segments, each with the unsegmented gap before it, as sclite assigns words
    (:func:`_unscored_regions`)."""
    from lhotse import CutSet

    cuts = []
    for talk in talks:
        if not talk.supervisions:
            continue
        start = min(s.start for s in talk.supervisions)
        end = min(max(s.end for s in talk.supervisions), talk.duration)
        cut = talk.truncate(offset=start, duration=end - start, preserve_id=True)
        cut.custom = {"unscored": [list(span) for span in unscored.get(talk.recording_id, [])]}
        cuts.append(cut)
    return CutSet.from_cuts(cuts)


def prepare_aishell1(corpus_dir: str | os.PathLike) -> dict[str, CutSet]:
    """AISHELL-1's sets from ``corpus_dir`` (the folder holding ``data_aishell``)."""
    from lhotse import CutSet
    from lhotse.recipes import prepare_aishell

    corpus_dir = Path(corpus_dir)
    transcript = corpus_dir / "data_aishell" / "transcript" / "aishell_transcript_v0.8.txt"
    _need(transcript, "is --corpus-dir the folder holding data_aishell?")
    for split in AISHELL_SPLITS:
        _need(corpus_dir / "data_aishell" / "wav" / split, "unpack data_aishell/wav/*.tar.gz first")
    manifests = prepare_aishell(corpus_dir)
    return {
        split: CutSet.from_cuts(_sorted_cuts(manifests[split]["recordings"], manifests[split]["supervisions"]))
        for split in AISHELL_SPLITS
    }


# ---- speed perturbation -----------------------------------------------------------------------------------------


def check_speed_factors(factors: Sequence[float], name: str = "--factors") -> None:
    """Raise a UserError naming ``name`` unless the speeds are finite, positive and distinct (a speed given twice
    would give two cuts of one id)."""
    if not factors:
        raise UserError(f"{name}: no speed given")
    for factor in factors:
        if not (math.isfinite(factor) and factor > 0):
            raise UserError(f"{name}: speeds must be finite and positive, got {factor}")
    twice = sorted({f for f in factors if list(factors).count(f) > 1})
    if twice:
        raise UserError(f"{name}: speed {twice[0]} given twice (its copies would share their cut ids)")


def speed_perturbed(cuts: Iterable[Cut], factors: Sequence[float] = SPEED_FACTORS) -> Iterator[Cut]:
    """Each cut at each speed ``factor`` in turn (1.0: the cut itself; others get the id suffix ``_sp<factor>``).

    Lazy: lhotse resamples the audio when a perturbed cut is loaded. Interleaved (not one copy after another),
    so the first N cuts (``srupp-asr cmvn --max-cuts``) see every speed. The factors must be finite, positive
    and distinct (:func:`check_speed_factors`)."""
    check_speed_factors(factors, "speed perturbation: factors")
    for cut in cuts:
        for factor in factors:
            yield cut if factor == 1.0 else cut.perturb_speed(factor, affix_id=True)


# ---- command line -----------------------------------------------------------------------------------------------


def _download_command(args: argparse.Namespace) -> int:
    folder = download_corpus(args.corpus, args.target_dir, args.subset)
    print(f"{args.corpus} is in {folder}")
    return 0


def _prepare_command(args: argparse.Namespace) -> int:
    from srupp_asr.manifest import load_cuts

    for path in prepare_corpus(args.corpus, args.corpus_dir, args.out_dir, args.subset, args.jobs).values():
        cuts = load_cuts(path, lazy=True, allow_command_sources=True)  # durations only: no audio is read
        count, hours = 0, 0.0
        for cut in cuts:
            count, hours = count + 1, hours + cut.duration / 3600
        print(f"wrote {path}: {count} cuts, {hours:.2f} h")
    return 0


def _same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether ``a`` and ``b`` name one file (through links or other spellings); False when either is missing."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _speed_perturb_command(args: argparse.Namespace) -> int:
    from srupp_asr.manifest import load_cuts, save_cuts

    check_speed_factors(args.factors)
    if _same_file(args.cuts, args.out):
        raise UserError(f"{args.out}: is the input manifest {args.cuts}; write the perturbed cuts to another file")
    # no audio is read: the perturbation is recorded in the cuts (and checked again where they are used)
    save_cuts(speed_perturbed(load_cuts(args.cuts, lazy=True, allow_command_sources=True), args.factors), args.out)
    print(f"wrote {args.out} (speeds {' '.join(str(f) for f in args.factors)})")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the ``corpus`` sub-command (``download``, ``prepare``, ``speed-perturb``, ``score-talks``)."""
    from srupp_asr.scoring.talks import score_talks_command

    what = "download and prepare LibriSpeech, TED-LIUM 3 and AISHELL-1 for the recipes"
    p = subparsers.add_parser("corpus", help=what, description=what)
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    subset_help = "LibriSpeech training subset: 100 or 960 hours (default 960)"

    d = actions.add_parser("download", help="download and unpack a corpus with lhotse")
    d.add_argument("corpus", choices=CORPORA)
    d.add_argument("target_dir", metavar="DIR", help="where to download and unpack")
    d.add_argument("--subset", default="960", choices=sorted(LIBRISPEECH_TRAIN), help=subset_help)
    d.set_defaults(func=_download_command)

    r = actions.add_parser(
        "prepare",
        help="write a downloaded corpus's cut manifests (<set>_cuts.jsonl.gz); data of your own in another "
        "toolkit's layout (Kaldi, NeMo, a table): srupp-asr prepare",
    )
    r.add_argument("corpus", choices=CORPORA)
    r.add_argument("corpus_dir", metavar="CORPUS_DIR", help="LibriSpeech, TEDLIUM_release-3 or aishell folder")
    r.add_argument("out_dir", metavar="OUT_DIR")
    r.add_argument("--subset", default="960", choices=sorted(LIBRISPEECH_TRAIN), help=subset_help)
    r.add_argument("--jobs", type=int, default=1, help="threads reading audio headers (default 1)")
    r.set_defaults(func=_prepare_command)

    s = actions.add_parser("speed-perturb", help="a cut manifest at several speeds (lazy: no audio written)")
    s.add_argument("cuts", metavar="CUTS")
    s.add_argument("out", metavar="OUT")
    s.add_argument("--factors", type=float, nargs="+", default=list(SPEED_FACTORS), help="default 0.9 1.0 1.1")
    s.set_defaults(func=_speed_perturb_command)

    t = actions.add_parser("score-talks", help="score whole-talk transcripts (long-form test)")
    t.add_argument("talks", metavar="TALK_CUTS", help="the talks manifest (<set>_talks_cuts.jsonl.gz)")
    t.add_argument("transcripts", metavar="TRANSCRIPT_DIR", help="srupp-asr transcribe -f json output")
    t.add_argument("--out-dir", required=True, help="where the report files go")
    t.add_argument("--name", help="dataset name in the report (default: from the manifest's name)")
    t.add_argument(
        "--stm",
        metavar="STM_DIR",
        help="also score the official way: the transcripts' words as OUT_DIR/hyp.ctm, the folder's *.stm files as "
        "OUT_DIR/ref.stm, scored by srupp-asr sclite into OUT_DIR/sclite.sys/.raw/.pra",
    )
    t.set_defaults(func=score_talks_command)
    return p
