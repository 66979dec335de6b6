"""English sentences from text that Debian ships: what the synthetic voices read.

Sources (each used when its package is installed; :func:`collect_sentences` reports which were found):

- ``fortunes``: fortune cookies, ``/usr/share/games/fortunes/*`` (fortune-mod with fortunes-min or fortunes;
  the ``off/`` folder of offensive ones is never read); attribution lines (``-- Author``) are left out;
- ``wordnet``: the quoted example sentences of WordNet's glosses, ``/usr/share/wordnet/data.*`` (wordnet-base);
- ``gcide``: the quoted examples of the GNU Collaborative International Dictionary of English,
  ``/usr/share/dictd/gcide.dict.dz`` (dict-gcide);
- ``licenses``: the licence texts in ``/usr/share/common-licenses`` (base-files, always there).

Every passage is split into sentences; each sentence is turned into its spoken form by
:func:`srupp_asr.synth.verbalize.verbalize` (or dropped), kept when it has 4-30 words and reads as English, and
deduplicated by its normalised transcript (:func:`srupp_asr.text.normalize_text`), the first source winning. The
spoken form is what every voice is given: its words, and only its words, are the transcript's.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from srupp_asr.synth.verbalize import _EXPAND, ABBREVIATIONS, verbalize
from srupp_asr.text import normalize_text

MIN_WORDS = 4
MAX_WORDS = 30

# Frequent English function words: a sentence with too few of them is a list, a title or another language.
_FUNCTION_WORDS = frozenset(
    """
    the a an of to in and or but is are was were be been being am it its this that these those he she
    they we you i me my your his her their our them him us not no on at by for with from as if then than
    so do does did have has had will would shall should can could may might must what which who whom
    whose when where why how all any some there here out up into over about after before
    """.split()  # noqa: SIM905 (a word list reads better as text)
)


@dataclass(frozen=True)
class Sentence:
    """One sentence of the pool: ``spoken`` is what a voice is given (and the transcript), ``written`` the source."""

    id: str
    source: str
    spoken: str
    written: str


@dataclass(frozen=True)
class TextSource:
    """A Debian text source: where its files are, which package brings them, how to read passages from them."""

    name: str
    packages: tuple[str, ...]
    pattern: str  # glob of its files
    read: Callable[[Path], Iterator[str]]

    def files(self) -> list[Path]:
        """Its installed files (regular files, symbolic links to one another counted once), sorted."""
        root = Path("/")
        found: dict[Path, Path] = {}
        for path in sorted(root.glob(self.pattern.lstrip("/"))):
            if path.is_file() and not path.name.endswith((".dat", ".u8")):
                found.setdefault(path.resolve(), path)
        return sorted(found.values())


@dataclass
class SourceReport:
    """What one source gave: files read, sentences seen and sentences kept (after filters and deduplication)."""

    name: str
    packages: tuple[str, ...]
    files: int = 0
    seen: int = 0
    kept: int = 0
    dropped: dict[str, int] = field(default_factory=dict)


def _full_stop(example: str) -> str:
    """A quoted example as a sentence: trailing commas or semicolons replaced by a full stop."""
    example = example.strip().rstrip(",;:- ")
    return example if example[-1:] in ".!?" else example + "."


def _read_fortunes(path: Path) -> Iterator[str]:
    text = path.read_text(encoding="utf-8", errors="replace")
    for entry in re.split(r"^%\s*$", text, flags=re.MULTILINE):
        lines = [ln for ln in entry.splitlines() if not ln.strip().startswith("--")]
        yield " ".join(lines)


def _read_wordnet(path: Path) -> Iterator[str]:
    with path.open(encoding="latin-1") as f:
        for line in f:
            if line.startswith(" ") or "|" not in line:
                continue  # licence header
            for example in re.findall(r'"([^"]+)"', line.split("|", 1)[1]):
                yield _full_stop(example)


def _read_gcide(path: Path) -> Iterator[str]:
    with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:  # dictzip is gzip-compatible
        text = f.read()
    for paragraph in text.split("\n\n"):
        paragraph = re.sub(r"\\[^\\\n]*\\", " ", paragraph)  # headwords with their accent marks: \Ab"di*ca"tion\
        for quote in re.findall(r'"([^"]{12,400})"', " ".join(paragraph.split())):
            yield _full_stop(quote)


def _read_paragraphs(path: Path) -> Iterator[str]:
    text = path.read_text(encoding="utf-8", errors="replace")
    for paragraph in re.split(r"\n\s*\n", text):
        yield " ".join(paragraph.split())


TEXT_SOURCES: tuple[TextSource, ...] = (
    TextSource("fortunes", ("fortune-mod", "fortunes-min", "fortunes"), "/usr/share/games/fortunes/*", _read_fortunes),
    TextSource("wordnet", ("wordnet-base",), "/usr/share/wordnet/data.*", _read_wordnet),
    TextSource("gcide", ("dict-gcide",), "/usr/share/dictd/gcide.dict.dz", _read_gcide),
    TextSource("licenses", ("base-files",), "/usr/share/common-licenses/*", _read_paragraphs),
)

# A sentence ends at . ! ? (with closing quotes or brackets) before a space and a capital letter or digit.
_BOUNDARY = re.compile(r"[.!?]+[\"')\]]*\s+(?=[\"'(\[]*[A-Z0-9])")
_NO_SPLIT_AFTER = ABBREVIATIONS | {key.rstrip(".") for key in _EXPAND}


def split_sentences(passage: str) -> list[str]:
    """Split a passage into sentences, not after abbreviations ("Mr.", "e.g.") or initials ("J. R. R.")."""
    passage = " ".join(passage.split())
    sentences, start = [], 0
    for match in _BOUNDARY.finditer(passage):
        before = passage[start : match.start() + 1].split()
        last = before[-1].lstrip("\"'([").lower() if before else ""
        if last.endswith(".") and not last.endswith(".."):
            bare = last.rstrip(".")
            if bare in _NO_SPLIT_AFTER or (len(bare) == 1 and bare.isalpha()):
                continue
        sentences.append(passage[start : match.end()].strip())
        start = match.end()
    tail = passage[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


def sentence_problem(spoken: str | None) -> str | None:
    """Why a spoken-form sentence is not used (None when it is): unsayable, word count, not English."""
    if spoken is None:
        return "unsayable"
    return _word_problem(normalize_text(spoken).split())


def _word_problem(words: list[str]) -> str | None:
    if len(words) < MIN_WORDS:
        return "too short"
    if len(words) > MAX_WORDS:
        return "too long"
    if sum(w in _FUNCTION_WORDS for w in words) < max(1, len(words) // 6):
        return "not English"
    return None


def filter_sentences(items: Iterable[tuple[str, str]], report: dict[str, SourceReport] | None = None) -> list[Sentence]:
    """The usable sentences of ``(source, written sentence)`` pairs, deduplicated by their normalised text."""
    seen: set[str] = set()
    counters: dict[str, int] = {}
    kept = []
    for source, written in items:
        rep = report.setdefault(source, SourceReport(source, ())) if report is not None else SourceReport(source, ())
        rep.seen += 1
        spoken = verbalize(written)
        if spoken is None:
            problem = "unsayable"
        else:
            key = normalize_text(spoken)
            problem = _word_problem(key.split()) or ("duplicate" if key in seen else None)
        if problem:
            rep.dropped[problem] = rep.dropped.get(problem, 0) + 1
            continue
        seen.add(key)
        counters[source] = counters.get(source, 0) + 1
        rep.kept += 1
        written = re.sub(r".\x08", "", written)  # overstrike (fortune files) would garble the table
        kept.append(Sentence(f"{source}-{counters[source]:06d}", source, spoken, written))
    return kept


def collect_sentences(sources: Iterable[str] | None = None, report: list[SourceReport] | None = None) -> list[Sentence]:
    """The usable sentences of the installed Debian text sources (all known ones, or the ``sources`` named).

    ``report``, when given, receives one :class:`SourceReport` per source (files 0: not installed).
    """
    known = {s.name: s for s in TEXT_SOURCES}
    names = list(known) if sources is None else list(sources)
    unknown = [n for n in names if n not in known]
    if unknown:
        from srupp_asr.errors import UserError

        raise UserError(f"text sources: unknown {', '.join(unknown)} (known: {', '.join(known)})")
    reports = {n: SourceReport(n, known[n].packages) for n in names}

    def items() -> Iterator[tuple[str, str]]:
        for name in names:
            files = known[name].files()
            reports[name].files = len(files)
            for path in files:
                for passage in known[name].read(path):
                    for sentence in split_sentences(passage):
                        yield name, sentence

    sentences = filter_sentences(items(), reports)
    if report is not None:
        report.extend(reports.values())
    return sentences
