"""``srupp-asr sclite``: NIST sclite's command line and reports, on the package's reader and aligner.

``srupp-asr sclite -r REF [trn|stm|ctm] -h HYP [trn|ctm] [TITLE] -i wsj -o sum rsum pralign dtl sgml -O DIR -n NAME``
scores as sclite (NIST SCTK) does and writes ``NAME.sys``, ``NAME.raw``, ``NAME.pra``, ``NAME.dtl`` and (trn
scoring) ``NAME.sgml`` in its layout; CTM confidences add sclite's NCE column to ``.sys``/``.raw``:

- trn against trn: the hypothesis file drives; each hypothesis id's reference is found case-insensitively (both
  lines are case-folded unless ``-s``); the speaker is taken from the id as ``-i`` says.
- STM against CTM: per recording and channel, hypothesis words are given to reference segments in time order: a
  word (an alternation block, by its latest word) belongs to the first segment whose end time is later than its
  midpoint, the channel's last segment takes the rest; segments marked ``IGNORE_TIME_SEGMENT_IN_SCORING`` drop
  their words. Utterance ids are ``SPEAKER-NNN``. ``-m ref`` / ``-m hyp`` leave out the segments outside the
  hypothesis' time range / the words outside the reference's.
- CTM against CTM: each channel cut into utterances ``FILE-CHANNEL-NNNN`` where the two sides' word gaps meet
  (:mod:`srupp_asr.scoring.sclite_ctm`); ``-T`` aligns them by the words' times (time-mediated alignment: a
  pairing costs the distance of the begin and end times, a word left out its duration), which sclite allows
  for CTM references only.
- ``-D`` optional words ``(uh)``, ``-F`` fragments, ``-c [DH] [NOASCII]`` characters: see
  :mod:`srupp_asr.scoring.wordnet`. Alignment: :func:`srupp_asr.scoring.align.align_net_batch`.

Options sclite has that this does not (``-S``, ``-w``, ``-L``, ``-d``, ``-P`` SGML input) are refused in one line
naming the option.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from srupp_asr.errors import UserError
from srupp_asr.scoring.align import align_net_batch, align_nets
from srupp_asr.scoring.formats import CtmToken, StmSegment, data_lines, read_ctm, read_stm, split_trn_id
from srupp_asr.scoring.sclite_ctm import MarkedWord, chunks, recordings
from srupp_asr.scoring.sclite_report import ScoredUtterance, SgmlHeader, dtl_text, pra_text, sgml_text, summary_table
from srupp_asr.scoring.wordnet import CharMode, WordNet, build_net, parse_tokens, word_positions

ID_TYPES = ("rm", "wsj", "spu_id", "swb", "sp", "atis")
_REFUSED = {
    "-S": "inferred word segmentation",
    "-w": "word-weight alignment",
    "-L": "language-model-weighted alignment",
    "-d": "GNU diff alignment",
    "-P": "SGML input",
    "-g": "SGML input",
}
_REPORTS = {"sum": "sys", "rsum": "raw", "pralign": "pra", "dtl": "dtl", "sgml": "sgml"}
_ENCODINGS = {"utf-8": "utf-8", "gb": "gb18030", "euc": "euc-jp"}
_ASCII_UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
# The letters sclite lowercases beside ASCII's under each -e utf-8 localization (measured letter by letter with
# sctk sclite over U+0080-U+1FFF: 'generic' and none fold ASCII only). Turkish I is dotless ı.
_FOLD_LETTERS = {
    "generic": "",
    "babel_turkish": "ÇÖÜĞŞİ",
    "babel_vietnamese": "ÀÁÂÃÈÉÊÌÍÒÓÔÕÙÚÝĂĐĨŨƠƯẠẢẤẦẨẪẬẮẰẲẴẶẸẺẼẾỀỂỄỆỈỊỌỎỐỒỔỖỘỚỜỞỠỢỤỦỨỪỬỮỰỲỴỶỸ",
    "ukrainian": "".join(map(chr, range(0x400, 0x430))) + "Ґ",  # not in Debian's sclite: Cyrillic capitals
}
_FOLDS = tuple(_FOLD_LETTERS)
_LOWER = {
    name: str.maketrans(
        _ASCII_UPPER + letters,
        ("abcdefghıjklmnopqrstuvwxyz" if name == "babel_turkish" else _ASCII_UPPER.lower())
        + "".join(c.lower()[0] for c in letters),
    )
    for name, letters in {None: "", **_FOLD_LETTERS}.items()
}
# sclite also skips the mark written without underscores (SCTK test3a): compared without them, any case.
IGNORE_MARK = "ignoretimesegmentinscoring"


@dataclass
class Options:
    """What a sclite command line asks for."""

    ref: str = ""
    ref_format: str = "trn"
    hyp: str = ""
    hyp_format: str = "trn"
    title: str | None = None
    id_type: str = "sp"
    fragments: bool = False
    optional: bool = False
    case_sensitive: bool = False
    chars: CharMode | None = None
    encoding: str = "latin-1"
    fold: str | None = None
    reports: list[str] = field(default_factory=lambda: ["sum"])
    stdout: bool = False
    out_dir: str | None = None
    name: str | None = None
    reduce_ref: bool = False
    reduce_hyp: bool = False
    time_align: bool = False


def parse_args(argv: Sequence[str]) -> Options:
    """sclite's options (``-r FILE [FMT]``, ``-o sum rsum ...``), refusing those it does not support."""
    opts = Options()
    args = list(argv)
    i = 0

    def values(limit: int | None = None) -> list[str]:
        nonlocal i
        out = []
        while (
            i < len(args) and not (args[i].startswith("-") and len(args[i]) > 1) and (limit is None or len(out) < limit)
        ):
            out.append(args[i])
            i += 1
        return out

    while i < len(args):
        flag = args[i]
        i += 1
        if flag in _REFUSED:
            raise UserError(f"sclite: option {flag} ({_REFUSED[flag]}) is not supported by srupp-asr sclite")
        if flag == "-r":
            opts.ref, *rest = values(2) or [""]
            opts.ref_format = rest[0] if rest else "trn"
        elif flag == "-h":
            opts.hyp, *rest = values(3) or [""]
            opts.hyp_format = rest[0] if rest else "trn"
            opts.title = rest[1] if len(rest) > 1 else None
        elif flag == "-i":
            (opts.id_type,) = values(1) or [""]
            if opts.id_type not in ID_TYPES:
                raise UserError(f"sclite: -i takes one of {', '.join(ID_TYPES)}, got {opts.id_type!r}")
        elif flag == "-F":
            opts.fragments = True
        elif flag == "-D":
            opts.optional = True
        elif flag == "-m":
            sides = values(2) or ["ref"]
            if not set(sides) <= {"ref", "hyp"}:
                raise UserError(f"sclite: -m takes ref and/or hyp, got {' '.join(sides)!r}")
            opts.reduce_ref, opts.reduce_hyp = "ref" in sides, "hyp" in sides
        elif flag == "-s":
            opts.case_sensitive = True
        elif flag == "-T":
            opts.time_align = True
        elif flag == "-c":
            words = {w.upper() for w in values()}
            opts.chars = CharMode(no_ascii="NOASCII" in words, drop_hyphens="DH" in words)
        elif flag == "-e":
            enc, *rest = values(2) or [""]
            if enc not in _ENCODINGS:
                raise UserError(f"sclite: -e takes one of {', '.join(_ENCODINGS)}, got {enc!r}")
            opts.encoding, opts.fold = _ENCODINGS[enc], (rest[0] if rest else None)
            if opts.fold is not None and opts.fold not in _FOLDS:
                raise UserError(f"sclite: -e {enc} takes a case folding of {', '.join(_FOLDS)}, got {opts.fold!r}")
        elif flag == "-o":
            words = values()
            opts.stdout = "stdout" in words
            opts.reports = [r for r in _expand_reports(words)]
        elif flag == "-O":
            (opts.out_dir,) = values(1) or [None]
        elif flag == "-n":
            (opts.name,) = values(1) or [None]
        elif flag in ("-f", "-l"):
            values(1)  # feedback level, line width: no effect on the reports
        else:
            raise UserError(f"sclite: unknown option {flag!r}")
    if not opts.ref or not opts.hyp:
        raise UserError("sclite: needs -r REF_FILE and -h HYP_FILE")
    formats = {(opts.ref_format, opts.hyp_format)}
    if not formats <= {("trn", "trn"), ("stm", "ctm"), ("ctm", "ctm")}:
        raise UserError(
            f"sclite: -r {opts.ref_format} against -h {opts.hyp_format} is not supported"
            " (trn/trn, stm/ctm and ctm/ctm are)"
        )
    if opts.time_align and opts.ref_format != "ctm":
        raise UserError("sclite: -T (time-mediated alignment) needs a CTM reference (-r FILE ctm), as in sclite")
    if "sgml" in opts.reports and opts.ref_format != "trn":
        # sclite's STM/CTM paths carry every word's times (word_aux), which the aligner here does not keep.
        print("sclite: warning: report 'sgml' is written for trn scoring only by srupp-asr sclite", file=sys.stderr)
        opts.reports.remove("sgml")
    return opts


def _expand_reports(words: Sequence[str]) -> list[str]:
    out = []
    for word in words:
        for name in ("sum", "rsum", "pralign") if word == "all" else (word,):
            if name in _REPORTS and name not in out:
                out.append(name)
            elif name not in _REPORTS and name not in ("stdout", "none"):
                print(f"sclite: warning: report '{name}' is not written by srupp-asr sclite", file=sys.stderr)
    return out


def fold_case(text: str, opts: Options) -> str:
    """sclite's case folding: ASCII letters, and under ``-e utf-8 LOCALIZATION`` that language's letters (Turkish
    I to dotless ı); nothing under ``-s``. Other letters keep their case, as in sclite."""
    if opts.case_sensitive:
        return text
    return text.translate(_LOWER[opts.fold if opts.encoding == "utf-8" else None])


def speaker_of(utt_id: str, id_type: str) -> str:
    """The speaker part of an utterance id, as sclite's ``-i`` takes it."""
    if id_type == "sp":
        return utt_id
    if id_type in ("wsj", "atis"):
        return utt_id[:3]
    for sep in "-_":
        if sep in utt_id:
            return utt_id[: utt_id.index(sep)]
    raise UserError(f"sclite: can't find the speaker in utterance id {utt_id!r} (-i {id_type})")


def _net(
    text: str,
    opts: Options,
    confidences: Sequence[float | None] | None = None,
    times: Sequence[tuple[float, float]] | None = None,
) -> WordNet:
    return build_net(fold_case(text, opts), opts.optional, opts.fragments, opts.chars, confidences, times)


def score_trn(opts: Options) -> list[ScoredUtterance]:
    """trn against trn: each hypothesis line with the reference of the same (case-folded) id."""
    refs: dict[str, str] = {}
    for number, line in data_lines(opts.ref, "reference file", opts.encoding):
        text, utt_id = split_trn_id(line)
        if utt_id is None:
            raise UserError(f"{opts.ref}:{number}: a trn line ends with its utterance id in parentheses")
        refs.setdefault(fold_case(utt_id, opts), text)
    pairs, keys = [], []
    for number, line in data_lines(opts.hyp, "hypothesis file", opts.encoding):
        text, utt_id = split_trn_id(line)
        if utt_id is None:
            raise UserError(f"{opts.hyp}:{number}: a trn line ends with its utterance id in parentheses")
        key = fold_case(utt_id, opts)
        if key not in refs:
            raise UserError(f"{opts.hyp}:{number}: no reference for utterance id '{utt_id}' in {opts.ref}")
        keys.append(key)
        pairs.append((_net(refs[key], opts), _net(text, opts)))
    alignments = align_net_batch(pairs)
    return [ScoredUtterance(k, speaker_of(k, opts.id_type), a) for k, a in zip(keys, alignments, strict=True)]


@dataclass(frozen=True)
class _CtmItem:
    """A CTM word, or an alternation block ``{ a / b }`` as one item timed by its latest word."""

    mid: float
    text: str
    confs: tuple[float | None, ...]
    kept: bool = True  # False: outside the reference's time range under -m hyp


def _ctm_items(tokens: Sequence[CtmToken], keep: tuple[float, float] | None = None) -> list[_CtmItem]:
    """A channel's CTM words as items with their midpoints and their words' confidences.

    ``keep`` (``-m hyp``): the time range (begin, end) of the reference; a word wholly outside it is not kept, an
    alternation block only when none of its words is kept."""
    items: list[_CtmItem] = []
    block: list[str] | None = None
    confs: list[float | None] = []
    mid, kept = 0.0, False
    for tok in tokens:
        inside = keep is None or tok.start is None or not (tok.start > keep[1] or tok.start + tok.duration < keep[0])
        if tok.word == "<ALT_BEGIN>":
            block, confs, mid, kept = ["{"], [], 0.0, False
        elif tok.word == "<ALT>" and block is not None:
            block.append("/")
        elif tok.word == "<ALT_END>" and block is not None:
            items.append(_CtmItem(mid, " ".join([*block, "}"]), tuple(confs), kept))
            block = None
        elif block is not None:
            block.append(tok.word)
            confs.append(tok.confidence)
            mid, kept = max(mid, tok.start + tok.duration / 2), kept or inside
        else:
            items.append(_CtmItem(tok.start + tok.duration / 2, tok.word, (tok.confidence,), inside))
    return items


def _segment_words(segs: Sequence[StmSegment], tokens: Sequence[CtmToken], opts: Options) -> list[tuple]:
    """(segment, its CTM items) of one channel, as sclite gives words to segments: in time order, each to the
    first segment ending after its midpoint, the last segment taking the rest.

    ``-m ref`` leaves out the segments outside the hypothesis words' time range (their words go to the next
    segment scored); ``-m hyp`` the words outside the remaining segments' range."""
    scored = [True] * len(segs)
    timed = [tok for tok in tokens if tok.start is not None]
    if opts.reduce_ref and timed:
        begin, end = timed[0].start, timed[-1].start + timed[-1].duration
        scored = [not (begin >= seg.end or end <= seg.start) for seg in segs]
    keep = None
    if opts.reduce_hyp:
        kept = [seg for seg, ok in zip(segs, scored, strict=True) if ok]
        keep = (min(s.start for s in kept), max(s.end for s in kept)) if kept else (float("inf"), float("-inf"))
    items = _ctm_items(tokens, keep)
    out, cur = [], 0
    for k, seg in enumerate(segs):
        if not scored[k]:
            continue
        end = len(items)
        if k < len(segs) - 1:
            end = cur
            while end < len(items) and items[end].mid < seg.end:
                end += 1
        out.append((seg, [item for item in items[cur:end] if item.kept]))
        cur = end
    return out


def _hyp_net(items: Sequence[_CtmItem], opts: Options) -> WordNet:
    """The hypothesis network of a segment's CTM items, each word with its confidence when the CTM has them."""
    text = " ".join(item.text for item in items)
    confs = [c for item in items for c in item.confs]
    words = len(word_positions(parse_tokens(text))) if any(c is not None for c in confs) else -1
    return _net(text, opts, confs if words == len(confs) else None)


def score_stm_ctm(opts: Options) -> list[ScoredUtterance]:
    """STM references against CTM hypotheses, words given to segments by time as sclite does."""
    segments = read_stm(opts.ref, opts.encoding)
    channels: dict[tuple[str, str], list] = {}
    tokens = read_ctm(opts.hyp, opts.encoding)
    for tok in tokens:
        channels.setdefault((tok.file, tok.channel.lower()), []).append(tok)
    confs = [tok.confidence for tok in tokens if tok.confidence is not None]
    outside = sum(not 0.0 <= c <= 1.0 for c in confs)
    if outside:  # sclite's own warning; NCE clips them
        print(f"Warning: {outside} of {len(confs)} confidence scores were not in the range (0.0,1.0)", file=sys.stderr)
    ref_channels: dict[tuple[str, str], list] = {}
    for seg in segments:
        ref_channels.setdefault((seg.file, seg.channel.lower()), []).append(seg)
    extra = [key for key in channels if key not in ref_channels]
    if extra:
        raise UserError(f"{opts.hyp}: recording '{extra[0][0]}' channel '{extra[0][1]}' is not in {opts.ref}")
    pairs, meta = [], []
    sentences: dict[str, int] = {}
    for key, segs in ref_channels.items():
        for seg, words in _segment_words(segs, channels.get(key, []), opts):
            if IGNORE_MARK in seg.text.lower().replace("_", ""):
                continue
            speaker = fold_case(seg.speaker, opts)
            utt_id = f"{speaker}-{sentences.get(speaker, 0):03d}"
            sentences[speaker] = sentences.get(speaker, 0) + 1
            pairs.append((_net(seg.text, opts), _hyp_net(words, opts)))
            meta.append((utt_id, speaker, seg))
    alignments = align_net_batch(pairs)
    return [
        ScoredUtterance(u, s, a, seg.file, seg.channel, fold_case(seg.labels, opts) or None)
        for (u, s, seg), a in zip(meta, alignments, strict=True)
    ]


_MARK_TEXT = {"<ALT_BEGIN>": "{", "<ALT>": "/", "<ALT_END>": "}"}


def _marked_net(words: Sequence[MarkedWord], opts: Options, path: str) -> WordNet:
    """The network of a run of CTM lines (alternation marks read as braces), each word with its times and
    confidence."""
    text = " ".join(_MARK_TEXT.get(w.token.word, w.token.word) for w in words)
    spoken = [w for w in words if w.token.word not in _MARK_TEXT]
    if len(word_positions(parse_tokens(text))) != len(spoken):
        raise UserError(f"{path}: a CTM word holds '{{', '}}' or (in an alternation) '/', which sclite reads apart")
    confs = [w.token.confidence for w in spoken]
    times = [(w.t1, w.t1 + w.dur) for w in spoken]
    return _net(text, opts, confs if any(c is not None for c in confs) else None, times)


def _fold_ctm(tokens: Sequence[CtmToken], opts: Options) -> list[CtmToken]:
    """CTM lines with recording, channel and word case-folded as sclite folds whole lines (marks kept)."""
    return [
        replace(
            tok,
            file=fold_case(tok.file, opts),
            channel=fold_case(tok.channel, opts),
            word=tok.word if tok.word in _MARK_TEXT else fold_case(tok.word, opts),
        )
        for tok in tokens
    ]


def score_ctm_ctm(opts: Options) -> list[ScoredUtterance]:
    """CTM reference against CTM hypothesis: recordings paired in file order, each channel cut into utterances
    (:func:`srupp_asr.scoring.sclite_ctm.chunks`) and aligned, by word times under ``-T``."""
    refs = recordings(_fold_ctm(read_ctm(opts.ref, opts.encoding), opts), opts.ref)
    hyps = recordings(_fold_ctm(read_ctm(opts.hyp, opts.encoding), opts), opts.hyp)
    for ref, hyp in zip(refs, hyps, strict=False):
        if ref.name != hyp.name:
            raise UserError(f"{opts.hyp}: recording '{hyp.name}' where {opts.ref} has '{ref.name}' (same order needed)")
    if len(refs) != len(hyps):
        longer, path = (refs, opts.ref) if len(refs) > len(hyps) else (hyps, opts.hyp)
        raise UserError(f"{path}: recording '{longer[min(len(refs), len(hyps))].name}' is not in the other file")
    out = []
    for ref, hyp in zip(refs, hyps, strict=True):
        for chunk in chunks(ref, hyp, opts.ref, opts.hyp):
            ref_net, hyp_net = _marked_net(chunk.ref, opts, opts.ref), _marked_net(chunk.hyp, opts, opts.hyp)
            alignment = align_nets(ref_net, hyp_net, time_mediated=opts.time_align, sort_indels=True)
            out.append(ScoredUtterance(chunk.utt_id, chunk.speaker, alignment, chunk.file, chunk.channel))
    return out


_SCORERS = {"trn": score_trn, "stm": score_stm_ctm, "ctm": score_ctm_ctm}


def sclite(opts: Options) -> list[ScoredUtterance]:
    """Score as ``opts`` say and write the reports; returns the scored utterances."""
    utts = _SCORERS[opts.ref_format](opts)
    title = opts.title or opts.hyp
    header = SgmlHeader(
        title, opts.ref, opts.hyp, opts.fragments, opts.optional, opts.chars is not None, opts.case_sensitive
    )
    texts = {
        "sum": lambda: summary_table(utts, title, raw=False, chars=opts.chars is not None),
        "rsum": lambda: summary_table(utts, title, raw=True, chars=opts.chars is not None),
        "pralign": lambda: pra_text(utts, title),
        "dtl": lambda: dtl_text(utts, title, opts.encoding),
        "sgml": lambda: sgml_text(utts, header),
    }
    out_dir = Path(opts.out_dir) if opts.out_dir else Path(opts.hyp).parent
    name = opts.name or Path(opts.hyp).name
    for report in opts.reports:
        text = texts[report]()
        if opts.stdout:
            sys.stdout.write(text)
        else:
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / f"{name}.{_REPORTS[report]}").write_text(text, encoding=opts.encoding, errors="replace")
    return utts


def main(argv: Sequence[str]) -> int:
    """Run ``srupp-asr sclite`` with sclite's own command line."""
    sclite(parse_args(argv))
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``sclite`` for ``srupp-asr --help`` (its command line is sclite's, parsed by :func:`parse_args`)."""
    p = subparsers.add_parser("sclite", help="NIST sclite's command line and reports (.sys/.raw/.pra)", add_help=False)
    p.add_argument("argv", nargs=argparse.REMAINDER)
    p.set_defaults(func=lambda args: main(args.argv))
    return p
