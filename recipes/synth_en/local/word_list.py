#!/usr/bin/env python3
"""Make the word list an LM directory carries for the search (``words.txt.gz``, see srupp_asr.decoding.lexicon):

    python recipes/synth_en/local/word_list.py OUT [SOURCE ...] [--tokenizer TOKENIZER] [--text FILE ...]

Each SOURCE is a word list, one word a line (the built-in model's: Debian's wamerican-huge, SCOWL, fetched by
fetch_word_list.sh). Each ``--text`` file adds the words of its sentences (training transcripts, one a line). Every
entry is normalised as transcripts are (srupp_asr.text.normalize_text: lower case, punctuation but in-word
apostrophes dropped); what becomes one word whose characters the tokenizer can all spell is kept (digits are not:
training text spells numbers out, so give --text files in that spoken form). OUT is written gzip-compressed
when it ends in .gz. Exit status: 0 written, 2 bad usage or a file that cannot be read (one line says which).
"""

from __future__ import annotations

import argparse
import gzip
import sys
from collections.abc import Iterable
from pathlib import Path

from srupp_asr.errors import UserError
from srupp_asr.fileio import atomic_output, read_lines
from srupp_asr.text import normalize_text
from srupp_asr.tokenizer import WORD_START, Tokenizer


def spellable(tokenizer: Tokenizer) -> set[str]:
    """The characters the tokenizer's pieces are made of (the word-start mark and the special pieces left out)."""
    pieces = tokenizer.pieces()[Tokenizer.sos_eos_id + 1 :]
    return {ch for piece in pieces for ch in piece.removeprefix(WORD_START)}


def words_of(lines: Iterable[str], alphabet: set[str], whole_sentences: bool) -> set[str]:
    """The normalised words of ``lines``: every word of each line (``whole_sentences``), else each line that is
    one word once normalised; only words spelt with ``alphabet``."""
    words = set()
    for line in lines:
        found = normalize_text(line).split()
        if not whole_sentences and len(found) != 1:
            continue
        words.update(w for w in found if set(w) <= alphabet)
    return words


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="the word list to write (.gz: compressed)")
    p.add_argument("sources", nargs="*", type=Path, help="word lists, one word a line")
    p.add_argument("--text", nargs="+", type=Path, default=[], help="sentences, one a line: their words are added")
    default_tokenizer = Path(__file__).resolve().parents[3] / "srupp_asr" / "default_model" / "tokenizer.model"
    p.add_argument("--tokenizer", type=Path, default=default_tokenizer, help="(default: the built-in model's)")
    args = p.parse_args(argv)
    if not args.sources and not args.text:
        p.error("give a word list or --text")
    try:
        alphabet = spellable(Tokenizer(args.tokenizer))
        words: set[str] = set()
        for path in args.sources:
            words |= words_of(read_lines(path, "word list", 64 * 2**20), alphabet, whole_sentences=False)
        for path in args.text:
            words |= words_of(read_lines(path, "text", 256 * 2**20), alphabet, whole_sentences=True)
    except (UserError, OSError) as err:
        print(f"word_list.py: {err}", file=sys.stderr)
        return 2
    data = "".join(f"{w}\n" for w in sorted(words)).encode()
    with atomic_output(args.out) as tmp:
        tmp.write_bytes(gzip.compress(data, 9, mtime=0) if args.out.suffix == ".gz" else data)
    print(f"{args.out}: {len(words):,} words")
    return 0


if __name__ == "__main__":
    sys.exit(main())
