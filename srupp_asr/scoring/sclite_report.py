"""sclite's report files: ``.sys`` (percentages by speaker), ``.raw`` (counts by speaker), ``.pra`` (alignments).

The layout is sclite's (NIST SCTK ``sc_stats``/``report``): a box 80 columns wide, one row per speaker in the order
speakers were first seen, then the Sum row and the Mean, S.D. (n-1) and Median of the speakers' rows. A speaker
without reference words shows counts marked ``*`` instead of percentages in ``.sys`` and is left out of the
percentage statistics (marked ``+``), as sclite does.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from srupp_asr.scoring.align import CORRECT, DELETION, INSERTION, SUBSTITUTION, Alignment, Counts, fmt_rate

WIDTH = 80
_RATE_HEAD = " Corr    Sub    Del    Ins    Err  S.Err "
_NCE_CLIP = 1e-7


@dataclass(frozen=True)
class ScoredUtterance:
    """One aligned utterance with what sclite reports of it."""

    utt_id: str
    speaker: str
    alignment: Alignment
    file: str | None = None
    channel: str | None = None
    labels: str | None = None


def by_speaker(utterances: Sequence[ScoredUtterance]) -> dict[str, list[ScoredUtterance]]:
    """Utterances grouped by speaker, speakers in the order first seen."""
    out: dict[str, list[ScoredUtterance]] = {}
    for utt in utterances:
        out.setdefault(utt.speaker, []).append(utt)
    return out


def speaker_counts(utterances: Sequence[ScoredUtterance]) -> dict[str, Counts]:
    """Each speaker's totals."""
    return {spk: sum((u.alignment.counts for u in utts), Counts()) for spk, utts in by_speaker(utterances).items()}


def _center(text: str, width: int) -> str:
    pad = width - len(text)
    return " " * (pad // 2) + text + " " * (pad - pad // 2)


def _values(c: Counts) -> list[int]:
    return [c.correct, c.substitutions, c.deletions, c.insertions, c.errors, c.sentence_errors]


def _rate_cells(values: Sequence[float | None], marks: Sequence[str]) -> str:
    """Six numbers as sclite prints them: the first 5 wide, the rest 7, each followed by its mark (or space)."""
    out = []
    for k, (value, mark) in enumerate(zip(values, marks, strict=True)):
        text = value if isinstance(value, str) else fmt_rate(value)
        out.append(text.rjust((5 if k == 0 else 7) - (1 if mark else 0)) + mark)
    return "".join(out) + " "


def _int_cells(values: Sequence[int]) -> str:
    return f"{values[0]:5d}" + "".join(f"{v:7d}" for v in values[1:]) + " "


def _stats(rows: Sequence[Sequence[float]]) -> list[tuple[str, list[float]]]:
    """Mean, S.D. (n-1; 0 for one row) and Median of each column."""
    cols = list(zip(*rows, strict=True)) if rows else []
    mean = [statistics.fmean(c) for c in cols]
    sd = [statistics.stdev(c) if len(c) > 1 else 0.0 for c in cols]
    median = [statistics.median(c) for c in cols]
    return [("Mean", mean), ("S.D.", sd), ("Median", median)]


def confidence_pairs(alignment: Alignment) -> Iterator[tuple[float, bool]]:
    """(confidence, word is correct) of each hypothesis word that has a confidence."""
    if alignment.hyp_conf is None:
        return
    h = 0
    for op in alignment.ops:
        if op == DELETION:
            continue
        conf, word = alignment.hyp_conf[h], alignment.hyp[h]
        h += 1
        if conf is not None and word:  # an optional word left out of the reference has no hypothesis word
            yield conf, op == CORRECT


def normalized_cross_entropy(pairs: Sequence[tuple[float, bool]]) -> float | None:
    """sclite's NCE of hypothesis word confidences: (H_max + sum log2 p(outcome)) / H_max, H_max the entropy of
    the correct/incorrect outcomes at their base rate p_c. Confidences are clipped to [1e-7, 1 - 1e-7] as sclite's
    are (its value with a conf 0 or 1 word, checked against sctk sclite). None where undefined (no words, or all
    correct or all wrong: H_max = 0)."""
    n, total = sum(ok for _, ok in pairs), len(pairs)
    if n in (0, total):
        return None
    p_c = n / total
    h_max = -n * math.log2(p_c) - (total - n) * math.log2(1 - p_c)
    got = 0.0
    for conf, ok in pairs:
        conf = min(max(conf, _NCE_CLIP), 1 - _NCE_CLIP)
        got += math.log2(conf if ok else 1 - conf)
    return (h_max + got) / h_max


def speaker_nce(utterances: Sequence[ScoredUtterance]) -> dict[str | None, float | None] | None:
    """Each speaker's NCE and the total's (key ``None``), or None when no hypothesis word has a confidence."""
    groups = {
        name: [p for u in utts for p in confidence_pairs(u.alignment)] for name, utts in by_speaker(utterances).items()
    }
    if not any(groups.values()):
        return None
    out: dict[str | None, float | None] = {name: normalized_cross_entropy(pairs) for name, pairs in groups.items()}
    out[None] = normalized_cross_entropy([p for pairs in groups.values() for p in pairs])
    return out


def _nce_cell(value: float | None) -> str:
    return f"{value:7.3f} |" if value is not None else "    -   |"


def summary_table(utterances: Sequence[ScoredUtterance], title: str, raw: bool, chars: bool) -> str:
    """The ``.sys`` (``raw=False``) or ``.raw`` table; with an NCE column when the hypotheses have confidences."""
    counts = speaker_counts(utterances)
    nce = speaker_nce(utterances)
    names = list(counts)
    col = max([len(n) + 2 for n in names] + [6 if raw else 8])
    inner = col + 1 + 13 + 1 + 41 + (9 if nce else 0)
    indent = " " * ((WIDTH - inner - 2) // 2)
    unit = "Chr" if chars else "Wrd"
    extra = "+--------|" if nce else "|"
    bar = "|" + "-" * col + "+" + "-" * 13 + "+" + "-" * 41 + extra
    lines = ["", "", "", _center("SYSTEM SUMMARY PERCENTAGES by SPEAKER", WIDTH), ""]
    lines += ["," + "-" * inner + ".", "|" + _center(title, inner) + "|", "|" + "-" * inner + "|"]
    head = "|  NCE   |" if nce else "|"
    lines += ["|" + " SPKR".ljust(col) + f"| # Snt # {unit} |" + _RATE_HEAD + head, bar]
    starred = plus = False
    for k, name in enumerate(names):
        c = counts[name]
        cells = _int_cells(_values(c)) if raw else _pct_cells(c)
        starred |= not raw and not c.tokens
        tail = "|" + _nce_cell(nce[name]) if nce else "|"
        lines.append("|" + f" {name}".ljust(col) + "|" + f"{c.sentences:5d}{c.tokens:7d} |" + cells + tail)
        lines.append(bar if k < len(names) - 1 else "|" + "=" * inner + "|")
    total = sum(counts.values(), Counts())
    sum_cells = _int_cells(_values(total)) if raw else _pct_cells(total)
    label = " Sum" if raw else " Sum/Avg"
    tail = "|" + _nce_cell(nce[None]) if nce else "|"
    lines += ["|" + label.ljust(col) + "|" + f"{total.sentences:5d}{total.tokens:7d} |" + sum_cells + tail]
    lines += ["|" + "=" * inner + "|"]
    size_rows = [[c.sentences, c.tokens] for c in counts.values()]
    if raw:
        value_rows = [_values(c) for c in counts.values()]
        marks = [""] * 6
    else:
        kept = [c for c in counts.values() if c.tokens]
        plus = len(kept) < len(counts)
        value_rows = [
            [*(100.0 * v / c.tokens for v in _values(c)[:5]), 100.0 * c.sentence_errors / c.sentences] for c in kept
        ]
        marks = ["+" if plus else ""] * 5 + [""]
    size_stats = _stats(size_rows)
    value_stats = _stats(value_rows) if value_rows else [(n, [None] * 6) for n in ("Mean", "S.D.", "Median")]
    if not raw and plus:  # S.Err is over sentences: every speaker counts
        serr = _stats([[100.0 * c.sentence_errors / c.sentences] for c in counts.values()])
        value_stats = [(n, [*v[:5], s[1][0]]) for (n, v), s in zip(value_stats, serr, strict=True)]
    defined = [v for name, v in (nce or {}).items() if name is not None and v is not None]
    nce_stats = _stats([[v] for v in defined]) if defined else [(n, [None]) for n in ("Mean", "S.D.", "Median")]
    for (name, sizes), (_, values), (_, nce_value) in zip(size_stats, value_stats, nce_stats, strict=True):
        size_text = f"{fmt_rate(sizes[0]):>5}{fmt_rate(sizes[1]):>7} "
        tail = "|" + _nce_cell(nce_value[0]) if nce else "|"
        lines.append("|" + _center(name, col) + "|" + size_text + "|" + _rate_cells(values, marks) + tail)
    lines.append("`" + "-" * inner + "'")
    lines = [line if not line or line.startswith(" " * 10) else indent + line for line in lines]
    if starred:
        lines += [
            "",
            "* No Reference words for this/these speaker(s).  Word counts supplied",
            "  rather than percents.",
        ]
    if plus:
        lines.append("+ Speaker(s) with no reference data is ignored")
    return "\n".join(lines) + "\n"


def _pct_cells(c: Counts) -> str:
    if not c.tokens:  # no reference words: counts, starred
        return _rate_cells([str(v) for v in _values(c)[:5]] + [c.sentence_error_rate], ["*"] * 5 + [""])
    return _rate_cells(c.row()[2:], [""] * 6)


def pra_text(utterances: Sequence[ScoredUtterance], title: str) -> str:
    """The ``.pra`` file: each speaker's utterances with their counts and REF/HYP/Eval lines."""
    groups = by_speaker(utterances)
    out = ["", "", "\t\tDUMP OF SYSTEM ALIGNMENT STRUCTURE", "", f"System name:   {title}", "", "Speakers: "]
    out += [f"{k:5d}:  {name}" for k, name in enumerate(groups)]
    out.append("")
    for k, (name, utts) in enumerate(groups.items()):
        out.append(f"Speaker sentences{k:4d}:  {name}   #utts: {len(utts)}")
        for utt in utts:
            out += _pra_utterance(utt)
    return "\n".join(out) + "\n\n"  # sclite closes the file with one more blank line


def _pra_utterance(utt: ScoredUtterance) -> list[str]:
    c = utt.alignment.counts
    lines = [f"id: ({utt.utt_id})"]
    if utt.labels:
        lines.append(f"Labels: <{utt.labels}>")
    if utt.file is not None:
        lines += [f"File: {utt.file}", f"Channel: {utt.channel}"]
    lines.append(f"Scores: (#C #S #D #I) {c.correct} {c.substitutions} {c.deletions} {c.insertions}")
    ref, hyp, ev = [], [], []
    for r, h, op in utt.alignment.columns():
        r = r if r is not None else ""
        h = h if h is not None else ""
        if op != "C":
            r, h = r.upper(), h.upper()
        width = max(len(r), len(h), 1)
        ref.append("*" * width if op == "I" else r.ljust(width))
        hyp.append("*" * width if op == "D" else h.ljust(width))
        ev.append((op if op != "C" else "").ljust(width))
    if ref:
        lines += ["REF:  " + " ".join(ref) + " ", "HYP:  " + " ".join(hyp) + " ", "Eval: " + " ".join(ev) + " "]
    lines.append("")
    return lines


def _dtl_list(title: str, counter: Counter, encoding: str) -> list[str]:
    """One list of the .dtl report: most frequent first, ties in byte order of the text (as sclite sorts)."""
    rows = sorted(counter.items(), key=lambda kv: (-kv[1], kv[0].encode(encoding, errors="replace")))
    out = [
        title.ljust(33) + "Total".ljust(22) + f"({len(rows)})",
        " " * 33 + f"With >= {1:2d} occurrences ({len(rows)})",
    ]
    out.append("")
    out += [f"{k:4d}:{count:5d}  ->  {text}" for k, (text, count) in enumerate(rows, start=1)]
    return [*out, "     -------", f"{sum(counter.values()):10d}"]


_DTL_NOTES = {
    "SUBSTITUTIONS": [
        "* NOTE: The 'Substitution' words are those reference words",
        "        for which the recognizer supplied an incorrect word.",
    ],
    "FALSELY RECOGNIZED": [
        "* NOTE: The 'Falsely Recognized' words are those hypothesis words",
        "        which the recognizer incorrectly substituted for a reference word.",
    ],
}


def dtl_text(utterances: Sequence[ScoredUtterance], title: str, encoding: str = "utf-8") -> str:
    """The ``.dtl`` report: sentence and word totals, then the confusion pairs and the inserted, deleted,
    substituted and falsely recognized words with their counts."""
    total = sum((u.alignment.counts for u in utterances), Counts())
    with_op = {op: sum(op in u.alignment.ops for u in utterances) for op in (SUBSTITUTION, DELETION, INSERTION)}

    def sentence_row(label: str, n: int) -> str:
        return label.ljust(40) + f"{fmt_rate(total.percent(n, of_sentences=True)):>5}%   ({n:4d})"

    def word_row(label: str, n: int) -> str:
        return label.ljust(26) + f"= {fmt_rate(total.percent(n)):>6}%   ({n:4d})"

    accuracy = None if total.error_rate is None else 100.0 - total.error_rate
    lines = [f"DETAILED OVERALL REPORT FOR THE SYSTEM: {title}", "", "SENTENCE RECOGNITION PERFORMANCE", ""]
    lines += [" sentences".ljust(40) + f"{total.sentences:14d}", sentence_row(" with errors", total.sentence_errors)]
    lines += ["", sentence_row("   with substitutions", with_op[SUBSTITUTION])]
    lines += [
        sentence_row("   with deletions", with_op[DELETION]),
        sentence_row("   with insertions", with_op[INSERTION]),
    ]
    lines += ["", "", "WORD RECOGNITION PERFORMANCE", "", word_row("Percent Total Error", total.errors), ""]
    lines += [word_row("Percent Correct", total.correct), "", word_row("Percent Substitution", total.substitutions)]
    lines += [word_row("Percent Deletions", total.deletions), word_row("Percent Insertions", total.insertions)]
    lines += ["Percent Word Accuracy".ljust(26) + f"= {fmt_rate(accuracy):>6}%", "", ""]
    hyp_words = total.correct + total.substitutions + total.insertions
    for label, n in (
        ("Ref. words", total.tokens),
        ("Hyp. words", hyp_words),
        ("Aligned words", hyp_words + total.deletions),
    ):
        lines.append(label.ljust(26) + f"=           ({n:4d})")
    lines.append("")
    columns = [(r, h, op) for u in utterances for r, h, op in u.alignment.columns() if op != CORRECT]
    lists = {
        "CONFUSION PAIRS": Counter(f"{r} ==> {h}" for r, h, op in columns if op == SUBSTITUTION),
        "INSERTIONS": Counter(h for _, h, op in columns if op == INSERTION),
        "DELETIONS": Counter(r for r, _, op in columns if op == DELETION),
        "SUBSTITUTIONS": Counter(r for r, _, op in columns if op == SUBSTITUTION),
        "FALSELY RECOGNIZED": Counter(h for _, h, op in columns if op == SUBSTITUTION),
    }
    for k, (name, counter) in enumerate(lists.items()):
        lines += _dtl_list(name, counter, encoding)
        if name in _DTL_NOTES:
            lines += ["", "", *_DTL_NOTES[name], ""]
            lines += [""] if k < len(lists) - 1 else []
        else:
            lines += ["", "", ""]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class SgmlHeader:
    """What the ``.sgml`` report's SYSTEM line says of the run."""

    title: str
    ref_file: str
    hyp_file: str
    fragments: bool
    optional: bool
    chars: bool = False
    case_sensitive: bool = False


def sgml_text(utterances: Sequence[ScoredUtterance], head: SgmlHeader) -> str:
    """The ``.sgml`` report of trn scoring: every utterance's alignment as ``EVAL,"ref","hyp"`` items, by speaker."""
    flag = {True: "TRUE", False: "FALSE"}
    lines = [
        f'<SYSTEM title="{head.title}" ref_fname="{head.ref_file}" hyp_fname="{head.hyp_file}"'
        f' creation_date="{time.ctime()}" format="2.4" frag_corr="{flag[head.fragments]}"'
        f' opt_del="{flag[head.optional]}" weight_ali="FALSE" weight_filename="">'
    ]
    sequence = {id(u): k for k, u in enumerate(utterances)}
    attrib = (' char_align="1"' if head.chars else "") + (' case_sense="1"' if head.case_sensitive else "")
    for name, utts in by_speaker(utterances).items():
        lines.append(f'<SPEAKER id="{name}">')
        for utt in utts:
            items = []
            for r, h, op in utt.alignment.columns():
                ref = "" if op == INSERTION else f'"{r}"'
                hyp = "" if op == DELETION else f'"{h}"'
                items.append(f"{op},{ref},{hyp}")
            lines.append(f'<PATH id="({utt.utt_id})" word_cnt="{len(items)}" sequence="{sequence[id(utt)]}"{attrib}>')
            lines += [":".join(items), "</PATH>"]
        lines.append("</SPEAKER>")
    lines.append("</SYSTEM>")
    return "\n".join(lines) + "\n"
