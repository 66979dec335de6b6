"""Model directories (:mod:`srupp_asr.model_dir`) from strangers: only YAML, safetensors and sentencepiece are
parsed; pickles, crafted files, hostile shard indexes and configs asking for absurd networks are refused with one
line naming the file, before anything runs or big memory is allocated. (The same for LM directories is in
``tests/test_lm.py``; YAML nested too deeply, for every config reader, in ``tests/test_fileio.py``.)"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from srupp_asr.errors import UserError
from srupp_asr.model_dir import (
    check_no_pickles,
    export_model,
    initial_weights,
    load_model_dir,
    read_weight_shapes,
    read_weights,
)
from tests.helpers import error_within, evil_pickle, seeded_model


@pytest.mark.parametrize("name", ["evil.pkl", "pytorch_model.bin", "notes"])
def test_a_pickle_in_a_model_directory_is_refused_unread(model_dir, name):
    marker = evil_pickle(model_dir, name)
    with pytest.raises(UserError, match=rf"^{model_dir / name}: a pickle file in a model directory is refused"):
        load_model_dir(model_dir)
    assert not marker.exists()


def test_a_torch_save_file_is_refused_by_its_zip_magic(model_dir):
    import torch

    torch.save({"w": torch.ones(2)}, model_dir / "extra_weights")
    with pytest.raises(UserError, match=r"extra_weights: a pickle file in a model directory is refused"):
        load_model_dir(model_dir)


def test_documentation_beside_the_model_is_fine(model_dir):
    (model_dir / "README.md").write_text("# my model\n")
    model, _ = load_model_dir(model_dir)
    assert model.vocab_size > 0


def test_yaml_python_tags_are_not_constructed(model_dir):
    marker = model_dir.parent / "yaml_ran"
    (model_dir / "config.yaml").write_text(
        f"format_version: 1\nmodel: !!python/object/apply:open [{str(marker)!r}, w]\n"
    )
    with pytest.raises(UserError, match=r"config\.yaml: not valid YAML"):
        load_model_dir(model_dir)
    assert not marker.exists()


def test_a_config_asking_for_a_huge_network_fails_on_shapes_without_allocating_it(model_dir, tmp_path):
    config = yaml.safe_load((model_dir / "config.yaml").read_text())
    config["model"]["encoder_conf"].update(d_model=65536, num_layers=64)  # ~10^12 bytes if it were built
    (model_dir / "config.yaml").write_text(yaml.safe_dump(config))
    script = (
        "import resource, sys\n"
        "from srupp_asr.model_dir import load_model_dir\nfrom srupp_asr.errors import UserError\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n    load_model_dir(sys.argv[1])\nexcept UserError as err:\n    print(err)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n"
    )
    out = subprocess.run([sys.executable, "-c", script, str(model_dir)], capture_output=True, text=True, timeout=120)
    message, grown_mib = out.stdout.splitlines()
    assert message.startswith(f"{model_dir / 'model.safetensors'}: missing weights encoder.layers.1.")
    assert int(grown_mib) < 200, f"loading grew the process by {grown_mib} MiB"


def _safetensors(header: bytes, body: bytes = b"", length: int | None = None) -> bytes:
    return struct.pack("<Q", len(header) if length is None else length) + header + body


CRAFTED_WEIGHTS = {
    "header length 2^60": _safetensors(b"{}", length=2**60),
    "header not JSON": _safetensors(b"{not json at all}"),
    "offsets past the end": _safetensors(
        json.dumps({"w": {"dtype": "F32", "shape": [1000], "data_offsets": [0, 4000]}}).encode(), b"\0" * 8
    ),
    "unknown dtype": _safetensors(
        json.dumps({"w": {"dtype": "Q99", "shape": [1], "data_offsets": [0, 4]}}).encode(), b"\0" * 4
    ),
    "empty": b"",
}


@pytest.mark.parametrize("name", list(CRAFTED_WEIGHTS))
def test_crafted_safetensors_files_are_one_line_errors(model_dir, name):
    (model_dir / "model.safetensors").write_bytes(CRAFTED_WEIGHTS[name])
    with pytest.raises(UserError, match=rf"^{model_dir / 'model.safetensors'}: not a readable safetensors file \("):
        load_model_dir(model_dir)


@pytest.mark.parametrize("content", [b"", b"\x0a\xff\xff\xff\xff\x0f garbage", pickle.dumps([1, 2, 3])])
def test_crafted_tokenizers_are_one_line_errors(model_dir, content):
    (model_dir / "tokenizer.model").write_bytes(content)
    with pytest.raises(UserError, match=rf"^{model_dir / 'tokenizer.model'}: (not a sentencepiece model|id 0 is)"):
        load_model_dir(model_dir)


def test_transcribe_with_a_booby_trapped_model_exits_2_with_one_line(model_dir, tmp_path):
    marker = evil_pickle(model_dir, "optimizer.pt")
    audio = tmp_path / "a.wav"
    import numpy as np
    import soundfile as sf

    sf.write(audio, np.zeros(16000, dtype=np.float32), 16000)
    out = subprocess.run(
        [sys.executable, "-m", "srupp_asr.cli", "transcribe", "--model", str(model_dir), str(audio)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"srupp-asr transcribe: error: {model_dir / 'optimizer.pt'}: a pickle file in a model directory is refused"
        " (model directories hold config.yaml, safetensors weights and tokenizer.model only; pickles can run code"
        " when loaded)"
    ]
    assert not marker.exists()


# ------------------------------------------------------------------------------------------ sharded weights

INDEX = "model.safetensors.index.json"
SHARDS = [f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)]


@pytest.fixture
def sharded_dir(tmp_path, char_tokenizer) -> Path:
    model = seeded_model(0, char_tokenizer.vocab_size)
    out = export_model(
        model.state_dict(), model.config, char_tokenizer.path, tmp_path / "model", max_shard_bytes=24_000
    )
    assert sorted(p.name for p in out.glob("model-*")) == SHARDS
    return out


def _edit_index(folder: Path, edit) -> None:
    index = json.loads((folder / INDEX).read_text())
    edit(index)
    (folder / INDEX).write_text(json.dumps(index))


def _first_tensor(folder: Path, shard: str) -> str:
    return next(k for k, f in json.loads((folder / INDEX).read_text())["weight_map"].items() if f == shard)


def _copy_tensor_into_second_shard(folder: Path) -> None:
    from safetensors.torch import load_file, save_file

    name = _first_tensor(folder, SHARDS[0])
    second = load_file(folder / SHARDS[1])
    save_file({**second, name: load_file(folder / SHARDS[0])[name]}, folder / SHARDS[1])


NOT_AN_INDEX = r"not a safetensors weights index \(expected \{\"metadata\": \{\"total_size\": N\}"
OUTSIDE = r"maps \S+ to '{}', not a \.safetensors file of this directory$"
HOSTILE_INDEXES = {
    "not JSON": (lambda d: (d / INDEX).write_text('{"weight_map": '), INDEX, r"not valid JSON \("),
    "not UTF-8": (lambda d: (d / INDEX).write_bytes(b"\xff\xfe{}"), INDEX, r"weights index is not UTF-8 text"),
    "deeply nested": (lambda d: (d / INDEX).write_text("[" * 100_000), INDEX, r"not valid JSON \("),
    "a list": (lambda d: (d / INDEX).write_text("[]"), INDEX, NOT_AN_INDEX),
    "no total_size": (lambda d: _edit_index(d, lambda i: i.pop("metadata")), INDEX, NOT_AN_INDEX),
    "total_size a string": (
        lambda d: _edit_index(d, lambda i: i["metadata"].update(total_size="74532")),
        INDEX,
        NOT_AN_INDEX,
    ),
    "file not a string": (
        lambda d: _edit_index(d, lambda i: i["weight_map"].update({"ctc.weight": 1})),
        INDEX,
        NOT_AN_INDEX,
    ),
    **{
        f"file {file}": (
            lambda d, file=file: _edit_index(d, lambda i: i["weight_map"].update({"ctc.weight": file})),
            INDEX,
            OUTSIDE.format(re.escape(file)),
        )
        for file in ("../model.safetensors", "/etc/passwd.safetensors", "sub/model.safetensors", "evil.pkl", "..")
    },
    "shard missing": (lambda d: (d / SHARDS[2]).unlink(), SHARDS[2], rf"not found \({INDEX} lists it\)$"),
    "shard is a directory": (
        lambda d: ((d / SHARDS[2]).unlink(), (d / SHARDS[2]).mkdir()),
        SHARDS[2],
        rf"is a directory, not a file \({INDEX} lists it\)$",
    ),
    "tensor absent from its shard": (
        lambda d: _edit_index(d, lambda i: i["weight_map"].update(ghost=SHARDS[0])),
        SHARDS[0],
        rf"has no tensor ghost \({INDEX} puts it there\)$",
    ),
    "tensor in two shards": (
        _copy_tensor_into_second_shard,
        SHARDS[1],
        rf"holds tensor \S+, which {INDEX} puts in {SHARDS[0]}$",
    ),
    "stray shard": (
        lambda d: shutil.copy(d / SHARDS[0], d / "model-00005-of-00005.safetensors"),
        "model-00005-of-00005.safetensors",
        rf"a weights file that {INDEX} does not list \(remove one of them\)$",
    ),
    "single file beside the index": (
        lambda d: shutil.copy(d / SHARDS[0], d / "model.safetensors"),
        "model.safetensors",
        rf"a weights file that {INDEX} does not list",
    ),
    "total_size off by one": (
        lambda d: _edit_index(d, lambda i: i["metadata"].update(total_size=i["metadata"]["total_size"] + 1)),
        INDEX,
        r"total_size is \d+, the shards hold \d+ bytes of tensors$",
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE_INDEXES))
def test_hostile_shard_indexes_are_one_line_errors_naming_the_file(sharded_dir, case):
    breaks, file, message = HOSTILE_INDEXES[case]
    breaks(sharded_dir)
    for read in (load_model_dir, read_weight_shapes, read_weights):
        with pytest.raises(UserError) as err:
            read(sharded_dir)
        assert "\n" not in str(err.value)
        assert str(err.value).startswith(f"{sharded_dir / file}: ")
        assert err.match(message)


def test_a_pickle_in_a_sharded_directory_is_refused_and_a_shard_is_never_unpickled(sharded_dir):
    check_no_pickles(sharded_dir)  # the shards and the index are not mistaken for pickles
    marker = evil_pickle(sharded_dir, "evil.pkl")
    with pytest.raises(UserError, match=r"evil\.pkl: a pickle file in a model directory is refused"):
        load_model_dir(sharded_dir)
    (sharded_dir / "evil.pkl").unlink()
    evil_pickle(sharded_dir, SHARDS[1])  # a pickle under a listed shard's name is parsed as safetensors only
    with pytest.raises(UserError, match=rf"^{sharded_dir / SHARDS[1]}: not a readable safetensors file \("):
        load_model_dir(sharded_dir)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_heads": 0}, "encoder_conf.num_heads must be at least 1, got 0"),  # was a ZeroDivisionError
        ({"num_layers": 0}, "encoder_conf.num_layers must be at least 1, got 0"),
        ({"num_heads": "two"}, "encoder_conf.num_heads must be an integer, got 'two'"),
    ],
)
def test_a_model_config_with_a_bad_encoder_value_is_one_line_naming_it(model_dir, change, message):
    config = yaml.safe_load((model_dir / "config.yaml").read_text())
    config["model"]["encoder_conf"].update(change)
    (model_dir / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(UserError, match=rf"^{model_dir / 'config.yaml'}: bad model settings \({message}\)$"):
        load_model_dir(model_dir)


def test_weights_stored_as_integers_where_the_model_has_floats_are_refused(model_dir, char_tokenizer):
    """float16 weights relabelled int16 in the header loaded and were cast by value: garbage transcripts."""
    from safetensors.torch import load_file, save_file

    weights = load_file(model_dir / "model.safetensors")
    key = next(k for k, v in weights.items() if v.is_floating_point() and v.numel() > 1 and "cmvn" not in k)
    weights[key] = weights[key].to(torch.float16).view(torch.int16)  # the same bytes, another label
    save_file(weights, model_dir / "model.safetensors")
    message = rf"^{model_dir / 'model.safetensors'}: {re.escape(key)} is stored as int16, the model expects a floating"
    with pytest.raises(UserError, match=message):
        load_model_dir(model_dir)
    with pytest.raises(UserError, match=rf"{re.escape(key)} is stored as int16, the model expects a floating tensor"):
        initial_weights(model_dir, seeded_model(0, char_tokenizer.vocab_size))  # train fit --model.init_from


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_weight_holding_nan_or_inf_is_refused_naming_the_file_and_tensor(model_dir, char_tokenizer, value):
    """One NaN in ctc.weight emptied every transcript, exit 0; weights are checked as they are read."""
    from safetensors.torch import load_file, save_file

    weights = load_file(model_dir / "model.safetensors")
    weights["ctc.weight"][3, 5] = value
    save_file(weights, model_dir / "model.safetensors")
    says = f"{model_dir / 'model.safetensors'}: weight ctc.weight holds 1 NaN or infinite value (a damaged or diverged"
    with pytest.raises(UserError, match=rf"^{re.escape(says)} model\)$"):
        load_model_dir(model_dir)
    with pytest.raises(UserError, match=re.escape(says)):
        initial_weights(model_dir, seeded_model(0, char_tokenizer.vocab_size))  # train fit --model.init_from


FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_the_fast_finiteness_check_never_passes_a_nan_or_inf_weight(dtype):
    """Loading first asks aminmax whether a weight is finite (5 ms where counting took 135 ms on the built-in
    model): one NaN or infinity anywhere (first, middle, last element; alone or with others) must fail it, and
    whatever it cannot tell falls back to the count, so a damaged weight is still refused."""
    from srupp_asr.model_dir import _surely_finite

    finite = (torch.randn(4097) * 3).to(dtype)
    if _surely_finite(finite) is False and dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        pytest.fail(f"a finite {dtype} weight was not recognised as finite")
    for value in (float("nan"), float("inf"), -float("inf")):
        for where in ([0], [2048], [4096], [0, 4096]):
            damaged = finite.clone()
            damaged[where] = torch.tensor(value).to(dtype)
            if not torch.isfinite(damaged.float()).all():  # float8_e4m3fn has no infinity: it stores NaN
                assert not _surely_finite(damaged), (dtype, value, where)
    assert _surely_finite(torch.empty(0, dtype=dtype))
    assert not _surely_finite(torch.zeros(3, dtype=torch.complex64))  # the caller counts
    assert _surely_finite(torch.arange(5))  # integers are finite


def test_a_nan_weight_in_a_shard_is_refused_naming_the_shard(sharded_dir):
    from safetensors.torch import load_file, save_file

    shard = sharded_dir / SHARDS[-1]
    weights = load_file(shard)
    key = next(k for k, v in weights.items() if v.is_floating_point())
    weights[key].view(-1)[0] = float("nan")
    save_file(weights, shard)
    with pytest.raises(UserError, match=rf"^{re.escape(str(shard))}: weight {re.escape(key)} holds 1 NaN"):
        load_model_dir(sharded_dir)


@pytest.mark.parametrize("name", ["config.yaml", "model.safetensors.index.json", "tokenizer.model"])
@pytest.mark.parametrize("kind", ["pipe", "device"])
def test_a_model_file_that_is_a_pipe_or_a_device_is_refused_without_waiting_or_reading(sharded_dir, name, kind):
    """A FIFO as config.yaml waited for ever; config.yaml linked to /dev/zero grew to 20.8 GB."""
    path = sharded_dir / name
    path.unlink()
    if kind == "pipe":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    what = {"pipe": "a pipe", "device": "a device"}[kind]
    err = error_within(10, lambda: load_model_dir(sharded_dir))
    assert isinstance(err, UserError)
    assert re.match(rf"^{re.escape(str(path))}: .* is not a regular file \({what}; save it", str(err))


def test_a_sharded_model_is_loaded_one_shard_at_a_time(tmp_path, char_tokenizer, monkeypatch):
    """Each shard's stored tensors are cast into the model and freed before the next shard is read, and the model
    gets every weight (float16 shards, cast back to float32)."""
    import weakref

    import srupp_asr.model_dir as model_dir

    model = seeded_model(0, char_tokenizer.vocab_size)
    out = model_dir.export_model(
        model.state_dict(),
        model.config,
        char_tokenizer.path,
        tmp_path / "m",
        dtype=torch.float16,
        max_shard_bytes=20_000,
    )
    read, alive_at_read = model_dir._read_safetensors, []
    earlier: list[weakref.ref] = []

    def reading(path, shapes_only):
        if not shapes_only:
            alive_at_read.append(sum(ref() is not None for ref in earlier))
        found = read(path, shapes_only)
        if not shapes_only:
            earlier.extend(weakref.ref(t) for t in found.values())
        return found

    monkeypatch.setattr(model_dir, "_read_safetensors", reading)
    loaded, _ = model_dir.load_model_dir(out, "cpu")
    assert len(alive_at_read) == len(list(out.glob("model-*.safetensors"))) > 2
    assert alive_at_read == [0] * len(alive_at_read)
    for key, value in model.state_dict().items():
        stored = value.half().float() if value.is_floating_point() and not model_dir.is_cmvn_key(key) else value
        torch.testing.assert_close(loaded.state_dict()[key], stored, rtol=0, atol=0)
