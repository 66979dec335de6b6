"""Report files of a scoring run: ``results.md``, ``report.html``, sclite-style alignments, PNG plots, trn files.

Every file is written atomically (:mod:`srupp_asr.fileio`), so an interrupted run never leaves half a report.
``report.html`` is self-contained (inline CSS, plots embedded as base64 PNG) and opens in any browser.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import html
import json
import os
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from srupp_asr import __version__
from srupp_asr.errors import UserError
from srupp_asr.fileio import write_files_together
from srupp_asr.scoring.align import CORRECT, DELETION, INSERTION, Alignment, Counts, fmt_rate
from srupp_asr.scoring.analysis import LEVELS, ScoreResult, UtteranceScore
from srupp_asr.scoring.formats import UtteranceText, trn_line

TABLE_HEADER = ("Snt", "Wrd", "Corr", "Sub", "Del", "Ins", "Err", "S.Err")
WORST = 20  # utterances shown in the HTML report
TOP = 20  # rows of the confusion / deletion / insertion tables
_SHOWN_IDS = 10  # ids listed in a warning


@dataclass
class ReportInfo:
    """What the report says about where the numbers come from."""

    name: str  # the dataset column of results.md
    ref: str = ""
    hyp: str = ""
    normalized: bool = True
    details: dict[str, str] = field(default_factory=dict)  # extra "key: value" lines (model, decoding, speed)


def fmt_percent(value: float | None) -> str:
    """``12.3%`` (:func:`~srupp_asr.scoring.align.fmt_rate` with a per-cent sign), or ``-`` when undefined."""
    return "-" if value is None else f"{fmt_rate(value)}%"


def score_line(result: ScoreResult, name: str) -> str:
    """One line: WER with its error types and sizes, then CER."""
    w, c = result.total("WER"), result.total("CER")
    return (
        f"{name}: WER {fmt_percent(w.error_rate)} (sub {fmt_rate(w.percent(w.substitutions))} "
        f"del {fmt_rate(w.percent(w.deletions))} ins {fmt_rate(w.percent(w.insertions))}; "
        f"{w.tokens} words, {w.sentences} sentences, S.Err {fmt_percent(w.sentence_error_rate)})  "
        f"CER {fmt_percent(c.error_rate)} ({c.tokens} chars)"
    )


def warnings_of(result: ScoreResult) -> list[str]:
    """Lines about ids that did not pair up, and about hypotheses that are all empty where the references hold
    words (the mark of an undertrained model, which would otherwise pass as a mere 100% WER)."""
    out = []
    if any(u.ref.strip() for u in result.utterances) and not any(u.hyp.strip() for u in result.utterances):
        out.append(
            f"every hypothesis is empty (no words for any of the {len(result.utterances)} utterances): the model"
            " may be undertrained, or the audio unlike its training data"
        )
    if result.missing:
        scored = "scored as empty hypotheses (all deletions)"
        out.append(f"{len(result.missing)} reference(s) have no hypothesis; {scored}: {_some(result.missing)}")
    if result.extra:
        out.append(f"{len(result.extra)} hypothesis(es) have no reference; ignored: {_some(result.extra)}")
    return out


def _some(ids: list[str]) -> str:
    more = f" ... (+{len(ids) - _SHOWN_IDS} more)" if len(ids) > _SHOWN_IDS else ""
    return " ".join(ids[:_SHOWN_IDS]) + more


def _row_cells(counts: Counts) -> list[str]:
    sentences, tokens, *rates = counts.row()
    return [str(sentences), str(tokens), *(fmt_rate(r) for r in rates)]


def results_md(result: ScoreResult, info: ReportInfo) -> str:
    """ESPnet ``RESULTS.md``-style tables of WER and CER (percentages, one decimal)."""
    lines = [
        "# RESULTS",
        f"## {info.name}",
        "",
        f"- date: `{dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M:%S UTC')}`",
        f"- srupp-asr version: `{__version__}`",
    ]
    lines += [f"- {label}: `{value}`" for label, value in (("ref", info.ref), ("hyp", info.hyp)) if value]
    lines += [f"- {key}: `{value}`" for key, value in info.details.items()]
    lines.append(f"- text normalisation: `{'srupp_asr.text.normalize_text' if info.normalized else 'none'}`")
    lines += [f"- warning: {w}" for w in warnings_of(result)]
    for level in LEVELS:
        lines += ["", f"### {level}", "", "|dataset|" + "|".join(TABLE_HEADER) + "|", "|---" * 9 + "|"]
        lines.append("|" + "|".join([info.name, *_row_cells(result.total(level))]) + "|")
    return "\n".join(lines) + "\n"


# ---- sclite-style alignment text ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=1 << 16)
def _width(text: str) -> int:
    """Display width in a monospace font (wide East Asian characters take two cells, marks none)."""
    if text.isascii():
        return len(text)
    return sum(0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def _pad(text: str, width: int) -> str:
    return text + " " * (width - _width(text))


def _upper_if_reversible(token: str | None) -> str | None:
    """``token`` upper-cased, unless lower-casing that would not give it back (``ı`` and ``i`` are both ``I``,
    ``ß`` is ``SS``, ``Paris`` has a capital already): then as it is."""
    if token is None:
        return None
    upper = token.upper()
    return upper if upper.lower() == token else token


def _marked(ref: str | None, hyp: str | None) -> tuple[str | None, str | None]:
    """The two tokens of an error column as printed: upper-cased where reversible, but as they are when that
    would make the two sides of a substitution look alike (``S`` for ``s`` when the reference has ``S``)."""
    shown = _upper_if_reversible(ref), _upper_if_reversible(hyp)
    return (ref, hyp) if shown[0] is not None and shown[0] == shown[1] else shown


def pralign_block(utt: UtteranceScore, alignment: Alignment) -> str:
    """One utterance as sclite's ``-o pralign`` prints it: errors upper-cased (where lower-casing gives the word
    back), gaps as ``*``."""
    c = alignment.counts
    ref_row, hyp_row, eval_row = [], [], []
    for ref, hyp, op in alignment.columns():
        if op != CORRECT:
            ref, hyp = _marked(ref, hyp)
        width = max(_width(ref or ""), _width(hyp or ""), 1)
        ref_row.append(_pad(ref if ref is not None else "*" * width, width))
        hyp_row.append(_pad(hyp if hyp is not None else "*" * width, width))
        eval_row.append(_pad("" if op == CORRECT else op, width))
    speaker = f"speaker: {utt.speaker}\n" if utt.speaker else ""
    note = "Note: no hypothesis given (scored as empty)\n" if utt.missing else ""
    return (
        f"id: ({utt.utt_id})\n{speaker}{note}"
        f"Scores: (#C #S #D #I) {c.correct} {c.substitutions} {c.deletions} {c.insertions}\n"
        f"REF:  {' '.join(ref_row)} \nHYP:  {' '.join(hyp_row)} \nEval: {' '.join(eval_row)} \n"
    )


def pralign_text(result: ScoreResult, level: str = "WER") -> str:
    """All utterances' alignments at ``level`` (WER: words, CER: characters), sclite pralign style."""
    attr = LEVELS[level]
    blocks = [pralign_block(u, getattr(u, attr)) for u in result.utterances]
    return f"{level} alignment ({len(blocks)} utterances; sclite costs: sub 4, del 3, ins 3)\n\n" + "\n".join(blocks)


# ---- HTML ----------------------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2em auto;max-width:1100px;
  color:#222;padding:0 1em;line-height:1.4}
h1{font-size:1.6em;margin-bottom:.2em}h2{margin-top:1.6em;border-bottom:2px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;margin:.6em 0}th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th{background:#f0f3f7}td.l,th.l{text-align:left}
.big{display:inline-block;margin:.4em 1.2em .4em 0;padding:.6em 1.2em;border-radius:8px;background:#eef3fb}
.big b{font-size:2em;display:block}
.warn{background:#fff4d6;border-left:4px solid #e0a800;padding:.4em .8em;margin:.4em 0}
.meta{color:#555;font-size:.9em}.meta code{font-size:.95em}
.plots img{max-width:100%;border:1px solid #eee;margin:.4em 0}
.utt{border:1px solid #ddd;border-radius:6px;padding:.5em .8em;margin:.8em 0}
.utt .head{font-size:.9em;color:#444;margin-bottom:.3em}
.ali{display:flex;flex-wrap:wrap;gap:.15em .35em;font-family:ui-monospace,Menlo,Consolas,monospace}
.col{display:inline-flex;flex-direction:column;padding:0 .2em;border-radius:3px}
.col span{white-space:pre}.col .h{color:#555}
.S{background:#ffd6d6}.D{background:#d6e6ff}.I{background:#ffe7c7}
.legend span{padding:0 .4em;margin-right:.5em;border-radius:3px}
.tops{display:flex;gap:2em;flex-wrap:wrap}
"""


def _table(header: list[str], rows: list[list[str]], left: int = 1) -> str:
    def cells(tag: str, values: list[str]) -> str:
        return "".join(f"<{tag}{' class=l' if i < left else ''}>{html.escape(v)}</{tag}>" for i, v in enumerate(values))

    body = "".join(f"<tr>{cells('td', r)}</tr>" for r in rows)
    return f"<table><tr>{cells('th', header)}</tr>{body}</table>"


def _counts_rows(groups: dict[str, Counts]) -> list[list[str]]:
    return [[name, *_row_cells(c)] for name, c in groups.items()]


def _alignment_html(alignment: Alignment) -> str:
    cols = []
    for ref, hyp, op in alignment.columns():
        r = html.escape(ref) if ref is not None else "*"
        h = html.escape(hyp) if hyp is not None else "*"
        cls = "" if op == CORRECT else f" {op}"
        cols.append(f'<span class="col{cls}"><span class="r">{r}</span><span class="h">{h}</span></span>')
    return f'<div class="ali">{"".join(cols) or "<i>(empty)</i>"}</div>'


def _worst_html(result: ScoreResult, n: int) -> str:
    parts = []
    for u in result.worst(n):
        c, cc = u.words.counts, u.chars.counts
        head = (
            f"<b>{html.escape(u.utt_id)}</b>"
            + (f" &middot; speaker {html.escape(u.speaker)}" if u.speaker else "")
            + f" &middot; {c.errors} word errors / {c.tokens} words (S {c.substitutions} D {c.deletions} "
            f"I {c.insertions}) &middot; WER {fmt_percent(c.error_rate)} &middot; CER {fmt_percent(cc.error_rate)}"
            + (" &middot; <i>no hypothesis given</i>" if u.missing else "")
        )
        parts.append(f'<div class="utt"><div class="head">{head}</div>{_alignment_html(u.words)}</div>')
    return "".join(parts) or "<p>No errors.</p>"


def report_html(result: ScoreResult, info: ReportInfo, pngs: dict[str, bytes], worst: int = WORST) -> str:
    """The self-contained HTML report (``pngs``: title -> PNG bytes, embedded inline)."""
    w, c = result.total("WER"), result.total("CER")
    esc = html.escape
    meta = [("ref", info.ref), ("hyp", info.hyp), *info.details.items()]
    meta.append(("text normalisation", "srupp_asr.text.normalize_text" if info.normalized else "none"))
    meta_html = "".join(f"<div>{esc(k)}: <code>{esc(str(v))}</code></div>" for k, v in meta if v)
    warn_html = "".join(f'<div class="warn">warning: {esc(x)}</div>' for x in warnings_of(result))
    big = "".join(
        f'<div class="big">{level}<b>{fmt_percent(t.error_rate)}</b>{t.errors} errors / {t.tokens} {unit}</div>'
        for level, t, unit in (("WER", w, "words"), ("CER", c, "characters"))
    )
    summary = _table(
        ["", "Snt", "Wrd / Chr", "Corr", "Sub", "Del", "Ins", "Err", "S.Err"],
        [["WER", *_row_cells(w)], ["CER", *_row_cells(c)]],
    )
    images = "".join(
        f'<h3>{esc(title)}</h3><img alt="{esc(title)}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'
        for title, data in pngs.items()
    )
    speakers_c = result.by_speaker("CER")
    speaker_rows = [
        [s, str(cw.sentences), str(cw.tokens)]
        + [fmt_rate(cw.percent(x)) for x in (cw.substitutions, cw.deletions, cw.insertions, cw.errors)]
        + [fmt_rate(cw.sentence_error_rate), fmt_rate(speakers_c[s].error_rate)]
        for s, cw in result.by_speaker("WER").items()
    ]
    lengths_c = result.by_length("CER")
    length_rows = [
        [b, str(cw.sentences), str(cw.tokens), fmt_rate(cw.error_rate), fmt_rate(lengths_c[b].error_rate)]
        for b, cw in result.by_length("WER").items()
    ]
    tops = (
        f"<div><h3>Confusion pairs</h3>"
        f"{_table(['reference', 'hypothesis', 'count'], [[r, h, str(n)] for (r, h), n in result.confusions(TOP)], 2)}"
        f"</div><div><h3>Most deleted</h3>"
        f"{_table(['word', 'count'], [[x, str(n)] for x, n in result.deleted(TOP)])}</div>"
        f"<div><h3>Most inserted</h3>{_table(['word', 'count'], [[x, str(n)] for x, n in result.inserted(TOP)])}</div>"
    )
    legend = (
        '<p class="legend">Each column shows the reference word over the hypothesis word: '
        f'<span class="{CORRECT}">correct</span><span class="S">substitution</span>'
        f'<span class="{DELETION}">deletion</span><span class="{INSERTION}">insertion</span> (gaps as *).</p>'
    )
    generated = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(info.name)}: WER {fmt_percent(w.error_rate)}</title><style>{_CSS}</style></head><body>
<h1>{esc(info.name)}</h1>
<div class="meta">srupp-asr {esc(__version__)} &middot; {generated}{meta_html}</div>
{warn_html}
<h2>Summary</h2>{big}{summary}
<p class="meta">Counts as sclite computes them (substitution 4, deletion 3, insertion 3, its tie-breaking);
CER aligns characters without the spaces between words, as <code>sclite -c</code>. Percentages of the
reference words (characters); S.Err is the share of sentences with any error.</p>
<h2>Plots</h2><div class="plots">{images}</div>
<h2>By speaker</h2>
{_table(["speaker", "Snt", "Wrd", "Sub", "Del", "Ins", "WER", "S.Err", "CER"], speaker_rows)}
<h2>WER by utterance length</h2>
{_table(["reference words", "Snt", "Wrd", "WER", "CER"], length_rows)}
<h2>Worst utterances</h2>{legend}{_worst_html(result, worst)}
<h2>Frequent errors</h2><div class="tops">{tops}</div>
</body></html>
"""


def results_json(result: ScoreResult, info: ReportInfo) -> str:
    """The totals as JSON (for scripts that collect many reports): per level (WER, CER) the sclite counts and
    rates, plus the report's name, sources and details (model, decoding, speed)."""
    levels = {}
    for level in ("WER", "CER"):
        c = result.total(level)
        levels[level] = {
            **{name: getattr(c, name) for name in ("sentences", "sentence_errors", "tokens", "correct")},
            **{name: getattr(c, name) for name in ("substitutions", "deletions", "insertions", "errors")},
            "error_rate": c.error_rate,
            "sentence_error_rate": c.sentence_error_rate,
        }
    doc = {"name": info.name, "ref": info.ref, "hyp": info.hyp, "normalized": info.normalized, **levels}
    doc["details"] = dict(info.details)
    doc["missing"], doc["extra"] = len(result.missing), len(result.extra)
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


# ---- writing everything --------------------------------------------------------------------------------------


def write_report(
    result: ScoreResult,
    out_dir: str | os.PathLike,
    info: ReportInfo,
    train_log: str | os.PathLike | None = None,
    worst: int = WORST,
    extra: dict[str, str] | None = None,
) -> dict[str, Path]:
    """Write every report file into ``out_dir``, all or nothing, with the ``extra`` files (name -> text) of the
    caller in the same set; returns {kind: path}.

    ``results.md``, ``results.json`` (the totals, for scripts), ``report.html``, ``alignment.wer.txt`` /
    ``alignment.cer.txt`` (sclite pralign style),
    ``ref.trn`` / ``hyp.trn`` (the normalised texts, ready for ``sclite -r ref.trn trn -h hyp.trn trn -i rm -e utf-8
    -s``, plus ``-c`` for CER: without ``-e utf-8`` sclite splits characters into bytes, without ``-s`` it ignores
    case),
    ``wer_by_length.png``, ``error_types.png`` and, with ``train_log`` (a Lightning ``metrics.csv``),
    ``training_curves.png``.
    """
    from srupp_asr.scoring import plots  # matplotlib: 1-2 s, kept out of score/evaluate --help

    out = Path(out_dir)
    # Everything is made in memory and every target checked first, so a report that cannot be written leaves
    # the folder as it was (each file is then written atomically).
    pngs = {
        "Error types": ("error_types.png", plots.error_types_png(result)),
        "Error rate by utterance length": ("wer_by_length.png", plots.wer_by_length_png(result)),
    }
    if train_log is not None:
        pngs["Training curves"] = ("training_curves.png", plots.training_curves_png(train_log))
    texts = {
        "ref.trn": [UtteranceText(u.utt_id, u.ref, u.speaker) for u in result.utterances],
        "hyp.trn": [UtteranceText(u.utt_id, u.hyp, u.speaker) for u in result.utterances],
    }
    files = {
        "results.json": results_json(result, info),
        "alignment.wer.txt": pralign_text(result, "WER"),
        "alignment.cer.txt": pralign_text(result, "CER"),
        "results.md": results_md(result, info),
        "report.html": report_html(result, info, {t: d for t, (_, d) in pngs.items()}, worst),
    }
    files |= extra or {}
    names = [name for name, _ in pngs.values()] + list(texts) + list(files)
    _check_targets(out, names)
    contents = {out / name: data for name, data in pngs.values()}
    contents |= {out / name: "".join(trn_line(t) + "\n" for t in items).encode() for name, items in texts.items()}
    contents |= {out / name: text.encode() for name, text in files.items()}
    write_files_together(contents)  # all or nothing: a full disk names the file and leaves the old report whole
    return {name: out / name for name in names}


def _check_targets(out: Path, names: list[str]) -> None:
    """Make ``out``; a UserError if it cannot be made or one of the report's files cannot replace what is there."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UserError(f"{out}: exists and is not a folder (the report goes into a folder)") from None
    for name in names:
        if (out / name).is_dir():
            raise UserError(f"{out / name}: is a folder; the report's file of that name cannot replace it")
