"""Decoding: CTC greedy, CTC prefix beam search, joint CTC/attention beam search and attention rescoring, batched
over utterances, with token and word timestamps and word confidences from a CTC forced alignment.

    from srupp_asr.decoding import DecodingOptions, decode
    hyps = decode(model, tokenizer, audio, audio_lens, DecodingOptions(mode="joint", beam=10))
"""

from srupp_asr.decoding.api import decode, decode_encoded
from srupp_asr.decoding.options import MODES, DecodingOptions, Hypothesis, Word
from srupp_asr.decoding.scorers import Scorer

__all__ = [
    "MODES",
    "DecodingOptions",
    "Hypothesis",
    "Scorer",
    "Word",
    "decode",
    "decode_encoded",
]
