"""Token and word timestamps, and word confidences, from a CTC forced alignment of a decoded hypothesis.

A hypothesis is aligned to its utterance's CTC log-probabilities with :func:`torchaudio.functional.forced_align`
(the best CTC path that emits exactly its tokens). A token's time is the first frame of its span in that path,
times ``frame_shift`` seconds. Words are groups of sentencepiece pieces: a piece starting with ``▁`` starts a word;
a word starts at its first token's first frame and ends at the end (exclusive) of its last token's span.

Word confidence: the mean, over the word's tokens, of each token's peak CTC posterior along the alignment (the
largest ``P(token | frame)`` over the frames the path spends on that token). CTC emits a token in a spike of one
or a few frames, so the peak, not the mean over the span, is what says how sure the model was.

A hypothesis the CTC head cannot emit in the utterance's frames (an attention-only result longer than the frames
allow), or a model without a CTC head, gets evenly spread token times over the utterance and confidence 0.
"""

from __future__ import annotations

import itertools

import torch
import torchaudio.functional as taf

from srupp_asr.decoding.options import Word
from srupp_asr.model import BLANK_ID
from srupp_asr.tokenizer import Tokenizer

WORD_START = "▁"


def ctc_can_emit(tokens: list[int], num_frames: int) -> bool:
    """Whether CTC can emit ``tokens`` in ``num_frames`` frames (a repeated token needs a blank between)."""
    repeats = sum(a == b for a, b in itertools.pairwise(tokens))
    return len(tokens) + repeats <= num_frames


def token_spans(log_probs: torch.Tensor, tokens: list[int]) -> tuple[list[int], list[int], list[float]] | None:
    """Forced alignment of ``tokens`` to ``log_probs`` ``(T, V)``: per token its first frame, end frame (exclusive)
    and peak posterior; None when CTC cannot emit the tokens in ``T`` frames."""
    if not tokens or not ctc_can_emit(tokens, log_probs.shape[0]):
        return None
    targets = torch.tensor([tokens], dtype=torch.int32)
    path, scores = taf.forced_align(log_probs[None].float().cpu(), targets, blank=BLANK_ID)
    path, probs = path[0], scores[0].exp()
    # The path visits the tokens in order: each run of one label is a span, the non-blank runs are the tokens.
    change = torch.ones_like(path, dtype=torch.bool)
    change[1:] = path[1:] != path[:-1]
    bounds = [*torch.nonzero(change).squeeze(1).tolist(), path.shape[0]]
    labels = path.tolist()
    spans = [(s, e) for s, e in itertools.pairwise(bounds) if labels[s] != BLANK_ID]
    peaks = [probs[s:e].max().item() for s, e in spans]
    return [s for s, _ in spans], [e for _, e in spans], peaks


def align_hypothesis(
    log_probs: torch.Tensor | None, tokens: list[int], tokenizer: Tokenizer, frame_shift: float, num_frames: int
) -> tuple[list[float], list[Word]]:
    """Token start times and words (with times and confidences) of ``tokens`` decoded from an utterance of
    ``num_frames`` encoder frames, ``log_probs`` ``(num_frames, V)`` its CTC log-probabilities (None: no CTC head)."""
    if not tokens:
        return [], []
    spans = token_spans(log_probs[:num_frames], tokens) if log_probs is not None else None
    if spans is None:  # no alignment: spread the tokens evenly, with no confidence
        step = num_frames / len(tokens)
        starts = [int(i * step) for i in range(len(tokens))]
        ends = [max(int((i + 1) * step), s + 1) for i, s in enumerate(starts)]
        peaks = [0.0] * len(tokens)
    else:
        starts, ends, peaks = spans
    words: list[Word] = []
    for first, last in _word_groups(tokens, tokenizer):
        text = tokenizer.decode(tokens[first:last]).strip()
        if not text:  # a lone word-boundary piece
            continue
        confidence = sum(peaks[first:last]) / (last - first)
        words.append(Word(text, starts[first] * frame_shift, ends[last - 1] * frame_shift, confidence))
    return [s * frame_shift for s in starts], words


def _word_groups(tokens: list[int], tokenizer: Tokenizer) -> list[tuple[int, int]]:
    """``[first, last)`` token ranges of the words: a new word at every piece that starts with ``▁``."""
    firsts = [i for i, t in enumerate(tokens) if i == 0 or tokenizer.id_to_piece(t).startswith(WORD_START)]
    return list(zip(firsts, [*firsts[1:], len(tokens)], strict=True))
