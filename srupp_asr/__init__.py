"""srupp-asr: speech recognition with SRU++ encoders (fast recurrence plus a little attention)."""

__version__ = "0.1.0"

__all__ = ["__version__"]
