"""A model or LM directory read into numpy arrays, with the checks the torch loader makes
(:mod:`srupp_asr.model_files`: no pickle, the config, the weights index and shards; every weight finite).

Floating weights stay in their stored dtype here (float16 for the built-in model); :class:`~srupp_asr.runtime.ops.
Weights` casts each to float32 as a network takes it. A directory this runtime cannot read (bfloat16 weights, which
numpy has no type for) raises :class:`Unsupported`, and the caller decodes with torch instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from srupp_asr.errors import UserError, first_line, is_out_of_memory
from srupp_asr.model_files import non_finite_weight, not_a_file, weight_groups


class Unsupported(Exception):
    """What the numpy runtime cannot run (its message says what): the caller falls back to torch."""


def read_arrays(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every weight of a model or LM directory (single file or shards), as stored, checked finite."""
    arrays: dict[str, np.ndarray] = {}
    for group in weight_groups(path, _read_safetensors, lambda a: a.nbytes):
        arrays.update(group)
    return arrays


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The arrays of one safetensors file; a one-line UserError naming it when it is not readable."""
    from safetensors import safe_open

    if not path.is_file():
        raise UserError(f"{path}: {not_a_file(path)} (a model directory holds its weights)")
    try:
        with safe_open(path, framework="numpy") as f:
            dtypes = {k: f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118
            if "BF16" in dtypes.values():
                raise Unsupported(f"{path}: bfloat16 weights (numpy has no bfloat16)")
            return {k: _finite(path, k, f.get_tensor(k)) for k in dtypes}
    except (UserError, Unsupported):
        raise
    except Exception as err:  # safetensors reports a bad header, truncation or a bad dtype with its own error types
        if is_out_of_memory(err):
            raise MemoryError(f"{path}: {first_line(err)}") from None
        raise UserError(f"{path}: not a readable safetensors file ({first_line(err)})") from None


def _finite(path: Path, key: str, array: np.ndarray) -> np.ndarray:
    """``array`` if every value is finite (its smallest and largest are: numpy's min and max propagate NaN), else
    the one-line error the torch loader gives."""
    if array.dtype.kind == "f" and array.size and not (np.isfinite(array.min()) and np.isfinite(array.max())):
        raise non_finite_weight(path, key, int(array.size - np.isfinite(array).sum()))
    return array
