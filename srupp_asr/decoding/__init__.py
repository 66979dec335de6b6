"""Decoding: CTC greedy, CTC prefix beam search, joint CTC/attention beam search and attention rescoring, batched
over utterances, with token and word timestamps and word confidences from a CTC forced alignment.

    from srupp_asr.decoding import DecodingOptions, decode
    hyps = decode(model, tokenizer, audio, audio_lens, DecodingOptions(mode="joint", beam=10))

Many recordings, batched and long ones in chunks, are decoded by :mod:`srupp_asr.decoding.batch` (``transcribe``
and ``evaluate`` share it). The options and their command-line arguments (:mod:`srupp_asr.decoding.options`,
:mod:`srupp_asr.decoding.settings`) load without torch; the search functions are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from srupp_asr.decoding.options import MODES, DecodingOptions, Hypothesis, Word

if TYPE_CHECKING:
    from srupp_asr.decoding.modes import decode, decode_encoded
    from srupp_asr.decoding.scorers import Scorer

_LAZY = {
    "decode": "srupp_asr.decoding.modes",
    "decode_encoded": "srupp_asr.decoding.modes",
    "Scorer": "srupp_asr.decoding.scorers",
}

__all__ = [
    "MODES",
    "DecodingOptions",
    "Hypothesis",
    "Scorer",
    "Word",
    "decode",
    "decode_encoded",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
