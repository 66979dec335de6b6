"""The decoding settings of ``transcribe`` and ``evaluate``, on the command line and in Python: the arguments
(:func:`add_decoding_arguments`), the default :class:`~srupp_asr.decoding.DecodingOptions` (:data:`DEFAULT_OPTIONS`)
and the keywords that change them (:func:`requested_options`), the device, and which LM to fuse
(:func:`choose_lm`: ``--lm``, else the model directory's own ``lm/``; :func:`fused_options`). Light to import (no
torch), so ``--help`` starts fast."""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srupp_asr.decoding.options import MAX_BEAM, MODES, DecodingOptions, lm_weight_problem
from srupp_asr.errors import UserError

if TYPE_CHECKING:
    from srupp_asr.lm import SRUppLM
    from srupp_asr.tokenizer import Tokenizer

DEFAULT_DECODING = "joint"  # the most accurate mode; long recordings are cut at pauses into pieces for it
DEFAULT_BATCH_SIZE = 8
# What transcribe() and evaluate() decode with unless told otherwise; the LM weight is the fused LM's own (None)
DEFAULT_OPTIONS = DecodingOptions(mode=DEFAULT_DECODING)
# The keywords transcribe() and evaluate() take as decoding options: the fields, and decoding (the mode's CLI name)
OPTION_NAMES = (*(f.name for f in dataclasses.fields(DecodingOptions)), "decoding")
# with --lm and no --lm-weight, when the LM directory records no weight of its own (a model directory's lm/ does;
# ESPnet's LibriSpeech recipes use 0.3-0.6)
DEFAULT_LM_WEIGHT = 0.3


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when a GPU is usable, else ``cpu``; ``cuda`` without one is a UserError."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {device}: no CUDA device is available here (use --device cpu)")
    if device != "cpu" and not device.startswith("cuda"):
        raise UserError(f"--device {device}: unknown device (choose cpu, cuda or auto)")
    return device


def add_decoding_arguments(p: argparse.ArgumentParser, batch_help: str) -> None:
    """Options shared by ``transcribe`` and ``evaluate``: device, batch size and the decoding settings."""
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (default auto)")
    p.add_argument(
        "--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help=f"{batch_help} (default {DEFAULT_BATCH_SIZE})"
    )
    modes_help = f"decoding mode (default {DEFAULT_DECODING})"
    p.add_argument("--decoding", default=DEFAULT_DECODING, choices=MODES, help=modes_help)
    p.add_argument("--beam", "--beam_size", type=int, help=f"beam size of the beam modes, 1-{MAX_BEAM} (default 10)")
    p.add_argument("--ctc-weight", type=float, help="CTC weight of joint and rescoring (default 0.3)")
    p.add_argument("--length-penalty", type=float, help="score added per output token (default 0)")
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


def requested_options(
    caller: str,
    options: DecodingOptions,
    decode_options: dict[str, Any],
    lm: str | os.PathLike[str] | None = None,
    no_lm: bool = False,
) -> tuple[DecodingOptions, float | None]:
    """The decoding options ``caller`` (``transcribe`` or ``evaluate``) was asked for: ``options`` with the keywords
    of ``decode_options`` (:class:`~srupp_asr.decoding.DecodingOptions` fields, or ``decoding`` for ``mode``; None
    leaves a field as it is), and their ``lm_weight`` apart (None: the fused LM's own), which applies once the LM is
    chosen (:func:`fused_options`). The LM settings are checked first (:func:`check_lm_flags`); a bad value is a
    one-line UserError, an unknown keyword a TypeError."""
    given = {k: v for k, v in decode_options.items() if v is not None}
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


def fused_options(options: DecodingOptions, choice: LMChoice) -> DecodingOptions:
    """``options`` with the weight of the LM ``choice`` fuses (0 without one); a one-line UserError when the mode
    takes no LM."""
    try:
        return dataclasses.replace(options, lm_weight=choice.weight if choice.path is not None else 0.0)
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


@dataclass(frozen=True)
class LMChoice:
    """The LM decoding fuses (``path``, None: none) with ``weight``, and where it came from (``origin``)."""

    path: Path | None
    weight: float | None
    origin: str

    def describe(self) -> str:
        """One line for the log: which LM and why."""
        if self.path is None:
            return f"decoding without a language model ({self.origin})"
        return f"fusing the language model {self.path} with weight {self.weight:g} ({self.origin})"


def choose_lm(
    model_dir: str | os.PathLike[str],
    decoding: str,
    lm: str | os.PathLike[str] | None = None,
    lm_weight: float | None = None,
    no_lm: bool = False,
) -> LMChoice:
    """Which LM to fuse, and with what weight: ``lm`` when given, else the model directory's own ``lm/``; its weight
    ``lm_weight`` when given, else the one recorded in the LM's config.yaml (the model directory's LM always has
    one), else :data:`DEFAULT_LM_WEIGHT`. ``no_lm`` or a weight of 0: none. ``ctc_greedy`` ignores the model's own
    LM (it takes none) unless a weight is asked for, which :func:`fused_options` then refuses, as it refuses
    ``lm`` with ``ctc_greedy``."""
    from srupp_asr.lm import LM_SUBDIR, read_fusion_weight

    check_lm_flags(lm, lm_weight, no_lm)
    if no_lm:
        return LMChoice(None, None, "--no-lm")
    if lm is not None:
        path, origin = Path(lm), "--lm"
    else:
        path, origin = Path(model_dir) / LM_SUBDIR, f"the model directory's, {LM_SUBDIR}/"
        if not os.path.lexists(path):
            if lm_weight:
                raise UserError(
                    f"decoding options: --lm-weight needs --lm (an LM directory): {model_dir} has no {LM_SUBDIR}/"
                )
            return LMChoice(None, None, f"{model_dir} has no {LM_SUBDIR}/")
        if decoding == "ctc_greedy" and not lm_weight:
            return LMChoice(None, None, "ctc_greedy takes no LM")
    weight = lm_weight if lm_weight is not None else read_fusion_weight(path)
    weight = DEFAULT_LM_WEIGHT if weight is None else weight
    if weight == 0:
        return LMChoice(None, None, "fusion weight 0")
    return LMChoice(path, weight, origin)


def load_fusion_lm(lm_dir: str | os.PathLike[str], tokenizer: Tokenizer, device: str) -> SRUppLM:
    """The LM of ``lm_dir`` on ``device``, checked to use ``tokenizer``'s pieces."""
    from srupp_asr.lm import check_same_tokenizer, load_lm

    lm, lm_tokenizer = load_lm(lm_dir, device)
    check_same_tokenizer(lm_tokenizer, tokenizer, lm_dir)
    return lm
