"""The Python API in whisper's shape: load a model once, transcribe many things with it.

::

    import srupp_asr

    model = srupp_asr.load_model()                      # the built-in model; or a model directory
    result = model.transcribe("talk.flac")              # one file: one Transcript
    print(result.text, [(w.word, w.start, w.end, w.confidence) for s in result.segments for w in s.words])
    results = model.transcribe(["a.wav", "calls/"])     # several files, folders, @LIST files: a list
    result = model.transcribe(samples, sample_rate=44100)   # numpy / torch samples, (samples,) or (channels, samples)

:func:`srupp_asr.transcribe` stays the one-call form (it loads the model, transcribes, and lets it go). Field names
are those of the JSON output: a transcript's ``text``, ``segments`` (``start``, ``end``, ``text``, ``words``) and
each word's ``word``, ``start``, ``end``, ``confidence``.

A model directory that carries its language model (``lm/``) is decoded with it by default (``no_lm=True`` or
``lm_weight=0`` turns it off, ``lm=DIR`` takes another); the LM is loaded at the first call that fuses it and kept.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srupp_asr.errors import UserError

if TYPE_CHECKING:
    import torch

    from srupp_asr.audio import SamplesReader
    from srupp_asr.lm import SRUppLM
    from srupp_asr.model import ASRModel
    from srupp_asr.tokenizer import Tokenizer
    from srupp_asr.writers import Transcript

# Names load_model takes besides a directory: the built-in model.
BUILTIN_NAMES = ("default", "builtin")
# whisper's model names, which a whisper user may give out of habit: told that they do not exist here
WHISPER_SIZES = ("tiny", "base", "small", "medium", "large", "large-v2", "large-v3", "turbo")


class Model:
    """A model directory loaded on a device, ready to transcribe (see :meth:`transcribe`)."""

    def __init__(self, net: ASRModel, tokenizer: Tokenizer, model_dir: str, device: torch.device) -> None:
        self.net, self.tokenizer, self.model_dir, self.device = net, tokenizer, model_dir, device
        self._lms: dict[Path, SRUppLM] = {}  # fusion LMs loaded for this model, by resolved directory

    @classmethod
    def load(cls, name_or_dir: str | os.PathLike[str] | None = None, device: str = "auto") -> Model:
        """Load ``name_or_dir`` (a model directory, or None / ``"default"`` for the built-in model) on ``device``
        (``cpu``, ``cuda``, ``cuda:1`` or ``auto``); a UserError naming the problem when it cannot be loaded."""
        from srupp_asr.decoding.cli import resolve_device
        from srupp_asr.inputs import default_model_dir
        from srupp_asr.model_dir import load_model as load_model_dir

        resolved = resolve_device(device)
        if name_or_dir is None or str(name_or_dir) in BUILTIN_NAMES:
            model_dir = default_model_dir()
        else:
            model_dir = Path(name_or_dir)
            if not model_dir.exists() and str(name_or_dir).removesuffix(".en") in WHISPER_SIZES:
                raise UserError(
                    f"{model_dir}: model directory not found (srupp-asr has no whisper-sized models: leave the model "
                    "out for the built-in one, or give a directory made by `srupp-asr average`)"
                )
        net, tokenizer = load_model_dir(model_dir, resolved)
        return cls(net, tokenizer, str(model_dir), next(net.parameters()).device)

    def transcribe(
        self, audio: Any, *, sample_rate: int | None = None, **options: Any
    ) -> Transcript | list[Transcript] | None:
        """Transcribe ``audio`` with this model (loaded once, reused by every call).

        ``audio``: a path to an audio file (returns its :class:`~srupp_asr.writers.Transcript`), samples in memory
        (a numpy array or torch tensor, (samples,) or (channels, samples), at ``sample_rate`` Hz: returns one
        Transcript), or a list of paths, a folder, an ``@LIST`` file or a list of sample arrays (returns a list, in
        order). ``options`` are those of :func:`srupp_asr.transcribe` (``decoding``, ``beam``, ``output_dir``,
        ``output_format``, ``on_error``, ...). A file that cannot be read raises :class:`UserError` unless
        ``on_error`` is given (then it is left out; a single input that failed returns None).
        """
        from srupp_asr.audio import is_samples
        from srupp_asr.transcribe import transcribe

        for fixed in ("model", "device"):
            if fixed in options:
                raise TypeError(f"Model.transcribe() takes no {fixed!r}: it is the loaded model's own")
        single = is_samples(audio) or (
            isinstance(audio, str | os.PathLike) and not os.fspath(audio).startswith("@") and not os.path.isdir(audio)
        )
        results = transcribe(audio, self, sample_rate=sample_rate, **options)
        if single:
            return results[0] if results else None
        return results

    def fusion_lm(self, lm_dir: str | os.PathLike[str]) -> SRUppLM:
        """The LM of ``lm_dir`` on this model's device, checked to share its tokenizer; loaded once per directory."""
        from srupp_asr.decoding.cli import load_fusion_lm

        key = Path(lm_dir).resolve()
        if key not in self._lms:
            self._lms[key] = load_fusion_lm(lm_dir, self.tokenizer, str(self.device))
        return self._lms[key]

    def __repr__(self) -> str:
        return f"Model({self.model_dir!r}, device={str(self.device)!r})"


def load_model(name_or_dir: str | os.PathLike[str] | None = None, device: str = "auto") -> Model:
    """Load a model once for many :meth:`Model.transcribe` calls: ``name_or_dir`` a model directory (what
    ``srupp-asr average`` or ``export`` wrote), or None / ``"default"`` for the built-in model; ``device``
    ``cpu``, ``cuda`` or ``auto`` (a GPU when there is one)."""
    return Model.load(name_or_dir, device)


def samples_readers(audio: Any, sample_rate: int | None) -> tuple[list[SamplesReader], list[str]] | None:
    """``audio`` as samples in memory: the readers of the arrays that can be used and one-line problems for those
    that cannot (named ``samples-N`` by position); None when ``audio`` holds paths, not samples. A list mixing
    the two, or a ``sample_rate`` given with paths, is a UserError."""
    from srupp_asr.audio import SamplesReader, is_samples

    if is_samples(audio):
        items = [audio]
    elif isinstance(audio, Sequence) and not isinstance(audio, str | bytes) and any(map(is_samples, audio)):
        items = list(audio)
        if not all(map(is_samples, items)):
            raise UserError("give either paths or sample arrays to transcribe, not both in one list")
    else:
        if sample_rate is not None:
            raise UserError("sample_rate is for samples given as arrays: files carry their own rate")
        return None
    readers, problems = [], []
    for i, samples in enumerate(items, 1):
        try:
            readers.append(SamplesReader(samples, sample_rate, name=f"samples-{i}"))
        except UserError as err:
            problems.append(str(err))
    return readers, problems
