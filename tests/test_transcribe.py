"""``srupp-asr transcribe`` end to end on the overfit model: outputs, inputs, bad files, long recordings, the API;
without a model: usage errors, the summary line, import weight. The last sections check what it writes against
independent references, as a demanding user would: subtitles read back with independent parsers (``srt``,
``webvtt-py``), strict JSON, Whisper's TSV layout, and long recordings made of known utterances at known offsets
decoded in chunks and with the VAD (the built-in model on espeak-ng speech), including recordings at a chunk
boundary, shorter than one frame and silent."""

from __future__ import annotations

import html
import io
import itertools
import json
import math
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from srupp_asr.audio import SAMPLE_RATE, load_audio
from srupp_asr.cli import main
from srupp_asr.errors import UserError
from srupp_asr.inputs import DEFAULT_MODEL_ENV
from srupp_asr.longform import merge_chunk_words, shift_words
from srupp_asr.transcribe import summary_line, transcribe
from srupp_asr.writers import (
    FORMATS,
    Segment,
    Transcript,
    segment_words,
    to_json,
    to_srt,
    to_tsv,
    to_txt,
    to_vtt,
    transcript_text,
    write_transcript,
)
from tests.helpers import W

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


def test_two_batches_decode_at_once_on_the_cpus_threads_with_the_same_transcripts(model, utts, monkeypatch):
    """With 2 torch threads ``transcribe`` decodes two batches at once, each on a thread of its own with one torch
    thread (:mod:`srupp_asr.decoding.batch`); with 1 thread, one batch at a time in the caller's thread."""
    import threading

    import torch

    from srupp_asr.decoding.batch import BatchDecoder

    seen: list[tuple[str, int]] = []
    decode_batch = BatchDecoder.decode_batch

    def spy(self, recordings):
        seen.append((threading.current_thread().name, torch.get_num_threads()))
        return decode_batch(self, recordings)

    monkeypatch.setattr(BatchDecoder, "decode_batch", spy)
    files = [w for w, _ in utts[:4]]
    threads = torch.get_num_threads()
    try:
        two = transcribe(files, model, decoding="ctc_greedy", batch_size=1, threads=2, device="cpu")
        assert len(seen) == 4 and {name for name, _ in seen} <= {"srupp-asr decode 0", "srupp-asr decode 1"}
        assert {n for _, n in seen} == {1} and torch.get_num_threads() == 2
        seen.clear()
        one = transcribe(files, model, decoding="ctc_greedy", batch_size=1, threads=1, device="cpu")
        assert seen == [("MainThread", 1)] * 4
    finally:
        torch.set_num_threads(threads)
    assert [t.text for t in two] == [t.text for t in one] == [t for _, t in utts[:4]]


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
    import torch
    import torchaudio.functional as AF

    return AF.resample(torch.from_numpy(load_audio(wav)), SAMPLE_RATE, rate).numpy()


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
    sf.write(tmp_path / "full.flac", load_audio(good), SAMPLE_RATE)
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
        audio = load_audio(wav)
        parts += [half, audio, half]
        spans.append(((pos + len(half)) / SAMPLE_RATE, (pos + len(half) + len(audio)) / SAMPLE_RATE))
        pos += 2 * len(half) + len(audio)
    path = tmp_path / "long.flac"
    sf.write(path, np.concatenate(parts), SAMPLE_RATE)
    return path, spans


def _pieces_decoded_alone(model, path: Path, chunks, tmp_path: Path) -> list[list]:
    """Each chunk of ``path`` cut out, written as its own file and transcribed alone; words in absolute times."""
    audio = load_audio(path)
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
    assert all(prev[1] - nxt[0] >= 1.0 - 1e-3 for prev, nxt in itertools.pairwise(t.chunks))  # at least the overlap
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


# ------------------------------------------------------------ without a model: usage errors, the summary, import weight


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "no audio given"),
        (["a.wav", "-f", "doc"], "unknown output format doc"),
        (["a.wav", "-f", "txt,srt"], "several output formats need --output-dir"),
        (["a.wav", "b.wav", "-f", "srt"], "srt for several files needs --output-dir"),
        (["a.wav", "--batch-size", "0"], "--batch-size must be at least 1"),
        (["a.wav", "--max-chunk-seconds", "10", "--chunk-overlap", "6"], "--chunk-overlap must be in"),
        (["a.wav", "--max-chunk-seconds", "inf"], "--max-chunk-seconds must be a number of seconds in [1, 1e+09]"),
        (["a.wav", "--max-chunk-seconds", "1e308"], "--max-chunk-seconds must be a number of seconds in [1, 1e+09]"),
        (["a.wav", "--max-chunk-seconds", "nan"], "--max-chunk-seconds must be a number of seconds in [1, 1e+09]"),
        (["a.wav", "--max-chunk-seconds", "0.001"], "--max-chunk-seconds must be a number of seconds in [1, 1e+09]"),
        (["a.wav", "--max-chunk-seconds", "0.5"], "got 0.5"),
        (["a.wav", "--segment-pause", "nan"], "--segment-pause must be a finite number of seconds >= 0, got nan"),
        (["a.wav", "--segment-pause", "inf"], "--segment-pause must be a finite number of seconds >= 0, got inf"),
        (["a.wav", "--segment-pause", "-1"], "--segment-pause must be a finite number of seconds >= 0, got -1"),
        (["a.wav", "--beam", "0"], "beam must be an integer in [1, 128] (memory grows with it), got 0"),
        (["a.wav", "--beam", "100000"], "beam must be an integer in [1, 128] (memory grows with it), got 100000"),
        (["a.wav", "--beam", "1000000000"], "beam must be an integer in [1, 128]"),
        (["a.wav", "--lm-weight", "1e300"], "lm_weight must be a number in [0, 1000], got 1e+300"),
        (["a.wav", "--lm-weight", "3.4e38"], "lm_weight must be a number in [0, 1000], got 3.4e+38"),
        (["a.wav", "--lm-weight", "nan"], "lm_weight must be a number in [0, 1000], got nan"),
        (["a.wav", "--length-penalty", "1e300"], "length_penalty must be a number in [-1000, 1000], got 1e+300"),
        (["a.wav", "--model", "nowhere"], "nowhere: model directory not found"),
        (["a.wav", "--model", "nowhere", "--device", "tpu"], "unknown device"),
    ],
)
def test_usage_errors_exit_2_with_one_line(capsys, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.wav").write_bytes(b"x")
    (tmp_path / "b.wav").write_bytes(b"x")
    assert main(["transcribe", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("srupp-asr transcribe: error: ") and err.count("\n") == 1
    assert message in err


def test_summary_line_gives_files_audio_wall_time_and_real_time_factor():
    assert summary_line(1, 0, 12.34, 2.0) == "transcribed 1 file: 0:12.3 of audio in 2.0 s, real-time factor 0.1621"
    assert summary_line(3, 2, 3723.4, 60.0) == (
        "transcribed 3 files (2 failed): 1:02:03.4 of audio in 60.0 s, real-time factor 0.0161"
    )
    assert summary_line(0, 1, 0.0, 0.5).endswith("real-time factor -")
    # With the decoding time: the real-time factor leaves the model load out, which is given apart.
    assert summary_line(2, 0, 100.0, 14.0, 4.0) == (
        "transcribed 2 files: 1:40.0 of audio in 14.0 s: decoding 4.0 s, real-time factor 0.0400; "
        "model load and setup 10.0 s"
    )


def test_importing_transcribe_leaves_torch_and_numpy_unloaded():
    # `srupp_asr` can export transcribe() and `srupp-asr transcribe --help` starts fast.
    code = "import sys, srupp_asr.transcribe; print('torch' in sys.modules or 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------- against independent references: reading back


def _seconds(stamp: str) -> float:
    hours, minutes, seconds = stamp.replace(",", ".").split(":")
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def read_srt(text: str) -> list[tuple[float, float, str]]:
    """Cues of SubRip ``text`` by the ``srt`` package (strict), checked numbered 1..n in order."""
    srt = pytest.importorskip("srt", reason="the dev extra srt (an independent SubRip parser) is not installed")
    subs = list(srt.parse(text, ignore_errors=False))
    assert [s.index for s in subs] == list(range(1, len(subs) + 1))
    for line in text.splitlines():
        if " --> " in line:
            assert re.fullmatch(r"\d{2,}:\d\d:\d\d,\d{3} --> \d{2,}:\d\d:\d\d,\d{3}", line), line
    return [(s.start.total_seconds(), s.end.total_seconds(), s.content) for s in subs]


def read_vtt(text: str) -> list[tuple[float, float, str]]:
    """Cues of WebVTT ``text`` by ``webvtt-py``, their text unescaped."""
    assert text.startswith("WEBVTT\n")
    for line in text.splitlines():
        if " --> " in line:
            assert re.fullmatch(r"\d{2,}:\d\d:\d\d\.\d{3} --> \d{2,}:\d\d:\d\d\.\d{3}", line), line
    webvtt = pytest.importorskip(
        "webvtt", reason="the dev extra webvtt-py (an independent WebVTT parser) is not installed"
    )
    captions = webvtt.from_buffer(io.StringIO(text)).captions
    return [(_seconds(c.start), _seconds(c.end), html.unescape(c.text)) for c in captions]


def read_tsv(text: str) -> list[tuple[int, int, str]]:
    lines = text.split("\n")
    assert lines[0] == "start\tend\ttext" and lines[-1] == ""
    rows = [line.split("\t") for line in lines[1:-1]]
    assert all(len(row) == 3 for row in rows), rows
    return [(int(a), int(b), t) for a, b, t in rows]


def strict_json(text: str) -> dict:
    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def check_cues(cues: list[tuple[float, float, str]]) -> None:
    """Subtitle cues a player shows as meant: each on screen for a while, in order, one at a time."""
    for start, end, _ in cues:
        assert 0 <= start < end, cues
    for (_, end, _), (start, _, _) in itertools.pairwise(cues):
        assert end <= start, cues


def check_all_formats(t: Transcript) -> None:
    """Every format of ``t`` reads back with the same segments: the parsers agree with each other and the JSON."""
    data = strict_json(to_json(t))
    segments = [s for s in data["segments"] if s["text"].strip()]
    texts = [" ".join(s["text"].split()) for s in segments]
    for cues, arrow in ((read_srt(to_srt(t)), "->"), (read_vtt(to_vtt(t)), "-->")):
        check_cues(cues)
        assert [c[2] for c in cues] == [text.replace("-->", arrow) for text in texts]  # SubRip has no escapes
        assert "\n" not in "".join(c[2] for c in cues)
    rows = read_tsv(to_tsv(t))
    assert [r[2] for r in rows] == texts
    assert to_txt(t).splitlines() == [r[2] for r in rows]
    words = [w for s in data["segments"] for w in s["words"]]
    for w in words:
        assert 0 <= w["start"] <= w["end"] <= data["duration"] and 0 <= w["confidence"] <= 1
    for a, b in itertools.pairwise(words):
        assert a["end"] <= b["start"], (a, b)


def _transcript(words, duration=10.0, max_words=12) -> Transcript:
    segments = segment_words(words, max_words=max_words, pause=0.8)
    return Transcript("talk.wav", duration, transcript_text(segments), segments, chunks=[(0.0, duration)])


# ------------------------------------------------------------------------------------------ the formats


ODD_TEXTS = {
    "newline": "first\nsecond",
    "blank line": "first\n\nsecond",
    "carriage return": "first\rsecond",
    "crlf": "first\r\n\r\nsecond",
    "unicode line separator": "first\u2028second",
    "next line": "first\x85second",
    "tab": "first\tsecond",
    "arrow": "a --> b",
    "markup": "<b>bold</b> & <i>",
    "entity": "&amp; &lt;",
    "non-ascii": "naïve café 日本語 🎤",
    "only digits": "1234",
}


@pytest.mark.parametrize("text", ODD_TEXTS.values(), ids=ODD_TEXTS.keys())
def test_any_text_reads_back_as_one_cue_per_segment_with_independent_parsers(text):
    """A word holding a line break (a byte-fallback piece can be one, and the API takes any word) must not end
    the cue, add a line to the txt or a row to the tsv: every format has one line of text per segment."""
    t = _transcript([W("before", 0.5, 1.0), W(text, 1.1, 1.9), W("after", 4.0, 4.5)])
    check_all_formats(t)
    expected = ["before " + " ".join(text.split()), "after"]
    assert [c[2] for c in read_srt(to_srt(t))] == [e.replace("-->", "->") for e in expected]
    assert [c[2] for c in read_vtt(to_vtt(t))] == expected
    assert strict_json(to_json(t))["segments"][0]["words"][1]["word"] == text  # the JSON keeps the exact text


def test_times_over_an_hour_and_over_a_hundred_hours_read_back():
    words = [W("one", 3723.004, 3724.5), W("two", 100 * 3600 + 1.5, 100 * 3600 + 2.25)]
    t = _transcript(words, duration=100 * 3600 + 3)
    check_all_formats(t)
    expected = [(3723.004, 3724.5), (360001.5, 360002.25)]
    for cues in (read_srt(to_srt(t)), read_vtt(to_vtt(t))):
        assert [pytest.approx(c[:2], abs=1e-6) for c in cues] == expected
    assert [(a, b) for a, b, _ in read_tsv(to_tsv(t))] == [(3723004, 3724500), (360001500, 360002250)]


def test_cues_are_never_empty_inverted_or_overlapping():
    """Segments that a player could not show (zero length once rounded to milliseconds, ending before they start,
    starting before the previous one ends) still give cues in order, each at least a millisecond long."""
    segments = [
        Segment(1.0, 1.0, "zero"),
        Segment(2.0004, 2.0001, "rounds to zero"),
        Segment(3.0, 2.5, "inverted"),
        Segment(4.0, 6.0, "long"),
        Segment(5.0, 7.0, "overlaps the previous"),
        Segment(5.5, 5.8, "inside the previous"),
    ]
    t = Transcript("talk.wav", 10.0, transcript_text(segments), segments)
    for cues in (read_srt(to_srt(t)), read_vtt(to_vtt(t))):
        check_cues(cues)
        assert [c[2] for c in cues] == [s.text for s in segments]
        assert cues[0][:2] == (1.0, 1.001) and cues[3][0] == 4.0


def test_an_empty_transcript_gives_files_the_parsers_accept():
    t = Transcript("silence.wav", 30.0, "", [], chunks=[(0.0, 30.0)])
    assert read_srt(to_srt(t)) == [] and read_vtt(to_vtt(t)) == [] and read_tsv(to_tsv(t)) == []
    assert to_txt(t) == ""
    data = strict_json(to_json(t))
    assert data["segments"] == [] and data["text"] == "" and data["duration"] == 30.0


@pytest.mark.parametrize("confidence", [math.nan, math.inf, -math.inf, 1.5, -0.25])
def test_json_is_strict_whatever_the_confidence(confidence):
    """``json.dumps`` writes NaN and Infinity by default, which no strict JSON reader takes: a confidence the model
    could not give (NaN from a broken model, or out of range) is written as a number in [0, 1]."""
    t = _transcript([W("odd", 0.5, 1.0, confidence), W("fine", 1.1, 1.5, 0.75)])
    data = strict_json(to_json(t))
    first, second = data["segments"][0]["words"]
    assert 0 <= first["confidence"] <= 1 and second["confidence"] == 0.75
    assert strict_json(to_json(t, indent=None)) == data
    check_all_formats(t)


def test_a_nan_left_in_the_data_is_an_error_not_a_file_json_readers_refuse():
    t = Transcript("talk.wav", 1.0, "", [], processing_seconds=math.nan)
    with pytest.raises(ValueError, match="JSON"):
        to_json(t)


def test_json_lines_stay_one_line_whatever_the_file_name_or_text_holds():
    """JSON writes NEL and the Unicode line and paragraph separators as they are, and ``str.splitlines`` breaks
    lines at them: a JSON line (several files to stdout) must stay one line."""
    name = "odd\x85name\u2028.wav"
    t = Transcript(name, 1.0, "a\u2029b", [Segment(0.0, 1.0, "a\u2029b")])
    line = to_json(t, indent=None)
    assert len(line.splitlines()) == 1
    data = strict_json(line)
    assert data["audio"] == name and data["text"] == "a\u2029b"


def test_tsv_is_whisper_layout_whatever_the_text():
    t = _transcript([W("tab\there", 0.0004, 0.5), W("new\nline", 0.6, 0.9996), W("x", 5.0, 5.5)])
    assert to_tsv(t) == "start\tend\ttext\n0\t1000\ttab here new line\n5000\t5500\tx\n"


# ------------------------------------------------------------------------------------------ joining chunks


def test_merged_chunk_words_are_in_time_order_and_do_not_overlap():
    """Two neighbours that hear different words where they overlap (a weak model at a chunk edge) must still give
    words in time order: they are the cues and JSON word times."""
    # Chunks [0, 12) and [8, 20), midpoint 10: "left" is kept from the first, "right" from the second, but their
    # spans cross (the copies are not one word: too little shared).
    first = [W("a", 1.0, 2.0), W("left", 9.2, 9.9)]
    second = [W("right", 9.7, 10.9), W("b", 15.0, 16.0)]
    merged = merge_chunk_words([(0.0, 12.0), (8.0, 20.0)], [first, second])
    assert [w.text for w in merged] == ["a", "left", "right", "b"]
    for a, b in itertools.pairwise(merged):
        assert a.start < a.end <= b.start < b.end, merged
    check_all_formats(_transcript(merged, duration=20.0, max_words=1))


def test_words_placed_in_the_leading_silence_of_a_piece_move_to_where_the_sound_starts():
    """A CTC model trained on utterances that start at once puts the first word of a piece at its first frame,
    however much silence comes first (the built-in model does): that word is moved to the speech onset."""
    from srupp_asr.longform import leading_silence, place_after_leading_silence

    rng = np.random.default_rng(0)
    wav = np.concatenate([np.zeros(SAMPLE_RATE), 0.3 * rng.standard_normal(SAMPLE_RATE // 2)]).astype(np.float32)
    assert leading_silence(wav, SAMPLE_RATE) == pytest.approx(1.0, abs=0.011)
    words = [W("we", 0.0, 0.04), W("need", 1.16, 1.36)]
    moved = place_after_leading_silence(words, leading_silence(wav, SAMPLE_RATE))
    assert [(w.text, w.start, w.end) for w in moved] == [
        ("we", pytest.approx(1.0, abs=0.011), pytest.approx(1.04, abs=0.011)),
        ("need", 1.16, 1.36),
    ]
    assert words[0].start == 0.0  # copies: the decoder's words stay as they were
    # Speech from the start, or a pause shorter than the VAD's: nothing moves.
    assert leading_silence(wav[SAMPLE_RATE - 3200 :], SAMPLE_RATE) == 0.0
    assert leading_silence(wav[SAMPLE_RATE:], SAMPLE_RATE) == 0.0
    assert leading_silence(np.zeros(SAMPLE_RATE, np.float32), SAMPLE_RATE) == 0.0  # all silence: no onset
    assert place_after_leading_silence(words, 0.0) == words
    # The model spreads a word from the first frame to where it really ends: it starts at the onset instead.
    (word,) = place_after_leading_silence([W("please", 0.0, 1.365)], 1.0)
    assert (word.start, word.end) == (1.0, pytest.approx(1.365))
    # Two words in the silence, the second running on past the onset: laid out in order, ending where it ended.
    first, second, third = place_after_leading_silence([W("a", 0.0, 0.04), W("b", 0.04, 1.2), W("c", 1.3, 1.5)], 1.0)
    assert first.start == 1.0 and first.start < first.end <= second.start < second.end == pytest.approx(1.2)
    assert (third.start, third.end) == (1.3, 1.5)


# ------------------------------------------------------------------------------------------ end to end

# Sentences for the built-in model (tests/test_default_model.py: it recognises espeak-ng speech outside its
# training text with a few errors); each is decoded alone, then inside one long recording at a known offset.
SENTENCES = [
    "please call stella and ask her to bring these things with her from the store",
    "the weather will be warm and sunny this afternoon",
    "a good book is the best of friends",
    "the children walked slowly to the old school",
    "we need more water for the garden",
    "she opened the window and looked at the river",
]
LEAD, PAUSE = 1.0, 1.5  # seconds of silence before the first sentence and between two sentences


@pytest.fixture(scope="module")
def sentences(synthesize_speech) -> list[np.ndarray]:
    return [load_audio(synthesize_speech(s, f"audit_{i}.wav")) for i, s in enumerate(SENTENCES)]


@pytest.fixture(scope="module")
def alone(sentences, tmp_path_factory) -> list[list[str]]:
    """The built-in model's words for each sentence decoded alone (the reference for the long recording): its own
    stretch of the recording, the silence before it (``LEAD`` or ``PAUSE``) and after it (``PAUSE``, none after the
    last) included, so that only what lies beyond differs."""
    # Was: the bare sentence. A model's greedy decoding may hear a word boundary differently with the recording's
    # silence in front ("at theriver" bare, "at the river" after 1.5 s of silence): not what this test is about.
    from srupp_asr.transcribe import transcribe

    folder = tmp_path_factory.mktemp("alone")
    paths = []
    for i, audio in enumerate(sentences):
        before = np.zeros(round((PAUSE if i else LEAD) * SAMPLE_RATE), np.float32)
        after = np.zeros(round(PAUSE * SAMPLE_RATE) if i + 1 < len(sentences) else 0, np.float32)
        paths.append(folder / f"s{i}.wav")
        sf.write(paths[-1], np.concatenate([before, audio, after]), SAMPLE_RATE, subtype="FLOAT")
    return [t.text.split() for t in transcribe(paths, decoding="ctc_greedy", device="cpu", threads=2)]


@pytest.fixture(scope="module")
def recording(sentences, tmp_path_factory) -> tuple[Path, list[tuple[float, float]]]:
    """A FLAC of the sentences, ``LEAD`` s of silence first and ``PAUSE`` s between them, and their spans."""
    silence = np.zeros(round(PAUSE * SAMPLE_RATE), np.float32)
    parts, spans, pos = [np.zeros(round(LEAD * SAMPLE_RATE), np.float32)], [], round(LEAD * SAMPLE_RATE)
    for i, audio in enumerate(sentences):
        if i:
            parts.append(silence)
            pos += len(silence)
        spans.append((pos / SAMPLE_RATE, (pos + len(audio)) / SAMPLE_RATE))
        parts.append(audio)
        pos += len(audio)
    path = tmp_path_factory.mktemp("long") / "long.flac"
    sf.write(path, np.concatenate(parts), SAMPLE_RATE)
    return path, spans


def _cli(capsys, *argv: str) -> int:
    code = main(["transcribe", "--decoding", "ctc_greedy", "--device", "cpu", "--threads", "2", "-q", *argv])
    capsys.readouterr()
    return code


LONG_MODES = {
    "whole": [],
    "overlapping chunks": ["--max-chunk-seconds", "4", "--chunk-overlap", "1"],
    "vad": ["--max-chunk-seconds", "4", "--vad"],
}


@pytest.mark.parametrize("mode", LONG_MODES.values(), ids=LONG_MODES.keys())
def test_a_long_recording_keeps_every_word_once_at_its_offset(capsys, recording, alone, tmp_path, mode):
    """Each sentence of the long recording gets as many words as decoded alone (none dropped or doubled at a chunk
    join), its first word starts within 0.3 s of where the sentence starts, and every output reads back."""
    path, spans = recording
    out = tmp_path / "new" / "out"  # made on the way
    assert _cli(capsys, *mode, "-f", "all", "-o", str(out), str(path)) == 0
    data = strict_json((out / "long.json").read_text(encoding="utf-8"))
    words = [w for s in data["segments"] for w in s["words"]]
    if mode:
        assert len(data["chunks"]) > 2
    for k, (start, end) in enumerate(spans):
        inside = [w for w in words if start - 0.3 <= (w["start"] + w["end"]) / 2 <= end + 0.3]
        assert len(inside) == len(alone[k]), (k, [w["word"] for w in inside], alone[k])
        assert abs(inside[0]["start"] - start) <= 0.3, (k, inside[0], start)
    assert len(words) == sum(len(a) for a in alone)
    for a, b in itertools.pairwise(words):
        assert a["end"] <= b["start"], (a, b)
    assert words[-1]["end"] <= data["duration"]
    _check_files(out, "long", data)


def test_the_vad_decodes_a_speaker_40_db_quieter_and_no_word_in_the_silence_after(capsys, sentences, tmp_path):
    """A loud sentence, then three sentences 40 dB quieter (wholly below the recording's VAD threshold), then 1 s of
    silence and a partial 10 ms frame, with --vad and 4 s chunks: the quiet speech gets as many words as decoded
    alone, and no word comes after it."""
    # Was: the quiet stretch was one VAD silence, its chunks skipped: 4 of its 27 words were kept; and the last
    # chunk, pure silence, was decoded (the trailing partial frame kept it out of the silence) and gave "he".
    gain, gap = 10 ** (-40 / 20), np.zeros(round(0.2 * SAMPLE_RATE), np.float32)
    quiet = np.concatenate([sentences[1] * gain, gap, sentences[2] * gain, gap, sentences[1] * gain])
    lead = np.concatenate([np.zeros(SAMPLE_RATE, np.float32), sentences[0], np.zeros(round(1.5 * SAMPLE_RATE))])
    tail = np.zeros(SAMPLE_RATE + 37, np.float32)
    sf.write(tmp_path / "quiet.wav", quiet, SAMPLE_RATE, subtype="FLOAT")
    sf.write(tmp_path / "mixed.wav", np.concatenate([lead, quiet, tail]), SAMPLE_RATE, subtype="FLOAT")
    out = tmp_path / "out"
    assert _cli(capsys, "-f", "json", "-o", str(out), str(tmp_path / "quiet.wav")) == 0
    alone = strict_json((out / "quiet.json").read_text())["text"].split()
    assert len(alone) >= 20  # the built-in model hears the quiet speech when it is decoded
    assert (
        _cli(capsys, "--max-chunk-seconds", "4", "--vad", "-f", "json", "-o", str(out), str(tmp_path / "mixed.wav"))
        == 0
    )
    data = strict_json((out / "mixed.json").read_text())
    words = [w for s in data["segments"] for w in s["words"]]
    start, end = len(lead) / SAMPLE_RATE, (len(lead) + len(quiet)) / SAMPLE_RATE
    heard = [w["word"] for w in words if start - 0.3 <= w["start"] and w["end"] <= end + 0.3]
    assert abs(len(heard) - len(alone)) <= 2, (heard, alone)
    assert words[-1]["end"] <= end + 0.3, words[-3:]


def _check_files(out: Path, name: str, data: dict) -> None:
    """The srt, vtt, tsv and txt of ``name`` in ``out`` read back and agree with its JSON ``data``."""
    segments = [s for s in data["segments"] if s["text"]]
    texts = [" ".join(s["text"].split()) for s in segments]
    for cues in (
        read_srt((out / f"{name}.srt").read_text("utf-8")),
        read_vtt((out / f"{name}.vtt").read_text("utf-8")),
    ):
        check_cues(cues)
        assert [c[2] for c in cues] == texts
        assert [c[0] for c in cues] == pytest.approx([s["start"] for s in segments], abs=1e-3)
    rows = read_tsv((out / f"{name}.tsv").read_text("utf-8"))
    assert [r[2] for r in rows] == texts
    for (start, end, _), segment in zip(rows, segments, strict=True):  # the JSON's seconds are rounded too
        assert abs(start - 1000 * segment["start"]) <= 1 and abs(end - 1000 * segment["end"]) <= 1
    assert (out / f"{name}.txt").read_text("utf-8").splitlines() == texts
    raw = (out / f"{name}.srt").read_bytes()
    assert not raw.startswith(b"\xef\xbb\xbf")  # UTF-8 without a byte-order mark
    assert not [p for p in os.listdir(out) if p.startswith(".")]  # no temporary file left


@pytest.mark.parametrize("offset", [-1, 0, 1], ids=["just under", "exactly", "just over"])
def test_a_recording_at_the_chunk_budget(capsys, sentences, tmp_path, offset):
    budget = 2.0
    samples = round(budget * SAMPLE_RATE) + offset
    audio = np.concatenate([sentences[2], np.zeros(SAMPLE_RATE, np.float32)])[:samples]
    path = tmp_path / "edge.wav"
    sf.write(path, audio, SAMPLE_RATE, subtype="FLOAT")
    out = tmp_path / "out"
    assert _cli(capsys, "--max-chunk-seconds", str(budget), "-f", "all", "-o", str(out), str(path)) == 0
    data = strict_json((out / "edge.json").read_text(encoding="utf-8"))
    assert len(data["chunks"]) == (2 if offset > 0 else 1)
    assert data["duration"] == pytest.approx(samples / SAMPLE_RATE, abs=1e-3)
    assert data["chunks"][-1][1] == pytest.approx(samples / SAMPLE_RATE, abs=1e-3)
    assert data["text"].split()[:2] == ["a", "good"]
    _check_files(out, "edge", data)


@pytest.mark.parametrize(
    ("name", "seconds", "extra"),
    [
        ("one sample", 1 / SAMPLE_RATE, []),
        ("shorter than a frame", 0.02, []),
        ("a long silence in chunks", 15.0, ["--max-chunk-seconds", "4"]),
        ("a long silence with the vad", 15.0, ["--max-chunk-seconds", "4", "--vad"]),
    ],
)
def test_silence_and_recordings_shorter_than_a_frame_give_valid_empty_outputs(capsys, tmp_path, name, seconds, extra):
    path = tmp_path / "quiet.wav"
    sf.write(path, np.zeros(max(1, round(seconds * SAMPLE_RATE)), np.float32), SAMPLE_RATE, subtype="FLOAT")
    out = tmp_path / "out"
    assert _cli(capsys, *extra, "-f", "all", "-o", str(out), str(path)) == 0
    data = strict_json((out / "quiet.json").read_text(encoding="utf-8"))
    assert data["segments"] == [] and data["text"] == ""
    assert data["duration"] == pytest.approx(seconds, abs=1e-3)
    _check_files(out, "quiet", data)
    assert (out / "quiet.srt").read_text() == "" and (out / "quiet.tsv").read_text() == "start\tend\ttext\n"


def test_same_stems_in_one_run_and_folders_get_distinct_outputs(capsys, sentences, tmp_path):
    """``talk.wav`` and ``talk.flac`` in one run, and ``talk.wav`` in another folder: three sets of outputs, named
    in input order, in an output folder that did not exist."""
    (tmp_path / "a").mkdir()
    inputs = [tmp_path / "talk.wav", tmp_path / "talk.flac", tmp_path / "a" / "talk.wav"]
    for path, audio in zip(inputs, sentences, strict=False):
        sf.write(path, audio, SAMPLE_RATE)
    out = tmp_path / "deep" / "er" / "out"
    assert _cli(capsys, "-f", "all", "-o", str(out), *map(str, inputs)) == 0
    assert sorted(os.listdir(out)) == sorted(f"{n}.{f}" for n in ("talk", "talk-2", "talk-3") for f in FORMATS)
    for name, path in zip(("talk", "talk-2", "talk-3"), inputs, strict=True):
        assert strict_json((out / f"{name}.json").read_text(encoding="utf-8"))["audio"] == str(path)


def test_writing_twice_replaces_the_outputs_whole(tmp_path):
    long_text = _transcript([W(f"w{i}", i, i + 0.5) for i in range(200)], duration=201.0)
    short_text = _transcript([W("short", 0.0, 0.5)], duration=1.0)
    write_transcript(long_text, tmp_path, "talk", list(FORMATS))
    write_transcript(short_text, tmp_path, "talk", list(FORMATS))
    assert read_srt((tmp_path / "talk.srt").read_text()) == [(0.0, 0.5, "short")]
    assert strict_json((tmp_path / "talk.json").read_text())["text"] == "short"
    assert sorted(os.listdir(tmp_path)) == sorted(f"talk.{f}" for f in FORMATS)


# ---- a full disk while writing outputs (RLIMIT_FSIZE: write() fails past the limit where ENOSPC would) ----


def _limit_file_size() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (60, 60))


def test_a_full_disk_while_writing_outputs_leaves_the_previous_ones_intact(model_dir, tmp_path):
    audio = [tmp_path / "a.wav", tmp_path / "b.wav"]
    for path in audio:
        sf.write(path, 0.01 * np.random.default_rng(0).standard_normal(16000).astype(np.float32), 16000)
    out = tmp_path / "out"
    out.mkdir()
    previous = {name: f"previous {name}\n" for name in ("a.json", "b.json")}
    for name, text in previous.items():
        (out / name).write_text(text)
    cmd = [sys.executable, "-m", "srupp_asr.cli", "transcribe", "--model", str(model_dir), "-f", "json", "-o", str(out)]
    proc = subprocess.run(
        [*cmd, *map(str, audio)], capture_output=True, text=True, timeout=300, preexec_fn=_limit_file_size
    )
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert proc.returncode != 0
    assert len(errors) == 2, proc.stderr
    for name, line in zip(previous, errors, strict=True):
        assert str(out / name) in line and "File too large" in line and "Traceback" not in proc.stderr
    assert {p.name: p.read_text() for p in out.iterdir()} == previous  # untouched, and no temporary file left


# ---- the VAD on audio without silence, memory over a 10-hour file, a bug that strikes one file ----


class TestLongFilesAndAnUnexpectedErrorOnOneFile:
    """``--vad`` on a recording with no silence gives no empty chunk; a 10-hour file is transcribed with bounded
    memory, every utterance heard in its place (*slow*); an unexpected error while decoding one file, batched or
    chunked, costs that file only."""

    ERROR_PREFIX = "srupp-asr transcribe: error: "

    def test_vad_on_a_recording_without_silence_gives_no_empty_chunk(self, model, tmp_path):
        # Where the VAD finds no silence near the end, the plan covers the rest with overlapping chunks and then adds an
        # empty one (5.0, 5.0): it is dropped, not decoded, and not listed in the transcript's chunks.
        noise = 0.05 * np.random.default_rng(4).standard_normal(5 * SAMPLE_RATE).astype(np.float32)
        sf.write(tmp_path / "noise.wav", noise, SAMPLE_RATE)
        (t,) = transcribe(tmp_path / "noise.wav", model, decoding="ctc_greedy", vad=True, max_chunk_seconds=2.0)
        assert len(t.chunks) >= 3 and all(end > start for start, end in t.chunks)
        assert t.chunks[-1][1] == pytest.approx(5.0) and t.duration == pytest.approx(5.0)

    @pytest.mark.slow
    def test_a_ten_hour_file_is_transcribed_with_bounded_memory(self, model, utts, tmp_path):
        # The default settings: 600 s chunks, the most audio decoded at once. The overfit model, trained on tight
        # utterances, garbles them inside long silence (its text is exact only without padding), so what is checked is
        # where the words land: in every 5-minute period, starting within its utterance, nowhere else - no stretch of
        # the 10 hours lost, repeated or shifted by the streaming.
        from tests.helpers import transcribe_measured

        if not Path("/proc/self/status").exists():
            pytest.skip("needs /proc to read a process's peak memory")
        hours, period = 10, 300.0  # an utterance in the middle of every 5 minutes, silence around it
        path = tmp_path / "ten_hours.wav"
        spans = []
        with sf.SoundFile(path, "w", SAMPLE_RATE, 1, subtype="PCM_16") as f:  # 1.15 GB, written 5 minutes at a time
            for k in range(int(hours * 3600 / period)):
                speech = load_audio(utts[k % len(utts)][0])
                block = np.zeros(int(period * SAMPLE_RATE), np.float32)
                at = len(block) // 2
                block[at : at + len(speech)] = speech
                f.write(block)
                spans.append((k * period + at / SAMPLE_RATE, k * period + (at + len(speech)) / SAMPLE_RATE))
        assert path.stat().st_size > 1e9

        (tmp_path / "short").mkdir()
        baseline, _ = transcribe_measured(model, utts[0][0], tmp_path / "short")  # Python, torch and the model
        peak, _ = transcribe_measured(model, path, tmp_path)
        path.unlink()
        whole = hours * 3600 * SAMPLE_RATE * 4 / 2**20  # the recording at once as float32: 2,197 MiB
        assert peak - baseline < 1024 < whole / 2, f"peak RSS {peak:.0f} MiB, {peak - baseline:.0f} above a short run"
        data = json.loads((tmp_path / "ten_hours.json").read_text())
        assert data["duration"] == pytest.approx(hours * 3600, abs=0.01)
        words = [w for s in data["segments"] for w in s["words"]]
        found = {}
        for w in words:
            k = int(w["start"] // period)
            start, end = spans[k]
            # A word starts within its utterance; it may end late (the overfit model sometimes emits a lone letter,
            # with no word boundary, when the next utterance begins: its word then spans the silence), not later.
            following = spans[k + 1][0] if k + 1 < len(spans) else hours * 3600
            assert start - 0.3 <= w["start"] <= end + 0.3 and w["end"] <= following + 0.3, (w, spans[k])
            found[k] = found.get(k, 0) + 1
        assert sorted(found) == list(range(len(spans)))  # every utterance heard, in its place

    @pytest.mark.parametrize("long", [False, True], ids=["batched", "long-form"])
    def test_an_unexpected_error_on_one_file_is_one_line_and_the_batch_goes_on(
        self, monkeypatch, capsys, model, utts, long
    ):
        # A bug that strikes one file (here: decoding raising on it) must cost that file only.
        import importlib

        victim, fine = utts[15], utts[16]
        worker = importlib.import_module("srupp_asr.decoding.batch").BatchDecoder
        method = "decode_long" if long else "decode_batch"
        original = getattr(worker, method)

        def failing(self, jobs, *args):
            if any(job.name == str(victim[0]) for job in (jobs if isinstance(jobs, list) else [jobs])):
                raise RuntimeError("simulated bug\nwith a second line")
            return original(self, jobs, *args)

        monkeypatch.setattr(worker, method, failing)
        args = ["transcribe", "--model", str(model), "--decoding", "ctc_greedy", str(victim[0]), str(fine[0])]
        if long:  # every file goes through the chunked long-form path
            args += ["--max-chunk-seconds", "1"]
        code = main(args)
        out, err = capsys.readouterr()
        assert code == 1
        assert f"{fine[0]}\t" in out
        errors = [line for line in err.splitlines() if line.startswith(self.ERROR_PREFIX)]
        assert errors == [
            f"{self.ERROR_PREFIX}{victim[0]}: internal error (RuntimeError: simulated bug); please report it"
        ]

    def test_running_out_of_memory_on_one_file_is_named_as_such_and_the_batch_goes_on(
        self, monkeypatch, capsys, model, utts
    ):
        # PyTorch's CPU allocator raises a RuntimeError; it was "internal error ... please report it".
        import importlib

        victim, fine = utts[15], utts[16]
        worker = importlib.import_module("srupp_asr.decoding.batch").BatchDecoder
        original = worker.decode_batch
        said = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 25769803776 bytes."

        def failing(self, jobs, *args):
            if any(job.name == str(victim[0]) for job in jobs):
                raise RuntimeError(said)
            return original(self, jobs, *args)

        monkeypatch.setattr(worker, "decode_batch", failing)
        code = main(["transcribe", "--model", str(model), "--decoding", "ctc_greedy", str(victim[0]), str(fine[0])])
        out, err = capsys.readouterr()
        assert code == 1 and f"{fine[0]}\t" in out
        errors = [line for line in err.splitlines() if line.startswith(self.ERROR_PREFIX)]
        assert errors == [
            f"{self.ERROR_PREFIX}{victim[0]}: out of memory while decoding ({said}); try a smaller --batch-size, --beam"
            " or --max-chunk-seconds"
        ]


def test_inputs_that_are_not_audio_are_named_before_the_model_loads(tmp_path, monkeypatch):
    from srupp_asr.loading import LoadedModel

    def never(*_args, **_kwargs):
        raise AssertionError("the model was loaded for inputs that cannot be transcribed")

    monkeypatch.setattr(LoadedModel, "load", classmethod(never))
    (tmp_path / "notes.wav").write_text("not audio")
    errors: list[str] = []
    assert transcribe([tmp_path / "notes.wav", tmp_path / "gone.wav"], on_error=errors.append) == []
    assert [e.split(": ")[0] for e in errors] == [str(tmp_path / "notes.wav"), str(tmp_path / "gone.wav")]
    assert "not a readable audio file" in errors[0]
