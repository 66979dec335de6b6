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
        raise UserError(f"{path}: torch.load(weights_only=True) refused it ({first_line(err)})") from None
    except Exception as err:  # zip, EOF, or storage errors: all mean "not a readable checkpoint"
        raise UserError(f"{path}: not a readable PyTorch checkpoint ({first_line(err)})") from None
    if lightning and (not isinstance(ckpt, dict) or not isinstance(ckpt.get("state_dict"), dict)):
        raise UserError(f"{path}: not a Lightning checkpoint (it has no state_dict)")
    return ckpt


def remove_partials(folder: str | os.PathLike, keep: Path | None = None) -> list[Path]:
    """Delete the ``.partial`` files a killed save left in ``folder`` (all but ``keep``); returns those removed."""
    removed = []
    for stale in Path(folder).glob(f".*{PARTIAL_SUFFIX}"):
        if stale != keep and stale.is_file():
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
                removed.append(stale)
    return removed
