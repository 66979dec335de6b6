"""srupp-asr: speech recognition with SRU++ encoders (fast recurrence plus a little attention).

``srupp_asr.transcribe(inputs, model=...)`` is the Python API of ``srupp-asr transcribe`` (importing it loads
neither torch nor numpy until it runs).
"""

__version__ = "0.1.0"

from srupp_asr.transcribe import transcribe  # after __version__, which the CLI modules read

__all__ = ["__version__", "transcribe"]
