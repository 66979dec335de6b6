"""CTM against CTM as sclite scores it: each channel cut into utterances where reference and hypothesis agree.

sclite (NIST SCTK ``ctm2ctm.c``) aligns a CTM hypothesis with a CTM reference one recording at a time, both
files in the same recording order, a recording's channels paired in file order (one or two channels). A channel
is cut into chunks of about 50 words: from 50 words past the chunk's start on both sides, the ends step back
until a gap between reference words overlaps a gap between hypothesis words (an alternation is never cut); where
no such place is found, the chunk is tried again twice as long. Chunk k of channel ``c`` of recording ``f`` is
utterance ``f-c-k`` (``k`` in four digits) of speaker ``f-c``.

The word arrays are indexed as sclite's are (from 1, alternation marks ``<ALT_BEGIN>``/``<ALT>``/``<ALT_END>``
taking a place and times 0), because the cut points read neighbouring words by index and so depend on it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from srupp_asr.errors import UserError
from srupp_asr.scoring.formats import CtmToken

FIRST_CHUNK_WORDS = 50
_NO_NEXT_WORD = 999999.99  # sclite's end time of the gap after a channel's last word


@dataclass(frozen=True)
class MarkedWord:
    """A CTM line as sclite's word array holds it: ``alternate`` for the marks and the words of an alternation."""

    token: CtmToken
    t1: float
    dur: float
    alternate: bool


@dataclass(frozen=True)
class Recording:
    """One recording's words (``words[0]`` a placeholder, so the first word is index 1) and its channels' last
    indices (one or two channels, in file order)."""

    name: str
    words: list[MarkedWord]
    channel_ends: list[int]


def recordings(tokens: Sequence[CtmToken], path: str) -> list[Recording]:
    """A CTM file's recordings in file order, each with its channels, as sclite's word arrays."""
    out: list[Recording] = []
    start = 0
    while start < len(tokens):
        end = start
        while end < len(tokens) and tokens[end].file == tokens[start].file:
            end += 1
        out.append(_recording(tokens[start:end], path))
        start = end
    seen = [r.name for r in out]
    if len(set(seen)) != len(seen):
        name = next(n for n in seen if seen.count(n) > 1)
        raise UserError(f"{path}: recording '{name}' is in more than one place; sort the CTM by recording")
    return out


def _recording(tokens: Sequence[CtmToken], path: str) -> Recording:
    words = [MarkedWord(CtmToken("", "", 0.0, 0.0, ""), 0.0, 0.0, False)]
    ends: list[int] = []
    inside = False
    for k, tok in enumerate(tokens, start=1):
        if k > 1 and tok.channel != tokens[k - 2].channel:
            ends.append(k - 1)
        mark = tok.word.startswith("<ALT")  # read_ctm writes the marks in capitals
        # sclite: an alternation runs from its <ALT_BEGIN> through its <ALT_END>
        inside = mark or (inside and words[-1].token.word != "<ALT_END>")
        words.append(MarkedWord(tok, tok.start or 0.0, tok.duration or 0.0, inside))
    ends.append(len(tokens))
    if len(ends) > 2:
        raise UserError(
            f"{path}: recording '{tokens[0].file}' has more than two channels or a channel in two places;"
            " sclite scores one or two channels, each in one block of lines"
        )
    return Recording(tokens[0].file, words, ends)


def _overlap(a1: float, a2: float, b1: float, b2: float) -> float:
    """How long two time spans overlap (negative: how far apart they are), as sclite computes it."""
    return min(a2, b2) - max(a1, b1)


def _word_overlap(ref: MarkedWord, hyp: MarkedWord) -> float:
    return _overlap(ref.t1, ref.t1 + ref.dur, hyp.t1, hyp.t1 + hyp.dur)


def _skip_alternation(ref: list[MarkedWord], rend: int, rstart: int) -> tuple[int, bool]:
    """One word back from ``rend`` and past any alternation; also whether an alternation was passed."""
    rend -= 1
    skipped = False
    while rend >= rstart and ref[rend].alternate:
        rend -= 1
        skipped = True
    return rend, skipped


def _synchronize(ref: list[MarkedWord], hyp: list[MarkedWord], r: int, h: int, rs: int, hs: int) -> tuple[int, int]:
    """Step the later of the two end words back until it overlaps the other or starts before it."""
    skipped = True
    while skipped:
        skipped = False
        if ref[r].t1 > hyp[h].t1:
            while not skipped and r >= rs and ref[r].t1 > hyp[h].t1 and _word_overlap(ref[r], hyp[h]) < 0.0:
                r, skipped = _skip_alternation(ref, r, rs)
        elif ref[r].t1 < hyp[h].t1:
            while h >= hs and ref[r].t1 < hyp[h].t1 and _word_overlap(ref[r], hyp[h]) < 0.0:
                h -= 1
    return r, h


def _step_back(ref: list[MarkedWord], hyp: list[MarkedWord], r: int, h: int, rs: int, hs: int) -> tuple[int, int]:
    """Move the end that starts later one word back, then the other end back past the words it no longer meets."""
    skipped = True
    while skipped:
        skipped = False
        if ref[r].t1 > hyp[h].t1:
            if r > rs:
                r, skipped = _skip_alternation(ref, r, rs)
            while not skipped and h >= hs and ref[r].t1 < hyp[h].t1 and _word_overlap(ref[r], hyp[h]) < 0.0:
                h -= 1
        else:
            if h > hs:
                h -= 1
            while not skipped and r >= rs and ref[r].t1 > hyp[h].t1 and _word_overlap(ref[r], hyp[h]) < 0.0:
                r, skipped = _skip_alternation(ref, r, rs)
    return r, h


def _gap_after(words: list[MarkedWord], k: int, last: int) -> tuple[float, float]:
    return words[k].t1 + words[k].dur, (_NO_NEXT_WORD if k == last else words[k + 1].t1)


def chop(
    ref: list[MarkedWord], hyp: list[MarkedWord], rs: int, hs: int, rlast: int, hlast: int, max_words: int
) -> tuple[int, int] | None:
    """The last reference and hypothesis indices of the chunk starting at ``rs``/``hs`` (sclite's
    ``chop_WTOKE_2``); None when no cut is found within ``max_words`` words."""
    if rs > rlast and hs > hlast:
        return None
    if rlast - rs < max_words and hlast - hs < max_words:
        return rlast, hlast
    r, h = min(rs + max_words, rlast), min(hs + max_words, hlast)
    while r >= rs and ref[r].alternate:
        r -= 1
    r, h = _synchronize(ref, hyp, r, h, rs, hs)
    while r > rs and h > hs:
        if _overlap(*_gap_after(ref, r, rlast), *_gap_after(hyp, h, hlast)) >= 0.0:
            return r, h
        r, h = _step_back(ref, hyp, r, h, rs, hs)
    return (r, h) if r > rs or h > hs else None


@dataclass(frozen=True)
class Chunk:
    """One utterance of a CTM-to-CTM alignment: its words on both sides and its names."""

    utt_id: str
    speaker: str
    file: str
    channel: str
    ref: list[MarkedWord]
    hyp: list[MarkedWord]


def chunks(ref: Recording, hyp: Recording, ref_path: str, hyp_path: str) -> Iterator[Chunk]:
    """A recording's utterances, channel by channel, as sclite cuts them."""
    if len(ref.channel_ends) != len(hyp.channel_ends):
        raise UserError(
            f"{hyp_path}: recording '{ref.name}' has {len(hyp.channel_ends)} channel(s), "
            f"{len(ref.channel_ends)} in {ref_path}"
        )
    rs = hs = 1
    for rlast, hlast in zip(ref.channel_ends, hyp.channel_ends, strict=True):
        number = 0
        while rs <= rlast or hs <= hlast:
            size = FIRST_CHUNK_WORDS
            while (cut := chop(ref.words, hyp.words, rs, hs, rlast, hlast, size)) is None:
                size *= 2
            # sclite names the chunk after the reference word it starts at (past a channel's last word: the next)
            first = ref.words[min(rs, len(ref.words) - 1)].token
            speaker = f"{first.file}-{first.channel}"
            yield Chunk(
                f"{speaker}-{number:04d}",
                speaker,
                first.file,
                first.channel,
                ref.words[rs : cut[0] + 1],
                hyp.words[hs : cut[1] + 1],
            )
            rs, hs = cut[0] + 1, cut[1] + 1
            number += 1
        rs, hs = rlast + 1, hlast + 1
