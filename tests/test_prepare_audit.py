"""Corpus import and long-form scoring checked against their references: NIST sclite with an STM and a CTM,
Kaldi's ``extract-segments`` and ``join_suffix.py`` / ESPnet's TED-LIUM ``prepare_data.sh``, NeMo's line reading."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from srupp_asr.corpora import manifest_path, normalize_tedlium_text, prepare_corpus, score_talks
from srupp_asr.errors import UserError
from srupp_asr.prepare import import_kaldi_dir, import_nemo_manifest
from tests.test_scoring_sclite import SCLITE

RATE = 16000


# Talk A: every case of where sclite puts a hypothesis word. Times are exact in binary, so midpoints that fall
# on a segment boundary are exactly on it.
STM_A = [
    (0, 1, "inter_segment_gap", "ignore_time_segment_in_scoring"),
    (1, 3, "Sp", "the cat sat"),
    (3, 5, "Sp", "on the mat"),
    (5, 7, "inter_segment_gap", "ignore_time_segment_in_scoring"),
    (7, 9, "Sp", "a dog ran"),
    # 9-10: an unsegmented gap before an ignored segment
    (10, 12, "inter_segment_gap", "ignore_time_segment_in_scoring"),
    (12, 14, "Sp", ""),  # an empty segment
    (14, 16, "Sp", "far away"),
    # 16-17: an unsegmented gap before a scored segment
    (17, 19, "Sp", "seven birds"),
    (19, 21, "inter_segment_gap", "ignore_time_segment_in_scoring"),
]
# (midpoint, word) of talk A's hypothesis, with what sclite does with each word
HYP_A = [
    (0.5, "noise"),  # in the leading ignored segment: left out
    (1.5, "the"),
    (2.0, "cat"),
    (2.5, "sat"),
    (3.5, "on"),
    (4.0, "the"),
    (4.5, "hat"),  # a substitution
    (5.0, "uh"),  # on the start of an ignored segment: left out
    (6.0, "um"),
    (7.0, "er"),  # on the end of an ignored segment: an insertion in the next one
    (7.5, "a"),
    (8.0, "dog"),
    (8.5, "ran"),
    (9.0, "hm"),  # on the end of a scored segment, before a gap and an ignored segment: left out
    (9.5, "ah"),  # in the gap before an ignored segment: left out
    (11.0, "oh"),
    (13.0, "yes"),  # in the empty segment: an insertion
    (14.5, "far"),
    (15.5, "away"),
    (16.5, "hmm"),  # in the gap before a scored segment: an insertion
    (17.5, "seven"),  # "birds" deleted
    (19.0, "ok"),  # on the start of the trailing ignored segment: left out
    (20.0, "bye"),
    (25.0, "end"),  # after the last (ignored) segment: left out
]
# Talk B has no hypothesis at all: all deletions.
STM_B = [(0, 2, "inter_segment_gap", "ignore_time_segment_in_scoring"), (2, 4, "Sp", "the river flows")]


def _stm(talk: str, segments) -> str:
    return "".join(f"{talk} 1 {who} {a:.2f} {b:.2f} <o,f0,male> {text}\n" for a, b, who, text in segments)


def _tedlium(root: Path) -> Path:
    """A TED-LIUM 3 layout whose test talks are A and B (silent audio: only the STMs and the times matter)."""
    corpus = root / "TEDLIUM_release-3"
    talks = {
        "train": {"T": [(0, 1, "Sp", "hello there")]},
        "dev": {"D": [(0, 1, "Sp", "good morning")]},
        "test": {"A": STM_A, "B": STM_B},
    }
    for split, stms in talks.items():
        for sub in ("sph", "stm"):
            (corpus / "legacy" / split / sub).mkdir(parents=True)
        for talk, segments in stms.items():
            (corpus / "legacy" / split / "stm" / f"{talk}.stm").write_text(_stm(talk, segments))
            audio = np.zeros(30 * RATE, dtype=np.int16)
            sf.write(corpus / "legacy" / split / "sph" / f"{talk}.sph", audio, RATE, format="NIST", subtype="PCM_16")
    return corpus


def _sclite_totals(folder: Path) -> tuple[int, int, int, int, int]:
    """(reference words, correct, substitutions, deletions, insertions) of sclite on ``ref.stm`` / ``hyp.ctm``."""
    cmd = [*SCLITE, "-r", "ref.stm", "stm", "-h", "hyp.ctm", "ctm", "-o", "rsum", "stdout"]
    out = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    row = re.search(r"\|\s*Sum\s*\|\s*\d+\s+(\d+)\s*\|\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)", out.stdout)
    assert row, out.stdout
    return tuple(int(n) for n in row.groups())


@pytest.mark.skipif(SCLITE is None, reason="sclite is not installed (apt-get install sctk)")
def test_talk_scores_equal_sclite_with_the_stm_and_a_ctm(tmp_path):
    # Was: an ignore_time_segment_in_scoring span covered only its own segment, so the words said in an
    # unsegmented gap before it ("hm", "ah" here) were scored as insertions; sclite gives them to the ignored
    # segment after them and leaves them out (ours: 11 correct, 1 substitution, 4 deletions, 5 insertions).
    corpus = _tedlium(tmp_path / "corpus")
    manifests = tmp_path / "manifests"
    prepare_corpus("tedlium3", corpus, manifests)
    transcripts = tmp_path / "transcripts"
    transcripts.mkdir()
    words = [{"word": w, "start": mid - 0.25, "end": mid + 0.25} for mid, w in HYP_A]
    segment = {"start": 0.25, "end": 25.25, "text": " ".join(w for _, w in HYP_A), "words": words}
    (transcripts / "A.json").write_text(json.dumps({"text": segment["text"], "segments": [segment]}))
    missing: list[str] = []
    result = score_talks(manifest_path(manifests, "test_talks"), transcripts, tmp_path / "out", missing=missing)
    assert missing == ["B.json"]
    total = result.total("WER")
    ours = (total.tokens, total.correct, total.substitutions, total.deletions, total.insertions)

    (tmp_path / "ref.stm").write_text(_stm("A", STM_A) + _stm("B", STM_B))
    (tmp_path / "hyp.ctm").write_text("".join(f"A 1 {mid - 0.25:.2f} 0.50 {w}\n" for mid, w in HYP_A))
    assert _sclite_totals(tmp_path) == (16, 11, 1, 4, 3)  # B's 3 words deleted; "er", "yes", "hmm" inserted
    assert ours == (16, 11, 1, 4, 3)


def test_a_suffix_after_a_tag_goes_with_the_tag():
    # Kaldi's and ESPnet's prepare_data.sh run join_suffix.py on the raw STM text, so "<unk> 's" becomes the one
    # token "<unk>'s" ("[unk]'s" in ESPnet): the suffix belongs to the unknown word. Was: the tags were removed
    # first and the suffix was then joined to the word before the tag ("in <unk> 's book" -> "in's book").
    assert normalize_tedlium_text("in <unk> 's book") == "in book"
    assert normalize_tedlium_text("the {NOISE} 's fine") == "the fine"
    assert normalize_tedlium_text("a <unk>'s x") == "a x"
    assert normalize_tedlium_text("it <sil> 's here") == "it's here"  # ESPnet removes <sil> before joining


def _tone(path: Path, seconds: float) -> Path:
    sf.write(path, np.full(round(seconds * RATE), 0.1, dtype=np.float32), RATE)
    return path


def test_kaldi_segment_overshooting_by_less_than_half_a_second_is_truncated(tmp_path):
    # Kaldi's extract-segments truncates a segment that ends less than --max-overshoot (0.5 s) past its audio and
    # rejects the others. Was: anything more than 0.1 s past the end was skipped.
    _tone(tmp_path / "a.wav", 2.0)
    (tmp_path / "wav.scp").write_text(f"a {tmp_path / 'a.wav'}\n")
    (tmp_path / "segments").write_text("u1 a 1.0 2.4\nu2 a 1.0 2.6\n")
    (tmp_path / "text").write_text("u1 one\nu2 two\n")
    problems: list[str] = []
    (cut,) = import_kaldi_dir(tmp_path, problems)
    assert (cut.id, cut.start, cut.duration) == ("u1", 1.0, 1.0)
    assert problems == [f"{tmp_path / 'segments'}: u2: ends at 2.60 s, after the audio's end at 2.00 s"]


def test_kaldi_segment_end_other_than_minus_one_is_not_the_recording_end(tmp_path):
    # Kaldi: only an end of -1 means "to the end of the recording"; another negative end is an invalid line.
    # Was: any negative end (a typo such as -0.5) silently took the whole rest of the recording.
    _tone(tmp_path / "a.wav", 2.0)
    (tmp_path / "wav.scp").write_text(f"a {tmp_path / 'a.wav'}\n")
    (tmp_path / "segments").write_text("u1 a 0.5 -1\nu2 a 0.5 -0.5\n")
    (tmp_path / "text").write_text("u1 one\nu2 two\n")
    problems: list[str] = []
    (cut,) = import_kaldi_dir(tmp_path, problems)
    assert (cut.id, cut.start, cut.duration) == ("u1", 0.5, 1.5)
    assert problems == [
        f"{tmp_path / 'segments'}: u2: negative end time '-0.5' (only -1 means the end of the recording)"
    ]


def test_lines_end_at_newlines_only(tmp_path):
    # Kaldi and NeMo split their files at "\n" only. Was: str.splitlines also split at U+2028, U+0085 and form
    # feeds, so a NeMo line written with ensure_ascii=False became two invalid JSON lines, and a Kaldi transcript
    # was cut short, its rest read as an utterance id without audio.
    _tone(tmp_path / "a.wav", 1.0)
    (tmp_path / "m.json").write_text(
        json.dumps({"audio_filepath": "a.wav", "text": "one\u2028two"}, ensure_ascii=False) + "\r\n",
        encoding="utf-8",
    )
    problems: list[str] = []
    (cut,) = import_nemo_manifest(tmp_path / "m.json", problems)
    assert problems == [] and cut.supervisions[0].text == "one\u2028two"

    (tmp_path / "wav.scp").write_text(f"a {tmp_path / 'a.wav'}\r\n")
    (tmp_path / "text").write_text("a caf\u0085 au\x0clait\r\n", encoding="utf-8")
    (cut,) = import_kaldi_dir(tmp_path, problems)
    assert problems == [] and cut.supervisions[0].text == "caf\u0085 au\x0clait"


def test_a_byte_order_mark_is_not_part_of_the_first_id(tmp_path):
    # Windows editors start a UTF-8 file with a byte order mark. Was: it became part of the first utterance id
    # ("\ufeffa": "no audio", and "a": "no transcript") and made a NeMo manifest's first line invalid JSON.
    _tone(tmp_path / "a.wav", 1.0)
    (tmp_path / "wav.scp").write_text(f"a {tmp_path / 'a.wav'}\r\n", encoding="utf-8-sig")
    (tmp_path / "text").write_text("a hello\r\n", encoding="utf-8-sig")
    (tmp_path / "m.json").write_text(json.dumps({"audio_filepath": "a.wav", "text": "hi"}), encoding="utf-8-sig")
    problems: list[str] = []
    (cut,) = import_kaldi_dir(tmp_path, problems)
    (nemo,) = import_nemo_manifest(tmp_path / "m.json", problems)
    assert problems == [] and cut.supervisions[0].text == "hello" and nemo.supervisions[0].text == "hi"


def test_text_that_is_not_utf8_is_one_line_naming_the_file_and_line(tmp_path):
    # Was: "<dir>/text: file is not UTF-8 text (invalid continuation byte at byte 13)": the byte, not the line.
    _tone(tmp_path / "a.wav", 1.0)
    (tmp_path / "wav.scp").write_text(f"a {tmp_path / 'a.wav'}\n")
    (tmp_path / "text").write_bytes(b"a hello\nb caf\xe9\n")  # Latin-1
    with pytest.raises(UserError) as err:
        import_kaldi_dir(tmp_path)
    assert str(err.value) == f"{tmp_path / 'text'}:2: file is not UTF-8 text (invalid continuation byte at byte 13)"
