"""Checkpoints on disk, read without Lightning and without unpickling code.

:func:`load_checkpoint` always uses ``torch.load(weights_only=True)``: a checkpoint from a stranger cannot run code,
and a truncated or corrupt one is a one-line :class:`~srupp_asr.errors.UserError` naming the file. It needs only
torch, so loading a model for inference (``srupp-asr transcribe``, ``evaluate``, ``average``) never imports
Lightning; the Lightning side of checkpoints (the atomic writer, the resumable ``ModelCheckpoint``, the loop-counter
repair on resume) is :mod:`srupp_asr.lightning_checkpoints`.

A checkpoint is written to a hidden ``.NAME.<random>.partial`` file (``PARTIAL_SUFFIX``) before its rename;
:func:`remove_partials` deletes those a killed save left.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import torch

from srupp_asr.errors import UserError, first_line

PARTIAL_SUFFIX = ".partial"  # of the hidden file a checkpoint is written to before its rename


def load_checkpoint(
    path: str | os.PathLike, map_location: Any = "cpu", mmap: bool = True, lightning: bool = True
) -> dict[str, Any]:
    """A checkpoint loaded with ``weights_only=True`` (memory-mapped unless ``mmap=False``); with ``lightning``
    it must hold a ``state_dict``. Every problem is a one-line UserError naming ``path``."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: checkpoint not found")
    if path.stat().st_size == 0:
        raise UserError(f"{path}: empty file (0 bytes), not a checkpoint")
    if mmap and not zipfile.is_zipfile(path):  # what torch would say in words about mmap
        raise UserError(f"{path}: not a readable PyTorch checkpoint (not a zip archive: truncated or corrupt?)")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        raise UserError(f"{path}: {_unpickling_problem(err)}") from None
    except Exception as err:  # zip, EOF, or storage errors: all mean "not a readable checkpoint"
        raise UserError(f"{path}: not a readable PyTorch checkpoint ({first_line(err)})") from None
    problem = _lightning_problem(ckpt) if lightning else None
    if problem:
        raise UserError(f"{path}: {problem}")
    return ckpt


def _unpickling_problem(err: pickle.UnpicklingError) -> str:
    """Why ``torch.load(weights_only=True)`` refused a file, without torch's advice to load it unsafely."""
    found = re.search(r"^(?:Trying to load |WeightsUnpickler error: )?(Unsupported .*|unsupported .*)$", str(err), re.M)
    detail = f": {found[1].rstrip('.')}" if found else ""
    return f"holds Python objects other than tensors and plain data{detail} (refused unread: they could run code)"


def _lightning_problem(ckpt: Any) -> str | None:
    """What keeps ``ckpt`` from being a Lightning checkpoint as this package reads one, or None: a ``state_dict``
    of named tensors, ``hyper_parameters`` a mapping and ``global_step`` a whole number when present (a crafted
    file with ``[1, 2]`` or ``'abc'`` there must be one line, not a traceback where they are used)."""
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("state_dict"), dict):
        return "not a Lightning checkpoint (it has no state_dict)"
    for key, value in ckpt["state_dict"].items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            return f"state_dict entry {key!r} is {type(value).__name__}, not a tensor (not a Lightning checkpoint)"
    hparams = ckpt.get("hyper_parameters")
    if hparams is not None and not isinstance(hparams, dict):
        return f"hyper_parameters is a {type(hparams).__name__}, not a mapping (not a Lightning checkpoint)"
    step = ckpt.get("global_step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        return f"global_step is {step!r}, not a whole number (not a Lightning checkpoint)"
    return None


def remove_partials(folder: str | os.PathLike, keep: Path | None = None) -> list[Path]:
    """Delete the ``.partial`` files a killed save left in ``folder`` (all but ``keep``); returns those removed."""
    removed = []
    for stale in Path(folder).glob(f".*{PARTIAL_SUFFIX}"):
        if stale != keep and stale.is_file():
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
                removed.append(stale)
    return removed
