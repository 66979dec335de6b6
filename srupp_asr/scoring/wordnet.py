"""sclite's transcript language as a word network: alternations, the null word, optional words, fragments.

A transcript (a trn line's text, an STM segment's text, a CTM channel's words) is a sequence of words and
alternations ``{ a b / c / @ }``: one of the ``/``-separated word sequences is said, ``@`` (or an empty
alternative) meaning none. sclite (NIST SCTK) aligns such a transcript as a network whose arcs are words; this
module builds that network so :func:`srupp_asr.scoring.align.align_nets` can align it the way sclite does.

- ``-D``: a word in parentheses, ``(uh)``, may be left out at no error (it counts as correct when deleted).
- ``-F``: a fragment, a word that ends or starts with ``-`` (``fi-``, ``-icks``), matches any word that starts
  (ends) with the rest of it.
- ``-c``: words are split into characters; ``NOASCII`` keeps runs of ASCII letters whole, ``DH`` drops hyphens.
- A word's tags after an unescaped ``;`` (``word;tag1;tag2``) are not part of it; ``\\;`` is a literal ``;``.
- A CTM word carries its begin and end times (``-T`` aligns by them); a null word ``@`` has times 0, as in sclite.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

NULL_WORD = "@"
_TOKEN = re.compile(r"[{}]|[^\s{}]+")
_TAG_SPLIT = re.compile(r"(?<!\\);")
_MARKS = re.compile(r"[{}()@;*]")  # a transcript without these is a chain of plain words
_FRAGMENT_MARKS = re.compile(r"[{}()@;*-]")


@dataclass(frozen=True)
class Word:
    """One arc's word: ``text`` as shown, ``key`` as compared (an optional word's text without parentheses)."""

    text: str
    key: str
    null: bool = False
    optional: bool = False
    fragment: bool = False
    conf: float | None = None  # a CTM hypothesis word's confidence (sclite's NCE)
    start: float = 0.0  # a CTM word's begin and end times in seconds (0 where there are none)
    end: float = 0.0


@dataclass(frozen=True)
class CharMode:
    """How ``-c`` splits words: ``no_ascii`` keeps ASCII runs whole, ``drop_hyphens`` removes ``-``."""

    no_ascii: bool = False
    drop_hyphens: bool = False


@dataclass
class WordNet:
    """A word network: arcs (word, from node, to node) in an order where every arc follows its predecessors.

    Node 0 is the start; ``stop`` is the end node. Index 0 of :meth:`preds` results stands for the (virtual)
    arc entering the start node, so a network of n arcs has arc indices 1..n."""

    words: list[Word] = field(default_factory=list)
    src: list[int] = field(default_factory=list)
    dst: list[int] = field(default_factory=list)
    stop: int = 0
    nodes: int = 1

    def add(self, word: Word, src: int, dst: int) -> None:
        """Append an arc."""
        self.words.append(word)
        self.src.append(src)
        self.dst.append(dst)

    def new_node(self) -> int:
        """A fresh node's number."""
        self.nodes += 1
        return self.nodes - 1

    def preds(self) -> list[list[int]]:
        """For arc indices 0..n: the arcs (1-based; 0 = the start) ending where each arc starts, in order."""
        into: list[list[int]] = [[] for _ in range(self.nodes)]
        into[0].append(0)
        for i, node in enumerate(self.dst, start=1):
            into[node].append(i)
        return [[]] + [into[s] for s in self.src]

    def final_arcs(self) -> list[int]:
        """The arcs (1-based; 0 = the start) that end at the stop node."""
        return ([0] if self.stop == 0 else []) + [i for i, d in enumerate(self.dst, start=1) if d == self.stop]

    def linear_words(self) -> list[Word] | None:
        """The words in order when the network is one chain of plain words (no alternation, null, optional
        word or fragment), else None: such a pair is aligned by the batched array aligner."""
        if len(self.words) != self.nodes - 1:
            return None
        node = 0
        for word, s, d in zip(self.words, self.src, self.dst, strict=True):
            if s != node or word.null or word.optional or word.fragment:
                return None
            node = d
        return self.words if node == self.stop else None


def parse_tokens(text: str) -> list[str]:
    """Words and the alternation marks ``{``, ``/``, ``}`` of a transcript (``/`` only counts inside braces)."""
    out: list[str] = []
    depth = 0
    for token in _TOKEN.findall(text):
        depth = max(0, depth + (token == "{") - (token == "}"))  # a stray '}' is a word
        if depth > 0 and "/" in token and token != "/":
            out += [part for part in re.split(r"(/)", token) if part]
        else:
            out.append(token)
    return out


def build_net(
    text: str,
    optional: bool = False,
    fragments: bool = False,
    chars: CharMode | None = None,
    confidences: Sequence[float | None] | None = None,
    times: Sequence[tuple[float, float]] | None = None,
) -> WordNet:
    """The network of one transcript (already case-folded), decoding ``-D``/``-F``/``-c`` as sclite does.

    ``confidences`` and ``times`` ((begin, end) in seconds), when given, have one value per word of
    :func:`parse_tokens` (the marks ``{ / }`` left out): each word's arcs (its characters' under ``-c``) carry it."""
    if chars is None and not (_FRAGMENT_MARKS if fragments else _MARKS).search(text):
        # Plain words only (most transcripts): a chain, built without parsing.
        texts = text.split()
        confs = confidences if confidences is not None else [None] * len(texts)
        spans = times if times is not None else [(0.0, 0.0)] * len(texts)
        words = [Word(w, w, conf=c, start=t[0], end=t[1]) for w, c, t in zip(texts, confs, spans, strict=True)]
        n = len(words)
        return WordNet(words, list(range(n)), list(range(1, n + 1)), n, n + 1)
    tokens = parse_tokens(text)
    token_confs: list[float | None] = [None] * len(tokens)
    token_times: list[tuple[float, float]] = [(0.0, 0.0)] * len(tokens)
    positions = word_positions(tokens)
    if confidences is not None:
        for k, conf in zip(positions, confidences, strict=True):
            token_confs[k] = conf
    if times is not None:
        for k, span in zip(positions, times, strict=True):
            token_times[k] = span
    net = WordNet()
    seq, _ = _parse_seq(tokens, 0)
    net.stop = net.new_node() if seq else 0
    if seq:
        _emit(seq, 0, net.stop, net, _Reader(tokens, token_confs, token_times, optional, fragments, chars))
    return net


def word_positions(tokens: Sequence[str]) -> list[int]:
    """The indices of the words among :func:`parse_tokens` tokens (not the marks ``{``, and ``/``, ``}`` inside
    an alternation)."""
    out, depth = [], 0
    for k, token in enumerate(tokens):
        if token == "{":
            depth += 1
        elif depth and token in ("/", "}"):
            depth -= token == "}"
        else:
            out.append(k)
    return out


def word_of(
    token: str, optional: bool, fragments: bool, conf: float | None = None, span: tuple[float, float] = (0.0, 0.0)
) -> Word:
    """A word as sclite reads it: tags dropped, ``(w)`` optional under ``-D``, ``w-``/``-w`` fragments under ``-F``."""
    value = _TAG_SPLIT.split(token, maxsplit=1)[0].replace("\\;", ";")
    if value.endswith("*") and len(value) > 1:
        value = value[:-1]  # sclite drops a trailing '*' (a marked word)
    key, is_opt = value, False
    if optional and len(value) >= 2 and value[0] == "(" and value[-1] == ")":
        key, is_opt = value[1:-1], True
    frag = fragments and len(key) > 0 and (key[0] == "-" or key[-1] == "-")
    return Word(value, key, value == NULL_WORD, is_opt, frag, conf, *span)


def split_chars(word: str, mode: CharMode) -> list[str]:
    """A word's characters as ``sclite -c`` splits them (ASCII runs whole under NOASCII; no hyphens under DH)."""
    if mode.drop_hyphens:
        word = word.replace("-", "")
    if not mode.no_ascii:
        return list(word)
    out: list[str] = []
    for ch in word:
        if ch.isascii() and out and out[-1][-1:].isascii() and out[-1].isascii():
            out[-1] += ch
        else:
            out.append(ch)
    return out


_Seq = list  # items: int (a word: its index in the tokens) or list[_Seq] (an alternation)


@dataclass(frozen=True)
class _Reader:
    """What turns a parsed token into its arcs: the tokens, their confidences and times, the -D/-F/-c options."""

    tokens: list[str]
    confs: list[float | None]
    times: list[tuple[float, float]]
    optional: bool
    fragments: bool
    chars: CharMode | None


def _parse_seq(tokens: list[str], i: int, nested: bool = False) -> tuple[_Seq, int]:
    """Items from ``tokens[i]`` up to the end or, inside an alternation, its next ``/`` or ``}``; outside one,
    ``/`` and ``}`` are words (sclite reads ``a / b`` as three words)."""
    seq: _Seq = []
    while i < len(tokens):
        token = tokens[i]
        if nested and token in ("/", "}"):
            return seq, i
        if token == "{":
            alternatives = []
            i += 1
            while True:
                alt, i = _parse_seq(tokens, i, nested=True)
                alternatives.append(alt)
                if i >= len(tokens) or tokens[i] == "}":
                    i += 1
                    break
                i += 1  # past '/'
            seq.append(alternatives)
            continue
        seq.append(i)
        i += 1
    return seq, i


def _emit(seq: _Seq, src: int, dst: int, net: WordNet, reader: _Reader) -> None:
    """Add the arcs of ``seq`` from node ``src`` to node ``dst``."""
    for k, item in enumerate(seq):
        end = dst if k == len(seq) - 1 else net.new_node()
        if isinstance(item, list):
            for alt in item:
                if alt:
                    _emit(alt, src, end, net, reader)
                else:
                    net.add(Word(NULL_WORD, NULL_WORD, null=True), src, end)
        else:
            word = word_of(
                reader.tokens[item], reader.optional, reader.fragments, reader.confs[item], reader.times[item]
            )
            _add_word(word, src, end, net, reader.chars)
        src = end


def _add_word(word: Word, src: int, dst: int, net: WordNet, chars: CharMode | None) -> None:
    """One word's arc, or under ``-c`` a chain of its characters' arcs (each optional if the word is; the word's
    time shared out equally among them, as sclite does)."""
    parts = split_chars(word.key, chars) if chars is not None and len(word.text) > 1 and not word.null else None
    if not parts or parts == [word.text]:
        net.add(word, src, dst)
        return
    step, begin = (word.end - word.start) / len(parts), word.start
    for k, part in enumerate(parts):
        end = dst if k == len(parts) - 1 else net.new_node()
        text = f"({part})" if word.optional else part
        frag = word.fragment and len(parts) == 1
        net.add(Word(text, part, part == NULL_WORD, word.optional, frag, word.conf, begin, begin + step), src, end)
        src, begin = end, begin + step
