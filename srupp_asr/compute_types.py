"""Compute types: the arithmetic a loaded ASR model runs in, named as faster-whisper names them (``--compute-type``).

- ``float32`` (the default): the weights as trained (stored float16/bfloat16 weights are upcast at load).
- ``int8``: torch's dynamic int8 quantisation of every ``nn.Linear`` of the ASR model, for the CPU: each weight
  matrix is stored int8 with a scale per output row, each call quantises its input from the input's own range
  and returns float32. Everything else stays float32 and gets float32 inputs: the frontend, the convolution
  subsampling, layer norms, attention's softmax (SDPA), the SRU recurrence (its ``u`` is a quantised Linear's
  float32 output) and the fused language model (one step at a time: too small to gain).
- ``bfloat16``: the encoder (convolution subsampling and encoder layers) under torch's bfloat16 autocast, as
  ``--trainer.precision bf16-mixed`` trains it: its convolutions and matrix products take bfloat16 inputs, while
  layer norms, softmax and the SRU recurrence's state stay float32; its output is cast back to float32 for the
  CTC head, the attention decoder and the LM, which run in float32. The weights stay float32. Only where the
  hardware does bfloat16 natively (a CPU with AVX512-BF16 or AMX, a CUDA GPU that supports it): elsewhere it
  would be slower than float32, so it is refused.

Light to import (no torch): the command modules add ``--compute-type`` with it while building their parsers.
"""

from __future__ import annotations

import argparse
import warnings
from typing import TYPE_CHECKING

from srupp_asr.errors import UserError

if TYPE_CHECKING:
    import torch

COMPUTE_TYPES = ("float32", "int8", "bfloat16")
DEFAULT_COMPUTE_TYPE = "float32"


def check_compute_type(compute_type: str) -> None:
    """A one-line UserError unless ``compute_type`` is one of :data:`COMPUTE_TYPES`."""
    if compute_type not in COMPUTE_TYPES:
        names = ", ".join(COMPUTE_TYPES[:-1]) + f" or {COMPUTE_TYPES[-1]}"
        raise UserError(f"--compute-type {compute_type}: unknown (choose {names})")


def apply_compute_type(model: torch.nn.Module, compute_type: str) -> torch.nn.Module:
    """``model`` (on the CPU for int8) in ``compute_type``; int8 replaces its Linear layers in place (the float32
    weights they held are freed); bfloat16 sets the model's ``encoder_autocast`` (see :meth:`ASRModel.encode`)."""
    check_compute_type(compute_type)
    if compute_type == "int8":
        device = next(model.parameters()).device
        if device.type != "cpu":
            raise UserError(f"--compute-type int8 runs on the CPU only, not on {device} (use --device cpu)")
        return quantize_linear_int8(model)
    if compute_type == "bfloat16":
        import torch

        check_native_bfloat16(next(model.parameters()).device)
        model.encoder_autocast = torch.bfloat16
    return model


def check_native_bfloat16(device: torch.device) -> None:
    """A one-line UserError unless ``device`` does bfloat16 arithmetic natively (:func:`native_bfloat16`)."""
    if not native_bfloat16(device):
        where = "this CPU has neither AVX512-BF16 nor AMX" if device.type == "cpu" else f"{device} has none"
        raise UserError(
            f"--compute-type bfloat16 needs native bfloat16 arithmetic and {where}: it would run slower than "
            "float32 here (use float32 or int8)"
        )


def native_bfloat16(device: torch.device) -> bool:
    """Whether ``device`` does bfloat16 arithmetic natively: a CPU with AVX512-BF16 or AMX (oneDNN's bfloat16
    kernels; without them torch emulates bfloat16, slower than float32), or a CUDA GPU that supports it."""
    import torch

    if device.type == "cpu":
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    return device.type == "cuda" and torch.cuda.is_bf16_supported()


def quantize_linear_int8(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with every ``nn.Linear`` replaced, in place, by torch's dynamic int8 Linear (weights per output
    channel, activations per call): the CPU's int8 matrix products, 2x fewer weight bytes than float16."""
    import torch
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    # torch 2.11 marks torch.ao.quantization deprecated in favour of torchao, whose int8 CPU path needs
    # torch.compile to be fast; the eager dynamic kernels used here are still torch's own (fbgemm / oneDNN).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.ao.quantization is deprecated", DeprecationWarning)
        return quantize_dynamic(model, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True)


def add_compute_type_argument(p: argparse.ArgumentParser) -> None:
    """``--compute-type`` (also faster-whisper's ``--compute_type``) for the commands that load an ASR model."""
    p.add_argument(
        "--compute-type",
        "--compute_type",
        default=DEFAULT_COMPUTE_TYPE,
        choices=COMPUTE_TYPES,
        help=f"arithmetic of the model: float32; int8 (the Linear layers quantised; CPU only, about the same WER); "
        f"bfloat16 (the encoder in bfloat16 autocast; a CPU with AVX512-BF16 or AMX, or a GPU: faster, about the "
        f"same WER) (docs/benchmarks.md) (default {DEFAULT_COMPUTE_TYPE})",
    )
