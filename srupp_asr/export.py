"""From a training run to a model directory: pick the best checkpoints, average their weights, export, load.

A finished model is a directory that inference reads without unpickling anything::

    MODEL_DIR/config.yaml         format_version, sample_rate and the ASRModel constructor arguments
    MODEL_DIR/model.safetensors   the ASRModel state dict (CMVN stats included), keys without Lightning's prefix
    MODEL_DIR/tokenizer.model     the sentencepiece model the weights were trained with

or, written with a shard size limit (``--max-shard-size``) that the weights exceed, the state dict split as Hugging
Face splits it: ``model-00001-of-0000N.safetensors`` ... and ``model.safetensors.index.json`` (``{"metadata":
{"total_size": bytes of tensor data}, "weight_map": {tensor: shard file}}``). With an index, every ``*.safetensors``
file of the directory must be a shard it lists: a stray one is an error, not ignored, so a mixed-up copy is noticed.
Floating weights may be stored as float16 or bfloat16 (``--dtype``; CMVN stats stay float32); loading casts them
back into the float32 model.

``srupp-asr average --exp-dir EXP --num 10 --out MODEL_DIR`` averages the 10 best checkpoints of a run by the
metric its ``ModelCheckpoint`` monitored, as ESPnet and WeNet do. A checkpoint's score is read from the callback
state Lightning stores inside it (``best_k_models`` holds the file's own score at the moment it was written), never
from its file name. ``last.ckpt`` is left out unless ``--include-last`` asks for the final weights as well.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import logging
import math
import os
import re
import shutil
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import torch
import yaml

from srupp_asr.audio import SAMPLE_RATE
from srupp_asr.checkpoints import load_checkpoint
from srupp_asr.errors import UserError, first_line
from srupp_asr.fileio import atomic_output, atomic_write_text, make_temp_dir, read_text, read_yaml_mapping
from srupp_asr.model import ASRModel
from srupp_asr.tokenizer import Tokenizer

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
CONFIG_FILE = "config.yaml"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"  # present instead of WEIGHTS_FILE when the weights are sharded
SHARD_FILE = "model-{:05d}-of-{:05d}.safetensors"
STORAGE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
TOKENIZER_FILE = "tokenizer.model"
MODEL_PREFIX = "model."  # ASRLightningModule holds the network as ``self.model``
MODES = ("min", "max")
DEFAULT_NUM = 10
# ASRModel arguments that shape only the training loss or input noise: checkpoints may differ in them (a run
# resumed with other settings) and still be averaged; the exported config takes the best checkpoint's.
TRAINING_ONLY = frozenset({"ctc_weight", "lsm_weight", "specaugment", "dither"})


# ------------------------------------------------------------------------------------------ reading checkpoints


@dataclass(frozen=True)
class _MonitorState:
    """What one ModelCheckpoint callback recorded in a checkpoint."""

    monitor: str
    mode: str | None  # None when the callback's state key does not say
    scores: dict[str, float]  # file name -> score, the callback's top-k at the time the file was written
    last_name: str | None  # file name of the callback's last checkpoint


def _monitor_states(ckpt: Mapping[str, Any]) -> list[_MonitorState]:
    """The states of the ModelCheckpoint callbacks (with a monitored metric) stored in ``ckpt``."""
    states = []
    for key, state in (ckpt.get("callbacks") or {}).items():
        if not isinstance(state, dict) or not state.get("monitor") or not isinstance(state.get("best_k_models"), dict):
            continue
        scores = {Path(p).name: float(v) for p, v in state["best_k_models"].items()}
        last = state.get("last_model_path")
        states.append(_MonitorState(state["monitor"], _mode_of(key), scores, Path(last).name if last else None))
    return states


def _mode_of(state_key: str) -> str | None:
    """The ``mode`` in a ModelCheckpoint state key, ``"ModelCheckpoint{'monitor': ..., 'mode': 'min', ...}"``."""
    if not isinstance(state_key, str) or "{" not in state_key:
        return None
    try:
        settings = ast.literal_eval(state_key[state_key.index("{") :])
    except (ValueError, SyntaxError):
        return None
    mode = settings.get("mode") if isinstance(settings, dict) else None
    return mode if mode in MODES else None


@dataclass(frozen=True)
class ScoredCheckpoint:
    """A checkpoint file with the training step it holds and its score by the selection metric (None: unknown)."""

    path: Path
    step: int
    score: float | None
    is_last: bool


@dataclass(frozen=True)
class Selection:
    """The checkpoints chosen for averaging, best first, and the metric and mode that ranked them."""

    checkpoints: list[ScoredCheckpoint]
    metric: str | None
    mode: str | None


@dataclass(frozen=True)
class _Recorded:
    """A checkpoint file with what its ModelCheckpoint callbacks recorded."""

    path: Path
    step: int
    states: list[_MonitorState]

    def scored(self, metric: str | None) -> ScoredCheckpoint:
        """Its score by ``metric``: a top-k checkpoint's callback state lists its own file with its score."""
        name = self.path.resolve().name  # a `save_last="link"` last.ckpt is its target: score that file
        score = next((s.scores[name] for s in self.states if s.monitor == metric and name in s.scores), None)
        is_last = any(s.last_name == name and name not in s.scores for s in self.states)
        return ScoredCheckpoint(self.path, self.step, score, is_last)


def _check_distinct(paths: Sequence[Path]) -> None:
    """Raise a UserError naming the second of two paths to one file (a checkpoint given twice would count double)."""
    seen: dict[tuple[int, int], Path] = {}
    for path in paths:
        try:
            stat = path.stat()
        except OSError:
            continue  # a missing file: loading it says so
        first = seen.setdefault((stat.st_dev, stat.st_ino), path)
        if first is not path:
            same = "given twice" if first == path else f"the same file as {first}"
            raise UserError(f"{path}: {same}; each checkpoint is averaged once")


def _read_record(path: Path) -> _Recorded:
    ckpt = load_checkpoint(path)
    return _Recorded(path, int(ckpt.get("global_step", -1)), _monitor_states(ckpt))


def _resolve_metric(metric: str | None, mode: str | None, states: list[_MonitorState], where: Path) -> tuple[str, str]:
    """The metric to rank by (the run's monitored one when not given) and its mode (the callback's when not given)."""
    monitors = sorted({s.monitor for s in states})
    if metric is None:
        if not monitors:
            raise UserError(f"{where}: the checkpoints record no monitored metric (ModelCheckpoint monitor)")
        if len(monitors) > 1:
            raise UserError(f"{where}: the checkpoints monitor several metrics ({', '.join(monitors)}); pick one")
        metric = monitors[0]
    elif metric not in monitors:
        found = ", ".join(monitors) or "none"
        raise UserError(f"{where}: no checkpoint scored by {metric} (monitored metrics: {found})")
    recorded = next((s.mode for s in states if s.monitor == metric and s.mode), None)
    if mode is None:
        mode = recorded or "min"
    elif recorded is not None and mode != recorded:
        log.warning("%s: ranking by %s with mode %s; training kept checkpoints by %s", where, metric, mode, recorded)
    if mode not in MODES:
        raise UserError(f"{where}: unknown mode {mode!r} (choose from {', '.join(MODES)})")
    return metric, mode


def _ranked(checkpoints: list[ScoredCheckpoint], mode: str) -> list[ScoredCheckpoint]:
    """Best first (NaN scores last); among equal scores the later step first."""
    sign = 1.0 if mode == "min" else -1.0

    def key(c: ScoredCheckpoint) -> tuple[bool, float, int]:
        score = float("nan") if c.score is None else c.score
        return math.isnan(score), 0.0 if math.isnan(score) else sign * score, -c.step

    return sorted(checkpoints, key=key)


def select(
    ckpts: str | os.PathLike | Sequence[str | os.PathLike],
    num: int | None = None,
    metric: str | None = None,
    mode: str | None = None,
    include_last: bool = False,
) -> Selection:
    """:func:`select_checkpoints` with the scores, metric and mode it used (``num=None``: 10 of a directory,
    all of a list)."""
    if num is not None and num < 1:
        raise UserError(f"--num must be at least 1, got {num}")
    if isinstance(ckpts, str | os.PathLike):
        return _select_from_dir(Path(ckpts), DEFAULT_NUM if num is None else num, metric, mode, include_last)
    if include_last:
        raise UserError("include_last applies to a checkpoint directory; list last.ckpt itself instead")
    return _select_from_list([Path(p) for p in ckpts], num, metric, mode)


def _select_from_dir(folder: Path, num: int, metric: str | None, mode: str | None, include_last: bool) -> Selection:
    if not folder.is_dir():
        raise UserError(f"{folder}: checkpoint directory not found")
    records, seen = [], set()
    for path in sorted(p for p in folder.glob("*.ckpt") if p.is_file()):
        stat = path.stat()
        if (stat.st_dev, stat.st_ino) not in seen:  # a last.ckpt that links to a top-k file is that file
            seen.add((stat.st_dev, stat.st_ino))
            records.append(_read_record(path))
    if not records:
        raise UserError(f"{folder}: no checkpoints (*.ckpt) found")
    metric, mode = _resolve_metric(metric, mode, [s for r in records for s in r.states], folder)
    described = [r.scored(metric) for r in records]
    chosen = _ranked([c for c in described if c.score is not None], mode)[:num]
    if not chosen:
        raise UserError(f"{folder}: no checkpoint records a {metric} score of its own")
    if len(chosen) < num:
        log.warning("%s: asked for the %d best checkpoints, only %d have a %s score", folder, num, len(chosen), metric)
    if include_last:
        lasts = sorted((c for c in described if c.is_last), key=lambda c: c.step)
        if not lasts:
            log.warning("%s: no last checkpoint to include", folder)
        elif lasts[-1].step in {c.step for c in chosen}:
            log.warning("%s: %s holds the step of a chosen checkpoint; not added twice", folder, lasts[-1].path.name)
        else:
            chosen.append(lasts[-1])
    return Selection(chosen, metric, mode)


def _select_from_list(paths: list[Path], num: int | None, metric: str | None, mode: str | None) -> Selection:
    if not paths:
        raise UserError("no checkpoints given")
    records = [_read_record(p) for p in paths]
    rank = num is not None and num < len(paths)
    try:
        metric, mode = _resolve_metric(metric, mode, [s for r in records for s in r.states], paths[0])
    except UserError:
        if rank or metric is not None:
            raise
        metric = mode = None  # averaging them all: scores are only shown, so none is fine
    described = [r.scored(metric) for r in records]
    if not rank:
        if num is not None and num > len(paths):
            log.warning("asked for the %d best checkpoints, %d were given: averaging them all", num, len(paths))
        return Selection(described, metric, mode)
    for c in described:
        if c.score is None:
            raise UserError(f"{c.path}: records no {metric} score of its own, so it cannot be ranked")
    return Selection(_ranked(described, mode)[:num], metric, mode)


def select_checkpoints(
    ckpt_dir: str | os.PathLike | Sequence[str | os.PathLike],
    num: int = DEFAULT_NUM,
    metric: str | None = None,
    mode: str | None = None,
    include_last: bool = False,
) -> list[Path]:
    """The ``num`` best checkpoints (best first) of a checkpoint directory, or of a list of checkpoint files, by
    ``metric`` (default: the one the run monitored) and ``mode`` (default: the run's); last.ckpt only if asked."""
    return [c.path for c in select(ckpt_dir, num, metric, mode, include_last).checkpoints]


# ------------------------------------------------------------------------------------------ averaging


def _model_arg_names() -> list[str]:
    """ASRModel's constructor arguments that a training run sets (vocab_size comes from the tokenizer)."""
    return [name for name in inspect.signature(ASRModel).parameters if name != "vocab_size"]


def _model_hparams(ckpt: Mapping[str, Any]) -> dict[str, Any]:
    hparams = ckpt.get("hyper_parameters") or {}
    return {name: hparams[name] for name in _model_arg_names() if name in hparams}


def _is_cmvn(key: str) -> bool:
    return key.endswith(("cmvn.mean", "cmvn.istd"))


def average_checkpoints(paths: Sequence[str | os.PathLike]) -> dict[str, torch.Tensor]:
    """The mean of the checkpoints' weights (float64 sums, cast back); integer buffers from the latest checkpoint;
    CMVN stats, which must be identical, as they are. Keys as in the checkpoints (Lightning's ``model.`` prefix)."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise ValueError("no checkpoints to average")
    _check_distinct(paths)
    sums: dict[str, torch.Tensor] = {}
    kept: dict[str, torch.Tensor] = {}  # CMVN and integer buffers: not averaged
    first: dict[str, torch.Tensor] = {}
    first_hparams: dict[str, Any] = {}
    latest_step = None
    for index, path in enumerate(paths):
        ckpt = load_checkpoint(path)
        weights, hparams, step = ckpt["state_dict"], _model_hparams(ckpt), int(ckpt.get("global_step", -1))
        if index == 0:
            first, first_hparams = weights, hparams
        else:
            _check_same_model(path, paths[0], weights, first, hparams, first_hparams)
        newest = latest_step is None or step >= latest_step
        latest_step = step if newest else latest_step
        for key, value in weights.items():
            if _is_cmvn(key):
                kept.setdefault(key, value.clone())
            elif value.is_floating_point():
                total = value.to(torch.float64, copy=True)
                sums[key] = total if index == 0 else sums[key].add_(total)
            elif newest:
                kept[key] = value.clone()
    count = len(paths)
    return {key: kept[key] if key in kept else (sums[key] / count).to(value.dtype) for key, value in first.items()}


def _check_same_model(
    path: Path,
    first_path: Path,
    weights: Mapping[str, torch.Tensor],
    first: Mapping[str, torch.Tensor],
    hparams: Mapping[str, Any],
    first_hparams: Mapping[str, Any],
) -> None:
    """Raise UserError unless ``path`` holds the same network (settings, weight names and shapes, CMVN stats)."""
    for name in sorted((set(hparams) | set(first_hparams)) - TRAINING_ONLY):
        if hparams.get(name) != first_hparams.get(name):
            detail = f"{name} is {hparams.get(name)!r}, {first_path.name} has {first_hparams.get(name)!r}"
            raise UserError(f"{path}: not the same model as {first_path.name} ({detail})")
    if set(weights) != set(first):
        diff = sorted(set(weights) ^ set(first))
        raise UserError(f"{path}: its weights differ in names from {first_path.name}'s ({', '.join(diff[:3])})")
    for key, value in weights.items():
        ref = first[key]
        if value.shape != ref.shape or value.dtype != ref.dtype:
            detail = f"{key} is {value.dtype} {tuple(value.shape)}, there {ref.dtype} {tuple(ref.shape)}"
            raise UserError(f"{path}: not the same model as {first_path.name} ({detail})")
        if _is_cmvn(key) and not torch.equal(value, ref):
            raise UserError(f"{path}: its CMVN stats ({key}) differ from {first_path.name}'s (a different run?)")


def model_config_from_checkpoint(
    path: str | os.PathLike, tokenizer: str | os.PathLike | None = None
) -> tuple[dict[str, Any], Path]:
    """ASRModel's constructor arguments of a training checkpoint and its tokenizer path (``tokenizer`` overrides the
    one the run used); vocab_size is the tokenizer's."""
    path = Path(path)
    ckpt = load_checkpoint(path)
    hparams = ckpt.get("hyper_parameters")
    if not isinstance(hparams, dict):
        raise UserError(f"{path}: has no hyper_parameters (not a srupp-asr training checkpoint)")
    if tokenizer is None:
        if not hparams.get("tokenizer"):
            raise UserError(f"{path}: names no tokenizer; give one with --tokenizer")
        tokenizer = hparams["tokenizer"]
        if not Path(tokenizer).is_file():
            raise UserError(f"{tokenizer}: the run's tokenizer (named in {path.name}) not found; give --tokenizer")
    tokenizer = Path(tokenizer)
    return {"vocab_size": Tokenizer(tokenizer).vocab_size, **_model_hparams(ckpt)}, tokenizer


# ------------------------------------------------------------------------------------------ model directories


def _strip_prefix(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """ASRModel's keys: Lightning's ``model.`` prefix removed where every key has it."""
    if state_dict and all(k.startswith(MODEL_PREFIX) for k in state_dict):
        return {k[len(MODEL_PREFIX) :]: v for k, v in state_dict.items()}
    return dict(state_dict)


def weights_problem(model: torch.nn.Module, weights: Mapping[str, torch.Tensor]) -> str | None:
    """What keeps ``weights`` from loading into ``model`` exactly (missing, unexpected or misshapen), or None."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in weights]
    unexpected = [k for k in weights if k not in expected]
    if missing or unexpected:
        parts = [
            f"{label} weights {_few(keys)}"
            for label, keys in (("missing", missing), ("unexpected", unexpected))
            if keys
        ]
        return "; ".join(parts)
    for key, value in expected.items():
        if weights[key].shape != value.shape:
            return f"{key} has shape {tuple(weights[key].shape)}, the model expects {tuple(value.shape)}"
    return None


def _few(keys: Sequence[str]) -> str:
    shown = ", ".join(keys[:3])
    return shown if len(keys) <= 3 else f"{shown} (+{len(keys) - 3} more)"


def check_replaceable(out_dir: str | os.PathLike) -> None:
    """Raise UserError unless ``out_dir`` is free, an empty directory or a model directory (which export replaces)."""
    out_dir = Path(out_dir)
    if not out_dir.exists():
        return
    has_weights = (out_dir / WEIGHTS_FILE).is_file() or (out_dir / WEIGHTS_INDEX_FILE).is_file()
    is_model = (out_dir / CONFIG_FILE).is_file() and has_weights
    if not out_dir.is_dir() or not (is_model or not any(out_dir.iterdir())):
        raise UserError(f"{out_dir}: exists and is not a srupp-asr model directory; refusing to replace it")


def export_model(
    state_dict: Mapping[str, torch.Tensor],
    model_config: Mapping[str, Any],
    tokenizer_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    source: Mapping[str, Any] | None = None,
    dtype: torch.dtype = torch.float32,
    max_shard_bytes: int | None = None,
) -> Path:
    """Write a model directory (config.yaml, model.safetensors, tokenizer.model) atomically; ``source`` (optional)
    records where the weights came from. An existing model directory at ``out_dir`` is replaced. Floating weights
    are stored in ``dtype`` (CMVN stats keep float32); ``max_shard_bytes`` splits them (see :func:`write_model_dir`)."""
    out_dir, tokenizer_path = Path(out_dir), Path(tokenizer_path)
    tokenizer = Tokenizer(tokenizer_path)
    if tokenizer.vocab_size != model_config.get("vocab_size"):
        vocab = model_config.get("vocab_size")
        raise UserError(
            f"{tokenizer_path}: tokenizer has {tokenizer.vocab_size} pieces, model_config vocab_size {vocab}"
        )
    model = ASRModel(**model_config)
    weights = {k: v.detach().to("cpu").contiguous().clone() for k, v in _strip_prefix(state_dict).items()}
    problem = weights_problem(model, weights)
    if problem:
        raise UserError(f"{tokenizer_path}: the weights do not fit the model with this tokenizer ({problem})")
    config: dict[str, Any] = {"format_version": FORMAT_VERSION, "sample_rate": SAMPLE_RATE, "model": model.config}
    if source:
        config["source"] = dict(source)
    return write_model_dir(out_dir, config, _cast_for_storage(weights, dtype, out_dir), tokenizer_path, max_shard_bytes)


def _cast_for_storage(
    weights: Mapping[str, torch.Tensor], dtype: torch.dtype, out_dir: Path
) -> dict[str, torch.Tensor]:
    """``weights`` with their floating tensors in ``dtype``; CMVN stats and integer buffers keep their own dtype."""
    if dtype not in STORAGE_DTYPES.values():
        raise ValueError(f"storage dtype must be one of {', '.join(STORAGE_DTYPES)}, got {dtype}")
    stored = {k: v.to(dtype) if v.is_floating_point() and not _is_cmvn(k) else v for k, v in weights.items()}
    for key, value in stored.items():
        if value is not weights[key] and value.isinf().any() and not weights[key].isinf().any():
            raise UserError(f"{out_dir}: {key} has values beyond the range of {dtype} (store as bfloat16 or float32)")
    return stored


def write_model_dir(
    out_dir: str | os.PathLike,
    config: Mapping[str, Any],
    weights: Mapping[str, torch.Tensor],
    tokenizer_path: str | os.PathLike,
    max_shard_bytes: int | None = None,
) -> Path:
    """Write ``config.yaml``, ``model.safetensors`` and a copy of the tokenizer as the directory ``out_dir``, all or
    nothing: the files go to a hidden sibling that replaces ``out_dir`` (an empty or model directory) at the end.
    Weights that would make a file larger than ``max_shard_bytes`` are written as shards of at most that size with
    an index (:data:`SHARD_FILE`, :data:`WEIGHTS_INDEX_FILE`); a single tensor too big for one is a UserError."""
    out_dir = Path(out_dir)
    check_replaceable(out_dir)
    shards = _pack_shards(weights, max_shard_bytes, out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_temp_dir(out_dir)  # what a killed export left beside it is removed first
    try:
        atomic_write_text(tmp / CONFIG_FILE, yaml.safe_dump(dict(config), sort_keys=False))
        _write_weights(tmp, shards)
        with atomic_output(tmp / TOKENIZER_FILE) as path:
            shutil.copyfile(tokenizer_path, path)
        _swap_in(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


_SAFETENSORS_METADATA = {"format_version": str(FORMAT_VERSION)}
# What a safetensors file holds besides its tensors' data, at most: the header length, the header's braces and
# metadata, and the spaces padding the header to 8 bytes.
_FILE_OVERHEAD = 8 + 2 + len(json.dumps({"__metadata__": _SAFETENSORS_METADATA})) + 7


def _stored_bytes(name: str, tensor: torch.Tensor) -> int:
    """At most what ``tensor`` adds to a safetensors file: its data and its header entry (here with the longest
    dtype name, 20-digit offsets, json.dumps' spaces and braces, which count for more than the comma it needs)."""
    entry = {name: {"dtype": "F8_E4M3FNUZ", "shape": list(tensor.shape), "data_offsets": [2**64, 2**64]}}
    return tensor.nbytes + len(json.dumps(entry))


def _pack_shards(
    weights: Mapping[str, torch.Tensor], max_bytes: int | None, out_dir: Path
) -> list[dict[str, torch.Tensor]]:
    """``weights``, in order, cut into consecutive groups that each make a safetensors file of at most
    ``max_bytes`` (one group when they all fit or there is no limit)."""
    if max_bytes is None:
        return [dict(weights)]
    budget = max_bytes - _FILE_OVERHEAD
    shards: list[dict[str, torch.Tensor]] = [{}]
    used = 0
    for name, tensor in weights.items():
        cost = _stored_bytes(name, tensor)
        if cost > budget:
            raise UserError(
                f"{out_dir}: tensor {name} takes {tensor.nbytes} bytes, more than fits in a shard of {max_bytes} bytes"
            )
        if used + cost > budget:
            shards.append({})
            used = 0
        shards[-1][name] = tensor
        used += cost
    return shards


def _write_weights(folder: Path, shards: Sequence[Mapping[str, torch.Tensor]]) -> None:
    """``folder/model.safetensors`` for one group of tensors; numbered shards and their index for several."""
    from safetensors.torch import save_file

    if len(shards) == 1:
        names = [WEIGHTS_FILE]
    else:
        names = [SHARD_FILE.format(i, len(shards)) for i in range(1, len(shards) + 1)]
    for name, shard in zip(names, shards, strict=True):
        with atomic_output(folder / name) as path:
            save_file(dict(shard), path, metadata=_SAFETENSORS_METADATA)
    if len(shards) > 1:
        weight_map = {key: name for name, shard in zip(names, shards, strict=True) for key in shard}
        total = sum(t.nbytes for shard in shards for t in shard.values())
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        atomic_write_text(folder / WEIGHTS_INDEX_FILE, json.dumps(index, indent=2) + "\n")


def _swap_in(new: Path, target: Path) -> None:
    """Rename directory ``new`` to ``target``; an existing ``target`` is moved aside first and removed after."""
    if not target.exists():
        os.rename(new, target)
        return
    old = target.with_name(f".{target.name}.{uuid.uuid4().hex}.old")
    os.rename(target, old)
    try:
        os.rename(new, target)
    except BaseException:
        os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


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


def load_model(model_dir: str | os.PathLike, device: str | torch.device = "cpu") -> tuple[ASRModel, Tokenizer]:
    """The model (in eval mode, on ``device``) and tokenizer of a model directory; reads no pickle.

    The directory is treated as untrusted: a file that could be a pickle is refused
    (:func:`check_no_pickles`), the config is checked against the weights file's header before any real memory
    is allocated (:func:`build_with_weights`), and only YAML, safetensors and sentencepiece are parsed."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        what = "is a file, not a model directory" if model_dir.exists() else "model directory not found"
        raise UserError(f"{model_dir}: {what}")
    check_no_pickles(model_dir)
    config_path, tokenizer_path = model_dir / CONFIG_FILE, model_dir / TOKENIZER_FILE
    config = read_model_config(model_dir)
    tokenizer = None

    def check_tokenizer(skeleton: torch.nn.Module) -> None:
        nonlocal tokenizer
        if not tokenizer_path.is_file():
            raise UserError(f"{tokenizer_path}: not found (a model directory holds its tokenizer)")
        tokenizer = Tokenizer(tokenizer_path)
        if tokenizer.vocab_size != skeleton.vocab_size:
            detail = f"tokenizer has {tokenizer.vocab_size} pieces, {CONFIG_FILE} says vocab_size {skeleton.vocab_size}"
            raise UserError(f"{tokenizer_path}: {detail}")

    model = build_with_weights(lambda: ASRModel(**config["model"]), config_path, model_dir, "model", check_tokenizer)
    return model.to(device).eval(), tokenizer


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
        index = json.loads(read_text(path, "weights index"))
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
            raise UserError(f"{folder / file}: {_not_a_file(folder / file)} ({path.name} lists it)")
    for stray in sorted(folder.glob("*.safetensors")):
        if stray.name not in names:
            raise UserError(f"{stray}: a weights file that {path.name} does not list (remove one of them)")
    shards = {folder / file: frozenset(tensors) for file, tensors in sorted(names.items())}
    return WeightFiles(path, shards, total_size)


def _read_weights(path: str | os.PathLike, shapes_only: bool) -> dict[str, torch.Tensor]:
    """The tensors of a model directory's weights files (:func:`weight_files`), or with ``shapes_only`` meta
    tensors of their shapes and stored dtypes (headers only); shards are checked against their index."""
    files = weight_files(path)
    if not files.shards:
        return _read_safetensors(files.path, shapes_only)
    tensors: dict[str, torch.Tensor] = {}
    for shard, expected in files.shards.items():
        found = _read_safetensors(shard, shapes_only)
        absent, extra = sorted(expected - found.keys()), sorted(found.keys() - expected)
        if absent:
            raise UserError(f"{shard}: has no tensor {absent[0]} ({files.path.name} puts it there)")
        if extra:
            elsewhere = next((s.name for s, names in files.shards.items() if extra[0] in names), None)
            where = f"which {files.path.name} puts in {elsewhere}" if elsewhere else f"not in {files.path.name}"
            raise UserError(f"{shard}: holds tensor {extra[0]}, {where}")
        tensors.update(found)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    if total != files.total_size:
        raise UserError(f"{files.path}: total_size is {files.total_size}, the shards hold {total} bytes of tensors")
    return tensors


# The dtype names of the safetensors format (its header's "dtype" field) that torch holds.
_SAFETENSORS_DTYPES = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


def _not_a_file(path: Path) -> str:
    """Why ``path``, expected to be a file, is not one: ``not found`` or ``is a directory, not a file``."""
    return "is a directory, not a file" if path.is_dir() else "not a file" if path.exists() else "not found"


def _read_safetensors(path: Path, shapes_only: bool) -> dict[str, torch.Tensor]:
    """The tensors of one safetensors file, or meta tensors of their shapes and dtypes (no pickle)."""
    from safetensors import safe_open

    if not path.is_file():
        raise UserError(f"{path}: {_not_a_file(path)} (a model directory holds its weights)")
    try:
        with safe_open(path, framework="pt") as f:
            if not shapes_only:
                return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
            slices = {k: f.get_slice(k) for k in f.keys()}  # noqa: SIM118
            unknown = sorted({s.get_dtype() for s in slices.values()} - _SAFETENSORS_DTYPES.keys())
            if unknown:
                raise ValueError(f"tensors of dtype {unknown[0]}, which a model cannot hold")
            return {
                k: torch.empty(s.get_shape(), dtype=_SAFETENSORS_DTYPES[s.get_dtype()], device="meta")
                for k, s in slices.items()
            }
    except Exception as err:  # safetensors reports a bad header, truncation or a bad dtype with its own error types
        raise UserError(f"{path}: not a readable safetensors file ({first_line(err)})") from None


def read_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The tensors of a model directory, single file or shards (or of one safetensors file), as stored; no pickle."""
    return _read_weights(path, shapes_only=False)


def initial_weights(
    path: str | os.PathLike, model: torch.nn.Module, tokenizer: Tokenizer | None = None
) -> dict[str, torch.Tensor]:
    """Weights to start training ``model`` from (``train fit --model.init_from PATH``): a model directory
    (``export``/``average`` output, read without pickle) or a training checkpoint (``.ckpt``, loaded with
    ``weights_only``). They must fit ``model`` exactly (every name and shape), and a model directory's tokenizer
    must have ``tokenizer``'s pieces (the same ids must mean the same text). Returned in the model's dtypes, any
    stored dtype (float16 shards, say) cast back. Every problem is a one-line UserError naming ``path``."""
    path = Path(path)
    if path.is_dir():
        check_no_pickles(path)
        weights = read_weights(path)
        theirs = path / TOKENIZER_FILE
        if tokenizer is not None and theirs.is_file() and Tokenizer(theirs).pieces() != tokenizer.pieces():
            raise UserError(
                f"{path}: its tokenizer ({theirs.name}) differs from the training tokenizer {tokenizer.path}"
                " (the same ids would mean other pieces); train with its tokenizer"
            )
    elif path.is_file():
        weights = _strip_prefix(load_checkpoint(path)["state_dict"])
    else:
        raise UserError(f"{path}: not found (init_from takes a model directory or a training checkpoint)")
    problem = weights_problem(model, weights)
    if problem:
        raise UserError(f"{path}: does not fit the model being trained ({problem})")
    expected = model.state_dict()
    return {key: value.to(expected[key].dtype) for key, value in weights.items()}


def read_weight_shapes(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The tensors :func:`read_weights` would return, as meta tensors of their shapes (reads the headers only)."""
    return _read_weights(path, shapes_only=True)


def build_with_weights(
    make: Callable[[], torch.nn.Module],
    config_path: Path,
    weights: Path,
    what: str,
    check: Callable[[torch.nn.Module], None] | None = None,
) -> torch.nn.Module:
    """``make()`` with the weights of ``weights`` (a model directory, or one safetensors file), checked before
    anything big is allocated: the module is first built on the meta device (no memory) and compared with the
    safetensors headers by shape (a float16 or bfloat16 copy of float32 weights is fine: loading casts it), so a
    config asking for a huge network fails on the shapes instead of exhausting memory. ``check(skeleton)`` runs in
    between."""
    try:
        with torch.device("meta"):
            skeleton = make()
    except (TypeError, ValueError) as err:
        raise UserError(f"{config_path}: bad {what} settings ({first_line(err)})") from None
    if check is not None:
        check(skeleton)
    problem = weights_problem(skeleton, read_weight_shapes(weights))
    if problem:
        raise UserError(f"{weight_files(weights).path}: {problem}")
    module = make()
    module.load_state_dict(read_weights(weights), strict=True)
    return module


# ------------------------------------------------------------------------------------------ command line


def _checkpoint_folder(exp_dir: Path) -> Path:
    """``EXP/checkpoints`` (where ``srupp-asr train`` writes them), or ``EXP`` itself when it holds the checkpoints."""
    from srupp_asr.train import checkpoint_dir

    if not exp_dir.is_dir():
        raise UserError(f"{exp_dir}: experiment directory not found")
    folder = Path(checkpoint_dir(exp_dir))
    if folder.is_dir():
        return folder
    if any(exp_dir.glob("*.ckpt")):
        return exp_dir
    raise UserError(f"{exp_dir}: no checkpoints (no {folder.name}/ folder, no *.ckpt files)")


_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?)\s*([a-z]*)\s*", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_size(text: str, name: str = "size") -> int:
    """Bytes of a size such as ``15MiB``, ``500KB``, ``1.5GB`` or ``1000000``; anything else is a UserError that
    names the option ``name``."""
    match = _SIZE.fullmatch(text)
    unit = _SIZE_UNITS.get(match[2].lower()) if match else None
    try:
        size = int(Decimal(match[1]) * unit) if unit else 0
    except InvalidOperation:
        size = 0
    if size < 1:
        raise UserError(f"{name}: {text!r} is not a size (examples: 15MiB, 500KB, 1000000 bytes)")
    return size


def average_command(args: argparse.Namespace) -> int:
    """``srupp-asr average``: average the best checkpoints of a run and export them as a model directory."""
    max_shard_bytes = parse_size(args.max_shard_size, "--max-shard-size") if args.max_shard_size else None
    check_replaceable(args.out)  # before the work, not after it
    ckpts = args.ckpts if args.ckpts else _checkpoint_folder(Path(args.exp_dir))
    selection = select(ckpts, args.num, args.metric, args.mode, args.include_last)
    paths = [c.path for c in selection.checkpoints]
    weights = average_checkpoints(paths)
    config, tokenizer = model_config_from_checkpoint(paths[0], args.tokenizer)
    source = {"checkpoints": [c.path.name for c in selection.checkpoints]}
    if selection.metric:
        source.update(metric=selection.metric, mode=selection.mode)
        source["scores"] = [c.score for c in selection.checkpoints]
    dtype = STORAGE_DTYPES[args.dtype]
    out = export_model(weights, config, tokenizer, args.out, source, dtype=dtype, max_shard_bytes=max_shard_bytes)
    ranked = f" (best by {selection.metric}, {selection.mode})" if selection.metric else ""
    print(f"averaged {len(paths)} checkpoint{'s' if len(paths) > 1 else ''}{ranked}:")
    for c in selection.checkpoints:
        score = f"{selection.metric}={c.score:.4f}" if c.score is not None else "(last)" if c.is_last else ""
        print(f"  {c.path}  step {c.step}  {score}".rstrip())
    print(f"wrote {out} ({', '.join(sorted(p.name for p in out.iterdir()))})")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the ``average`` sub-command."""
    p = subparsers.add_parser("average", help="average the best checkpoints of a run and export a model directory")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--exp-dir", metavar="EXP", help="the run's trainer.default_root_dir (checkpoints in EXP/checkpoints)"
    )
    where.add_argument("--ckpts", nargs="+", metavar="CKPT", help="checkpoint files to average (all, unless --num)")
    p.add_argument("--num", type=int, help=f"how many of the best checkpoints to average (default {DEFAULT_NUM})")
    p.add_argument("--metric", help="the validation metric to rank by (default: the one the run monitored)")
    p.add_argument("--mode", choices=MODES, help="min or max is best (default: the run's checkpoint mode)")
    p.add_argument("--include-last", action="store_true", help="average last.ckpt (the final weights) as well")
    p.add_argument("--tokenizer", metavar="MODEL", help="tokenizer to ship (default: the one the run used)")
    p.add_argument(
        "--dtype",
        choices=list(STORAGE_DTYPES),
        default="float32",
        help="store the floating weights in this type, CMVN stats excepted (default float32; loading casts back)",
    )
    p.add_argument(
        "--max-shard-size",
        metavar="SIZE",
        help="split the weights into safetensors shards of at most SIZE (15MiB, 500KB, bytes) plus an index"
        " when they exceed it (default: one model.safetensors)",
    )
    p.add_argument("--out", required=True, metavar="MODEL_DIR", help="model directory to write (replaced if it exists)")
    p.set_defaults(func=average_command)
    return p
