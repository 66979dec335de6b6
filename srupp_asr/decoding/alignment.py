"""Token and word timestamps, and word confidences, from a CTC forced alignment of a decoded hypothesis.

A hypothesis is aligned to its utterance's CTC log-probabilities (a numpy array) by :func:`forced_align`: the best
CTC path that emits exactly its tokens, found by a Viterbi search in numpy that breaks ties as
``torchaudio.functional.forced_align`` does, so the paths are torchaudio's (this module imports no torch: inference
on the CPU runs without it). A token's time is the first frame of its span in that path, times ``frame_shift``
seconds. Words are groups of sentencepiece pieces: a piece starting with ``▁`` starts a word; a word starts at its
first token's first frame and ends at the end (exclusive) of its last token's span.

Word confidence: the mean, over the word's tokens, of each token's peak CTC posterior along the alignment (the
largest ``P(token | frame)`` over the frames the path spends on that token). CTC emits a token in a spike of one
or a few frames, so the peak, not the mean over the span, is what says how sure the model was.

A hypothesis the CTC head cannot emit in the utterance's frames (an attention-only result longer than the frames
allow, or one every path of which has a ``-inf`` or NaN log-probability), or a model without a CTC head, gets evenly
spread token times over the utterance and confidence 0.
"""

from __future__ import annotations

import bisect
import difflib
import itertools
import math

import numpy as np

from srupp_asr.decoding.options import Word
from srupp_asr.tokenizer import WORD_START, Tokenizer

BLANK_ID = Tokenizer.blank_id


def ctc_can_emit(tokens: list[int], num_frames: int) -> bool:
    """Whether CTC can emit ``tokens`` in ``num_frames`` frames (a repeated token needs a blank between)."""
    repeats = sum(a == b for a, b in itertools.pairwise(tokens))
    return len(tokens) + repeats <= num_frames


def forced_align(log_probs: np.ndarray, tokens: list[int], blank: int = BLANK_ID) -> np.ndarray:
    """The label of every frame (``(T,)`` int64) on the best CTC path through ``log_probs`` ``(T, V)`` that emits
    ``tokens`` (non-empty, no ``blank``): the path ``torchaudio.functional.forced_align`` returns, computed as it
    does: float32 sums, states out of reach of the path's ends kept at -inf, and its tie-breaking (a move is taken
    only when it beats both others: where the two moves tie above staying the path stays, not always the best path
    but torchaudio's). The path is meaningful only when one with a finite log-probability exists (see
    :data:`IMPOSSIBLE`)."""
    log_probs = np.asarray(log_probs, dtype=np.float32)
    T, L = log_probs.shape[0], len(tokens)
    targets = np.asarray(tokens, dtype=np.int64)
    repeats = int(np.count_nonzero(targets[1:] == targets[:-1]))
    if not L or L + repeats > T:
        raise ValueError(f"CTC cannot emit {L} tokens ({repeats} repeated) in {T} frames")
    S = 2 * L + 1
    labels = np.full(S, blank, dtype=np.int64)
    labels[1::2] = targets
    # The states a path may reach from two states back: a token that differs from the previous one (the blank
    # between them skipped).
    can_jump = np.zeros(S, dtype=bool)
    can_jump[3::2] = targets[1:] != targets[:-1]
    # Scores of the states at the previous and the current frame, after two -inf cells (state i at index i + 2).
    prev = np.full(S + 2, -np.inf, dtype=np.float32)
    cur = prev.copy()
    back = np.zeros((T, S), dtype=np.int8)  # per frame and state: how many states back its move came from
    start, end = (0 if L + repeats < T else 1), 2  # the states the path can be in at this frame: [start, end)
    prev[start + 2 : end + 2] = log_probs[0, labels[start:end]]
    for t in range(1, T):
        if T - t <= L + repeats:  # the path must still reach the last states
            if start % 2 == 1 and targets[start // 2] != targets[start // 2 + 1]:
                start += 1
            start += 1
        if t <= L + repeats:  # the path cannot have gone further from the first states
            if end % 2 == 0 and end < 2 * L and targets[end // 2 - 1] != targets[end // 2]:
                end += 1
            end += 1
        stay, step = prev[start + 2 : end + 2], prev[start + 1 : end + 1]
        jump = np.where(can_jump[start:end], prev[start:end], np.float32(-np.inf))
        jumps = (jump > stay) & (jump > step)
        steps = (step > stay) & (step > jump)
        moves = steps.astype(np.int8)
        moves[jumps] = 2
        back[t, start:end] = moves
        cur.fill(-np.inf)
        cur[start + 2 : end + 2] = np.where(jumps, jump, np.where(steps, step, stay)) + log_probs[t, labels[start:end]]
        prev, cur = cur, prev
    state = S - 1 if prev[S + 1] > prev[S] else S - 2
    path = np.empty(T, dtype=np.int64)
    for t in range(T - 1, -1, -1):
        path[t] = labels[state]
        state -= int(back[t, state])
    return path


def token_spans(log_probs: np.ndarray, tokens: list[int]) -> tuple[list[int], list[int], list[float]] | None:
    """Forced alignment of ``tokens`` to ``log_probs`` ``(T, V)``: per token its first frame, end frame (exclusive)
    and peak posterior; None when CTC cannot emit the tokens in ``T`` frames, or gives every path that does
    probability 0 (a ``-inf`` or NaN log-probability on each).

    One alignment of ``T`` frames and ``N`` tokens has ``T x (2N + 1)`` trellis cells, a byte of back-pointer each
    (a whole hour of speech reaches gigabytes). Above :data:`MAX_CELLS` the utterance is cut into windows at frames
    where the best path emits blank, each window gets the hypothesis tokens the best path emits in it (hypothesis
    and best path matched with difflib), and each window is aligned on its own."""
    if not tokens or not ctc_can_emit(tokens, log_probs.shape[0]):
        return None
    if log_probs.shape[0] * (2 * len(tokens) + 1) <= MAX_CELLS:
        return _align(log_probs, tokens)
    return _align_in_windows(log_probs, tokens)


MAX_CELLS = 2**27  # trellis cells per forced alignment (128 MiB of back-pointers)


# Stands for a -inf (or NaN) log-probability in forced_align's input: with no finite path every score is -inf and
# the path found means nothing (it may even skip a token); with this floor the path is impossible exactly when it
# passes through a floored cell (the floor dominates any sum of finite log-probabilities).
IMPOSSIBLE = -1e30


def _align(log_probs: np.ndarray, tokens: list[int]) -> tuple[list[int], list[int], list[float]] | None:
    """forced_align's spans (see :func:`token_spans`), None when every path that emits ``tokens`` is impossible."""
    floored = np.nan_to_num(np.asarray(log_probs, dtype=np.float32), nan=IMPOSSIBLE, neginf=IMPOSSIBLE)
    path = forced_align(floored, tokens)
    scores = floored[np.arange(path.shape[0]), path]
    if bool((scores <= np.float32(IMPOSSIBLE)).any()):
        return None
    # The path visits the tokens in order: each run of one label is a span, the non-blank runs are the tokens.
    change = np.ones(path.shape[0], dtype=bool)
    change[1:] = path[1:] != path[:-1]
    firsts = np.flatnonzero(change)
    peaks = np.maximum.reduceat(np.exp(scores), firsts)
    tokens_at = path[firsts] != BLANK_ID
    ends = np.append(firsts[1:], path.shape[0])
    return firsts[tokens_at].tolist(), ends[tokens_at].tolist(), peaks[tokens_at].tolist()


def _align_in_windows(log_probs: np.ndarray, tokens: list[int]) -> tuple[list[int], list[int], list[float]]:
    T, N = log_probs.shape[0], len(tokens)
    best = log_probs.argmax(-1)
    emits = (best != BLANK_ID) & np.concatenate([[True], best[1:] != best[:-1]])
    emit_frames = np.flatnonzero(emits).tolist()
    greedy = best[emits].tolist()
    # hyp_before[g]: hypothesis tokens that come before the best path's g-th token (monotone in g)
    hyp_before: list[int | None] = [None] * len(greedy) + [N]
    matcher = difflib.SequenceMatcher(None, greedy, tokens, autojunk=False)
    for a, b, size in matcher.get_matching_blocks():
        for j in range(size):
            hyp_before[a + j] = b + j
    for g in reversed(range(len(greedy))):
        if hyp_before[g] is None:
            hyp_before[g] = hyp_before[g + 1]
    pieces = 2 * math.ceil(T * (2 * N + 1) / MAX_CELLS)
    blank_frames = np.flatnonzero(best == BLANK_ID)
    cuts = [0]
    for i in range(1, pieces):
        target = T * i // pieces
        if blank_frames.size:  # the blank frame nearest the even cut
            target = int(blank_frames[np.abs(blank_frames - target).argmin()])
        if target > cuts[-1]:
            cuts.append(target)
    cuts.append(T)
    starts: list[int] = []
    ends: list[int] = []
    peaks: list[float] = []
    for lo, hi in itertools.pairwise(cuts):
        first = hyp_before[bisect.bisect_left(emit_frames, lo)] if lo else 0
        last = hyp_before[bisect.bisect_left(emit_frames, hi)] if hi < T else N
        chunk = tokens[first:last]
        if not chunk:
            continue
        fits = ctc_can_emit(chunk, hi - lo) and (hi - lo) * (2 * len(chunk) + 1) <= 2 * MAX_CELLS
        spans = _align(log_probs[lo:hi], chunk) if fits else None
        if spans is not None:
            s, e, p = spans
            starts += [lo + x for x in s]
            ends += [lo + x for x in e]
            peaks += p
        else:  # the window cannot hold its tokens (the best path and the hypothesis disagree here): spread them
            step = (hi - lo) / len(chunk)
            starts += [lo + int(i * step) for i in range(len(chunk))]
            ends += [max(lo + int((i + 1) * step), starts[-len(chunk) + i] + 1) for i in range(len(chunk))]
            peaks += [0.0] * len(chunk)
    return starts, ends, peaks


def align_hypothesis(
    log_probs: np.ndarray | None, tokens: list[int], tokenizer: Tokenizer, frame_shift: float, num_frames: int
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
