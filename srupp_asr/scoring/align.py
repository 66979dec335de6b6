"""Levenshtein alignment of reference and hypothesis tokens with sclite's costs and tie-breaking.

sclite (NIST SCTK, ``net_dp.c``) scores a substitution 4, a deletion or insertion 3 and a match 0. Among
alignments of equal cost it prefers, cell by cell, the diagonal step (match or substitution) when it is no
worse than both others, then the deletion when it is strictly cheaper than the insertion, else the insertion;
the back trace starts at the end of both sequences. The totals of an alignment depend on these choices
(three substitutions cost the same as two deletions plus two insertions and one more match), so they are
reproduced exactly here and the counts equal sclite's.

The dynamic programme runs row by row (one reference token per row) over a whole batch of utterance pairs at
once in numpy: within a row the insertion chain ``D[b] = min(x[b], D[b-1] + 3)`` is a running minimum,
``D[b] = 3 b + cummin(x[k] - 3 k)``, so a row is a handful of array operations. Pairs are grouped by length so
padding stays small; the back trace also runs for the whole batch at once.

Character alignment (CER) follows ``sclite -c``: words are split into characters (Unicode code points) and the
spaces between words are not tokens.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields, replace
from decimal import ROUND_HALF_UP, Decimal

import numpy as np

from srupp_asr.scoring.wordnet import Word, WordNet

COST_SUB = 4
COST_DEL = 3
COST_INS = 3

CORRECT, SUBSTITUTION, DELETION, INSERTION = "C", "S", "D", "I"

_DIAG, _DEL, _INS = 0, 1, 2  # back pointers
_LETTERS = np.frombuffer(b"CSDI", dtype=np.uint8)  # indexed by the back-trace codes below
_C, _S, _D, _I = 0, 1, 2, 3
_MAX_CELLS = 1 << 23  # back-pointer bytes per batch (8 MiB)
_MAX_BATCH = 1024
# The most cells (reference tokens + 1) x (hypothesis tokens + 1) one pair may take: its back-pointer table
# (256 MiB) and a few seconds of CPU. About 16,000 words against 16,000; a 20-million-word line would need years.
MAX_PAIR_CELLS = 1 << 28


class TooLongToAlign(ValueError):
    """A pair of token sequences whose alignment would take more than :data:`MAX_PAIR_CELLS` cells."""

    def __init__(self, index: int, ref_tokens: int, hyp_tokens: int) -> None:
        self.index, self.ref_tokens, self.hyp_tokens = index, ref_tokens, hyp_tokens
        super().__init__(
            f"aligning {ref_tokens:,} reference tokens with {hyp_tokens:,} hypothesis tokens needs"
            f" {(ref_tokens + 1) * (hyp_tokens + 1):,} cells, more than the {MAX_PAIR_CELLS:,} one utterance may"
            " use (about 16,000 tokens each); split it into shorter utterances"
        )


@dataclass(frozen=True)
class Counts:
    """Totals of one or more alignments, as sclite reports them (tokens = reference words or characters)."""

    sentences: int = 0
    sentence_errors: int = 0
    tokens: int = 0
    correct: int = 0
    substitutions: int = 0
    deletions: int = 0
    insertions: int = 0

    def __add__(self, other: Counts) -> Counts:
        return Counts(*(getattr(self, name) + getattr(other, name) for name in _COUNT_FIELDS))

    @property
    def errors(self) -> int:
        """Substitutions + deletions + insertions."""
        return self.substitutions + self.deletions + self.insertions

    def percent(self, count: int, of_sentences: bool = False) -> float | None:
        """``count`` as a percentage of the reference tokens (or sentences); None when there are none."""
        total = self.sentences if of_sentences else self.tokens
        return 100.0 * count / total if total else None

    @property
    def error_rate(self) -> float | None:
        """WER or CER in percent; None when the references hold no tokens."""
        return self.percent(self.errors)

    @property
    def sentence_error_rate(self) -> float | None:
        """Share of sentences with at least one error, in percent; None without sentences."""
        return self.percent(self.sentence_errors, of_sentences=True)

    def row(self) -> tuple[float | None, ...]:
        """(Snt, Wrd, Corr, Sub, Del, Ins, Err, S.Err) as in sclite's percentage summary."""
        rates = (self.correct, self.substitutions, self.deletions, self.insertions, self.errors)
        return (self.sentences, self.tokens, *(self.percent(r) for r in rates), self.sentence_error_rate)


_COUNT_FIELDS = tuple(f.name for f in fields(Counts))
_TENTH = Decimal("0.1")


def fmt_rate(value: float | None) -> str:
    """A percentage with one decimal, halves rounded up (12.25 -> ``12.3``), or ``-`` when undefined.

    ``f"{value:.1f}"`` rounds the binary float: half to even where the tie is exact (12.25 -> 12.2) and either way
    where it is not (0.35 -> 0.3). The shortest repr of ``100 * count / total`` is the exact decimal whenever that
    is a tie (a tie has at most a few digits; a count ratio that is not one lies further from it than a float's
    precision), so rounding that decimal half up gives the exact rate rounded half up, as sclite prints ties.
    """
    if value is None:
        return "-"
    number = Decimal(repr(float(value)))  # float(): a string or list in a results.json is a ValueError / TypeError
    return str(number.quantize(_TENTH, ROUND_HALF_UP)) if number.is_finite() else f"{value:.1f}"


@dataclass(frozen=True)
class Alignment:
    """One aligned utterance: ``ops`` has one letter per column (C, S, D or I)."""

    ref: tuple[str, ...]
    hyp: tuple[str, ...]
    ops: str
    # The hypothesis tokens' confidences (CTM hypotheses that have them), one per ``hyp`` token; else None.
    hyp_conf: tuple[float | None, ...] | None = None

    def columns(self) -> Iterator[tuple[str | None, str | None, str]]:
        """(reference token or None, hypothesis token or None, op) per column, in order."""
        r = h = 0
        for op in self.ops:
            ref = self.ref[r] if op != INSERTION else None
            hyp = self.hyp[h] if op != DELETION else None
            r += op != INSERTION
            h += op != DELETION
            yield ref, hyp, op

    @property
    def counts(self) -> Counts:
        """This utterance's totals (one sentence)."""
        cor = self.ops.count(CORRECT)
        sub, dele, ins = self.ops.count(SUBSTITUTION), self.ops.count(DELETION), self.ops.count(INSERTION)
        return Counts(1, int(sub + dele + ins > 0), len(self.ref), cor, sub, dele, ins)


def word_tokens(text: str) -> tuple[str, ...]:
    """Words of ``text`` (split on whitespace)."""
    return tuple(text.split())


def char_tokens(text: str) -> tuple[str, ...]:
    """Characters of ``text`` without the spaces between words, as ``sclite -c`` splits them."""
    return tuple("".join(text.split()))


def align(ref: Sequence[str], hyp: Sequence[str]) -> Alignment:
    """Align one pair of token sequences (see :func:`align_batch`)."""
    return align_batch([(ref, hyp)])[0]


def align_batch(pairs: Sequence[tuple[Sequence[str], Sequence[str]]]) -> list[Alignment]:
    """Align many (reference tokens, hypothesis tokens) pairs with sclite's costs; results in input order.
    A pair over :data:`MAX_PAIR_CELLS` raises :class:`TooLongToAlign` before any work."""
    for index, (ref, hyp) in enumerate(pairs):
        if (len(ref) + 1) * (len(hyp) + 1) > MAX_PAIR_CELLS:
            raise TooLongToAlign(index, len(ref), len(hyp))
    vocab: dict[str, int] = {}

    def encode(tokens: Sequence[str]) -> np.ndarray:
        return np.array([vocab.setdefault(t, len(vocab)) for t in tokens], dtype=np.int32)

    ids = [(encode(ref), encode(hyp)) for ref, hyp in pairs]
    out: list[Alignment | None] = [None] * len(pairs)
    for batch in _batches(ids):
        for i, ops in zip(batch, _align_ids([ids[i] for i in batch]), strict=True):
            ref, hyp = pairs[i]
            out[i] = Alignment(tuple(ref), tuple(hyp), ops)
    return out  # type: ignore[return-value]


def _batches(ids: list[tuple[np.ndarray, np.ndarray]]) -> Iterator[list[int]]:
    """Indices grouped by similar lengths, each group's padded back-pointer table within ``_MAX_CELLS``."""
    order = sorted(range(len(ids)), key=lambda i: (len(ids[i][0]), len(ids[i][1])))
    batch: list[int] = []
    rows = cols = 0
    for i in order:
        r, c = max(rows, len(ids[i][0]) + 1), max(cols, len(ids[i][1]) + 1)
        if batch and ((len(batch) + 1) * r * c > _MAX_CELLS or len(batch) == _MAX_BATCH):
            yield batch
            batch, r, c = [], len(ids[i][0]) + 1, len(ids[i][1]) + 1
        batch.append(i)
        rows, cols = r, c
    if batch:
        yield batch


def _align_ids(ids: list[tuple[np.ndarray, np.ndarray]]) -> list[str]:
    """The op strings of a batch of integer token sequences (the dynamic programme and back trace)."""
    n = np.array([len(r) for r, _ in ids])
    m = np.array([len(h) for _, h in ids])
    batch, rows, cols = len(ids), int(n.max()), int(m.max())
    # One padding column more than needed, so the back trace may read index -1 of an empty sequence.
    ref = np.full((batch, rows + 1), -1, dtype=np.int32)
    hyp = np.full((batch, cols + 1), -2, dtype=np.int32)  # padding never matches
    for k, (r, h) in enumerate(ids):
        ref[k, : len(r)] = r
        hyp[k, : len(h)] = h

    # Costs are at most 3 (rows + cols): 16-bit integers halve the memory traffic where they suffice.
    dtype = np.int16 if 4 * (rows + cols + 2) < np.iinfo(np.int16).max else np.int32
    sub_cost, del_cost, ins_cost = (dtype(c) for c in (COST_SUB, COST_DEL, COST_INS))
    back = np.empty((batch, rows + 1, cols + 1), dtype=np.uint8)
    back[:, 0, :] = _INS
    back[:, 1:, 0] = _DEL
    ramp = ins_cost * np.arange(cols + 1, dtype=dtype)
    cost = np.broadcast_to(ramp, (batch, cols + 1)).copy()
    for a in range(1, rows + 1):
        sub = cost[:, :-1] + (ref[:, a - 1, None] != hyp[:, :cols]) * sub_cost
        dele = cost + del_cost
        best = dele.copy()
        np.minimum(sub, dele[:, 1:], out=best[:, 1:])
        cost = np.minimum.accumulate(best - ramp, axis=1) + ramp
        ins = cost[:, :-1] + ins_cost
        take_sub = (sub <= dele[:, 1:]) & (sub <= ins)
        take_del = dele[:, 1:] < ins
        # diagonal (0) where it is no worse than both, else deletion (1) if strictly cheaper, else insertion (2)
        np.multiply(~take_sub, _INS - take_del.view(np.uint8), out=back[:, a, 1:])

    # Back trace of the whole batch at once, from (n, m) of each pair to (0, 0).
    a, b = n.copy(), m.copy()
    index = np.arange(batch)
    steps = int((n + m).max())
    trace = np.empty((batch, steps), dtype=np.uint8)
    length = np.zeros(batch, dtype=np.int64)
    for t in range(steps):
        active = (a > 0) | (b > 0)
        code = back[index, a, b]
        match = ref[index, a - 1] == hyp[index, b - 1]  # only read on diagonal steps, where a, b >= 1
        trace[:, t] = np.where(code == _DIAG, np.where(match, _C, _S), np.where(code == _DEL, _D, _I))
        length += active
        a -= active & (code != _INS)
        b -= active & (code != _DEL)
    letters = _LETTERS[trace]
    return [letters[k, : length[k]][::-1].tobytes().decode("ascii") for k in range(batch)]


# Word networks (alternations, optional words, fragments): sclite's network DP (``net_dp.c``) over arc pairs: a
# null word ``@`` is left out for 0.001, an optional word for 2, any other word for 3; ``@`` against ``@`` costs 1,
# a substitution 4, a match 0. The costs are single-precision floats summed in single precision, as sclite's are:
# 0.001 is not exact there, so where it is added decides between paths that tie in exact arithmetic.
_F32 = np.float32
_NET_NULL, _NET_OPTIONAL, _NET_INDEL, _NET_NULL_PAIR, _NET_SUB = map(_F32, (0.001, 2.0, 3.0, 1.0, 4.0))
_NET_MATCH = _F32(0.0)
_TIME_NULL, _TIME_MISMATCH = 0.001, 0.001


def fragment_equal(a: Word, b: Word) -> bool:
    """sclite's word match: the texts are equal, or (``-F``) a fragment ``fi-``/``-icks`` matches its rest."""
    x, y = a.key, b.key
    if a.fragment or b.fragment:
        for frag, other in ((x, y), (y, x)):
            if len(frag) > 1 and frag[0] == "-":
                return len(other) >= len(frag) - 1 and other.endswith(frag[1:])
            if len(frag) > 1 and frag[-1] == "-":
                return other.startswith(frag[:-1])
    return x == y


def _indel_cost(word: Word) -> np.float32:
    return _NET_NULL if word.null else _NET_OPTIONAL if word.optional else _NET_INDEL


def _pair_cost(a: Word, b: Word) -> np.float32:
    if a.null and b.null:
        return _NET_NULL_PAIR
    return _NET_MATCH if fragment_equal(a, b) else _NET_SUB


def _time_indel_cost(word: Word) -> np.float32:
    """sclite's ``-T`` cost of leaving a word out: its duration (0.001 for a null word ``@``)."""
    return _F32(_TIME_NULL if word.null else word.end - word.start)


def _time_pair_cost(a: Word, b: Word) -> np.float32:
    """sclite's ``-T`` cost of pairing two words: how far apart their begin and end times are, plus 0.001 when
    the words differ (so a substitution costs a little more than a match at the same times)."""
    miss = 0.0 if fragment_equal(a, b) else _TIME_MISMATCH
    return _F32(abs(a.start - b.start) + abs(a.end - b.end) + miss)


def align_nets(ref: WordNet, hyp: WordNet, time_mediated: bool = False, sort_indels: bool = False) -> Alignment:
    """Align two word networks as sclite does: the cheapest path pair, ties broken as in ``net_dp.c``.

    The diagonal step wins when no worse than both others, then the deletion when strictly cheaper than the
    insertion; among predecessor arcs the first cheapest counts. Null words ``@`` are left out of the result;
    an optional word left out (either side) is a correct word against an empty one.

    ``time_mediated`` (sclite ``-T``): costs from the words' times instead of 3/4 (see :func:`_time_pair_cost`).
    ``sort_indels``: each run of insertions and deletions ordered by begin time, as sclite shows CTM-to-CTM
    alignments (a stable sort: the counts do not change)."""
    indel, pair = (_time_indel_cost, _time_pair_cost) if time_mediated else (_indel_cost, _pair_cost)
    pa, pb = ref.preds(), hyp.preds()
    na, nb = len(ref.words) + 1, len(hyp.words) + 1
    rw, hw = [None, *ref.words], [None, *hyp.words]
    zero = _F32(0.0)
    cost = [[zero] * nb for _ in range(na)]
    back = [[(-1, -1)] * nb for _ in range(na)]
    ins_cost = [zero] + [indel(w) for w in hyp.words]
    for b in range(1, nb):
        p = min(pb[b], key=lambda k: cost[0][k])
        cost[0][b], back[0][b] = cost[0][p] + ins_cost[b], (0, p)
    for a in range(1, na):
        p = min(pa[a], key=lambda k: cost[k][0])
        cost[a][0], back[a][0] = cost[p][0] + indel(rw[a]), (p, 0)
    for a in range(1, na):
        ra, row, del_a = rw[a], cost[a], indel(rw[a])
        for b in range(1, nb):
            ins_p = min(pb[b], key=lambda k: row[k])
            del_p = min(pa[a], key=lambda k: cost[k][b])
            sub_pa, sub_pb, sub = -1, -1, None
            for x in pa[a]:
                cx = cost[x]
                for y in pb[b]:
                    if sub is None or cx[y] < sub:
                        sub, sub_pa, sub_pb = cx[y], x, y
            sub = sub + pair(ra, hw[b])
            ins = row[ins_p] + ins_cost[b]
            dele = cost[del_p][b] + del_a
            if sub <= dele and sub <= ins:
                row[b], back[a][b] = sub, (sub_pa, sub_pb)
            elif dele < ins:
                row[b], back[a][b] = dele, (del_p, b)
            else:
                row[b], back[a][b] = ins, (a, ins_p)
    best = None
    for x in ref.final_arcs():
        for y in hyp.final_arcs():
            if best is None or cost[x][y] < cost[best[0]][best[1]]:
                best = (x, y)
    columns = _net_columns(best, back, rw, hw)
    if sort_indels:
        columns = _indels_by_time(columns)
    refs = tuple(c[0] for c in columns if c[0] is not None)
    hyps = tuple(c[1] for c in columns if c[1] is not None)
    confs = tuple(c[2] for c in columns if c[1] is not None)
    ops = "".join(c[3] for c in columns)
    return Alignment(refs, hyps, ops, confs if any(c is not None for c in confs) else None)


# One column of a network alignment: (reference text or None, hypothesis text or None, the hypothesis word's
# confidence, op, begin time of the word an insertion/deletion shows).
_Column = tuple[str | None, str | None, float | None, str, float]


def _net_columns(start: tuple[int, int], back: list, rw: list, hw: list) -> list[_Column]:
    """The back trace of :func:`align_nets` as columns in order (empty strings for left-out optional words)."""
    out: list[_Column] = []
    a, b = start
    while a > 0 or b > 0:
        ba, bb = back[a][b]
        if ba == a:  # insertion
            word = hw[b]
            if not word.null:
                op = CORRECT if word.optional else INSERTION
                out.append(("" if word.optional else None, word.text, word.conf, op, word.start))
        elif bb == b:  # deletion
            word = rw[a]
            if not word.null:
                op = CORRECT if word.optional else DELETION
                out.append((word.text, "" if word.optional else None, None, op, word.start))
        elif not (rw[a].null and hw[b].null):
            op = CORRECT if fragment_equal(rw[a], hw[b]) else SUBSTITUTION
            out.append((rw[a].text, hw[b].text, hw[b].conf, op, 0.0))
        a, b = ba, bb
    out.reverse()
    return out


def _indels_by_time(columns: list[_Column]) -> list[_Column]:
    """Each run of insertions and deletions stably sorted by begin time (sclite's ``sort_PATH_time_marks``)."""
    out: list[_Column] = []
    run: list[_Column] = []
    for column in [*columns, None]:
        if column is not None and column[3] in (INSERTION, DELETION):
            run.append(column)
            continue
        out += sorted(run, key=lambda c: c[4])
        run = []
        if column is not None:
            out.append(column)
    return out


def align_net_batch(pairs: Sequence[tuple[WordNet, WordNet]], time_mediated: bool = False) -> list[Alignment]:
    """Align many network pairs: chains of plain words together in the array aligner (:func:`align_batch`),
    the others (and all of them under ``time_mediated``) one by one with :func:`align_nets`. Both give sclite's
    alignment."""
    out: list[Alignment | None] = [None] * len(pairs)
    plain: list[int] = []
    for i, (ref, hyp) in enumerate(pairs):
        if time_mediated:
            out[i] = align_nets(ref, hyp, time_mediated=True)
        elif ref.linear_words() is not None and hyp.linear_words() is not None:
            plain.append(i)
        else:
            out[i] = align_nets(ref, hyp)
    texts = [([w.text for w in pairs[i][0].words], [w.text for w in pairs[i][1].words]) for i in plain]
    for i, alignment in zip(plain, align_batch(texts), strict=True):
        confs = tuple(w.conf for w in pairs[i][1].words)
        out[i] = replace(alignment, hyp_conf=confs) if any(c is not None for c in confs) else alignment
    return out  # type: ignore[return-value]
