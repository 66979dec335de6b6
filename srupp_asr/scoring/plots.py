"""PNG plots of a report (matplotlib, drawn on a bare ``Figure``: no pyplot state, no display needed).

Each function returns the PNG bytes; the report writes them to files and embeds them in the HTML.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections import defaultdict

from matplotlib.figure import Figure

from srupp_asr.errors import UserError
from srupp_asr.fileio import read_text
from srupp_asr.scoring.align import fmt_rate
from srupp_asr.scoring.analysis import LEVELS, ScoreResult

_COLORS = {"sub": "#d62728", "del": "#1f77b4", "ins": "#ff7f0e", "WER": "#4c72b0", "CER": "#55a868"}
# Panels of the training curves, in this order: metrics named ``<stage>/<name>`` share a panel per name.
_CURVE_ORDER = ("loss", "wer", "acc", "loss_ctc", "loss_att", "lr")
_MAX_PANELS = 6
_SKIP_METRICS = {"nonfinite_skipped"}


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})  # no version stamp: same input, same bytes
    return buf.getvalue()


def wer_by_length_png(result: ScoreResult) -> bytes:
    """Bars of WER and CER per reference-length bucket, with the number of utterances in each."""
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.add_subplot()
    buckets = result.by_length("WER")
    cer = result.by_length("CER")
    labels = list(buckets)
    width = 0.4
    top = 0.0
    for k, (level, table) in enumerate((("WER", buckets), ("CER", cer))):
        xs = [i + (k - 0.5) * width for i in range(len(labels))]
        ys = [table[b].error_rate or 0.0 for b in labels]
        ax.bar(xs, ys, width, label=level, color=_COLORS[level])
        top = max([top, *ys])
    ax.set_xticks(range(len(labels)), [f"{b}\n(n={buckets[b].sentences})" for b in labels])
    ax.set_xlabel("reference length in words (number of utterances)")
    ax.set_ylim(0, max(top, 1.0) * 1.25)  # room for the legend above the bars
    ax.set_ylabel("error rate (%)")
    ax.set_title("Error rate by utterance length")
    ax.legend()
    return _png(fig)


def error_types_png(result: ScoreResult) -> bytes:
    """Stacked bars of substitution, deletion and insertion rates for WER and CER."""
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.add_subplot()
    levels = list(LEVELS)
    bottom = [0.0] * len(levels)
    for name, attr in (("sub", "substitutions"), ("del", "deletions"), ("ins", "insertions")):
        values = [result.total(lv).percent(getattr(result.total(lv), attr)) or 0.0 for lv in levels]
        ax.bar(levels, values, 0.5, bottom=bottom, label=name, color=_COLORS[name])
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    for i, total in enumerate(bottom):
        ax.annotate(f"{fmt_rate(total)}%", (i, total), xytext=(0, 3), textcoords="offset points", ha="center")
    ax.set_ylabel("% of reference tokens")
    ax.set_title("Error types")
    ax.set_ylim(0, max([*bottom, 1.0]) * 1.15)
    ax.legend()
    return _png(fig)


def read_metrics_csv(path: str | os.PathLike) -> dict[str, list[tuple[float, float]]]:
    """A Lightning CSVLogger ``metrics.csv`` as {metric: [(step, value), ...]} (empty cells skipped)."""
    lines = read_text(path, "training log").splitlines()
    rows = list(csv.reader(lines))
    if not rows or "step" not in rows[0]:
        raise UserError(f"{path}: not a Lightning metrics.csv (no 'step' column in the header)")
    header = rows[0]
    step_col = header.index("step")
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for number, row in enumerate(rows[1:], start=2):
        if not any(row):
            continue
        if len(row) != len(header):
            raise UserError(f"{path}:{number}: {len(row)} fields, the header has {len(header)}")
        try:
            step = float(row[step_col])
            for name, cell in zip(header, row, strict=True):
                if cell and name not in ("epoch", "step"):
                    series[name].append((step, float(cell)))
        except ValueError:
            raise UserError(f"{path}:{number}: a value is not a number") from None
    if not series:
        raise UserError(f"{path}: training log holds no metric values")
    return dict(series)


def training_curves_png(path: str | os.PathLike) -> bytes:
    """Training and validation curves from a Lightning ``metrics.csv``: one panel per metric name."""
    panels: dict[str, list[tuple[str, list[tuple[float, float]]]]] = defaultdict(list)
    for name, points in read_metrics_csv(path).items():
        stage, _, metric = name.rpartition("/")
        if metric not in _SKIP_METRICS and any(math.isfinite(v) for _, v in points):
            panels[metric].append((stage or metric, points))
    order = sorted(panels, key=lambda m: (_CURVE_ORDER.index(m) if m in _CURVE_ORDER else len(_CURVE_ORDER), m))
    order = order[:_MAX_PANELS]
    cols = min(3, len(order))
    rows = math.ceil(len(order) / cols)
    fig = Figure(figsize=(4.2 * cols, 3.2 * rows), layout="constrained")
    for i, metric in enumerate(order):
        ax = fig.add_subplot(rows, cols, i + 1)
        for stage, points in panels[metric]:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=stage)
        if metric.startswith("loss") and all(v > 0 for _, pts in panels[metric] for _, v in pts):
            ax.set_yscale("log")
        ax.set_title(metric)
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    fig.suptitle("Training curves")
    return _png(fig)
