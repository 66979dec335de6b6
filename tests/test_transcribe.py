"""``srupp-asr transcribe`` end to end on the overfit model: outputs, inputs, bad files, long recordings, the API."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from srupp_asr.audio import SAMPLE_RATE, load_audio
from srupp_asr.cli import main
from srupp_asr.errors import UserError
from srupp_asr.longform import merge_chunk_words, shift_words
from srupp_asr.transcribe import DEFAULT_MODEL_ENV, transcribe

GREEDY = ["--decoding", "ctc_greedy"]  # exact on the overfit utterances and the fastest mode
ERROR_LINE = re.compile(r"^srupp-asr transcribe: error: (.+?): (.+)$")


@pytest.fixture(scope="module")
def model(overfit_model_dir) -> Path:
    return overfit_model_dir[0]


@pytest.fixture(scope="module")
def utts(overfit_model_dir) -> list[tuple[Path, str]]:
    return overfit_model_dir[1]


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["transcribe", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_one_file_prints_its_text_and_a_summary(capsys, model, utts):
    wav, text = utts[0]
    code, out, err = _run(capsys, "--model", str(model), *GREEDY, str(wav))
    assert code == 0
    assert out == f"{text}\n"
    assert re.fullmatch(
        r"transcribed 1 file: 0:0\d\.\d of audio in \d+\.\d s: decoding \d+\.\d s, real-time factor \d+\.\d{4}; "
        r"model load and setup \d+\.\d s\n",
        err,
    )


def test_several_files_print_in_input_order_whatever_the_batching(capsys, model, utts):
    chosen = list(reversed(utts[:7]))  # lengths differ, so batches sorted by length reorder them internally
    code, out, _ = _run(capsys, "--model", str(model), *GREEDY, "--batch-size", "3", "-q", *(str(w) for w, _ in chosen))
    assert code == 0
    assert out.splitlines() == [f"{w}\t{t}" for w, t in chosen]


def test_progress_bar_counts_audio_seconds_on_stderr(capsys, model, utts):
    transcribe([w for w, _ in utts[:2]], model, decoding="ctc_greedy", progress=True)
    err = capsys.readouterr().err
    total = sum(sf.info(w).frames for w, _ in utts[:2]) / SAMPLE_RATE
    assert "transcribing: 100%" in err and f"{total:.1f}/{total:.1f} s of audio" in err


def test_batched_and_one_by_one_decoding_agree(model, utts):
    files = [w for w, _ in utts[:6]]
    batched = transcribe(files, model, decoding="ctc_greedy", batch_size=6)
    single = transcribe(files, model, decoding="ctc_greedy", batch_size=1)
    assert [t.text for t in batched] == [t.text for t in single] == [t for _, t in utts[:6]]
    for a, b in zip(batched, single, strict=True):
        words_a = [(w.text, w.start, w.end) for s in a.segments for w in s.words]
        words_b = [(w.text, w.start, w.end) for s in b.segments for w in s.words]
        assert words_a == words_b


def test_default_mode_recognises_the_utterances(model, utts):
    files = [w for w, _ in utts[:3]]
    assert [t.text for t in transcribe(files, model)] == [t for _, t in utts[:3]]


def test_every_format_is_written_to_the_output_dir(capsys, model, utts, tmp_path):
    (wav, text), (wav2, _) = utts[1], utts[2]
    out_dir = tmp_path / "out"
    code, out, _ = _run(capsys, "--model", str(model), *GREEDY, "-f", "all", "-o", str(out_dir), str(wav), str(wav2))
    assert code == 0 and out == ""
    assert sorted(os.listdir(out_dir)) == sorted(f"{p.stem}.{f}" for p in (wav, wav2) for f in FORMATS_ALL)
    assert (out_dir / f"{wav.stem}.txt").read_text() == f"{text}\n"
    data = json.loads((out_dir / f"{wav.stem}.json").read_text())
    words = [w for s in data["segments"] for w in s["words"]]
    assert [w["word"] for w in words] == text.split()
    duration = sf.info(wav).duration
    assert data["duration"] == pytest.approx(duration, abs=1e-3)
    assert all(0 <= w["start"] <= w["end"] <= duration + 1e-3 and 0 <= w["confidence"] <= 1 for w in words)
    assert all(a["end"] <= b["start"] for a, b in itertools.pairwise(words))
    assert data["model"] == str(model) and data["decoding"]["mode"] == "ctc_greedy"
    assert data["processing_seconds"] > 0
    srt = (out_dir / f"{wav.stem}.srt").read_text()
    assert re.fullmatch(rf"1\n00:00:\d\d,\d{{3}} --> 00:00:\d\d,\d{{3}}\n{text}\n", srt)
    vtt = (out_dir / f"{wav.stem}.vtt").read_text()
    assert re.fullmatch(rf"WEBVTT\n\n00:00:\d\d\.\d{{3}} --> 00:00:\d\d\.\d{{3}}\n{text}\n\n", vtt)
    tsv = (out_dir / f"{wav.stem}.tsv").read_text().splitlines()
    assert tsv[0] == "start\tend\ttext"
    start_ms, end_ms, tsv_text = tsv[1].split("\t")
    assert tsv_text == text
    assert (int(start_ms), int(end_ms)) == (round(words[0]["start"] * 1000), round(words[-1]["end"] * 1000))


FORMATS_ALL = ("txt", "json", "srt", "vtt", "tsv")


def test_same_stems_get_distinct_output_names(capsys, model, utts, tmp_path):
    wav, text = utts[3]
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        shutil.copy(wav, tmp_path / sub / "talk.wav")
    out_dir = tmp_path / "out"
    code, _, _ = _run(
        capsys, "--model", str(model), *GREEDY, "-o", str(out_dir), str(tmp_path / "a"), str(tmp_path / "b")
    )
    assert code == 0
    assert sorted(os.listdir(out_dir)) == ["talk-2.txt", "talk.txt"]
    assert (out_dir / "talk-2.txt").read_text() == f"{text}\n"


def test_json_to_stdout_for_several_files_is_json_lines(capsys, model, utts):
    files = [str(w) for w, _ in utts[:2]]
    code, out, _ = _run(capsys, "--model", str(model), *GREEDY, "-q", "-f", "json", *files)
    assert code == 0
    assert [json.loads(line)["text"] for line in out.splitlines()] == [t for _, t in utts[:2]]


def test_directories_and_list_files_expand_in_a_fixed_order(capsys, model, utts, tmp_path):
    tree = tmp_path / "tree"
    (tree / "b" / "deeper").mkdir(parents=True)
    (tree / ".hidden").mkdir()
    shutil.copy(utts[0][0], tree / "z.wav")
    shutil.copy(utts[1][0], tree / "b" / "deeper" / "y.wav")
    shutil.copy(utts[2][0], tree / "b" / "x.wav")
    shutil.copy(utts[3][0], tree / ".hidden" / "w.wav")  # hidden: skipped
    (tree / "b" / "notes.txt").write_text("not audio\n")  # not an audio name: skipped
    listed = tmp_path / "list.txt"
    listed.write_text(f"# a comment\n\n{utts[4][0]}\n{tree / 'z.wav'}\n")
    code, out, _ = _run(capsys, "--model", str(model), *GREEDY, "-q", str(tree), f"@{listed}", "--list", str(listed))
    assert code == 0
    expected = [
        (tree / "b" / "deeper" / "y.wav", utts[1][1]),
        (tree / "b" / "x.wav", utts[2][1]),
        (tree / "z.wav", utts[0][1]),
        (utts[4][0], utts[4][1]),  # z.wav again from the list: transcribed once
    ]
    assert out.splitlines() == [f"{p}\t{t}" for p, t in expected]


def _resampled(wav: Path, rate: int) -> np.ndarray:
    import torchaudio.functional as AF

    return AF.resample(load_audio(wav), SAMPLE_RATE, rate).numpy()


@pytest.mark.parametrize(("fmt", "rate", "channels"), [("FLAC", 44100, 2), ("WAV", 22050, 1), ("WAV", 48000, 3)])
def test_other_rates_and_channel_counts_give_the_same_text(model, utts, tmp_path, fmt, rate, channels):
    wav, text = utts[5]
    path = tmp_path / f"utt.{fmt.lower()}"
    sf.write(
        path,
        np.stack([_resampled(wav, rate)] * channels, axis=1),
        rate,
        format=fmt,
        subtype="FLOAT" if fmt == "WAV" else None,
    )
    (result,) = transcribe(path, model, decoding="ctc_greedy")
    assert result.text == text


@pytest.mark.parametrize("fmt", ["OGG", "MP3"])
def test_lossy_formats_are_transcribed(model, utts, tmp_path, fmt):
    # The overfit model is too fragile for codec noise to promise the exact text; the file must still decode whole.
    wav, text = utts[5]
    path = tmp_path / f"utt.{fmt.lower()}"
    sf.write(path, _resampled(wav, 44100), 44100, format=fmt)
    (result,) = transcribe(path, model, decoding="ctc_greedy")
    assert result.duration == pytest.approx(sf.info(wav).duration, abs=0.1)
    assert len(result.text.split()) >= len(text.split()) - 1


def _bad_files(tmp_path: Path, good: Path) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    (tmp_path / "empty.wav").write_bytes(b"")
    (tmp_path / "noise.wav").write_bytes(rng.integers(0, 256, 4000, dtype=np.uint8).tobytes())
    (tmp_path / "notes.txt").write_text("these are not the samples you are looking for\n" * 20)
    sf.write(tmp_path / "full.flac", load_audio(good).numpy(), SAMPLE_RATE)
    data = (tmp_path / "full.flac").read_bytes()
    (tmp_path / "cut.flac").write_bytes(data[: len(data) // 2])
    return {
        "empty": tmp_path / "empty.wav",
        "random bytes": tmp_path / "noise.wav",
        "text": tmp_path / "notes.txt",
        "truncated": tmp_path / "cut.flac",
        "missing": tmp_path / "missing.wav",
    }


def test_bad_files_get_one_line_each_and_the_others_are_transcribed(capsys, model, utts, tmp_path):
    (good, text), (good2, text2) = utts[6], utts[7]
    bad = _bad_files(tmp_path, good)
    argv = [str(good), *(str(p) for p in bad.values()), str(good2)]
    code, out, err = _run(capsys, "--model", str(model), *GREEDY, "--batch-size", "8", *argv)
    assert code == 1  # some inputs failed: 1 however many (2 is a usage error); the closing line counts them
    assert out.splitlines() == [f"{good}\t{text}", f"{good2}\t{text2}"]
    lines = err.splitlines()
    errors = [ERROR_LINE.match(line) for line in lines[:-1]]
    assert all(errors), lines
    assert sorted(m.group(1) for m in errors) == sorted(str(p) for p in bad.values())
    reasons = {m.group(1): m.group(2) for m in errors}
    assert "empty" in reasons[str(bad["empty"])]
    assert "not a readable audio file" in reasons[str(bad["random bytes"])]
    assert "not a readable audio file" in reasons[str(bad["text"])]
    assert "not a readable audio file" in reasons[str(bad["truncated"])]
    assert reasons[str(bad["missing"])] == "no such file"
    assert lines[-1].startswith(f"transcribed 2 files ({len(bad)} failed): ")


def test_exit_status_is_1_however_many_inputs_fail(capsys, model, tmp_path):
    for i in range(3):
        (tmp_path / f"e{i:03d}.wav").write_bytes(b"")
    code, _, err = _run(capsys, "--model", str(model), "-q", str(tmp_path))
    assert code == 1
    assert len(err.splitlines()) == 3
    code, _, err = _run(capsys, "--model", str(model), str(tmp_path / "e000.wav"))
    assert code == 1 and err.splitlines()[-1].startswith("transcribed 0 files (1 failed): ")


def test_an_empty_directory_is_a_failure(capsys, model, tmp_path, utts):
    (tmp_path / "nothing").mkdir()
    code, out, err = _run(capsys, "--model", str(model), *GREEDY, "-q", str(tmp_path / "nothing"), str(utts[0][0]))
    assert code == 1 and out == f"{utts[0][1]}\n"
    assert "no audio files" in err


def test_python_api_raises_without_an_error_handler(model, tmp_path):
    (tmp_path / "empty.wav").write_bytes(b"")
    with pytest.raises(UserError, match=r"empty\.wav: not a readable audio file"):
        transcribe(tmp_path / "empty.wav", model, decoding="ctc_greedy")


def test_python_api_reports_through_on_error_and_hands_transcripts_over_in_order(model, utts, tmp_path):
    (tmp_path / "empty.wav").write_bytes(b"")
    errors, seen = [], []
    files = [utts[2][0], tmp_path / "empty.wav", utts[0][0], utts[1][0]]
    result = transcribe(
        files, model, decoding="ctc_greedy", batch_size=2, on_error=errors.append, on_transcript=seen.append
    )
    assert [t.path for t in result] == [str(utts[i][0]) for i in (2, 0, 1)]
    assert seen == result
    assert errors == [f"{tmp_path / 'empty.wav'}: not a readable audio file (the file is empty)"]


def test_default_model_comes_from_the_environment(capsys, model, utts, monkeypatch):
    monkeypatch.setenv(DEFAULT_MODEL_ENV, str(model))
    code, out, _ = _run(capsys, *GREEDY, "-q", str(utts[0][0]))
    assert (code, out) == (0, f"{utts[0][1]}\n")


def test_a_model_that_lacks_what_the_mode_needs_is_a_usage_error(capsys, model, utts, tmp_path):
    import yaml
    from safetensors.torch import load_file, save_file

    ctc_only = tmp_path / "ctc_only"
    shutil.copytree(model, ctc_only)
    config = yaml.safe_load((ctc_only / "config.yaml").read_text())
    config["model"]["ctc_weight"] = 1.0  # no attention decoder
    (ctc_only / "config.yaml").write_text(yaml.safe_dump(config))
    weights = {k: v for k, v in load_file(ctc_only / "model.safetensors").items() if not k.startswith("decoder.")}
    save_file(weights, ctc_only / "model.safetensors")
    code, out, err = _run(capsys, "--model", str(ctc_only), "--decoding", "joint", str(utts[0][0]))
    assert code == 2 and out == ""
    assert err.startswith(f"srupp-asr transcribe: error: {ctc_only}: ") and "decoder" in err


# ------------------------------------------------------------------------------------------ long recordings


def _long_recording(tmp_path: Path, utts, count: int, pause: float) -> tuple[Path, list[tuple[float, float]]]:
    """FLAC of ``count`` utterances, each with ``pause / 2`` s of silence before and after; their speech spans."""
    half = np.zeros(int(pause / 2 * SAMPLE_RATE), np.float32)
    parts, spans, pos = [], [], 0
    for wav, _ in utts[:count]:
        audio = load_audio(wav).numpy()
        parts += [half, audio, half]
        spans.append(((pos + len(half)) / SAMPLE_RATE, (pos + len(half) + len(audio)) / SAMPLE_RATE))
        pos += 2 * len(half) + len(audio)
    path = tmp_path / "long.flac"
    sf.write(path, np.concatenate(parts), SAMPLE_RATE)
    return path, spans


def _pieces_decoded_alone(model, path: Path, chunks, tmp_path: Path) -> list[list]:
    """Each chunk of ``path`` cut out, written as its own file and transcribed alone; words in absolute times."""
    audio = load_audio(path).numpy()
    words = []
    for i, (start, end) in enumerate(chunks):
        piece = tmp_path / f"piece{i}.wav"
        sf.write(piece, audio[round(start * SAMPLE_RATE) : round(end * SAMPLE_RATE)], SAMPLE_RATE, subtype="FLOAT")
        (t,) = transcribe(piece, model, decoding="ctc_greedy", batch_size=1)
        words.append(shift_words([w for s in t.segments for w in s.words], start))
    return words


def _timed(words) -> list[tuple[str, float, float]]:
    return [(w.text, round(w.start, 6), round(w.end, 6)) for w in words]


def test_vad_chunks_of_a_long_recording_equal_its_segments_decoded_alone(model, utts, tmp_path):
    path, spans = _long_recording(tmp_path, utts, count=6, pause=0.8)
    # Every utterance with its pauses is 2.0-2.4 s, two are over 4 s: a 3 s budget must cut at every pause.
    (t,) = transcribe(path, model, decoding="ctc_greedy", vad=True, max_chunk_seconds=3.0)
    assert len(t.chunks) == 6
    assert t.chunks[0][0] == 0 and t.chunks[-1][1] == pytest.approx(t.duration)
    for (_, end), (start, _), (_, speech_end), (speech_start, _) in zip(
        t.chunks, t.chunks[1:], spans, spans[1:], strict=False
    ):
        assert end == start  # cut, not overlapped
        assert speech_end < end < speech_start  # in the pause between two utterances
    expected = [w for piece in _pieces_decoded_alone(model, path, t.chunks, tmp_path) for w in piece]
    assert _timed(w for s in t.segments for w in s.words) == _timed(expected)
    assert t.text == " ".join(w.text for w in expected)


def test_overlapping_chunks_are_joined_at_word_boundaries(model, utts, tmp_path):
    path, _ = _long_recording(tmp_path, utts, count=4, pause=0.8)
    (t,) = transcribe(path, model, decoding="ctc_greedy", max_chunk_seconds=4.0, chunk_overlap=1.0)
    assert len(t.chunks) >= 3
    assert all(b - a <= 4.0 + 1e-9 for a, b in t.chunks)
    assert all(
        prev[1] - nxt[0] == pytest.approx(1.0, abs=1e-3) for prev, nxt in zip(t.chunks, t.chunks[1:], strict=False)
    )
    words = [w for s in t.segments for w in s.words]
    assert words, "no words"
    assert all(a.start <= b.start for a, b in itertools.pairwise(words))
    expected = merge_chunk_words(t.chunks, _pieces_decoded_alone(model, path, t.chunks, tmp_path))
    assert _timed(words) == _timed(expected)


def test_a_long_recording_is_written_with_absolute_times(capsys, model, utts, tmp_path):
    path, spans = _long_recording(tmp_path, utts, count=4, pause=1.0)
    out_dir = tmp_path / "out"
    code, _, _ = _run(
        capsys,
        "--model",
        str(model),
        *GREEDY,
        "--vad",
        "--max-chunk-seconds",
        "3",
        "-f",
        "json,srt",
        "-o",
        str(out_dir),
        str(path),
    )
    assert code == 0
    data = json.loads((out_dir / "long.json").read_text())
    assert len(data["chunks"]) == 4
    starts = [s["start"] for s in data["segments"]]
    # A 1 s pause between utterances ends a segment: one per utterance, each inside its utterance's span.
    assert len(starts) == 4
    for segment, (speech_start, speech_end) in zip(data["segments"], spans, strict=True):
        assert speech_start - 0.1 <= segment["start"] <= segment["end"] <= speech_end + 0.1
    assert (out_dir / "long.srt").read_text().count(" --> ") == 4


@pytest.mark.parametrize(
    ("texts", "seconds", "warned"), [(["", " "], 6.0, True), (["", "a word"], 6.0, False), (["", ""], 4.0, False)]
)
def test_a_model_that_hears_no_words_anywhere_warns(tmp_path, monkeypatch, capsys, texts, seconds, warned):
    """Empty text for every input (5 s of audio or more) is one warning line, exit status still 0."""
    import importlib

    import soundfile as sf

    from srupp_asr.cli import main as cli_main
    from srupp_asr.writers import Transcript

    paths = []
    for i in range(len(texts)):
        paths.append(tmp_path / f"{i}.wav")
        sf.write(paths[-1], np.zeros(1600, dtype=np.float32), 16000)

    def fake(inputs, *args, **kwargs):
        return [
            Transcript(path=str(p), duration=seconds / len(texts), text=t, segments=[])
            for p, t in zip(paths, texts, strict=True)
        ]

    monkeypatch.setattr(importlib.import_module("srupp_asr.transcribe"), "transcribe", fake)
    assert cli_main(["transcribe", "--output_dir", str(tmp_path / "out"), *map(str, paths)]) == 0
    err = capsys.readouterr().err
    assert ("warning: the model emitted no words for any of the 2 file(s)" in err) == warned
