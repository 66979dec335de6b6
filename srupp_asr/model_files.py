"""The files of a model directory and of an LM directory, read without torch: the names, ``config.yaml``'s checks,
the weights files (a single ``model.safetensors``, or shards and their index) and the refusal of pickles.

:mod:`srupp_asr.model_dir` builds torch networks from them (and writes them); :mod:`srupp_asr.runtime` builds numpy
networks from them. A directory from a stranger is treated as untrusted: only YAML, JSON, safetensors and
sentencepiece are parsed, and a file that could be a pickle is refused.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from srupp_asr.audio import SAMPLE_RATE
from srupp_asr.checks import lm_weight_problem
from srupp_asr.errors import UserError, first_line
from srupp_asr.fileio import MAX_CONFIG_BYTES, read_text, read_yaml_mapping
from srupp_asr.tokenizer import Tokenizer

FORMAT_VERSION = 1
CONFIG_FILE = "config.yaml"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"  # present instead of WEIGHTS_FILE when the weights are sharded
SHARD_FILE = "model-{:05d}-of-{:05d}.safetensors"
TOKENIZER_FILE = "tokenizer.model"
LM_SUBDIR = "lm"  # a model directory's own LM (srupp_asr.lm)
FUSION_WEIGHT_KEY = "fusion_weight"  # in an LM's config.yaml: the fusion weight to use it with by default
LEXICON_WEIGHT_KEY = "lexicon_weight"  # ... and the weight of its word list (srupp_asr.decoding.lexicon)
LENGTH_PENALTY_KEY = "length_penalty"  # ... and the length penalty to decode with when it is fused
T = TypeVar("T")


def read_model_config(model_dir: str | os.PathLike) -> dict[str, Any]:
    """The checked contents of ``model_dir/config.yaml`` (format_version 1)."""
    path = Path(model_dir) / CONFIG_FILE
    if not path.exists():
        raise UserError(f"{path}: not found (not a srupp-asr model directory)")
    data = read_yaml_mapping(path, "model config")
    if "format_version" not in data:
        raise UserError(f"{path}: no format_version (not a srupp-asr model config)")
    if data["format_version"] != FORMAT_VERSION:
        version = data["format_version"]
        raise UserError(f"{path}: unknown format_version {version!r} (this srupp-asr reads {FORMAT_VERSION})")
    if data.get("sample_rate", SAMPLE_RATE) != SAMPLE_RATE:
        raise UserError(f"{path}: sample_rate {data['sample_rate']!r} is not supported (the model takes {SAMPLE_RATE})")
    if not isinstance(data.get("model"), dict):
        raise UserError(f"{path}: has no model settings (a 'model:' mapping)")
    return data


def check_fusion_weight(value: Any, what: str) -> float:
    """``value`` as a fusion weight (:func:`~srupp_asr.checks.lm_weight_problem`); a one-line UserError
    starting with ``what`` if not."""
    problem = lm_weight_problem(value)
    if problem:
        raise UserError(f"{what} {problem}")
    return float(value)


def read_fusion_weight(lm_dir: str | os.PathLike) -> float | None:
    """The fusion weight recorded in ``lm_dir/config.yaml`` (None when it records none, as ``train-lm`` output);
    a missing or unreadable config, or a bad weight, is a one-line UserError naming the file."""
    config_path = lm_config_path(lm_dir)
    value = read_yaml_mapping(config_path, "LM config").get(FUSION_WEIGHT_KEY)
    return None if value is None else check_fusion_weight(value, f"{config_path}: {FUSION_WEIGHT_KEY}")


def read_lexicon_weight(lm_dir: str | os.PathLike) -> float | None:
    """The word list weight recorded in ``lm_dir/config.yaml`` (None when it records none); a bad one is a
    one-line UserError naming the file."""
    config_path = lm_config_path(lm_dir)
    value = read_yaml_mapping(config_path, "LM config").get(LEXICON_WEIGHT_KEY)
    return None if value is None else check_fusion_weight(value, f"{config_path}: {LEXICON_WEIGHT_KEY}")


def read_length_penalty(lm_dir: str | os.PathLike) -> float | None:
    """The length penalty recorded in ``lm_dir/config.yaml`` (None when it records none); a bad one is a one-line
    UserError naming the file."""
    from srupp_asr.decoding.options import length_penalty_problem

    config_path = lm_config_path(lm_dir)
    value = read_yaml_mapping(config_path, "LM config").get(LENGTH_PENALTY_KEY)
    if value is not None and length_penalty_problem(value):
        raise UserError(f"{config_path}: {LENGTH_PENALTY_KEY} {length_penalty_problem(value)}")
    return None if value is None else float(value)


def lm_config_path(lm_dir: str | os.PathLike) -> Path:
    """``lm_dir/config.yaml``; a one-line UserError when ``lm_dir`` is not a folder or holds no config (a config
    that is there but not a regular file is refused as what it is when read)."""
    lm_dir = Path(lm_dir)
    if not lm_dir.is_dir():
        what = "not a directory (an LM directory holds config.yaml, weights and tokenizer.model)"
        raise UserError(f"{lm_dir}: {what if lm_dir.exists() else 'LM directory not found'}")
    config_path = lm_dir / CONFIG_FILE
    if not os.path.lexists(config_path):
        raise UserError(f"{config_path}: not found (not a srupp-asr LM directory)")
    return config_path


def read_lm_config(lm_dir: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """``lm_dir/config.yaml`` and its checked contents (format_version 1, an ``lm:`` mapping), after refusing any
    pickle in ``lm_dir``; a one-line UserError naming the file otherwise."""
    config_path = lm_config_path(lm_dir)
    check_no_pickles(Path(lm_dir))
    data = read_yaml_mapping(config_path, "LM config")
    if data.get("format_version") != FORMAT_VERSION:
        raise UserError(f"{config_path}: unknown format_version {data.get('format_version')!r}")
    if not isinstance(data.get("lm"), dict):
        what = "an ASR model, not an LM" if isinstance(data.get("model"), dict) else "no 'lm:' settings"
        raise UserError(f"{config_path}: {what}")
    return config_path, data


def read_tokenizer(folder: Path, vocab_size: int, said: str, holder: str = "a model directory") -> Tokenizer:
    """The tokenizer of a model (or LM) directory, checked to have the ``vocab_size`` pieces its config gives
    (``said``: how the error words it, e.g. ``config.yaml says vocab_size 256``)."""
    path = Path(folder) / TOKENIZER_FILE
    if not os.path.lexists(path):  # there but not a file: the reader says what it is
        raise UserError(f"{path}: not found ({holder} holds its tokenizer)")
    tokenizer = Tokenizer(path)
    if tokenizer.vocab_size != vocab_size:
        raise UserError(f"{path}: tokenizer has {tokenizer.vocab_size} pieces, {said}")
    return tokenizer


def check_same_tokenizer(lm_tokenizer: Tokenizer, asr_tokenizer: Tokenizer, lm_dir: str | os.PathLike) -> None:
    """A UserError unless the LM was trained on the ASR model's pieces (same vocabulary, same ids)."""
    same = lm_tokenizer.vocab_size == asr_tokenizer.vocab_size and all(
        lm_tokenizer.id_to_piece(i) == asr_tokenizer.id_to_piece(i) for i in range(asr_tokenizer.vocab_size)
    )
    if not same:
        raise UserError(f"{lm_dir}: the LM's tokenizer differs from the ASR model's (train the LM with its tokenizer)")


# Names of files that hold pickles (torch.save, joblib, numpy object arrays), and the first bytes of one.
PICKLE_SUFFIXES = frozenset({".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".bin", ".joblib", ".npy", ".npz", ".dill"})
_PICKLE_MAGIC = (b"PK\x03\x04", *(bytes([0x80, protocol]) for protocol in range(2, 6)))


def check_no_pickles(folder: Path, parsed: Sequence[str] = (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE)) -> None:
    """Refuse a model (or LM) directory holding a file that could be a pickle, by name or by its first bytes:
    a directory from a stranger must not suggest that anything in it is to be unpickled. ``parsed`` files, the
    weights index and the shards it lists are read by their own safe parsers and not sniffed (a safetensors header
    length can begin with 0x80)."""
    skipped = {*parsed, WEIGHTS_INDEX_FILE, *(shard.name for shard in weight_files(folder).shards)}
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        path = folder / entry.name
        if entry.name in skipped or not entry.is_file():
            continue
        by_name = path.suffix.lower() in PICKLE_SUFFIXES
        try:
            with open(path, "rb") as f:
                head = f.read(4)
        except OSError:
            head = b""
        if by_name or head.startswith(_PICKLE_MAGIC):
            raise UserError(
                f"{path}: a pickle file in a model directory is refused (model directories hold config.yaml,"
                " safetensors weights and tokenizer.model only; pickles can run code when loaded)"
            )


@dataclass(frozen=True)
class WeightFiles:
    """Where a model directory keeps its weights."""

    path: Path  # model.safetensors, or the index of the shards: the file that errors about the weights name
    shards: dict[Path, frozenset[str]]  # each shard with the tensors the index puts in it; empty for a single file
    total_size: int | None  # the index's total bytes of tensor data


# A shard is a file of the model directory itself: no separators, no "..", no hidden file.
_SHARD_NAME = re.compile(r"\w[\w.-]*\.safetensors")


def weight_files(path: str | os.PathLike) -> WeightFiles:
    """The weights files of a model directory (``path`` may also be one safetensors file or an index): the single
    model.safetensors, or the shards its index lists. The index is checked: JSON of the Hugging Face layout,
    shards that are files of this directory and exist, and no ``*.safetensors`` file it does not list."""
    path = Path(path)
    if path.is_dir():
        path = path / WEIGHTS_INDEX_FILE if (path / WEIGHTS_INDEX_FILE).exists() else path / WEIGHTS_FILE
    if path.name != WEIGHTS_INDEX_FILE:
        return WeightFiles(path, {}, None)
    try:
        index = json.loads(read_text(path, "weights index", MAX_CONFIG_BYTES))
    except (ValueError, RecursionError) as err:
        raise UserError(f"{path}: not valid JSON ({first_line(err)})") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    metadata = index.get("metadata") if isinstance(index, dict) else None
    total_size = metadata.get("total_size") if isinstance(metadata, dict) else None
    if (
        not isinstance(weight_map, dict)
        or not all(isinstance(f, str) for f in weight_map.values())
        or type(total_size) is not int
    ):
        layout = '{"metadata": {"total_size": N}, "weight_map": {tensor: file}}'
        raise UserError(f"{path}: not a safetensors weights index (expected {layout})")
    names: dict[str, set[str]] = {}
    for tensor, file in weight_map.items():
        if not _SHARD_NAME.fullmatch(file):
            raise UserError(f"{path}: maps {tensor} to {file!r}, not a .safetensors file of this directory")
        names.setdefault(file, set()).add(tensor)
    folder = path.parent
    for file in sorted(names):
        if not (folder / file).is_file():
            raise UserError(f"{folder / file}: {not_a_file(folder / file)} ({path.name} lists it)")
    for stray in sorted(folder.glob("*.safetensors")):
        if stray.name not in names:
            raise UserError(f"{stray}: a weights file that {path.name} does not list (remove one of them)")
    shards = {folder / file: frozenset(tensors) for file, tensors in sorted(names.items())}
    return WeightFiles(path, shards, total_size)


def not_a_file(path: Path) -> str:
    """Why ``path``, expected to be a file, is not one: ``not found`` or ``is a directory, not a file``."""
    return "is a directory, not a file" if path.is_dir() else "not a file" if path.exists() else "not found"


def non_finite_weight(path: Path, key: str, bad: int) -> UserError:
    """The error for weight ``key`` of ``path`` holding ``bad`` NaN or infinite values. One NaN in a weight spreads to
    every output it feeds (one in the CTC head empties every transcript), so such weights are refused when read."""
    plural = "s" if bad > 1 else ""
    return UserError(f"{path}: weight {key} holds {bad} NaN or infinite value{plural} (a damaged or diverged model)")


def weight_groups(
    path: str | os.PathLike, read_file: Callable[[Path], dict[str, T]], nbytes: Callable[[T], int]
) -> Iterator[dict[str, T]]:
    """The tensors of a model directory's weights files (:func:`weight_files`) one file at a time, each read by
    ``read_file`` (torch tensors, numpy arrays, or their shapes alone): the single file, or each shard, checked
    against the index (the index's total size, by ``nbytes`` of each tensor, after the last), so that a loader can
    free each before the next."""
    files = weight_files(path)
    if not files.shards:
        yield read_file(files.path)
        return
    total = 0
    for shard, expected in files.shards.items():
        found = read_file(shard)
        absent, extra = sorted(expected - found.keys()), sorted(found.keys() - expected)
        if absent:
            raise UserError(f"{shard}: has no tensor {absent[0]} ({files.path.name} puts it there)")
        if extra:
            elsewhere = next((s.name for s, names in files.shards.items() if extra[0] in names), None)
            where = f"which {files.path.name} puts in {elsewhere}" if elsewhere else f"not in {files.path.name}"
            raise UserError(f"{shard}: holds tensor {extra[0]}, {where}")
        total += sum(nbytes(t) for t in found.values())
        yield found
        del found  # not held while the next shard is read
    if total != files.total_size:
        raise UserError(f"{files.path}: total_size is {files.total_size}, the shards hold {total} bytes of tensors")
