"""File-system primitives of :mod:`srupp_asr.fileio`: replacing a whole directory in one step, the temporary
names of atomic writes, and the YAML reader every config goes through."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from srupp_asr.errors import UserError
from srupp_asr.fileio import (
    MAX_CONFIG_BYTES,
    atomic_output,
    atomic_write_text,
    make_temp_dir,
    read_bytes,
    read_text,
    read_yaml_mapping,
    replace_dir,
    temp_prefix,
)
from srupp_asr.lm import SRUppLM, load_lm, save_lm
from srupp_asr.model_dir import load_model_dir
from tests.helpers import error_within

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


DEEP_YAML = "model: " + "[" * 5000 + "]" * 5000 + "\n"  # PyYAML composes nested collections recursively


def test_deeply_nested_yaml_is_one_line_naming_the_file_not_a_recursion_error(
    model_dir, tmp_path, char_tokenizer, capsys
):
    """A model directory's config.yaml, an LM's and ``train --config`` gave a RecursionError traceback."""
    from srupp_asr.cli import main

    with pytest.raises(RecursionError):  # what the reader met, as a traceback
        yaml.safe_load(DEEP_YAML)
    (model_dir / "config.yaml").write_text(DEEP_YAML)
    with pytest.raises(UserError, match=rf"^{model_dir / 'config.yaml'}: not a usable model config \(YAML nested too"):
        load_model_dir(model_dir)
    lm = SRUppLM(vocab_size=char_tokenizer.vocab_size, d_model=16, num_layers=1, attn_dim=8, num_heads=2)
    lm_dir = save_lm(lm, char_tokenizer.path, tmp_path / "lm")
    (lm_dir / "config.yaml").write_text(DEEP_YAML)
    with pytest.raises(UserError, match=rf"^{lm_dir / 'config.yaml'}: not a usable LM config \(YAML nested too deeply"):
        load_lm(lm_dir)
    config = tmp_path / "deep.yaml"
    config.write_text(DEEP_YAML)
    assert main(["train", "fit", "--config", str(config)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"srupp-asr train: error: {config}: not a usable config file (YAML nested too deeply)"
    )


def _not_a_file(tmp_path: Path, kind: str) -> Path:
    """A path named config.yaml that is a named pipe, a link to /dev/zero or a folder."""
    path = tmp_path / "config.yaml"
    if kind == "pipe":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    return path


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("pipe", "config file is not a regular file (a pipe; save it to a file)"),
        ("device", "config file is not a regular file (a device; save it to a file)"),
        ("folder", "is a directory, not a config file"),
    ],
)
def test_the_small_file_reader_refuses_a_pipe_a_device_or_a_folder_as_what_it_is(tmp_path, kind, says):
    path = _not_a_file(tmp_path, kind)
    for read in (read_bytes, read_text, read_yaml_mapping):
        err = error_within(10, lambda read=read: read(path, "config file"))  # a pipe's writer never comes
        assert isinstance(err, UserError) and str(err) == f"{path}: {says}"


def test_the_small_file_reader_refuses_a_file_over_its_bound_before_reading_it(tmp_path):
    path = tmp_path / "config.yaml"
    with open(path, "wb") as f:
        f.truncate(8 * 2**30)  # sparse: 8 GiB to read, nothing on disk
    with pytest.raises(UserError) as err:
        read_yaml_mapping(path, "model config")
    assert (
        str(err.value) == f"{path}: model config holds more than {MAX_CONFIG_BYTES // 2**20} MiB (the most this reads)"
    )
    path.write_bytes(b"a: 1\n" + b"#" * (MAX_CONFIG_BYTES - 5))  # exactly at the bound: read
    assert read_yaml_mapping(path) == {"a": 1}


def test_a_stream_is_read_up_to_the_bound_when_streams_are_allowed(tmp_path):
    with pytest.raises(UserError, match=r"^/dev/zero: list file holds more than 1 MiB \(the most this reads\)$"):
        read_bytes("/dev/zero", "list file", 2**20, streams=True)
    with pytest.raises(UserError, match="is a directory, not a list file"):
        read_bytes(tmp_path, "list file", 2**20, streams=True)
