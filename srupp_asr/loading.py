"""Loading a model for decoding: the one way a model directory, its fusion LM and its device come together.

:class:`LoadedModel` is what ``transcribe``, ``evaluate`` and the Python API (:class:`srupp_asr.api.Model`, a
subclass) decode with. :meth:`LoadedModel.load` resolves the device (:func:`compute_device`: ``auto``, a missing
GPU, int8 on the CPU only) and the engine: float32 on the CPU runs on the numpy runtime (:mod:`srupp_asr.runtime`, no
torch) where it runs the model, anything else reads the model directory as a torch network in its compute type
(:func:`srupp_asr.model_dir.load_model_dir`: no pickle, every tensor checked) and readies the CPU recurrence, so that
all of it counts as loading, not decoding.
:meth:`LoadedModel.fuse` settles the LM: which one (:func:`choose_lm`: ``lm``, else the model directory's own
``lm/``), the options' LM weight (:func:`fused_options`) and the LM itself, loaded once per directory
(:func:`load_fusion_lm`). Light to import (no torch).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Self

from srupp_asr.compute_types import DEFAULT_COMPUTE_TYPE, check_compute_type, check_native_bfloat16
from srupp_asr.decoding.settings import DEFAULT_LM_WEIGHT, check_lm_flags
from srupp_asr.errors import UserError

if TYPE_CHECKING:
    import torch

    from srupp_asr.decoding import DecodingOptions
    from srupp_asr.lm import SRUppLM
    from srupp_asr.model import ASRModel
    from srupp_asr.runtime.engine import NumpyASR
    from srupp_asr.runtime.lm import SRUppLM as NumpyLM
    from srupp_asr.tokenizer import Tokenizer

# Names LoadedModel.load takes besides a directory: the built-in model.
BUILTIN_NAMES = ("default", "builtin")
# whisper's model names, which a whisper user may give out of habit: told that they do not exist here
WHISPER_SIZES = ("tiny", "base", "small", "medium", "large", "large-v2", "large-v3", "turbo")


# Device files of the GPU drivers torch's CUDA (or ROCm) build talks to: NVIDIA's, AMD's, WSL's.
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg")
ENGINES = ("auto", "numpy", "torch")  # what computes on the CPU: see LoadedModel.load


def add_engine_argument(p: argparse.ArgumentParser) -> None:
    """``--engine`` for the commands that load an ASR model."""
    p.add_argument(
        "--engine",
        default="auto",
        choices=ENGINES,
        help="what computes on the CPU: auto (numpy for float32 on the CPU: no torch imported, less than half the "
        "memory; torch for a GPU, int8, bfloat16, the rescoring modes and the Conformer or BLSTM encoders), numpy "
        "or torch (default auto)",
    )


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when a GPU is usable, else ``cpu`` (without importing torch on a machine with no GPU
    driver); ``cuda`` without one is a UserError."""
    if device == "cpu" or (device == "auto" and not any(os.path.exists(path) for path in GPU_DEVICE_FILES)):
        return "cpu"
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {device}: no CUDA device is available here (use --device cpu)")
    if device != "cpu" and not device.startswith("cuda"):
        raise UserError(f"--device {device}: unknown device (choose cpu, cuda or auto)")
    return device


def compute_device(compute_type: str, device: str) -> str:
    """The device a model of ``compute_type`` runs on for the requested ``device`` (``cpu``, ``cuda``, ``auto``):
    int8 runs on the CPU only, so ``auto`` picks the CPU for it and ``cuda`` is a one-line UserError; bfloat16 runs
    only where the device does bfloat16 natively (one line otherwise)."""
    check_compute_type(compute_type)
    if compute_type == "int8":
        if device != "auto" and resolve_device(device) != "cpu":
            raise UserError(f"--compute-type int8 runs on the CPU only, not on --device {device} (use --device cpu)")
        return "cpu"
    resolved = resolve_device(device)
    if compute_type == "bfloat16":
        import torch

        check_native_bfloat16(torch.device(resolved))
    return resolved


@dataclass(frozen=True)
class LMChoice:
    """The LM decoding fuses (``path``, None: none) with ``weight``, and where it came from (``origin``); the
    weight of its word list as it records it (``lexicon_weight``; None: it carries none) and the length penalty it
    records (None: none)."""

    path: Path | None
    weight: float | None
    origin: str
    lexicon_weight: float | None = None
    length_penalty: float | None = None

    def describe(self) -> str:
        """One line for the log: which LM and why."""
        if self.path is None:
            return f"decoding without a language model ({self.origin})"
        words = "" if self.lexicon_weight is None else ", and its word list"
        return f"fusing the language model {self.path} with weight {self.weight:g} ({self.origin}){words}"


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
    from srupp_asr.decoding.lexicon import word_list_weight
    from srupp_asr.model_files import LM_SUBDIR, read_fusion_weight, read_length_penalty

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
    return LMChoice(path, weight, origin, word_list_weight(path), read_length_penalty(path))


def fused_options(options: DecodingOptions, choice: LMChoice) -> DecodingOptions:
    """``options`` with the weight of the LM ``choice`` fuses (0 without one), of its word list (the one asked
    for, else the LM's; 0 without one) and the length penalty (the one asked for, else the LM's, else 0); a
    one-line UserError when the mode takes no LM, or a word list weight is asked for where the LM has none."""
    words = options.lexicon_weight
    if choice.path is None or choice.lexicon_weight is None:
        if words:
            where = f"{choice.path} has no word list" if choice.path is not None else "no LM is fused"
            raise UserError(f"decoding options: --lexicon-weight needs an LM with a word list (words.txt): {where}")
        words = 0.0
    elif words is None:
        words = choice.lexicon_weight
    penalty = options.length_penalty
    if penalty is None:  # (a choice of no LM records none)
        penalty = choice.length_penalty or 0.0
    try:
        lm_weight = choice.weight if choice.path is not None else 0.0
        return dataclasses.replace(options, lm_weight=lm_weight, lexicon_weight=words, length_penalty=penalty)
    except ValueError as err:
        raise UserError(f"decoding options: {err}") from None


def load_fusion_lm(lm_dir: str | os.PathLike[str], tokenizer: Tokenizer, device: str) -> SRUppLM:
    """The LM of ``lm_dir`` on ``device``, checked to use ``tokenizer``'s pieces."""
    from srupp_asr.decoding.lexicon import read_word_list
    from srupp_asr.lm import load_lm
    from srupp_asr.model_files import check_same_tokenizer

    lm, lm_tokenizer = load_lm(lm_dir, device)
    check_same_tokenizer(lm_tokenizer, tokenizer, lm_dir)
    lm.word_list = read_word_list(lm_dir, tokenizer)
    return lm


def model_dir_named(name_or_dir: str | os.PathLike[str] | None) -> Path:
    """The model directory ``name_or_dir`` names: None, ``default`` or ``builtin`` the built-in model's; one that is
    no directory is a one-line UserError (a whisper model name told so), checked without reading the model."""
    from srupp_asr.inputs import default_model_dir

    if name_or_dir is None or str(name_or_dir) in BUILTIN_NAMES:
        return default_model_dir()
    model_dir = Path(name_or_dir)
    if not model_dir.exists() and str(name_or_dir).removesuffix(".en") in WHISPER_SIZES:
        raise UserError(
            f"{model_dir}: model directory not found (srupp-asr has no whisper-sized models: leave the model "
            "out for the built-in one, or give a directory made by `srupp-asr average`)"
        )
    if not model_dir.is_dir():
        what = "is a file, not a model directory" if model_dir.exists() else "model directory not found"
        raise UserError(f"{model_dir}: {what}")
    return model_dir


def ready_cpu_recurrence(net: torch.nn.Module) -> None:
    """Build or import the SRU recurrence's CPU extension now, for a model on the CPU that runs it: its first
    use would otherwise be counted as decoding time (0.5 s). Where it cannot be built, decoding says so itself."""
    from srupp_asr import kernels
    from srupp_asr.sru import SRUppLayer

    if next(net.parameters()).device.type == "cpu" and any(isinstance(m, SRUppLayer) for m in net.modules()):
        with contextlib.suppress(kernels.BackendUnavailable):
            kernels.cpu_extension()


def runs_on_numpy(net: object) -> bool:
    """Whether ``net`` is a numpy network of :mod:`srupp_asr.runtime` (else a torch module)."""
    return hasattr(net, "decode_waveforms")


class LoadedModel:
    """A model directory loaded for decoding, with the fusion LMs loaded for it (by directory).

    On the CPU in float32 the network is the numpy runtime's (:mod:`srupp_asr.runtime`: no torch imported, less than
    half the memory) wherever it runs the model; elsewhere, and for the modes the runtime does not run
    (:meth:`net_for`), it is the torch network."""

    def __init__(
        self,
        net: ASRModel | NumpyASR,
        tokenizer: Tokenizer,
        model_dir: str,
        device: torch.device | str,
        compute_type: str = DEFAULT_COMPUTE_TYPE,
    ) -> None:
        self.net, self.tokenizer, self.model_dir, self.device = net, tokenizer, model_dir, device
        self.compute_type = compute_type
        self._torch_net = None if runs_on_numpy(net) else net  # loaded when a mode needs it (net_for)
        self._lms: dict[tuple[bool, Path], object] = {}  # fusion LMs by (numpy?, resolved directory)

    @classmethod
    def load(
        cls,
        name_or_dir: str | os.PathLike[str] | None = None,
        device: str = "auto",
        compute_type: str = DEFAULT_COMPUTE_TYPE,
        engine: str = "auto",
    ) -> Self:
        """Load ``name_or_dir`` (a model directory, or None / ``"default"`` for the built-in model) on ``device``
        (``cpu``, ``cuda``, ``cuda:1`` or ``auto``) in ``compute_type`` (``float32``, ``int8`` on the CPU, or
        ``bfloat16`` where the device does it natively: :mod:`srupp_asr.compute_types`); a UserError naming the
        problem when it cannot be loaded. ``engine``: ``auto`` (the numpy runtime for float32 on the CPU where it
        runs the model, else torch), ``numpy`` (that runtime, or a UserError saying why not) or ``torch``."""
        if engine not in ENGINES:
            raise UserError(f"--engine {engine}: unknown engine (choose {', '.join(ENGINES)})")
        resolved = compute_device(compute_type, device)
        model_dir = model_dir_named(name_or_dir)
        if engine != "torch":
            if resolved == "cpu" and compute_type == "float32":
                from srupp_asr.runtime.engine import NumpyASR, Unsupported

                try:
                    net, tokenizer = NumpyASR.load(model_dir)
                    return cls(net, tokenizer, str(model_dir), "cpu", compute_type)
                except Unsupported as err:
                    if engine == "numpy":
                        raise UserError(f"--engine numpy: {err}") from None
            elif engine == "numpy":
                raise UserError(
                    f"--engine numpy: float32 on the CPU only, not {compute_type} on {resolved} (use --engine torch)"
                )
        from srupp_asr.model_dir import load_model_dir

        net, tokenizer = load_model_dir(model_dir, resolved, compute_type)
        ready_cpu_recurrence(net)
        return cls(net, tokenizer, str(model_dir), next(net.parameters()).device, compute_type)

    def net_for(self, options: DecodingOptions) -> ASRModel | NumpyASR:
        """The network that decodes with ``options``: :attr:`net`, or, for a mode the numpy runtime does not run
        (``rescoring``, ``ctc_prefix_beam`` without an LM), the torch network on the CPU, loaded then (once)."""
        if not runs_on_numpy(self.net) or self.net.runs(options):
            return self.net
        if self._torch_net is None:
            from srupp_asr.model_dir import load_model_dir

            self._torch_net, _ = load_model_dir(self.model_dir, "cpu", self.compute_type)
            ready_cpu_recurrence(self._torch_net)
        return self._torch_net

    def fusion_lm(self, lm_dir: str | os.PathLike[str], numpy: bool | None = None) -> SRUppLM | NumpyLM:
        """The LM of ``lm_dir`` for this model (numpy for a numpy network, unless ``numpy`` says otherwise), checked
        to share its tokenizer; loaded once per directory."""
        numpy = runs_on_numpy(self.net) if numpy is None else numpy
        key = (numpy, Path(lm_dir).resolve())
        if key not in self._lms:
            if numpy:
                from srupp_asr.runtime.engine import load_numpy_lm

                self._lms[key] = load_numpy_lm(lm_dir, self.tokenizer)
            else:
                self._lms[key] = load_fusion_lm(
                    lm_dir, self.tokenizer, "cpu" if runs_on_numpy(self.net) else str(self.device)
                )
        return self._lms[key]

    def fuse(
        self, options: DecodingOptions, lm: str | os.PathLike[str] | None, lm_weight: float | None, no_lm: bool
    ) -> tuple[DecodingOptions, SRUppLM | NumpyLM | None, LMChoice]:
        """The options to decode with (their LM weight set), the LM to fuse (None: none; for the network
        :meth:`net_for` gives for them) and the choice made (:func:`choose_lm`), for options asked with ``lm``,
        ``lm_weight`` (None: the LM's own) and ``no_lm``."""
        choice = choose_lm(self.model_dir, options.mode, lm, lm_weight, no_lm)
        options = fused_options(options, choice)
        if choice.path is None:
            return options, None, choice
        return options, self.fusion_lm(choice.path, runs_on_numpy(self.net_for(options))), choice

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model_dir!r}, device={str(self.device)!r})"
