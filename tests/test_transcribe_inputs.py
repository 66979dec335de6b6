"""``transcribe`` without a model: finding inputs, the default model, usage errors, the summary, import weight."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from srupp_asr.cli import main
from srupp_asr.errors import UserError
from srupp_asr.transcribe import (
    DECODING_MODES,
    DEFAULT_MODEL_ENV,
    default_model_candidates,
    default_model_dir,
    find_inputs,
    resolve_device,
    summary_line,
)


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    return path


def test_directories_are_searched_recursively_for_audio_names_in_sorted_order(tmp_path):
    for name in ["b/2.flac", "b/1.WAV", "a/deep/0.mp3", "c.ogg", "b/notes.txt", ".git/x.wav", "b/.x.wav", "d/e.opus"]:
        _touch(tmp_path / name)
    files, problems = find_inputs([tmp_path])
    rel = [str(Path(f).relative_to(tmp_path)) for f in files]
    assert rel == ["a/deep/0.mp3", "b/1.WAV", "b/2.flac", "c.ogg", "d/e.opus"]
    assert problems == []


def test_files_are_taken_as_given_and_duplicates_dropped(tmp_path):
    a = _touch(tmp_path / "a.wav")
    odd = _touch(tmp_path / "speech.data")  # named explicitly: tried whatever its name
    files, problems = find_inputs([str(odd), str(a), str(tmp_path), "missing.wav", str(tmp_path / "." / "a.wav")])
    assert files == [str(odd), str(a), "missing.wav"]  # the directory adds a.wav again: once is enough
    assert problems == []


def test_list_files_hold_one_input_per_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _touch(tmp_path / "x.wav")
    _touch(tmp_path / "dir" / "y.flac")
    (tmp_path / "list.txt").write_text("# comment\n\n  x.wav  \ndir\n")
    assert find_inputs(["@list.txt"]) == (["x.wav", "dir/y.flac"], [])


def test_an_unreadable_list_file_is_a_problem_and_the_other_inputs_still_count(tmp_path):
    a = _touch(tmp_path / "a.wav")
    (tmp_path / "list.txt").write_text(f"{a}\n")
    missing = tmp_path / "nope.txt"
    files, problems = find_inputs([f"@{missing}", f"@{tmp_path}", f"@{tmp_path / 'list.txt'}"])
    assert files == [str(a)]
    assert problems == [f"{missing}: list file not found", f"{tmp_path}: is a directory, not a list file"]


def test_a_directory_without_audio_is_a_problem(tmp_path):
    _touch(tmp_path / "readme.md")
    files, problems = find_inputs([tmp_path])
    assert files == []
    assert problems == [
        f"{tmp_path}: no audio files (.wav, .flac, .ogg, .oga, .opus, .mp3, .aif, .aiff, .au, "
        ".w64, .rf64, .caf, .sph, .m4a, .m4b, .mp4, .3gp, .mov, .webm, .mka, .mkv, .aac, .wma, .amr, .ac3) "
        "in this directory"
    ]


def test_default_model_candidates_follow_the_documented_order(monkeypatch, tmp_path):
    monkeypatch.delenv(DEFAULT_MODEL_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    package_root = Path(__file__).resolve().parent.parent
    assert default_model_candidates() == [
        package_root / "srupp_asr" / "default_model",
        package_root / "exp" / "synth_en" / "model",
        tmp_path / ".cache" / "srupp-asr" / "default_model",
    ]
    monkeypatch.setenv(DEFAULT_MODEL_ENV, str(tmp_path / "mine"))
    assert default_model_candidates() == [tmp_path / "mine"]


def test_the_first_existing_default_model_is_used(monkeypatch, tmp_path):
    monkeypatch.delenv(DEFAULT_MODEL_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    cached = tmp_path / ".cache" / "srupp-asr" / "default_model"
    _touch(cached / "config.yaml")
    candidates = default_model_candidates()
    expected = next(p for p in candidates if (p / "config.yaml").is_file())
    assert default_model_dir() == expected


def test_no_default_model_says_how_to_build_one(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(DEFAULT_MODEL_ENV, str(tmp_path / "none"))
    _touch(tmp_path / "a.wav")
    assert main(["transcribe", str(tmp_path / "a.wav")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert str(tmp_path / "none") in err and "make demo" in err and "recipes/synth_en/run.sh" in err


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
        (["a.wav", "--beam", "0"], "beam must be an integer >= 1"),
        (["a.wav", "--model", "nowhere"], "nowhere: model directory not found"),
        (["a.wav", "--model", "nowhere", "--device", "tpu"], "unknown device"),
    ],
)
def test_usage_errors_exit_2_with_one_line(capsys, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    _touch(tmp_path / "a.wav")
    _touch(tmp_path / "b.wav")
    assert main(["transcribe", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("srupp-asr transcribe: error: ") and err.count("\n") == 1
    assert message in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cuda_without_a_gpu_is_a_user_error():
    with pytest.raises(UserError, match="no CUDA device"):
        resolve_device("cuda")
    assert resolve_device("auto") == "cpu"


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


def test_the_cli_offers_every_decoding_mode():
    from srupp_asr.decoding import MODES

    assert DECODING_MODES == MODES
