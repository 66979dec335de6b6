"""From a training run to a model directory: pick the best checkpoints, average their weights, export them.

``srupp-asr average --exp-dir EXP --num 10 --out MODEL_DIR`` averages the 10 best checkpoints of a run by the
metric its ``ModelCheckpoint`` monitored, as ESPnet and WeNet do. A checkpoint's score is read from the callback
state Lightning stores inside it (``best_k_models`` holds the file's own score at the moment it was written), never
from its file name. ``last.ckpt`` is left out unless ``--include-last`` asks for the final weights as well. The
model directory it writes, and how it is read, are in :mod:`srupp_asr.model_dir`.

``--lm LM_DIR --lm-weight W`` puts an SRU++ LM (``srupp-asr train-lm`` output, trained with the model's tokenizer)
into the model directory as ``lm/``, stored in ``--lm-dtype`` (float16 by default), with ``W`` as its default
fusion weight; :func:`ship_lm` does the same for a model directory that exists already (the built-in model's LM).
:func:`average_lms` averages LM directories of one shape and tokenizer (a "soup" of an LM and its fine-tuned copy).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import logging
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srupp_asr.errors import UserError

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

MODES = ("min", "max")
DEFAULT_NUM = 10
# --dtype and --lm-dtype: the names of model_dir.STORAGE_DTYPES, written out so that --help imports no torch
DTYPE_CHOICES = ("float32", "float16", "bfloat16")
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
    callbacks = ckpt.get("callbacks")
    for key, state in callbacks.items() if isinstance(callbacks, dict) else ():
        if not isinstance(state, dict) or not state.get("monitor") or not isinstance(state.get("best_k_models"), dict):
            continue
        try:  # a crafted state (a score that is no number, a path that is no text) is not a monitor's: left out
            scores = {Path(p).name: float(v) for p, v in state["best_k_models"].items()}
            last = state.get("last_model_path")
            states.append(
                _MonitorState(str(state["monitor"]), _mode_of(key), scores, Path(last).name if last else None)
            )
        except (TypeError, ValueError, RuntimeError):
            continue
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
    from srupp_asr.checkpoints import load_checkpoint

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
    from srupp_asr.model import ASRModel

    return [name for name in inspect.signature(ASRModel).parameters if name != "vocab_size"]


def _model_hparams(ckpt: Mapping[str, Any]) -> dict[str, Any]:
    hparams = ckpt.get("hyper_parameters") or {}
    return {name: hparams[name] for name in _model_arg_names() if name in hparams}


def average_checkpoints(paths: Sequence[str | os.PathLike]) -> dict[str, torch.Tensor]:
    """The mean of the checkpoints' weights (float64 sums, cast back; a NaN or inf weight is a UserError); integer
    buffers from the latest checkpoint; CMVN stats, which must be identical, as they are; the checkpoints must be of
    one network and tokenizer. Keys as in the checkpoints (Lightning's ``model.`` prefix)."""
    import torch

    from srupp_asr.checkpoints import load_checkpoint
    from srupp_asr.model_dir import is_cmvn_key

    paths = [Path(p) for p in paths]
    if not paths:
        raise ValueError("no checkpoints to average")
    _check_distinct(paths)
    sums: dict[str, torch.Tensor] = {}
    kept: dict[str, torch.Tensor] = {}  # CMVN and integer buffers: not averaged
    first: dict[str, torch.Tensor] = {}
    first_hparams: dict[str, Any] = {}
    first_tokenizer = None
    latest_step = None
    for index, path in enumerate(paths):
        ckpt = load_checkpoint(path)
        weights, hparams, step = ckpt["state_dict"], _model_hparams(ckpt), int(ckpt.get("global_step", -1))
        tokenizer = (ckpt.get("hyper_parameters") or {}).get("tokenizer")
        if index == 0:
            first, first_hparams, first_tokenizer = weights, hparams, tokenizer
        else:
            _check_same_model(path, paths[0], weights, first, hparams, first_hparams)
            _check_same_tokenizer(path, paths[0], tokenizer, first_tokenizer)
        newest = latest_step is None or step >= latest_step
        latest_step = step if newest else latest_step
        for key, value in weights.items():
            if is_cmvn_key(key):
                kept.setdefault(key, value.clone())
            elif value.is_floating_point():
                _check_finite(path, key, value)
                total = value.to(torch.float64, copy=True)
                sums[key] = total if index == 0 else sums[key].add_(total)
            elif newest:
                kept[key] = value.clone()
    count = len(paths)
    return {key: kept[key] if key in kept else (sums[key] / count).to(value.dtype) for key, value in first.items()}


def _check_same_tokenizer(path: Path, first_path: Path, tokenizer: Any, first_tokenizer: Any) -> None:
    """Raise UserError if ``path`` was trained with a tokenizer whose pieces differ from ``first_path``'s: with the
    same vocab_size the weights have the same shapes, but an output id means another piece in each."""
    from srupp_asr.tokenizer import Tokenizer

    if tokenizer == first_tokenizer or not isinstance(tokenizer, str) or not isinstance(first_tokenizer, str):
        return
    if not (Path(tokenizer).is_file() and Path(first_tokenizer).is_file()):
        log.warning(
            "%s: trained with tokenizer %s, %s with %s; not found, so not compared",
            path,
            tokenizer,
            first_path.name,
            first_tokenizer,
        )
        return
    if Tokenizer(tokenizer).pieces() != Tokenizer(first_tokenizer).pieces():
        raise UserError(
            f"{path}: trained with tokenizer {tokenizer}, {first_path.name} with {first_tokenizer}, whose pieces"
            " differ (the same output id means other text); average checkpoints of one run"
        )


def _check_finite(path: Path, key: str, value: torch.Tensor) -> None:
    """Raise UserError if a weight of ``path`` holds NaN or infinity: in a mean it would spoil that weight whole."""
    import torch

    bad = value.numel() - int(torch.isfinite(value).sum())
    if bad:
        raise UserError(
            f"{path}: {key} holds {bad} non-finite value{'s' if bad > 1 else ''} (NaN or inf: a diverged checkpoint?);"
            " averaging it would make the model's outputs NaN, leave it out"
        )


def _check_same_model(
    path: Path,
    first_path: Path,
    weights: Mapping[str, torch.Tensor],
    first: Mapping[str, torch.Tensor],
    hparams: Mapping[str, Any],
    first_hparams: Mapping[str, Any],
) -> None:
    """Raise UserError unless ``path`` holds the same network (settings, weight names and shapes, CMVN stats)."""
    import torch

    from srupp_asr.model_dir import is_cmvn_key

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
        if is_cmvn_key(key) and not torch.equal(value, ref):
            raise UserError(f"{path}: its CMVN stats ({key}) differ from {first_path.name}'s (a different run?)")


def model_config_from_checkpoint(
    path: str | os.PathLike, tokenizer: str | os.PathLike | None = None
) -> tuple[dict[str, Any], Path]:
    """ASRModel's constructor arguments of a training checkpoint and its tokenizer path (``tokenizer`` overrides the
    one the run used); vocab_size is the tokenizer's."""
    from srupp_asr.checkpoints import load_checkpoint
    from srupp_asr.tokenizer import Tokenizer

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


def lm_writer(
    lm_dir: str | os.PathLike, tokenizer_path: str | os.PathLike, weight: float | None, dtype: torch.dtype
) -> Callable[[Path], Path]:
    """Check the LM of ``lm_dir`` (loads, same tokenizer as ``tokenizer_path``'s) and return a function that writes
    it as an LM directory at a given path in ``dtype`` with the fusion weight ``weight`` (None: the LM's own recorded
    weight, else ``DEFAULT_LM_WEIGHT``). Every problem is a one-line UserError naming the file."""
    from srupp_asr.decoding.lexicon import lexicon_path, word_list_weight
    from srupp_asr.decoding.settings import DEFAULT_LM_WEIGHT
    from srupp_asr.lm import load_lm
    from srupp_asr.model_files import (
        check_fusion_weight,
        check_same_tokenizer,
        read_fusion_weight,
        read_length_penalty,
    )
    from srupp_asr.tokenizer import Tokenizer

    lm, lm_tokenizer = load_lm(lm_dir)
    check_same_tokenizer(lm_tokenizer, Tokenizer(tokenizer_path), lm_dir)
    if weight is None:
        weight = read_fusion_weight(lm_dir)
    weight = check_fusion_weight(DEFAULT_LM_WEIGHT if weight is None else weight, "--lm-weight")

    lexicon, lexicon_weight = lexicon_path(lm_dir), word_list_weight(lm_dir)  # the word list goes with the LM
    length_penalty = read_length_penalty(lm_dir)  # and the length penalty chosen with them

    def write(path: Path) -> Path:
        from srupp_asr.lm import save_lm

        return save_lm(lm, lm_tokenizer.path, path, weight, dtype, lexicon, lexicon_weight, length_penalty)

    return write


def average_lms(lm_dirs: Sequence[str | os.PathLike], out_dir: str | os.PathLike) -> Path:
    """Write the uniform mean of the LMs in ``lm_dirs`` (float64 sums, stored in float32) as an LM directory at
    ``out_dir``: a weight-space average, as of checkpoints, for LMs of one shape and tokenizer (an LM and its
    fine-tuned copy, say). Every mismatch is a one-line UserError naming the LM."""
    import torch

    from srupp_asr.lm import load_lm, save_lm
    from srupp_asr.model_files import check_same_tokenizer

    if len(lm_dirs) < 2:
        raise UserError("average_lms: give at least two LM directories")
    first, tokenizer = load_lm(lm_dirs[0])
    sums = {k: v.to(torch.float64, copy=True) for k, v in first.state_dict().items()}
    for lm_dir in lm_dirs[1:]:
        lm, lm_tokenizer = load_lm(lm_dir)
        check_same_tokenizer(lm_tokenizer, tokenizer, lm_dir)
        if lm.config != first.config:
            raise UserError(f"{lm_dir}: another LM shape than {lm_dirs[0]} ({lm.config} against {first.config})")
        for key, value in lm.state_dict().items():
            sums[key] += value.to(torch.float64)
    first.load_state_dict({k: (v / len(lm_dirs)).to(torch.float32) for k, v in sums.items()})
    return save_lm(first, tokenizer.path, out_dir)


def ship_lm(
    model_dir: str | os.PathLike,
    lm_dir: str | os.PathLike,
    weight: float | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Put the LM of ``lm_dir`` into the existing model directory ``model_dir`` as ``lm/`` (replacing one there,
    atomically), stored in ``dtype`` (None: float16) with the default fusion weight ``weight``; returns the new
    ``lm/`` path."""
    import torch

    from srupp_asr.model_dir import TOKENIZER_FILE, read_model_config
    from srupp_asr.model_files import LM_SUBDIR

    model_dir = Path(model_dir)
    read_model_config(model_dir)  # a model directory, not something else
    target = model_dir / LM_SUBDIR
    if target.resolve() == Path(lm_dir).resolve():
        raise UserError(f"{lm_dir}: is the model directory's own LM already")
    return lm_writer(lm_dir, model_dir / TOKENIZER_FILE, weight, dtype or torch.float16)(target)


def average_command(args: argparse.Namespace) -> int:
    """``srupp-asr average``: average the best checkpoints of a run and export them as a model directory."""
    from srupp_asr.model_dir import STORAGE_DTYPES, check_replaceable, export_model

    max_shard_bytes = parse_size(args.max_shard_size, "--max-shard-size") if args.max_shard_size else None
    check_replaceable(args.out)  # before the work, not after it
    if args.lm_weight is not None and args.lm is None:
        raise UserError("--lm-weight needs --lm (the LM directory to put into the model directory)")
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
    subdirs = {}
    if args.lm is not None:
        from srupp_asr.model_files import LM_SUBDIR

        subdirs[LM_SUBDIR] = lm_writer(args.lm, tokenizer, args.lm_weight, STORAGE_DTYPES[args.lm_dtype])
    out = export_model(
        weights, config, tokenizer, args.out, source, dtype=dtype, max_shard_bytes=max_shard_bytes, subdirs=subdirs
    )
    ranked = f" (best by {selection.metric}, {selection.mode})" if selection.metric else ""
    print(f"averaged {len(paths)} checkpoint{'s' if len(paths) > 1 else ''}{ranked}:")
    for c in selection.checkpoints:
        score = f"{selection.metric}={c.score:.4f}" if c.score is not None else "(last)" if c.is_last else ""
        print(f"  {c.path}  step {c.step}  {score}".rstrip())
    print(f"wrote {out} ({', '.join(sorted(p.name for p in out.iterdir()))})")
    if subdirs:
        from srupp_asr.model_files import LM_SUBDIR, read_fusion_weight

        weight = read_fusion_weight(out / LM_SUBDIR)
        print(f"with the LM of {args.lm} as {out / LM_SUBDIR} ({args.lm_dtype}, default fusion weight {weight:g})")
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
        choices=DTYPE_CHOICES,
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
    p.add_argument(
        "--lm",
        metavar="LM_DIR",
        help="SRU++ LM (srupp-asr train-lm, the model's tokenizer) to ship in MODEL_DIR/lm; transcribe and evaluate"
        " fuse it by default",
    )
    p.add_argument(
        "--lm-weight",
        type=float,
        help="its default fusion weight, stored in MODEL_DIR/lm/config.yaml (default: the LM's own, else 0.3)",
    )
    p.add_argument(
        "--lm-dtype",
        choices=DTYPE_CHOICES,
        default="float16",
        help="store the LM's weights in this type (default float16)",
    )
    p.set_defaults(func=average_command)
    return p
