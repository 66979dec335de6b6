"""Long recordings: where to cut them, where the silences are, and how the pieces' words join up.

A recording that fits the memory budget is decoded whole (the SRU++ encoder's strength is long context).
A longer one is cut into chunks that overlap by at least ``overlap`` seconds, each starting and ending at the
quietest moment within reach (a chunk that starts inside a word can make a model lose a word seconds later);
each chunk is decoded alone and the words are joined at the overlaps: a word the overlap holds is taken from the
chunk where it lies farther from the chunk's edge, so every word comes from a chunk that heard enough context
around it. With the energy VAD the cuts go in the middle of silences instead and chunks need no overlap; where a
stretch longer than a chunk has no silence, that part falls back to overlapping chunks.

Everything here is plain arithmetic on sample counts, energies and word times (no model), so it is tested
directly; ``transcribe`` reads the audio and runs the model.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

VAD_FRAME_SECONDS = 0.01  # energy frames of 10 ms
MIN_SILENCE = 0.3  # seconds below the threshold that count as a pause to cut in
VAD_FLOOR_DB = -100.0  # the energy of digital silence, in dB of full scale
VAD_MARGIN_DB = 6.0  # the threshold is at least this far above the noise floor
VAD_RANGE_DB = 60.0  # the noise floor counts as at most this far below the speech level


@dataclass(frozen=True)
class Chunk:
    """A stretch ``[start, end)`` of a recording, in samples."""

    start: int
    end: int

    def seconds(self, sample_rate: int) -> tuple[float, float]:
        """``(start, end)`` in seconds."""
        return self.start / sample_rate, self.end / sample_rate


QUIET_WINDOW_SECONDS = 0.2  # loudness is compared over windows this long: a pause, not a plosive's closure
QUIET_TOLERANCE_DB = 1.0  # windows this close to the quietest count as quiet as it


@dataclass(frozen=True)
class Loudness:
    """A recording's frame energies (:func:`frame_energies_db`), to find its quietest moment within a stretch."""

    energies_db: np.ndarray
    frame_samples: int
    window_frames: int = round(QUIET_WINDOW_SECONDS / VAD_FRAME_SECONDS)

    def quietest(self, start: int, end: int) -> int:
        """The sample in ``[start, end]`` at the middle of the quietest stretch there: windows of ``window_frames``
        centred in the range are compared by mean power; of those within ``QUIET_TOLERANCE_DB`` of the quietest,
        the latest run of neighbours is taken and its middle returned (``end`` where no window is centred in the
        range)."""
        frame, width = self.frame_samples, self.window_frames
        half = width * frame // 2  # window k covers frames [k, k + width) and is centred at sample k * frame + half
        first = max(0, -((half - start) // frame))  # the first window centred at or after start (a ceiling)
        last = min(len(self.energies_db) - width, (end - half) // frame)  # the last one centred at or before end
        if last < first:
            return end
        power = 10.0 ** (np.asarray(self.energies_db[first : last + width], dtype=np.float64) / 10.0)
        sums = np.cumsum(np.concatenate([[0.0], power]))
        level = 10.0 * np.log10(np.maximum((sums[width:] - sums[:-width]) / width, 1e-30))
        centres = np.arange(first, last + 1, dtype=np.int64) * frame + half
        quiet = np.flatnonzero(level <= level.min() + QUIET_TOLERANCE_DB)
        run = len(quiet) - 1  # the latest run of neighbouring quiet windows
        while run > 0 and quiet[run - 1] == quiet[run] - 1:
            run -= 1
        return int(centres[(quiet[run] + quiet[-1]) // 2])


def plan_chunks(
    num_samples: int,
    max_samples: int,
    overlap_samples: int,
    silences: Sequence[tuple[int, int]] | None = None,
    loudness: Loudness | None = None,
    grid: int = 1,
) -> list[Chunk]:
    """Cover ``[0, num_samples)`` with chunks of at most ``max_samples``, each starting on a multiple of ``grid``
    samples (the model's frame: a chunk then sees the very frames the whole recording would).

    Without ``silences``: overlapping chunks (one when the whole fits). Each chunk starts at the quietest moment
    (by the recording's ``loudness``) of the previous chunk's second half that leaves ``overlap_samples`` before
    that chunk's end, which lies at the quietest moment past the overlap: a chunk that starts inside a word can
    make a model lose words beyond it. Without ``loudness``: as late as the budget allows. The last chunk is at
    least half a budget long where the budget allows (a sliver of a word alone is easily misheard). With
    ``silences`` (``(start, end)`` sample ranges): cut in the middle of the latest silence that keeps a chunk within
    ``max_samples`` (and, preferably, past its half), chunks touching without overlap; a stretch with no such
    silence is covered by overlapping chunks.
    """
    if max_samples <= 0:
        raise ValueError(f"max_samples must be positive, got {max_samples}")
    if not 0 <= overlap_samples < max_samples:
        raise ValueError(f"overlap_samples must be in [0, max_samples), got {overlap_samples} for {max_samples}")
    if grid <= 0:
        raise ValueError(f"grid must be positive, got {grid}")
    if num_samples <= max_samples:
        return [Chunk(0, num_samples)]
    loudness = loudness or Loudness(np.zeros(0), 1)
    if silences is None:
        return _overlapping(0, num_samples, max_samples, overlap_samples, loudness, grid)
    middles = ((a + b) // 2 // grid * grid for a, b in silences)
    cuts = sorted(c for c in middles if 0 < c < num_samples)
    chunks: list[Chunk] = []
    pos = 0
    while num_samples - pos > max_samples:
        reachable = [c for c in cuts if pos < c <= pos + max_samples]
        preferred = [c for c in reachable if c >= pos + max_samples // 2]
        if preferred or reachable:
            cut = (preferred or reachable)[-1]
            chunks.append(Chunk(pos, cut))
            pos = cut
            continue
        # No silence within reach: overlapping chunks up to the next silence (or the end).
        following = [c for c in cuts if c > pos + max_samples]
        stop = following[0] if following else num_samples
        chunks.extend(_overlapping(pos, stop, max_samples, overlap_samples, loudness, grid))
        pos = stop
    if pos < num_samples:  # (a stretch of overlapping chunks may already have reached the end)
        chunks.append(Chunk(pos, num_samples))
    return chunks


def _overlapping(begin: int, end: int, max_samples: int, overlap: int, loudness: Loudness, grid: int) -> list[Chunk]:
    """Chunks of at most ``max_samples`` covering ``[begin, end)`` (``begin`` on the grid), cut at quiet moments,
    neighbours overlapping by at least ``overlap``, each starting on the grid."""
    chunks, start = [], begin
    while end - start > max_samples:
        latest = min(start + max_samples - overlap, end - max_samples // 2)  # the last chunk half a budget or more
        quiet = loudness.quietest(min(start + max_samples // 2, latest), latest)
        following = quiet // grid * grid  # earlier, so the overlap only grows
        if following <= start:  # (a grid as coarse as half the budget)
            following = quiet
        chunks.append(Chunk(start, loudness.quietest(following + overlap, start + max_samples)))
        start = following
    return [*chunks, Chunk(start, end)]


# ------------------------------------------------------------------------------------------ energy VAD


def frame_energies_db(wav: np.ndarray | Any, frame_samples: int) -> np.ndarray:
    """Mean-square energy in dB (full scale = 0 dB, floor ``VAD_FLOOR_DB``) of consecutive whole frames of ``wav``;
    a last partial frame is left out."""
    samples = np.asarray(wav, dtype=np.float64)
    count = len(samples) // frame_samples
    frames = samples[: count * frame_samples].reshape(count, frame_samples)
    power = np.mean(frames * frames, axis=1)
    return np.maximum(10.0 * np.log10(np.maximum(power, 1e-30)), VAD_FLOOR_DB)


def energies_from_blocks(blocks: Iterable[np.ndarray | Any], frame_samples: int) -> tuple[np.ndarray, int]:
    """:func:`frame_energies_db` of a recording read as consecutive blocks (each a whole number of frames but the
    last), so only the energies, not the audio, are held; and the recording's length in samples."""
    energies, total = [], 0
    for block in blocks:
        energies.append(frame_energies_db(block, frame_samples))
        total += len(block)
    return (np.concatenate(energies) if energies else np.zeros(0)), total


def silences_from_energies(
    energies_db: np.ndarray, num_samples: int, frame_samples: int, min_silence_frames: int
) -> list[tuple[int, int]]:
    """:func:`find_silences` in a recording of ``num_samples``: a silence that reaches the last whole frame runs on
    to the end of the recording (over the partial frame, which has no energy of its own)."""
    found = find_silences(energies_db, frame_samples, min_silence_frames)
    if found and num_samples - found[-1][1] < frame_samples:
        found[-1] = (found[-1][0], num_samples)
    return found


def energy_threshold_db(energies_db: np.ndarray) -> float:
    """A speech/silence threshold halfway (in dB) between the recording's noise floor (5th percentile energy, but
    at most ``VAD_RANGE_DB`` below the speech) and its speech level (95th percentile), and at least
    ``VAD_MARGIN_DB`` above the floor."""
    if len(energies_db) == 0:
        return VAD_FLOOR_DB
    floor, speech = np.percentile(energies_db, [5, 95])
    floor = max(floor, speech - VAD_RANGE_DB)  # digital silence would put the threshold in the noise
    return float(floor + max(VAD_MARGIN_DB, 0.5 * (speech - floor)))


def find_silences(
    energies_db: np.ndarray, frame_samples: int, min_silence_frames: int, threshold_db: float | None = None
) -> list[tuple[int, int]]:
    """``(start, end)`` sample ranges where at least ``min_silence_frames`` frames in a row lie below the threshold
    (default: :func:`energy_threshold_db` of these energies) and hold no quieter sound of their own.

    A stretch below the recording's threshold whose frames rise above the stretch's own threshold (a speaker far
    quieter than the loudest one: 40 dB quieter falls wholly below the recording's threshold) is not a silence:
    only the pauses inside it, found the same way with its own threshold, are. Otherwise a chunk inside it would
    be skipped as silent, and the cuts could fall inside its words."""
    return _silences(np.asarray(energies_db, dtype=np.float64), frame_samples, min_silence_frames, threshold_db, 0)


MAX_VAD_LEVELS = 4  # how many times a quiet stretch is searched again with its own threshold


def _silences(
    energies: np.ndarray, frame_samples: int, min_frames: int, threshold_db: float | None, level: int
) -> list[tuple[int, int]]:
    if threshold_db is None:
        threshold_db = energy_threshold_db(energies)
    quiet = np.concatenate([[False], energies < threshold_db, [False]])
    edges = np.flatnonzero(np.diff(quiet.astype(np.int8)))
    found = []
    for a, b in zip(edges[0::2].tolist(), edges[1::2].tolist(), strict=True):
        if b - a < min_frames:
            continue
        if level + 1 < MAX_VAD_LEVELS and len(loud_frames(energies[a:b])):
            inner = _silences(energies[a:b], frame_samples, min_frames, None, level + 1)
            found.extend((a * frame_samples + x, a * frame_samples + y) for x, y in inner)
        else:
            found.append((a * frame_samples, b * frame_samples))
    return found


def loud_frames(energies_db: np.ndarray) -> np.ndarray:
    """Indices of the frames at or above the energies' own :func:`energy_threshold_db`: none for silence or steady
    noise (the threshold is at least ``VAD_MARGIN_DB`` above the noise floor)."""
    if len(energies_db) == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(energies_db >= energy_threshold_db(energies_db))


# ------------------------------------------------------------------------------------------ joining chunks


def shift_words(words: Iterable[Any], seconds: float) -> list[Any]:
    """Copies of dataclass words with ``start`` and ``end`` moved by ``seconds``."""
    return [dataclasses.replace(w, start=w.start + seconds, end=w.end + seconds) for w in words]


def merge_chunk_words(chunks: Sequence[tuple[float, float]], words: Sequence[Sequence[Any]]) -> list[Any]:
    """Join the words of overlapping chunks (``(start, end)`` in seconds; words in absolute times, in order).

    Inside the overlap of two neighbours a word is taken from the chunk where it lies farther from the chunk's
    edge: before the overlap's midpoint from the earlier chunk, after it from the later one (word centres
    decide). A word that straddles the midpoint can be kept by both or by neither; where the two copies overlap
    in time, the one farther from its chunk's edge stays. The result is in time order without overlaps
    (:func:`in_time_order`): two different words the neighbours heard across the join share out their overlap.
    """
    if len(chunks) != len(words):
        raise ValueError(f"{len(chunks)} chunks but {len(words)} word lists")
    if not chunks:
        return []
    merged = list(words[0])
    for (_, prev_end), (start, _), nxt in zip(chunks[:-1], chunks[1:], words[1:], strict=True):
        if start >= prev_end:  # touching (cut in a silence): nothing to reconcile
            merged.extend(nxt)
            continue
        middle = (start + prev_end) / 2
        before = [w for w in merged if _centre(w) < middle]
        after = [w for w in nxt if _centre(w) >= middle]
        dropped_before = [w for w in merged if _centre(w) >= middle]
        dropped_after = [w for w in nxt if _centre(w) < middle]
        if before and after and _same_word(before[-1], after[0]):
            # Both kept it: keep the copy with more context (its distance to its own chunk's edge).
            if prev_end - _centre(before[-1]) >= _centre(after[0]) - start:
                after = after[1:]
            else:
                before = before[:-1]
        elif dropped_before and dropped_after and _same_word(dropped_before[0], dropped_after[-1]):
            # Neither kept it: take it back from the side with more context.
            if prev_end - _centre(dropped_before[0]) >= _centre(dropped_after[-1]) - start:
                before.append(dropped_before[0])
            else:
                after.insert(0, dropped_after[-1])
        merged = before + after
    return in_time_order(merged)


def in_time_order(words: Sequence[Any]) -> list[Any]:
    """``words`` sorted by their centres, and where one starts before the previous one ends, both cut at the middle
    of their shared stretch (kept between the two centres, so neither becomes empty); words left as they were are
    the same objects."""
    ordered = sorted(words, key=_centre)
    for i in range(1, len(ordered)):
        a, b = ordered[i - 1], ordered[i]
        if b.start < a.end:
            cut = min(max((a.end + b.start) / 2, _centre(a)), _centre(b))
            ordered[i - 1] = dataclasses.replace(a, end=cut)
            ordered[i] = dataclasses.replace(b, start=cut, end=max(b.end, cut))
    return ordered


# ------------------------------------------------------------------------------------------ words in silence


def leading_silence(wav: np.ndarray | Any, sample_rate: int) -> float:
    """Seconds of silence at the start of ``wav``: the energy frames (of ``VAD_FRAME_SECONDS``) before the first one
    at or above the piece's own :func:`energy_threshold_db`; 0 when that is shorter than ``MIN_SILENCE`` or when no
    frame rises above the threshold (all silence, or steady noise)."""
    frame = round(VAD_FRAME_SECONDS * sample_rate)
    block = frame * round(30.0 / VAD_FRAME_SECONDS)  # 30 s at a time: a 600 s chunk is not copied whole
    energies = [frame_energies_db(wav[i : i + block], frame) for i in range(0, len(wav), block)]
    energies = np.concatenate(energies) if energies else np.zeros(0)
    loud = loud_frames(energies)
    if len(loud) == 0 or loud[0] < round(MIN_SILENCE / VAD_FRAME_SECONDS):
        return 0.0
    return float(loud[0] * frame / sample_rate)


def place_after_leading_silence(words: Sequence[Any], onset: float) -> list[Any]:
    """``words`` (in order, times in seconds from the start of a decoded piece) with none starting before ``onset``,
    where the piece's leading silence ends: those that do are laid out again from the onset, in order, keeping their
    lengths where there is room (a word that ran on past the onset still ends where it ended; one wholly inside the
    silence ends before the next word starts). Words left as they were are the same objects.

    A CTC model trained on utterances that start at once emits the first token at the first frame, however long the
    silence before it (the built-in model does): the first word would start at the start of the piece, seconds early
    after a long pause, and a chunk cut in a pause would place it where the chunk before it decides."""
    early = 0
    while early < len(words) and words[early].start < onset:
        early += 1
    if not early:
        return list(words)
    last = words[early - 1]
    following = words[early].start if early < len(words) else math.inf
    room_end = last.end if last.end > onset else following
    lengths = [max(w.end - w.start, 0.0) for w in words[:early]]
    scale = min(1.0, (room_end - onset) / sum(lengths)) if sum(lengths) > 0 else 1.0
    placed, time = [], onset
    for word, length in zip(words[:early], lengths, strict=True):
        placed.append(dataclasses.replace(word, start=time, end=time + length * scale))
        time = placed[-1].end
    return placed + list(words[early:])


def _centre(word: Any) -> float:
    return (word.start + word.end) / 2


def _same_word(a: Any, b: Any) -> bool:
    """Two copies of one spoken word: most of the shorter one's span is shared."""
    shared = min(a.end, b.end) - max(a.start, b.start)
    shorter = min(a.end - a.start, b.end - b.start)
    return shared >= 0.5 * shorter if shorter > 0 else shared >= 0 and a.text == b.text
