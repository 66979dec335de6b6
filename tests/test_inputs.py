"""What ``transcribe`` is given (:mod:`srupp_asr.inputs`): the audio files named by files, directories and @LIST files,
and the built-in model's directory."""

from __future__ import annotations

import os
from pathlib import Path

from srupp_asr.cli import main
from srupp_asr.inputs import DEFAULT_MODEL_ENV, default_model_candidates, default_model_dir, find_inputs


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


def test_a_list_file_with_a_byte_order_mark_names_its_first_file(tmp_path):
    """Notepad and Windows PowerShell write UTF-8 with a byte-order mark (and CRLF line ends)."""
    listed = tmp_path / "list.txt"
    listed.write_bytes(f"\ufeff{tmp_path / 'a.wav'}\r\n{tmp_path / 'b.wav'}\r\n".encode())
    assert find_inputs([f"@{listed}"]) == ([str(tmp_path / "a.wav"), str(tmp_path / "b.wav")], [])


def test_a_list_file_entry_ends_at_a_newline_only(tmp_path):
    # Was: str.splitlines also ended an entry at U+2028, U+0085 or a form feed, all legal in a file name: the name
    # was split into two that do not exist.
    names = [tmp_path / "talk\u2028one.wav", tmp_path / "b\x0cc\x85d.wav"]
    listed = tmp_path / "list.txt"
    listed.write_text("".join(f"{n}\n" for n in names), encoding="utf-8")
    assert find_inputs([f"@{listed}"]) == ([str(n) for n in names], [])


def test_a_list_file_that_is_not_utf8_is_one_problem_naming_its_line(tmp_path):
    listed = tmp_path / "list.txt"
    listed.write_bytes(b"a.wav\ncaf\xe9.wav\n")
    found, problems = find_inputs([f"@{listed}"])
    assert found == [] and problems == [
        f"{listed}:2: list file is not UTF-8 text (invalid continuation byte at byte 9)"
    ]


def test_symlink_loops_end_the_search_and_list_each_file_once(tmp_path):
    tree = tmp_path / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    for name in ("x.wav", "a/y.wav", "a/b/z.wav"):
        (tree / name).write_bytes(b"x")
    os.symlink("../..", tree / "a" / "b" / "up")  # back to tree
    os.symlink(".", tree / "a" / "here")
    os.symlink("x.wav", tree / "x_again.wav")  # a second name for x.wav
    files, problems = find_inputs([tree, tree / "a" / "b" / "up", tree / "a" / "here", tree / "x.wav"])
    assert problems == []
    assert sorted(os.path.relpath(f, tree) for f in files) == ["a/b/z.wav", "a/y.wav", "x.wav"]
