"""Importing Kaldi data directories and NeMo manifests as cut manifests."""

from __future__ import annotations

import argparse
import json
import shutil

import numpy as np
import pytest
import soundfile as sf

from srupp_asr import prepare
from srupp_asr.data import load_cuts
from srupp_asr.errors import UserError
from srupp_asr.prepare import import_kaldi_dir, import_nemo_manifest


def write_tone(path, seconds: float, rate: int = 16000, channels: int = 1):
    """A quiet 440 Hz tone of exactly ``seconds`` (rounded to samples)."""
    t = np.arange(round(seconds * rate)) / rate
    tone = 0.1 * np.sin(2 * np.pi * 440 * t).astype(np.float32)
    sf.write(path, np.stack([tone] * channels, axis=1) if channels > 1 else tone, rate)
    return path


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
        f"segments: u4: audio file not found: {tmp_path / 'gone.wav'}",
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
        f"{m}:3: audio file not found: {tmp_path / 'missing.wav'}",
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
