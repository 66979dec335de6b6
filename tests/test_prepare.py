"""Importing Kaldi data directories and NeMo manifests as cut manifests."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from srupp_asr import prepare
from srupp_asr.corpora import manifest_path, normalize_tedlium_text, prepare_corpus
from srupp_asr.errors import UserError
from srupp_asr.manifest import load_cuts
from srupp_asr.prepare import (
    AUDIOFOLDER_METADATA,
    TableColumns,
    import_kaldi_dir,
    import_nemo_manifest,
    import_table,
    save_splits,
    split_path,
)
from srupp_asr.scoring.talks import score_talks
from tests.helpers import SCLITE, write_tone


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    prepare.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture
def kaldi_dir(tmp_path):
    """Two recordings cut into three segments, speakers, one raw punctuated transcript."""
    write_tone(tmp_path / "r1.wav", 3.0)
    write_tone(tmp_path / "r2.flac", 2.0, rate=8000)
    data = tmp_path / "data"
    data.mkdir()
    (data / "wav.scp").write_text(f"r1 {tmp_path / 'r1.wav'}\nr2 {tmp_path / 'r2.flac'}\n")
    (data / "segments").write_text("u1 r1 0.00 1.25\nu2 r1 1.25 -1\nu3 r2 0.5 1.5\n")
    (data / "text").write_text("u1 Hello, World!\nu2 SECOND part\nu3 third\n")
    (data / "utt2spk").write_text("u1 alice\nu2 alice\nu3 bob\n")
    return data


def test_kaldi_segments_become_cuts_of_their_recordings(kaldi_dir):
    problems: list[str] = []
    cuts = import_kaldi_dir(kaldi_dir, problems)
    assert problems == []
    by_id = {c.id: c for c in cuts}
    assert sorted(by_id) == ["u1", "u2", "u3"]
    assert (by_id["u1"].start, by_id["u1"].duration) == (0.0, 1.25)
    assert (by_id["u2"].start, by_id["u2"].duration) == (1.25, 1.75)  # end -1 = end of the recording
    assert by_id["u3"].sampling_rate == 8000 and by_id["u3"].load_audio().shape == (1, 8000)
    sup = by_id["u1"].supervisions[0]
    assert (sup.text, sup.speaker, sup.start, sup.duration) == ("Hello, World!", "alice", 0.0, 1.25)
    assert by_id["u3"].supervisions[0].speaker == "bob"


def test_kaldi_without_segments_makes_one_cut_per_recording(tmp_path):
    write_tone(tmp_path / "a.wav", 1.5, channels=2)
    (tmp_path / "wav.scp").write_text(f"a {tmp_path / 'a.wav'}\n")
    (tmp_path / "text").write_text("a stereo speech\n")
    (cut,) = import_kaldi_dir(tmp_path)
    assert (cut.id, cut.duration, cut.num_channels) == ("a", 1.5, 2)
    assert cut.supervisions[0].text == "stereo speech" and cut.supervisions[0].speaker is None


def test_kaldi_missing_audio_and_malformed_lines_are_skipped_and_reported(kaldi_dir, tmp_path):
    (kaldi_dir / "wav.scp").write_text(
        f"r1 {tmp_path / 'r1.wav'}\nr2 {tmp_path / 'r2.flac'}\nr3 {tmp_path / 'gone.wav'}\nr4\n"
    )
    (kaldi_dir / "segments").write_text(
        "u1 r1 0.00 1.25\nu2 r1 1.25\nu3 r2 0.5 2.6\nu4 r3 0 1\nu5 r4 0 1\nu6 r9 0 1\nu7 r1 x 1\n"
    )
    (kaldi_dir / "text").write_text(
        "u1 one\nu2 two\nu3 three\nu4 four\nu5 five\nu6 six\nu7 seven\nu8 orphan\nu1 again\n"
    )
    problems: list[str] = []
    cuts = import_kaldi_dir(kaldi_dir, problems)
    assert [c.id for c in cuts] == ["u1"]
    assert len(problems) == 8
    joined = "\n".join(problems)
    for expected in [
        "text:9: duplicate id 'u1'",
        "segments: u2: malformed line",
        "segments: u3: ends at 2.60 s, after the audio's end at 2.00 s",
        f"segments: u4: {tmp_path / 'gone.wav'}: audio file not found",
        "segments: u5: no audio path or command after the recording id",
        "segments: u6: recording 'r9' is not in wav.scp",
        "segments: u7: time is not a number: 'x'",
        "text: u8: no audio (not in segments)",
    ]:
        assert expected in joined


def test_kaldi_segment_slightly_past_the_end_is_clipped(kaldi_dir):
    (kaldi_dir / "segments").write_text("u1 r1 2.0 3.05\n")
    (cut,) = import_kaldi_dir(kaldi_dir)
    assert (cut.start, cut.duration) == (2.0, 1.0)


@pytest.mark.skipif(shutil.which("sox") is None, reason="sox is not installed")
def test_kaldi_pipe_command_is_run_at_import_and_at_load(tmp_path):
    write_tone(tmp_path / "a.wav", 1.0, rate=8000)
    (tmp_path / "wav.scp").write_text(f"a sox {tmp_path / 'a.wav'} -t wav - |\nb false |\n")
    (tmp_path / "text").write_text("a piped\nb broken\n")
    problems: list[str] = []
    (cut,) = import_kaldi_dir(tmp_path, problems, allow_commands=True)
    assert cut.recording.sources[0].type == "command"
    assert (cut.duration, cut.sampling_rate) == (1.0, 8000)
    np.testing.assert_allclose(cut.load_audio()[0], sf.read(tmp_path / "a.wav", dtype="float32")[0], atol=1e-4)
    assert len(problems) == 1 and "wav.scp: b: command failed" in problems[0]


def test_kaldi_dir_without_text_is_a_user_error(tmp_path):
    (tmp_path / "wav.scp").write_text("a a.wav\n")
    with pytest.raises(UserError, match="text: not found"):
        import_kaldi_dir(tmp_path)
    with pytest.raises(UserError, match="nowhere: not a directory"):
        import_kaldi_dir(tmp_path / "nowhere")


def test_nemo_manifest_resolves_relative_paths_and_offsets(tmp_path, synthesize_speech):
    (tmp_path / "audio").mkdir()
    write_tone(tmp_path / "audio" / "long.wav", 4.0)
    speech = synthesize_speech("hello from espeak", name="hello.wav")
    lines = [
        {"audio_filepath": "audio/long.wav", "duration": 1.5, "offset": 0.5, "text": "First Part."},
        {"audio_filepath": "audio/long.wav", "duration": 2.0, "offset": 2.0, "text": "second part"},
        {"audio_filepath": str(speech), "duration": 0.1, "text": "Hello from espeak"},
        {"audio_filepath": str(speech), "text": "Hello from espeak"},
    ]
    (tmp_path / "m.json").write_text("".join(json.dumps(x) + "\n" for x in lines))
    problems: list[str] = []
    cuts = {c.id: c for c in import_nemo_manifest(tmp_path / "m.json", problems)}
    assert problems == []
    assert sorted(cuts) == ["hello", "hello_000000_000010", "long_000050_000200", "long_000200_000400"]
    first = cuts["long_000050_000200"]
    assert (first.start, first.duration, first.supervisions[0].text) == (0.5, 1.5, "First Part.")
    assert first.recording.sources[0].source == str(tmp_path / "audio" / "long.wav")
    assert first.recording.id == cuts["long_000200_000400"].recording.id == "long"
    whole = cuts["hello"]
    assert whole.sampling_rate == 22050 and whole.duration == pytest.approx(sf.info(speech).duration)


def test_nemo_bad_lines_are_skipped_with_their_line_numbers(tmp_path):
    write_tone(tmp_path / "a.wav", 1.0)
    (tmp_path / "m.json").write_text(
        "\n".join(
            [
                json.dumps({"audio_filepath": "a.wav", "duration": 1.0, "text": "fine"}),
                "{not json",
                json.dumps({"audio_filepath": "missing.wav", "duration": 1.0, "text": "gone"}),
                json.dumps({"audio_filepath": "a.wav", "duration": 1.0}),
                json.dumps({"audio_filepath": "a.wav", "duration": "long", "text": "x"}),
                json.dumps({"audio_filepath": "a.wav", "offset": 0.5, "duration": 3.0, "text": "too long"}),
                json.dumps({"audio_filepath": "a.wav", "duration": 1.0, "text": "again"}),
                json.dumps(["a.wav"]),
            ]
        )
    )
    problems: list[str] = []
    cuts = import_nemo_manifest(tmp_path / "m.json", problems)
    assert [c.id for c in cuts] == ["a"]
    m = tmp_path / "m.json"
    assert problems == [
        f"{m}:2: not valid JSON (Expecting property name enclosed in double quotes)",
        f"{m}:3: {tmp_path / 'missing.wav'}: audio file not found",
        f"{m}:4: no 'text'",
        f"{m}:5: 'duration' is not a number: 'long'",
        f"{m}:6: {tmp_path / 'a.wav'}: ends at 3.50 s, after the audio's end at 1.00 s",
        f"{m}:7: duplicate of line 1 (a)",
        f"{m}:8: expected a JSON object, got list",
    ]


def test_cli_writes_the_manifest_and_exits_by_what_was_skipped(kaldi_dir, tmp_path, capsys):
    out = tmp_path / "out" / "cuts.jsonl.gz"
    assert _run(["prepare", "kaldi", str(kaldi_dir), str(out)]) == 0
    assert [c.id for c in load_cuts(out)] == ["u1", "u2", "u3"]
    assert f"wrote 3 cuts to {out}; skipped 0" in capsys.readouterr().out
    assert sorted(p.name for p in out.parent.iterdir()) == ["cuts.jsonl.gz"]  # no temporary file left

    (kaldi_dir / "text").write_text("u1 one\nu2 two\n")
    assert _run(["prepare", "kaldi", str(kaldi_dir), str(out)]) == 1
    captured = capsys.readouterr()
    assert "wrote 2 cuts" in captured.out and "skipped 1" in captured.out
    assert "skipped: " in captured.err and "u3: no transcript" in captured.err

    (tmp_path / "bad.json").write_text("{}\n")
    with pytest.raises(UserError, match=r"bad\.json: nothing could be imported \(1 entries skipped\)"):
        _run(["prepare", "nemo", str(tmp_path / "bad.json"), str(tmp_path / "bad.jsonl.gz")])
    assert not (tmp_path / "bad.jsonl.gz").exists()


def test_cli_refuses_an_output_that_is_not_jsonl(kaldi_dir, tmp_path):
    with pytest.raises(UserError, match=r"cuts\.txt: cut manifests are written as \.jsonl\.gz"):
        _run(["prepare", "kaldi", str(kaldi_dir), str(tmp_path / "cuts.txt")])


def test_kaldi_pipe_commands_run_only_when_allowed(tmp_path, capsys):
    from srupp_asr.cli import main

    flag = tmp_path / "ran"
    (tmp_path / "wav.scp").write_text(f"a touch {flag}; cat x.wav |\nb b.wav\n")
    (tmp_path / "text").write_text("a one\nb two\n")
    with pytest.raises(UserError, match=r"wav\.scp: 1 entries are shell commands \(the first: a\); nothing was run"):
        import_kaldi_dir(tmp_path)
    assert main(["prepare", "kaldi", str(tmp_path), str(tmp_path / "cuts.jsonl.gz")]) == 2
    assert "--allow-command-sources" in capsys.readouterr().err and not flag.exists()
    main(["prepare", "kaldi", str(tmp_path), str(tmp_path / "cuts.jsonl.gz"), "--allow-command-sources"])
    assert flag.exists()


# ----------------------------------------------------------------------------------------------------
# moved from tests/test_prepare_audit.py
# Corpus import and long-form scoring checked against their references: NIST sclite with an STM and a CTM,
# Kaldi's ``extract-segments`` and ``join_suffix.py`` / ESPnet's TED-LIUM ``prepare_data.sh``, NeMo's line reading.

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


@pytest.mark.reference
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


@pytest.mark.reference
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


@pytest.mark.reference
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


@pytest.mark.reference
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


@pytest.mark.reference
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


@pytest.mark.reference
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


@pytest.mark.reference
def test_text_that_is_not_utf8_is_one_line_naming_the_file_and_line(tmp_path):
    # Was: "<dir>/text: file is not UTF-8 text (invalid continuation byte at byte 13)": the byte, not the line.
    _tone(tmp_path / "a.wav", 1.0)
    (tmp_path / "wav.scp").write_text(f"a {tmp_path / 'a.wav'}\n")
    (tmp_path / "text").write_bytes(b"a hello\nb caf\xe9\n")  # Latin-1
    with pytest.raises(UserError) as err:
        import_kaldi_dir(tmp_path)
    assert str(err.value) == f"{tmp_path / 'text'}:2: file is not UTF-8 text (invalid continuation byte at byte 13)"


# ----------------------------------------------------------------------------------------------------
# moved from tests/test_prepare_table.py
# Importing a folder of audio plus a table of transcripts (CSV, TSV, Hugging Face audiofolder) as cut manifests.


@pytest.fixture
def audio(tmp_path):
    """Three recordings of known lengths and rates under tmp_path/clips."""
    clips = tmp_path / "clips"
    clips.mkdir()
    write_tone(clips / "a.wav", 1.25)
    write_tone(clips / "b.flac", 0.5, rate=8000)
    write_tone(clips / "c.wav", 2.0, rate=22050)
    return clips


def test_csv_with_quoted_text_and_split_column_gives_one_cut_set_per_split(tmp_path, audio):
    table = tmp_path / "transcripts.csv"
    table.write_text(
        "path,duration_s,speaker,text,split\n"
        'clips/a.wav,99.0,ann,"Hello, World!",train\n'
        "clips/b.flac,0.5,bob,second,dev\n"
        'clips/c.wav,2,ann,"She said ""yes""",train\n'
    )
    problems: list[str] = []
    splits = import_table(table, problems)
    assert problems == []
    assert sorted(splits) == ["dev", "train"]
    train = {c.id: c for c in splits["train"]}
    assert sorted(train) == ["a", "c"]
    assert train["a"].duration == 1.25  # from the audio header, not the table's duration column
    assert (train["c"].duration, train["c"].sampling_rate) == (2.0, 22050)
    sup = train["a"].supervisions[0]
    assert (sup.text, sup.speaker, sup.start, sup.duration) == ("Hello, World!", "ann", 0.0, 1.25)
    assert train["c"].supervisions[0].text == 'She said "yes"'
    (dev,) = splits["dev"]
    assert (dev.id, dev.duration, dev.sampling_rate, dev.supervisions[0].speaker) == ("b", 0.5, 8000, "bob")
    assert dev.load_audio().shape == (1, 4000)


def test_tsv_keeps_quotes_as_text_and_goes_to_the_default_split(tmp_path, audio):
    table = tmp_path / "t.tsv"
    table.write_text('file_name\ttranscription\nclips/a.wav\t"quoted" words\nclips/b.flac\t\n')
    splits = import_table(table, default_split="test")
    assert list(splits) == ["test"]
    texts = {c.id: c.supervisions[0].text for c in splits["test"]}
    assert texts == {"a": '"quoted" words', "b": ""}
    assert all(c.supervisions[0].speaker is None for c in splits["test"])


def test_audiofolder_metadata_csv_and_split_subfolders(tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    write_tone(flat / "x.wav", 0.75)
    (flat / "metadata.csv").write_text("file_name,transcription,speaker_id\nx.wav,one two,s1\n")
    (cut,) = import_table(flat)["all"]
    assert (cut.id, cut.duration, cut.supervisions[0].text, cut.supervisions[0].speaker) == ("x", 0.75, "one two", "s1")

    nested = tmp_path / "nested"
    for split in ("train", "test"):
        (nested / split).mkdir(parents=True)
        write_tone(nested / split / "0001.wav", 0.5 if split == "train" else 1.0)
        (nested / split / "metadata.csv").write_text(f"file_name,text\n0001.wav,{split} words\n")
    splits = import_table(nested)
    assert sorted(splits) == ["test", "train"]
    (test,), (train,) = splits["test"], splits["train"]
    assert (train.duration, train.supervisions[0].text) == (0.5, "train words")
    assert (test.duration, test.supervisions[0].text) == (1.0, "test words")
    assert train.id != test.id  # the same stem in two splits still gives unique cut ids
    (tmp_path / "bare").mkdir()
    with pytest.raises(UserError, match=r"bare: no metadata\.csv"):
        import_table(tmp_path / "bare")


def test_bad_rows_are_skipped_with_one_line_naming_the_table_and_line(tmp_path, audio):
    (tmp_path / "broken.wav").write_bytes(b"RIFF not audio")
    table = tmp_path / "t.csv"
    table.write_text(
        "path,text,split\n"
        "clips/a.wav,fine,train\n"
        "clips/missing.wav,gone,train\n"
        "clips/b.flac,too,many,fields\n"
        ",no path,train\n"
        "clips/c.wav,no split,\n"
        "\n"
        "broken.wav,not audio,train\n"
        "clips/b.flac,bad split,../x\n"
        "clips/a.wav,again,dev\n"
    )
    problems: list[str] = []
    splits = import_table(table, problems)
    assert [c.id for c in splits["train"]] == ["a"] and list(splits) == ["train"]
    assert len(problems) == 7
    expected = [
        (3, "audio file not found"),
        (4, "4 fields, the header has 3"),
        (5, "no audio path in column 'path'"),
        (6, "no split in column 'split'"),
        (8, "cannot read audio"),
        (9, "split '../x' is not a name"),
        (10, "clips/a.wav is listed again (first at"),
    ]
    for problem, (line, why) in zip(problems, expected, strict=True):
        assert problem.startswith(f"{table}:{line}: ") and why in problem and "\n" not in problem


def test_columns_are_found_by_name_or_named_explicitly(tmp_path, audio):
    table = tmp_path / "t.csv"
    table.write_text("clip,words_said,who\nclips/a.wav,hi,me\n")
    with pytest.raises(UserError, match=r"t\.csv: no audio column \(looked for path, file_name"):
        import_table(table)
    (cut,) = import_table(table, columns=TableColumns(audio="clip", text="words_said", speaker="who"))["all"]
    assert (cut.supervisions[0].text, cut.supervisions[0].speaker) == ("hi", "me")
    with pytest.raises(UserError, match="no column 'nope'"):
        import_table(table, columns=TableColumns(audio="nope"))
    with pytest.raises(UserError, match=r"is a \.csv or \.tsv"):
        import_table(tmp_path / "clips" / "a.wav")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(UserError, match=r"empty\.csv: empty"):
        import_table(tmp_path / "empty.csv")


def test_audio_root_overrides_the_tables_folder(tmp_path, audio):
    table = tmp_path / "elsewhere" / "t.tsv"
    table.parent.mkdir()
    table.write_text("path\ttext\na.wav\thi\n")
    (cut,) = import_table(table, audio_root=audio)["all"]
    assert cut.recording.sources[0].source == str(audio / "a.wav")


def test_cli_writes_one_manifest_per_split_that_training_loads(tmp_path, audio, capsys):
    table = tmp_path / "t.csv"
    table.write_text("path,text,speaker,split\nclips/a.wav,One,ann,train\nclips/b.flac,Two,bob,dev\n")
    out = tmp_path / "out"
    assert _run(["prepare", "table", str(table), str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["dev_cuts.jsonl.gz", "train_cuts.jsonl.gz"]
    (train,) = load_cuts(out / "train_cuts.jsonl.gz")  # the check every training and evaluate run makes
    assert (train.id, train.supervisions[0].text) == ("a", "One")
    assert "wrote 2 cuts" in capsys.readouterr().out

    table.write_text("path,text,split\nclips/a.wav,One,train\nclips/gone.wav,Two,train\n")
    assert _run(["prepare", "table", str(table), str(tmp_path / "out2")]) == 1
    assert f"skipped: {table}:3: {tmp_path / 'clips/gone.wav'}: audio file not found" in capsys.readouterr().err

    table.write_text("path,text\nclips/gone.wav,x\n")
    with pytest.raises(UserError, match="nothing could be imported"):
        _run(["prepare", "table", str(table), str(tmp_path / "out3")])
    assert not (tmp_path / "out3").exists()


def test_a_failed_write_leaves_no_split_half_written(tmp_path, audio, monkeypatch):
    table = tmp_path / "t.csv"
    table.write_text("path,text,split\nclips/a.wav,one,dev\nclips/b.flac,two,train\n")
    splits = import_table(table)
    out = tmp_path / "out"
    out.mkdir()
    split_path(out, "dev").write_text("previous run\n")
    import srupp_asr.manifest

    real_save = srupp_asr.manifest.save_cuts  # prepare imports it when it writes

    def fail_on_train(cuts, path):
        if "train" in str(path):
            raise OSError(28, "No space left on device", str(path))
        real_save(cuts, path)

    monkeypatch.setattr(srupp_asr.manifest, "save_cuts", fail_on_train)
    with pytest.raises(OSError, match="No space left"):
        save_splits(splits, out)
    assert sorted(p.name for p in out.iterdir()) == ["dev_cuts.jsonl.gz"]  # no temporary folder left either
    assert split_path(out, "dev").read_text() == "previous run\n"  # the earlier manifest is untouched


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_a_quoted_field_keeps_its_line_breaks_and_later_rows_keep_their_line_numbers(tmp_path, audio, newline):
    table = tmp_path / "t.csv"
    rows = ["path,text", 'clips/a.wav,"hello', 'world"', "clips/b.flac,two", "gone.wav,three"]
    table.write_bytes(newline.join(rows).encode() + newline.encode())
    problems: list[str] = []
    cuts = list(import_table(table, problems)["all"])
    assert [(c.id, c.supervisions[0].text) for c in cuts] == [("a", f"hello{newline}world"), ("b", "two")]
    assert problems == [f"{table}:5: {tmp_path / 'gone.wav'}: audio file not found"]


def test_a_quote_never_closed_is_blamed_on_its_own_line_and_the_rows_after_it_are_read(tmp_path, audio):
    table = tmp_path / "t.csv"
    table.write_text('path,text\nclips/a.wav,"never closed\nclips/b.flac,two\nclips/c.wav,three\n')
    problems: list[str] = []
    cuts = import_table(table, problems)["all"]
    assert [c.id for c in cuts] == ["b", "c"]
    assert problems == [f"{table}:2: a quote opened in this row is never closed; the row is skipped"]


def test_a_nul_in_a_transcript_is_refused(tmp_path, audio):
    table = tmp_path / "t.csv"
    table.write_text("path,text\nclips/a.wav,he\0llo\nclips/b.flac,two\n")
    problems: list[str] = []
    assert [c.id for c in import_table(table, problems)["all"]] == ["b"]
    assert problems == [f"{table}:2: a field holds a NUL character (not text)"]


def test_audio_outside_the_tables_folder_is_refused_unless_its_folder_is_allowed(tmp_path, audio):
    outside = tmp_path / "outside"
    outside.mkdir()
    write_tone(outside / "x.wav", 0.5)
    (audio / "link.wav").symlink_to(outside / "x.wav")
    table = audio / "t.csv"
    table.write_text(f"path,text\n../outside/x.wav,a\n{outside / 'x.wav'},b\nlink.wav,c\n/etc/passwd,d\na.wav,e\n")
    problems: list[str] = []
    assert [c.id for c in import_table(table, problems)["all"]] == ["a"]
    refused = [f"{outside / 'x.wav'}", f"{outside / 'x.wav'}", f"{audio / 'link.wav'}", "/etc/passwd"]
    assert problems == [
        f"{table}:{line}: audio file {path} is outside the table's folder ({audio}); allow it with --audio-roots"
        for line, path in zip((2, 3, 4, 5), refused, strict=True)
    ]
    table.write_text("path,text\n../outside/x.wav,a\na.wav,e\n")
    assert [c.id for c in import_table(table, audio_roots=[outside])["all"]] == ["x", "a"]


def test_an_audiofolder_table_cannot_reach_out_of_its_folder(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    write_tone(tmp_path / "secret.wav", 0.5)
    (folder / AUDIOFOLDER_METADATA).write_text("file_name,transcription\n../secret.wav,a\n")
    problems: list[str] = []
    assert import_table(folder, problems) == {}
    assert problems == [
        f"{folder / AUDIOFOLDER_METADATA}:2: audio file {tmp_path / 'secret.wav'} is outside the table's folder"
        f" ({folder}); allow it with --audio-roots"
    ]


def test_a_url_a_pipe_a_device_and_a_folder_are_reported_as_what_they_are(tmp_path, audio):
    os.mkfifo(audio / "pipe.wav")
    (audio / "zero.wav").symlink_to("/dev/zero")
    (audio / "folder.wav").mkdir()
    table = audio / "t.csv"
    table.write_text("path,text\nhttps://example.com/a.wav,a\npipe.wav,b\nzero.wav,c\nfolder.wav,d\n")
    problems: list[str] = []
    assert import_table(table, problems, audio_roots=["/dev"]) == {}
    assert problems == [
        f"{table}:2: audio path 'https://example.com/a.wav' is a URL (the importer reads local files only: download"
        " it first)",
        f"{table}:3: {audio / 'pipe.wav'}: audio file is not a regular file (a pipe; save it to a file)",
        f"{table}:4: {audio / 'zero.wav'}: audio file is not a regular file (a device; save it to a file)",
        f"{table}:5: {audio / 'folder.wav'}: is a directory, not an audio file",
    ]


def test_a_link_and_the_file_it_names_are_one_file_listed_twice(tmp_path, audio):
    (audio / "alias.wav").symlink_to(audio / "a.wav")
    table = audio / "t.csv"
    table.write_text("path,text\na.wav,one\nalias.wav,other text\n")
    problems: list[str] = []
    assert [c.id for c in import_table(table, problems)["all"]] == ["a"]
    assert problems == [
        f"{table}:3: alias.wav is listed again, the same file as {audio / 'a.wav'} (first at {table}:2)"
    ]


def test_a_table_that_is_a_pipe_is_one_line_not_a_wait(tmp_path):
    os.mkfifo(tmp_path / "t.csv")
    with pytest.raises(UserError, match=r"t\.csv: table is not a regular file \(a pipe; save it to a file\)$"):
        import_table(tmp_path / "t.csv")


def test_audio_that_does_not_decode_is_reported_with_the_decoders_reason(tmp_path, audio):
    """It was "Fetching info about audio ... failed. Details:" with nothing after it."""
    (audio / "junk.wav").write_bytes(bytes(range(256)) * 12)
    table = audio / "t.csv"
    table.write_text("path,text\njunk.wav,a\n")
    problems: list[str] = []
    import_table(table, problems)
    junk = audio / "junk.wav"
    assert problems == [f"{table}:2: cannot read audio {junk} (Error opening '{junk}': Format not recognised.)"]
