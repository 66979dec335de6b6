"""File-system primitives of :mod:`srupp_asr.fileio`: replacing a whole directory in one step."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from srupp_asr.fileio import make_temp_dir, replace_dir

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
