"""The decoding settings of ``transcribe`` and ``evaluate``, on the command line and in Python: the arguments
(:func:`add_decoding_arguments`), the default :class:`~srupp_asr.decoding.DecodingOptions` (:data:`DEFAULT_OPTIONS`)
and the keywords that change them (:func:`requested_options`). Which LM is fused, and the device, are the loader's
(:mod:`srupp_asr.loading`). Light to import (no torch), so ``--help`` starts fast."""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

from srupp_asr.checks import lm_weight_problem
from srupp_asr.decoding.options import DEFAULT_BEAM, MAX_BEAM, MODES, DecodingOptions
from srupp_asr.errors import UserError

DEFAULT_DECODING = "joint"  # the most accurate mode; long recordings are cut at pauses into pieces for it
DEFAULT_BATCH_SIZE = 8  # recordings decoded together on a CPU
# ... and on a GPU, where a search step costs its kernel launches whatever the batch (the step is launch-bound, the
# kernels tiny): more recordings a batch, fewer steps a recording
GPU_BATCH_SIZE = 32
# What transcribe() and evaluate() decode with unless told otherwise; the LM weight and the word list's weight are
# the fused LM's own (None)
DEFAULT_OPTIONS = DecodingOptions(mode=DEFAULT_DECODING)
# The keywords transcribe() and evaluate() take as decoding options: the fields, and decoding (the mode's CLI name)
OPTION_NAMES = (*(f.name for f in dataclasses.fields(DecodingOptions)), "decoding")
# whisper's keyword for a field, taken as the command line takes --beam_size
WHISPER_OPTION_NAMES = {"beam_size": "beam"}
# with --lm and no --lm-weight, when the LM directory records no weight of its own (a model directory's lm/ does;
# ESPnet's LibriSpeech recipes use 0.3-0.6)
DEFAULT_LM_WEIGHT = 0.3
# What a word outside an LM's word list costs when its config.yaml records no weight: about the log-probability of
# a word (the built-in model's LM records its own)
DEFAULT_LEXICON_WEIGHT = 10.0


def add_decoding_arguments(p: argparse.ArgumentParser, batch_help: str) -> None:
    """Options shared by ``transcribe`` and ``evaluate``: device, batch size and the decoding settings."""
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (default auto)")
    p.add_argument(
        "--batch-size",
        type=int,
        help=f"{batch_help} (default {DEFAULT_BATCH_SIZE} on a CPU, {GPU_BATCH_SIZE} on a GPU)",
    )
    modes_help = f"decoding mode (default {DEFAULT_DECODING})"
    p.add_argument("--decoding", default=DEFAULT_DECODING, choices=MODES, help=modes_help)
    p.add_argument(
        "--beam", "--beam_size", type=int, help=f"beam size of the beam modes, 1-{MAX_BEAM} (default {DEFAULT_BEAM})"
    )
    p.add_argument("--ctc-weight", type=float, help="CTC weight of joint and rescoring (default 0.3)")
    p.add_argument(
        "--length-penalty",
        type=float,
        help="score added per output token (default: the one stored with the fused LM, else 0)",
    )
    p.add_argument(
        "--lm",
        metavar="DIR",
        help="SRU++ LM directory (srupp-asr train-lm) for shallow fusion (default: the model directory's lm/, if any)",
    )
    p.add_argument(
        "--lm-weight",
        type=float,
        help="weight of the LM's log-probability; 0: no LM (default: the weight stored with the LM, else "
        f"{DEFAULT_LM_WEIGHT})",
    )
    p.add_argument("--no-lm", action="store_true", help="decode without a language model (not the model's lm/ either)")
    p.add_argument(
        "--lexicon-weight",
        type=float,
        help="what each word outside the LM's word list (its words.txt) costs a hypothesis; 0: no word list "
        "(default: the weight stored with the LM)",
    )


def batch_size_for(batch_size: int | None, device: object) -> int:
    """``batch_size``, or where it is None the default for ``device``: :data:`GPU_BATCH_SIZE` on a CUDA device,
    else :data:`DEFAULT_BATCH_SIZE`."""
    if batch_size is not None:
        return batch_size
    return GPU_BATCH_SIZE if str(device).startswith("cuda") else DEFAULT_BATCH_SIZE


def check_batch_size(batch_size: int | None) -> None:
    """A one-line UserError for a batch size below 1 (None: the device's default)."""
    if batch_size is not None and batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {batch_size}")


def requested_options(
    caller: str,
    options: DecodingOptions,
    decode_options: dict[str, Any],
    lm: str | os.PathLike[str] | None = None,
    no_lm: bool = False,
) -> tuple[DecodingOptions, float | None]:
    """The decoding options ``caller`` (``transcribe`` or ``evaluate``) was asked for: ``options`` with the keywords
    of ``decode_options`` (:class:`~srupp_asr.decoding.DecodingOptions` fields, ``decoding`` for ``mode``, whisper's
    ``beam_size`` for ``beam``; None
    leaves a field as it is), and their ``lm_weight`` apart (None: the fused LM's own), which applies once the LM is
    chosen (:func:`srupp_asr.loading.fused_options`). The LM settings are checked first (:func:`check_lm_flags`);
    a bad value is a one-line UserError, an unknown keyword a TypeError."""
    given = {k: v for k, v in decode_options.items() if v is not None}
    for whisper, name in WHISPER_OPTION_NAMES.items():
        if whisper in given:
            if name in given:
                raise TypeError(f"{caller}() takes the {name} once: as {name}= or as {whisper}=, not both")
            given[name] = given.pop(whisper)
    for name in given:
        if name not in OPTION_NAMES:
            raise TypeError(f"{caller}() got an unexpected keyword argument {name!r}")
    if "decoding" in given:
        if "mode" in given:
            raise TypeError(f"{caller}() takes the mode once: as decoding= or as mode=, not both")
        given["mode"] = given.pop("decoding")
    lm_weight = given.pop("lm_weight", options.lm_weight)
    check_lm_flags(lm, lm_weight, no_lm)
    try:
        return dataclasses.replace(options, lm_weight=None, **given), lm_weight
    except ValueError as err:
        raise UserError(f"decoding options: {err}") from None


def check_lm_flags(lm: str | os.PathLike[str] | None, lm_weight: float | None, no_lm: bool) -> None:
    """A one-line UserError for LM settings that contradict each other or a bad weight (before any work)."""
    if lm_weight is not None and lm_weight_problem(lm_weight):
        raise UserError(f"decoding options: lm_weight {lm_weight_problem(lm_weight)}")
    if no_lm and lm is not None:
        raise UserError("decoding options: --no-lm and --lm contradict each other")
    if no_lm and lm_weight:
        raise UserError(f"decoding options: --no-lm and --lm-weight {lm_weight:g} contradict each other")
