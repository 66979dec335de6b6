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
The loading is :class:`srupp_asr.loading.LoadedModel`'s, which :func:`srupp_asr.transcribe` also uses for a
model given by its directory: this module imports ``transcribe``, never the other way round.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from srupp_asr.compute_types import DEFAULT_COMPUTE_TYPE
from srupp_asr.loading import LoadedModel
from srupp_asr.transcribe import transcribe  # one way: transcribe imports nothing of this module

if TYPE_CHECKING:
    from srupp_asr.writers import Transcript


class Model(LoadedModel):
    """A model directory loaded on a device, ready to transcribe (see :meth:`transcribe`); :meth:`load` loads one."""

    def transcribe(
        self, audio: Any, *, sample_rate: int | None = None, **options: Any
    ) -> Transcript | list[Transcript] | None:
        """Transcribe ``audio`` with this model (loaded once, reused by every call).

        ``audio``: a path to an audio file (returns its :class:`~srupp_asr.writers.Transcript`), samples in memory
        (a numpy array or torch tensor, (samples,) or (channels, samples), at ``sample_rate`` Hz: returns one
        Transcript), or a list of paths, a folder, an ``@LIST`` file or a list of sample arrays (returns a list, in
        order). ``options`` are those of :func:`srupp_asr.transcribe` (``options=DecodingOptions(...)`` or
        ``decoding``, ``beam``, ..., ``output_dir``, ``output_format``, ``on_error``, ...). A file that cannot be
        read raises :class:`UserError` unless ``on_error`` is given (then it is left out; a single input that
        failed returns None).
        """
        from srupp_asr.audio import is_samples

        for fixed in ("model", "device", "compute_type", "engine"):
            if fixed in options:
                raise TypeError(f"Model.transcribe() takes no {fixed!r}: it is the loaded model's own")
        single = is_samples(audio) or (
            isinstance(audio, str | os.PathLike) and not os.fspath(audio).startswith("@") and not os.path.isdir(audio)
        )
        results = transcribe(audio, self, sample_rate=sample_rate, **options)
        if single:
            return results[0] if results else None
        return results


def load_model(
    name_or_dir: str | os.PathLike[str] | None = None,
    device: str = "auto",
    compute_type: str = DEFAULT_COMPUTE_TYPE,
    engine: str = "auto",
) -> Model:
    """Load a model once for many :meth:`Model.transcribe` calls: ``name_or_dir`` a model directory (what
    ``srupp-asr average`` or ``export`` wrote), or None / ``"default"`` for the built-in model; ``device``
    ``cpu``, ``cuda`` or ``auto`` (a GPU when there is one); ``compute_type`` ``float32``, ``int8`` (the
    Linear layers quantised; CPU only, so ``auto`` means the CPU) or ``bfloat16`` (the encoder in bfloat16 autocast,
    where the device does it natively; :mod:`srupp_asr.compute_types`); ``engine`` ``auto`` (float32 on the CPU in
    numpy, without torch: :mod:`srupp_asr.runtime`), ``numpy`` or ``torch``."""
    return Model.load(name_or_dir, device, compute_type, engine)
