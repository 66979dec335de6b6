"""File-system primitives of :mod:`srupp_asr.fileio`: replacing a whole directory in one step, and the temporary
names of atomic writes."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from srupp_asr.fileio import atomic_output, atomic_write_text, make_temp_dir, replace_dir, temp_prefix

NAMES = ("config.yaml", "model.safetensors", "tokenizer.model")


def _write_dir(folder, text: str):
    folder.mkdir(exist_ok=True)
    for name in NAMES:
        (folder / name).write_text(text)
    return folder


@pytest.mark.skipif(sys.platform != "linux", reason="the one-step exchange is renameat2(RENAME_EXCHANGE), Linux only")
def test_replacing_a_model_directory_never_leaves_the_path_without_a_whole_model(tmp_path, monkeypatch):
    # Was: the old directory was renamed aside (.model.<uuid>.old) and then the new one renamed in: between the
    # two renames `model` did not exist (1 of the 3 states observed below was "no model"), so a transcribe
    # starting then failed with "model directory not found" and a kill -9 there left no model at the path,
    # the old one hidden under a name that no later run sweeps.
    out = _write_dir(tmp_path / "model", "first")
    new = _write_dir(make_temp_dir(out), "second")

    def whole() -> bool:
        return all((out / name).is_file() for name in NAMES)

    observed: list[bool] = []
    real_rename, real_rmtree = os.rename, shutil.rmtree

    def rename(src, dst, *args, **kwargs):
        real_rename(src, dst, *args, **kwargs)
        observed.append(whole())

    def rmtree(path, *args, **kwargs):
        observed.append(whole())  # the displaced old directory is being removed
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(shutil, "rmtree", rmtree)
    replace_dir(new, out)
    monkeypatch.undo()
    assert observed and all(observed), observed
    assert all((out / name).read_text() == "second" for name in NAMES)
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # nothing of the old directory left beside it


@pytest.mark.parametrize("length", [237, 238, 246, 255])
def test_atomic_writes_take_any_name_the_file_system_allows(tmp_path, length):
    # The temporary name is short and hidden, not the output's name plus 18 bytes (which failed from 238 bytes).
    path = tmp_path / ("x" * (length - 4) + ".txt")
    atomic_write_text(path, "hello\n")
    assert path.read_text() == "hello\n"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


@pytest.mark.parametrize(
    ("name", "suffix"),
    [("talk.flac", ".tmp.flac"), ("cuts.jsonl.gz", ".tmp.jsonl.gz"), ("a." + "b" * 250, ".tmp")],
)
def test_atomic_temporary_names_are_hidden_short_and_keep_the_format_suffix(tmp_path, name, suffix):
    with atomic_output(tmp_path / name) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(temp_prefix()) and tmp.name.endswith(suffix)
        assert temp_prefix().startswith(".") and len(temp_prefix()) <= 1 + 6 + 1 + 7 + 1  # ".host-pid-"
        assert len(tmp.name) == len(temp_prefix()) + 8 + len(suffix)  # + mkstemp's 8 random characters + the suffix
        tmp.write_bytes(b"data")
    assert [p.name for p in tmp_path.iterdir()] == [name]
