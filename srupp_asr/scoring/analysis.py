"""Scoring a set of transcripts: pairing references with hypotheses, aligning, and the breakdowns of a report.

:func:`score_transcripts` pairs each reference with its hypothesis by utterance id (a missing hypothesis counts
as an empty one, so all its words are deletions; hypotheses without a reference are left out), normalises both
sides with :func:`srupp_asr.text.normalize_text` (the training normalisation) and aligns words and characters.
The :class:`ScoreResult` it returns holds every utterance's alignments and computes the totals, the
per-speaker and per-length tables, the confusion pairs and the most deleted and inserted words.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from srupp_asr.errors import UserError
from srupp_asr.scoring.align import (
    DELETION,
    INSERTION,
    SUBSTITUTION,
    Alignment,
    Counts,
    TooLongToAlign,
    align_batch,
    char_tokens,
    word_tokens,
)
from srupp_asr.scoring.formats import UtteranceText
from srupp_asr.text import normalize_text

LEVELS = {"WER": "words", "CER": "chars"}  # report name -> UtteranceScore attribute
LENGTH_BUCKETS = (1, 5, 10, 20, 40, 80)  # lower edges (reference words) of the WER-by-length buckets
NO_SPEAKER = "(none)"
# The most words (references and hypotheses together, normalised) one scoring holds with their word and character
# alignments: about 2.5 GB at the peak (4.5 million words took 1.16 GB with the report). A larger set is refused
# in one line before any alignment (it is scored in parts, or its totals summed: results.json holds the counts).
MAX_SCORED_WORDS = 10_000_000


@dataclass(frozen=True)
class UtteranceScore:
    """One utterance: normalised texts and their word and character alignments."""

    utt_id: str
    speaker: str | None
    ref: str
    hyp: str
    words: Alignment
    chars: Alignment
    missing: bool = False  # no hypothesis was given for it


@dataclass(frozen=True)
class ScoreResult:
    """Every scored utterance plus the ids that did not pair up."""

    utterances: list[UtteranceScore]
    missing: list[str] = field(default_factory=list)  # references without a hypothesis (scored as empty)
    extra: list[str] = field(default_factory=list)  # hypotheses without a reference (ignored)

    def counts(self, level: str = "WER") -> list[Counts]:
        """Per-utterance counts at ``level`` (WER or CER), in utterance order."""
        return self._counts[level]

    @cached_property
    def _counts(self) -> dict[str, list[Counts]]:
        return {name: [getattr(u, attr).counts for u in self.utterances] for name, attr in LEVELS.items()}

    def total(self, level: str = "WER") -> Counts:
        """Totals over all utterances."""
        return sum(self.counts(level), Counts())

    def by_speaker(self, level: str = "WER") -> dict[str, Counts]:
        """Totals per speaker, speakers sorted by name (utterances without one under ``(none)``)."""
        return self._group(level, lambda u: u.speaker or NO_SPEAKER)

    def by_length(self, level: str = "WER") -> dict[str, Counts]:
        """Totals per bucket of reference length in words (``0``, ``1-4``, ``5-9``, ... ``80+``)."""
        return self._group(level, lambda u: length_bucket(len(u.words.ref)), key=_bucket_order)

    def _group(
        self, level: str, name: Callable[[UtteranceScore], str], key: Callable | None = None
    ) -> dict[str, Counts]:
        groups: dict[str, Counts] = {}
        for u, c in zip(self.utterances, self.counts(level), strict=True):
            label = name(u)
            groups[label] = groups.get(label, Counts()) + c
        return dict(sorted(groups.items(), key=key))

    def _word_columns(self, op: str) -> Iterator[tuple[str | None, str | None]]:
        return ((r, h) for u in self.utterances for r, h, o in u.words.columns() if o == op)

    def confusions(self, n: int = 20) -> list[tuple[tuple[str, str], int]]:
        """The ``n`` most frequent word substitutions as ((reference, hypothesis), count)."""
        return _most_common(Counter(self._word_columns(SUBSTITUTION)), n)

    def deleted(self, n: int = 20) -> list[tuple[str, int]]:
        """The ``n`` most frequently deleted reference words."""
        return _most_common(Counter(r for r, _ in self._word_columns(DELETION)), n)

    def inserted(self, n: int = 20) -> list[tuple[str, int]]:
        """The ``n`` most frequently inserted hypothesis words."""
        return _most_common(Counter(h for _, h in self._word_columns(INSERTION)), n)

    def worst(self, n: int = 20, level: str = "WER") -> list[UtteranceScore]:
        """The ``n`` utterances with the most errors (ties: higher error rate first, then by id)."""
        pairs = [(u, c) for u, c in zip(self.utterances, self.counts(level), strict=True) if c.errors]
        pairs.sort(key=lambda uc: (-uc[1].errors, -uc[1].errors / max(uc[1].tokens, 1), uc[0].utt_id))
        return [u for u, _ in pairs[:n]]


def length_bucket(words: int) -> str:
    """The label of the reference-length bucket holding ``words`` words."""
    if words == 0:
        return "0"
    lower = max(edge for edge in LENGTH_BUCKETS if edge <= words)
    i = LENGTH_BUCKETS.index(lower)
    return f"{lower}+" if i == len(LENGTH_BUCKETS) - 1 else f"{lower}-{LENGTH_BUCKETS[i + 1] - 1}"


def _bucket_order(item: tuple[str, Counts]) -> int:
    return int(item[0].split("-")[0].rstrip("+"))


def _most_common(counter: Counter, n: int) -> list:
    """Most common first, ties in sorted order so reports do not depend on input order."""
    return sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


def _word_count(text: str) -> int:
    """Words of a text (one line at a time: the lists are dropped at once)."""
    return len(text.split())


def score_transcripts(
    refs: Sequence[UtteranceText],
    hyps: Sequence[UtteranceText],
    normalize: bool = True,
    utt2spk: dict[str, str] | None = None,
) -> ScoreResult:
    """Pair references with hypotheses by id, normalise, and align words and characters of every reference.

    Speakers come from ``utt2spk`` when given, else from the reference (or, failing that, the hypothesis) file.
    """
    by_id = {h.utt_id: h for h in hyps}
    # Checked on the texts as read (before normalising, the slow part): a set over the bound is refused at once.
    total = sum(_word_count(t.text) for t in refs) + sum(
        _word_count(by_id[r.utt_id].text) for r in refs if r.utt_id in by_id
    )
    if total > MAX_SCORED_WORDS:
        raise UserError(
            f"{len(refs):,} utterances hold {total:,} words (references and hypotheses), more than the"
            f" {MAX_SCORED_WORDS:,} one scoring holds in memory (about 2.5 GB); score the set in parts"
        )
    prep = normalize_text if normalize else (lambda s: " ".join(s.split()))
    ref_ids = {r.utt_id for r in refs}
    rows = []
    for r in refs:
        h = by_id.get(r.utt_id)
        speaker = (utt2spk or {}).get(r.utt_id) or r.speaker or (h.speaker if h else None)
        rows.append((r.utt_id, speaker, prep(r.text), prep(h.text) if h else "", h is None))
    try:
        words = align_batch([(word_tokens(ref), word_tokens(hyp)) for _, _, ref, hyp, _ in rows])
        chars = align_batch([(char_tokens(ref), char_tokens(hyp)) for _, _, ref, hyp, _ in rows])
    except TooLongToAlign as err:
        raise UserError(f"utterance {rows[err.index][0]}: {err}") from None
    return ScoreResult(
        [UtteranceScore(i, s, r, h, w, c, m) for (i, s, r, h, m), w, c in zip(rows, words, chars, strict=True)],
        missing=[i for i, _, _, _, m in rows if m],
        extra=[h.utt_id for h in hyps if h.utt_id not in ref_ids],
    )
