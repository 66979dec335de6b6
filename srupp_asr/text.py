"""Transcript normalisation: the one function shared by tokenizer training, targets, decoding and scoring.

``normalize_text`` maps a raw transcript to the form the model learns and is scored on:

1. Unicode NFKC, so compatibility forms fold together (full-width ``Ａ`` -> ``A``, ligature ``ﬁ`` -> ``fi``,
   superscript ``²`` -> ``2``).
2. Case folding with ``str.casefold`` (not ``str.lower``): the text is compared, never displayed, and casefold is
   Python's caseless-matching operation. It also folds what ``lower`` leaves apart (German ``ß`` -> ``ss``,
   final sigma ``ς`` -> ``σ``), so a hypothesis is not counted wrong for an orthographic variant of the same word.
   NFKC runs again afterwards because casefolding can produce unnormalised sequences.
3. Characters kept: letters of any script (Unicode categories L*, so Mandarin characters, kana and Cyrillic
   survive), combining marks attached to a word (M*, without which Devanagari or Thai words fall apart) and
   digits / numerals (N*).
   Apostrophes are kept inside words only (between two kept characters: ``don't``, ``o'clock``); typographic
   apostrophes (``’ ‘ ʼ`` and stray backticks or acute accents) count as ``'``. A leading or trailing apostrophe
   (``'tis``, ``students'``) is dropped.
4. Everything else (punctuation, symbols, control characters, any whitespace) becomes a space; so ``well-known``
   becomes ``well known``, ``3.5`` becomes ``3 5`` and CJK punctuation (``，。``) separates words.
5. Runs of spaces collapse to one; leading and trailing spaces go.

The function is idempotent: ``normalize_text(normalize_text(s)) == normalize_text(s)``.
"""

from __future__ import annotations

import unicodedata

_APOSTROPHES = str.maketrans({"’": "'", "‘": "'", "ʼ": "'", "`": "'", "´": "'"})


def _is_word_char(char: str) -> bool:
    return unicodedata.category(char)[0] in "LMN"


def normalize_text(text: str) -> str:
    """Normalise a transcript (NFKC, casefold, letters/marks/digits and in-word apostrophes kept, rest spaced)."""
    # Apostrophe look-alikes first: NFKC would split the acute accent into a space and a combining mark. And again
    # after each NFKC, which makes some (U+0149 to U+02BC + n, a full-width backtick to a backtick): else a second
    # pass would map those, and a target normalised twice would differ from a reference normalised once.
    text = unicodedata.normalize("NFKC", text.translate(_APOSTROPHES)).translate(_APOSTROPHES)
    text = unicodedata.normalize("NFKC", text.casefold()).translate(_APOSTROPHES)
    out: list[str] = []
    last = len(text) - 1
    for i, char in enumerate(text):
        category = unicodedata.category(char)[0]
        if category in "LN":
            out.append(char)
        elif category == "M" and out and out[-1] != " ":
            out.append(char)  # a mark only counts attached to a word (NFKC turns ``¨`` into space + mark)
        elif char == "'" and out and out[-1] != " " and i < last and _is_word_char(text[i + 1]):
            out.append(char)  # after a kept character (not a mark that was dropped: "¨'0" is "0"), before a word one
        else:
            out.append(" ")
    return " ".join("".join(out).split())
