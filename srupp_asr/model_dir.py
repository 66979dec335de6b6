"""The model directory: what a finished model is on disk, written atomically and read without unpickling.

A model directory holds::

    MODEL_DIR/config.yaml         format_version, sample_rate and the ASRModel constructor arguments
    MODEL_DIR/model.safetensors   the ASRModel state dict (CMVN stats included), keys without Lightning's prefix
    MODEL_DIR/tokenizer.model     the sentencepiece model the weights were trained with
    MODEL_DIR/lm/                 optional: the model's SRU++ language model, an LM directory (:mod:`srupp_asr.lm`)
                                  with its default fusion weight; ``transcribe``/``evaluate`` fuse it by default

or, written with a shard size limit (``--max-shard-size``) that the weights exceed, the state dict split as Hugging
Face splits it: ``model-00001-of-0000N.safetensors`` ... and ``model.safetensors.index.json`` (``{"metadata":
{"total_size": bytes of tensor data}, "weight_map": {tensor: shard file}}``). With an index, every ``*.safetensors``
file of the directory must be a shard it lists: a stray one is an error, not ignored, so a mixed-up copy is noticed.
Floating weights may be stored as float16 or bfloat16 (``--dtype``; CMVN stats stay float32); loading casts them
back into the float32 model.

Writing: :func:`export_model` (a state dict, the model's settings and its tokenizer; ``srupp-asr average`` in
:mod:`srupp_asr.average` calls it), :func:`write_model_dir`. Reading: :func:`load_model_dir` (inference),
:func:`initial_weights` (``train fit --model.init_from``), :func:`read_weights`, :func:`build_with_weights` (also
used for LM directories, :mod:`srupp_asr.lm`). A directory from a stranger is treated as untrusted throughout.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import yaml

from srupp_asr.audio import SAMPLE_RATE
from srupp_asr.checkpoints import load_checkpoint
from srupp_asr.compute_types import DEFAULT_COMPUTE_TYPE, apply_compute_type
from srupp_asr.errors import UserError, first_line, is_out_of_memory
from srupp_asr.fileio import (
    atomic_output,
    atomic_write_text,
    make_temp_dir,
    replace_dir,
)
from srupp_asr.model import ASRModel
from srupp_asr.model_files import (  # the files, read without torch; re-exported for the readers and writers here
    CONFIG_FILE,
    FORMAT_VERSION,
    SHARD_FILE,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    WEIGHTS_INDEX_FILE,
    check_no_pickles,
    non_finite_weight,
    not_a_file,
    read_model_config,
    read_tokenizer,
    weight_files,
    weight_groups,
)
from srupp_asr.tokenizer import Tokenizer

STORAGE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
MODEL_PREFIX = "model."  # ASRLightningModule holds the network as ``self.model``


def is_cmvn_key(key: str) -> bool:
    """Whether a state-dict key holds the CMVN statistics (kept in float32, never averaged)."""
    return key.endswith(("cmvn.mean", "cmvn.istd"))


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
    for key, value in expected.items():
        # Loading casts float16/bfloat16 to the model's float32, but an integer tensor in a floating one's place
        # (float16 bits relabelled int16) would be cast by value into garbage: refused, and the other way round.
        stored = weights[key].dtype
        if stored.is_floating_point != value.dtype.is_floating_point or stored.is_complex != value.dtype.is_complex:
            kind = "a floating" if value.dtype.is_floating_point else "an integer"
            return f"{key} is stored as {str(stored).removeprefix('torch.')}, the model expects {kind} tensor"
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
    subdirs: Mapping[str, Callable[[Path], object]] | None = None,
) -> Path:
    """Write a model directory (config.yaml, model.safetensors, tokenizer.model) atomically; ``source`` (optional)
    records where the weights came from. An existing model directory at ``out_dir`` is replaced. Floating weights
    are stored in ``dtype`` (CMVN stats keep float32); ``max_shard_bytes`` splits them, ``subdirs`` adds folders
    (the LM, ``lm/``) in the same atomic write (see :func:`write_model_dir`)."""
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
    stored = _cast_for_storage(weights, dtype, out_dir)
    return write_model_dir(out_dir, config, stored, tokenizer_path, max_shard_bytes, subdirs)


def _cast_for_storage(
    weights: Mapping[str, torch.Tensor], dtype: torch.dtype, out_dir: Path
) -> dict[str, torch.Tensor]:
    """``weights`` with their floating tensors in ``dtype``; CMVN stats and integer buffers keep their own dtype."""
    if dtype not in STORAGE_DTYPES.values():
        raise ValueError(f"storage dtype must be one of {', '.join(STORAGE_DTYPES)}, got {dtype}")
    stored = {k: v.to(dtype) if v.is_floating_point() and not is_cmvn_key(k) else v for k, v in weights.items()}
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
    subdirs: Mapping[str, Callable[[Path], object]] | None = None,
    files: Mapping[str, Path] | None = None,
) -> Path:
    """Write ``config.yaml``, ``model.safetensors`` and a copy of the tokenizer as the directory ``out_dir``, all or
    nothing: the files go to a hidden sibling that replaces ``out_dir`` (an empty or model directory) at the end.
    Weights that would make a file larger than ``max_shard_bytes`` are written as shards of at most that size with
    an index (:data:`SHARD_FILE`, :data:`WEIGHTS_INDEX_FILE`); a single tensor too big for one is a UserError.
    ``subdirs`` maps a folder name to a function that writes that folder (given its path) before the swap, so a
    model and its LM (``lm/``) appear together or not at all; ``files`` maps a file name to a file copied in (an LM's
    word list)."""
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
        for name, source in (files or {}).items():
            with atomic_output(tmp / name) as path:
                shutil.copyfile(source, path)
        for name, write in (subdirs or {}).items():
            write(tmp / name)
        replace_dir(tmp, out_dir)
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


def load_model_dir(
    model_dir: str | os.PathLike, device: str | torch.device = "cpu", compute_type: str = DEFAULT_COMPUTE_TYPE
) -> tuple[ASRModel, Tokenizer]:
    """The model (in eval mode, on ``device``, in ``compute_type``: :mod:`srupp_asr.compute_types`) and tokenizer
    of a model directory; reads no pickle.

    The directory is treated as untrusted: a file that could be a pickle is refused
    (:func:`check_no_pickles`), the config is checked against the weights file's header before any real memory
    is allocated (:func:`build_with_weights`), and only YAML, safetensors and sentencepiece are parsed."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        what = "is a file, not a model directory" if model_dir.exists() else "model directory not found"
        raise UserError(f"{model_dir}: {what}")
    check_no_pickles(model_dir)
    config_path = model_dir / CONFIG_FILE
    config = read_model_config(model_dir)
    tokenizer = None

    def check_tokenizer(skeleton: torch.nn.Module) -> None:
        nonlocal tokenizer
        vocab_size = skeleton.vocab_size
        tokenizer = read_tokenizer(model_dir, vocab_size, f"{CONFIG_FILE} says vocab_size {vocab_size}")

    model = build_with_weights(lambda: ASRModel(**config["model"]), config_path, model_dir, "model", check_tokenizer)
    return apply_compute_type(model.to(device).eval(), compute_type), tokenizer


def _read_weights(path: str | os.PathLike, shapes_only: bool) -> dict[str, torch.Tensor]:
    """The tensors of a model directory's weights files (:func:`weight_files`), or with ``shapes_only`` meta
    tensors of their shapes and stored dtypes (headers only); shards are checked against their index."""
    tensors: dict[str, torch.Tensor] = {}
    for group in _weight_groups(path, shapes_only):
        tensors.update(group)
    return tensors


def _weight_groups(path: str | os.PathLike, shapes_only: bool) -> Iterator[dict[str, torch.Tensor]]:
    """:func:`srupp_asr.model_files.weight_groups` of torch tensors (or meta tensors of their shapes)."""
    return weight_groups(
        path, lambda file: _read_safetensors(file, shapes_only), lambda t: t.numel() * t.element_size()
    )


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


def _read_safetensors(path: Path, shapes_only: bool) -> dict[str, torch.Tensor]:
    """The tensors of one safetensors file, or meta tensors of their shapes and dtypes (no pickle)."""
    from safetensors import safe_open

    if not path.is_file():
        raise UserError(f"{path}: {not_a_file(path)} (a model directory holds its weights)")
    try:
        with safe_open(path, framework="pt") as f:
            if not shapes_only:
                return {k: _finite(path, k, f.get_tensor(k)) for k in f.keys()}  # noqa: SIM118
            slices = {k: f.get_slice(k) for k in f.keys()}  # noqa: SIM118
            unknown = sorted({s.get_dtype() for s in slices.values()} - _SAFETENSORS_DTYPES.keys())
            if unknown:
                raise ValueError(f"tensors of dtype {unknown[0]}, which a model cannot hold")
            return {
                k: torch.empty(s.get_shape(), dtype=_SAFETENSORS_DTYPES[s.get_dtype()], device="meta")
                for k, s in slices.items()
            }
    except UserError:  # a non-finite weight: already one line
        raise
    except Exception as err:  # safetensors reports a bad header, truncation or a bad dtype with its own error types
        if is_out_of_memory(err):  # the file may be fine: the process could not map it
            raise MemoryError(f"{path}: {first_line(err)}") from None
        raise UserError(f"{path}: not a readable safetensors file ({first_line(err)})") from None


def _finite(path: Path, key: str, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` if every value is finite; else a UserError naming ``path`` and ``key``. One NaN in a weight
    spreads to every output it feeds (one in the CTC head empties every transcript), so weights holding one are
    refused when read, not decoded into empty or wrong text."""
    if _surely_finite(tensor):
        return tensor
    if tensor.is_floating_point() or tensor.is_complex():
        bad = tensor.numel() - int(torch.isfinite(tensor).sum())
        if bad:
            raise non_finite_weight(path, key, bad)
    return tensor


def _surely_finite(tensor: torch.Tensor) -> bool:
    """True when a float tensor's smallest and largest values are finite, which holds only if every value is:
    ``aminmax`` propagates NaN (as documented). On float16 weights it is 25x faster than counting finite values
    (5 against 135 ms for the built-in model's 15.8 M, every load). False where it cannot tell (complex, a dtype
    aminmax does not take): the caller then counts."""
    if not tensor.is_floating_point():
        return not tensor.is_complex()
    if tensor.numel() == 0:
        return True
    try:
        low, high = torch.aminmax(tensor)
    except (RuntimeError, NotImplementedError):
        return False
    return bool(torch.isfinite(low)) and bool(torch.isfinite(high))


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
        with torch.device("meta"), _SkipInit():
            skeleton = make()
    except (TypeError, ValueError) as err:
        raise UserError(f"{config_path}: bad {what} settings ({first_line(err)})") from None
    if check is not None:
        check(skeleton)
    problem = weights_problem(skeleton, read_weight_shapes(weights))
    if problem:
        raise UserError(f"{weight_files(weights).path}: {problem}")
    with _SkipInit():  # every parameter and buffer is then loaded, so drawing random ones would be waste
        module = make()
    # A file at a time: its stored (float16) tensors are cast into the module and freed before the next file is read,
    # so a sharded model never holds a stored copy of all its weights beside the float32 ones.
    loaded: set[str] = set()
    for group in _weight_groups(weights, shapes_only=False):
        module.load_state_dict(group, strict=False)  # names and shapes: checked against the headers above
        loaded.update(group)
        del group
    missing = sorted(module.state_dict().keys() - loaded)
    if missing:  # the files changed since their headers were read
        raise UserError(f"{weight_files(weights).path}: missing weights {_few(missing)}")
    return module


class _SkipInit(torch.overrides.TorchFunctionMode):
    """Calls of ``torch.nn.init`` functions return their tensor untouched (as Lightning's empty init does). On the
    meta device this also keeps torch from importing ``torch._dynamo`` (1.5 s and about 250 MB: its meta kernels of
    the random fills are compiled references), and on the CPU it skips drawing weights that loading overwrites."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return kwargs["tensor"] if "tensor" in kwargs else args[0]
        return func(*args, **kwargs)
