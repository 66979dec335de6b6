"""srupp-asr: speech recognition with SRU++ encoders (fast recurrence plus a little attention).

``srupp_asr.load_model()`` loads a model once; its ``.transcribe(audio)`` takes paths or samples in memory.
``srupp_asr.transcribe(inputs, model=...)`` is the one-call form, the Python API of ``srupp-asr transcribe``.
Importing the package loads neither torch nor numpy until one of them runs.
"""

__version__ = "0.1.0"

from srupp_asr.api import Model, load_model
from srupp_asr.transcribe import transcribe  # after __version__, which the CLI modules read

__all__ = ["Model", "__version__", "load_model", "transcribe"]
