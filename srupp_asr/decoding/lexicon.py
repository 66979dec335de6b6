"""A word list as a scorer of the beam search: every word a hypothesis spells that is not in the list costs it a
penalty, charged at the token where the word stops being the beginning of any listed word (or, for a beginning
that is no word of its own, where the word ends).

A model whose tokens are small word pieces (the built-in model has 256) can spell words that do not exist
("undertention" for "under tension", "meltrated" for "maltreated"); a language model over the same pieces makes
them unlikely, not impossible. Checking the words during the search, not afterwards, keeps the hypotheses that
spell real words in the beam (an n-best list re-ranked by a word list gains little: its alternatives to a
non-word are mostly other non-words). This is the lexicon of a classic decoder made soft: a word outside the list
costs ``lexicon_weight`` instead of being impossible, so that a name no list holds can still be written when the
audio is clear enough.

Pure numpy (no torch): the numpy runtime and the torch search share :class:`LexiconScorer`. A hypothesis' state is
the number of the word beginning it has spelt since its last word start; a table, filled as new beginnings appear,
maps (state, token) to the next state and the penalty, so that a search step is two array lookups.
"""

from __future__ import annotations

import bisect
import gzip
import heapq
import io
import os
import threading
import zlib
from collections.abc import Iterable, Iterator, Sequence
from itertools import compress
from pathlib import Path

import numpy as np

from srupp_asr.decoding.settings import DEFAULT_LEXICON_WEIGHT
from srupp_asr.errors import UserError
from srupp_asr.fileio import decode_text, read_bytes
from srupp_asr.model_files import read_lexicon_weight
from srupp_asr.tokenizer import WORD_START, Tokenizer

# The largest word list read (bytes, after decompression): the Debian SCOWL "insane" list is 7 MB; a file past
# this is not a word list (a model directory is not trusted to be small).
MAX_LEXICON_BYTES = 64 * 1024 * 1024
# The word list an LM directory may carry, plain or gzip-compressed (the built-in model's is compressed).
LEXICON_FILES = ("words.txt", "words.txt.gz")
# The most states a table makes before the next search starts a fresh one: about 100 bytes each, plus 2 KB for each
# filled row (a few in a hundred of them)
MAX_TABLE_STATES = 300_000
# Words of at most this many UTF-8 bytes are kept in one fixed-width array (all but 8 of the built-in model's 338,109
# words); longer ones apart
SHORT_BYTES = 24
SPLIT_ROWS = 32_768  # words copied into the array at once while a list is read
# every white space character (str.isspace: all are below U+3001) to a newline, which then separates the words
_NEWLINES = {c: "\n" for c in range(0x3001) if chr(c).isspace()}
EMPTY = 0  # no piece of the current word yet (at the start, or after a word-start piece that is the mark alone)
DEAD = 1  # the current word is no beginning of a listed word: charged already, nothing more until it ends


class Lexicon:
    """A set of words (lower case, as the tokenizer writes them) that answers "is ``p`` a word" and "is ``p`` the
    beginning of some word", for many ``p`` at once (:meth:`prefixes`: one ``numpy.searchsorted``).

    The words are one sorted array of UTF-8 byte strings of :data:`SHORT_BYTES` at most (the built-in model's
    338,000 words in 8 MB, where a list of ``str`` took 22 MB), and the few longer ones a sorted list beside it."""

    def __init__(self, words: Iterable[str]) -> None:
        """The words of ``words`` (white space inside one separates it into two), each once; a word holding a NUL
        is left out."""
        short, long = _split("\n".join(words))
        self._short = np.unique(short)
        self._long = sorted(set(long))

    def __len__(self) -> int:
        return self._short.size + len(self._long)

    def __iter__(self) -> Iterator[str]:
        """The words in sorted order."""
        return heapq.merge((w.decode() for w in self._short.tolist()), self._long)

    def __contains__(self, word: object) -> bool:
        if not isinstance(word, str):
            return False
        data = word.encode()
        if b"\0" in data:  # (no word holds one)
            return False
        if len(data) > SHORT_BYTES:
            i = bisect.bisect_left(self._long, word)
            return i < len(self._long) and self._long[i] == word
        i = int(np.searchsorted(self._short, data))
        return i < self._short.size and self._short[i] == data

    def prefixes(self, prefixes: Sequence[str]) -> np.ndarray:
        """Whether some word starts with each of ``prefixes`` ``(n,)`` bool (the empty prefix: any word)."""
        queries = np.array([p.encode() for p in prefixes], dtype=bytes)
        at = np.searchsorted(self._short, queries).clip(max=max(self._short.size - 1, 0))
        found = np.char.startswith(self._short[at], queries) if self._short.size else np.zeros(len(queries), bool)
        found &= np.array(["\0" not in p for p in prefixes], dtype=bool)  # (no word holds one; it reads as padding)
        for i, prefix in enumerate(prefixes):  # the long words: a handful
            if not found[i] and self._long:
                j = bisect.bisect_left(self._long, prefix)
                found[i] = j < len(self._long) and self._long[j].startswith(prefix)
        return found

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> Lexicon:
        """The words of a UTF-8 text file (``.gz``: gzip-compressed), one a line (any white space separates
        them), lower-cased. A file past :data:`MAX_LEXICON_BYTES` (compressed or not), one that is no regular file
        or no UTF-8 text, or one with no word is a :class:`UserError` naming the file."""
        path = Path(path)
        data = read_bytes(path, "word list", MAX_LEXICON_BYTES)
        if path.suffix == ".gz":
            try:
                with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
                    data = f.read(MAX_LEXICON_BYTES + 1)
            except (OSError, EOFError, zlib.error) as err:
                raise UserError(f"{path}: the word list is not gzip data ({err})") from None
            if len(data) > MAX_LEXICON_BYTES:
                raise UserError(f"{path}: the word list holds more than {MAX_LEXICON_BYTES // 2**20} MiB of text")
        text = decode_text(data, path, "word list").lower()
        del data
        lexicon = cls([text])  # (one string: no str object per word, which would stay as the allocator's garbage)
        if not len(lexicon):
            raise UserError(f"{path}: the word list is empty")
        return lexicon


def _split(text: str) -> tuple[np.ndarray, list[str]]:
    """The words of ``text`` (split at any white space, empty ones and those holding a NUL left out): those of at
    most :data:`SHORT_BYTES` UTF-8 bytes as one array (unsorted, repeats kept), the longer ones as ``str``. Made in
    numpy from the text's bytes, so that a list of 338,000 words costs no Python object per word."""
    data = np.frombuffer(text.translate(_NEWLINES).encode() + b"\n", np.uint8)
    ends = np.flatnonzero(data == ord("\n"))
    starts = np.concatenate([[0], ends[:-1] + 1])
    lengths = ends - starts
    valid = lengths > 0
    valid[np.searchsorted(ends, np.flatnonzero(data == 0))] = False  # (a NUL would read as the array's padding)
    short = valid & (lengths <= SHORT_BYTES)
    long = [data[a:b].tobytes().decode() for a, b in zip(starts[valid & ~short], ends[valid & ~short], strict=True)]
    starts, lengths = starts[short], lengths[short]
    columns = np.arange(SHORT_BYTES)
    out = np.zeros((starts.size, SHORT_BYTES), np.uint8)
    for i in range(0, starts.size, SPLIT_ROWS):  # (the index of a block of words: SPLIT_ROWS x SHORT_BYTES int64)
        rows = slice(i, i + SPLIT_ROWS)
        block = data[np.minimum(starts[rows, None] + columns, data.size - 1)]
        block[columns >= lengths[rows, None]] = 0
        out[rows] = block
    return out.view(f"S{SHORT_BYTES}").reshape(-1), long


class LexiconTable:
    """The lexicon's state machine over a tokenizer's pieces, a state being the word begun so far (:data:`EMPTY`,
    :data:`DEAD` or a listed word's beginning): for state ``s`` and token ``t`` the next state and the penalty (0 or
    1). A state's row of both is filled the first time the state is scored (the rows are dense: most states made
    are never reached). One table serves the searches that ``transcribe`` runs in threads at once: filling and
    reading hold a lock."""

    def __init__(self, lexicon: Lexicon, pieces: Sequence[str], special: Sequence[int], end: int) -> None:
        """``pieces`` the tokenizer's pieces by id; ``special`` the ids that spell nothing (blank, unknown),
        charged as a word outside the list; ``end`` the id that ends the hypothesis."""
        self.lexicon = lexicon
        self.vocab = len(pieces)
        self._text = [p[1:] if p.startswith(WORD_START) else p for p in pieces]
        self._end = end
        self._partial = ["", ""]  # the word begun so far, by state (EMPTY, DEAD: "" and unused)
        self._ids = {"": EMPTY}
        self._row = np.full(1024, -1, dtype=np.int32)  # each state's row, -1: not filled
        self._next = np.zeros((64, self.vocab), dtype=np.int32)
        self._penalty = np.zeros((64, self.vocab), dtype=np.float32)
        self.filled = 0  # rows filled
        self._lock = threading.Lock()
        # The tokens by kind (the end first, then the special ones, then word starts; the rest continue a word)
        kind = np.array([p.startswith(WORD_START) for p in pieces], dtype=bool)
        self._special = np.isin(np.arange(self.vocab), list(special)) & (np.arange(self.vocab) != end)
        self._starts = kind & ~self._special & (np.arange(self.vocab) != end)
        self._continues = np.flatnonzero(~kind & ~self._special & (np.arange(self.vocab) != end))
        # What a word start leads to, whatever came before: the state of its text where that begins a listed word
        begins = lexicon.prefixes(self._text) & self._starts
        self._start_next = np.full(self.vocab, DEAD, dtype=np.int32)
        for token in np.flatnonzero(begins).tolist():
            self._start_next[token] = self._state(self._text[token])
        self._start_charge = (self._starts & ~begins).astype(np.float32)

    @property
    def states(self) -> int:
        """How many states have been made (every listed beginning some filled row leads to)."""
        return len(self._partial)

    def _state(self, partial: str) -> int:
        """The state of having spelt ``partial`` (a listed word's beginning), made if new."""
        state = self._ids.get(partial)
        if state is None:
            state = self._ids[partial] = len(self._partial)
            self._partial.append(partial)
            if state == self._row.size:  # room for the rows of the states made
                self._row = np.concatenate([self._row, np.full(self._row.size, -1, dtype=np.int32)])
        return state

    def _fill(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        """The next states and penalties of ``state`` for every token."""
        partial = self._partial[state]
        ended = np.float32(state not in (EMPTY, DEAD) and partial not in self.lexicon)  # a beginning, no word
        nxt = self._start_next.copy()  # (DEAD for every token but the word starts of listed beginnings)
        pen = self._start_charge + ended * self._starts
        pen[self._special] = state != DEAD
        nxt[self._end], pen[self._end] = EMPTY, ended
        if state != DEAD:  # the tokens that continue the word: into a listed beginning, or out of the list
            words = [partial + self._text[token] for token in self._continues.tolist()]
            listed = self.lexicon.prefixes(words)
            pen[self._continues] = ~listed
            for token, word in zip(self._continues[listed].tolist(), compress(words, listed), strict=True):
                nxt[token] = self._state(word)
        return nxt, pen

    def penalties(self, states: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """The penalties ``(N, K)`` of tokens ``(N, K)`` after states ``(N,)``."""
        with self._lock:
            rows = self._rows(states)
            return self._penalty[rows[:, None], tokens]

    def successors(self, states: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """The states after states ``(N,)`` read one token each, ``tokens`` ``(N,)``."""
        with self._lock:
            return self._next[self._rows(states), tokens]

    def _rows(self, states: np.ndarray) -> np.ndarray:
        """The rows of ``states``, filled first where they are not yet."""
        for state in np.unique(states[self._row[states] < 0]).tolist():
            if self.filled == len(self._next):
                self._next = np.concatenate([self._next, np.zeros_like(self._next)])
                self._penalty = np.concatenate([self._penalty, np.zeros_like(self._penalty)])
            self._next[self.filled], self._penalty[self.filled] = self._fill(state)
            self._row[state] = self.filled
            self.filled += 1
        return self._row[states]


class WordList:
    """An LM's word list as the searches use it: the words and the tokenizer's pieces, and the current
    :class:`LexiconTable`. A table grows with the word beginnings the searches reach; past
    :data:`MAX_TABLE_STATES` states the next search starts a fresh one (the searches running keep theirs), so that
    a process decoding for days holds a bounded table."""

    def __init__(self, lexicon: Lexicon, pieces: Sequence[str], special: Sequence[int], end: int) -> None:
        self.lexicon, self._args = lexicon, (list(pieces), list(special), end)
        self._table: LexiconTable | None = None
        self._lock = threading.Lock()

    def table(self) -> LexiconTable:
        """The table a new search uses."""
        with self._lock:
            if self._table is None or self._table.states > MAX_TABLE_STATES:
                self._table = LexiconTable(self.lexicon, *self._args)
            return self._table


class LexiconScorer:
    """The lexicon as a partial scorer (the candidates only) of the numpy beam search
    (:class:`srupp_asr.runtime.search.Scorer`; the torch search wraps it): ``-1`` for each word a token takes out
    of the list (see the module docstring), 0 otherwise; the search multiplies it by the lexicon weight. The state
    is one int32 per hypothesis."""

    full = False

    def __init__(self, table: LexiconTable) -> None:
        self.table = table

    def init_state(self, utterances: np.ndarray) -> np.ndarray:
        """The state of bare hypotheses, one per entry of ``utterances``: no word begun."""
        return np.full(len(utterances), EMPTY, dtype=np.int32)

    def score(self, state: np.ndarray, ys: object, candidates: np.ndarray) -> tuple[np.ndarray, None]:
        """``(N, K)`` float32 scores of the ``candidates`` ``(N, K)`` after hypotheses in ``state`` ``(N,)``."""
        return -self.table.penalties(state, candidates), None

    def select(self, state: np.ndarray, rows: np.ndarray, tokens: np.ndarray | None, pending: None) -> np.ndarray:
        """The state of hypotheses ``rows`` extended by ``tokens`` (or as they are: ``tokens`` None)."""
        if tokens is None:
            return state[rows]
        return self.table.successors(state[rows], tokens)


def lexicon_path(lm_dir: str | os.PathLike[str]) -> Path | None:
    """The word list an LM directory carries (:data:`LEXICON_FILES`, the first there), or None."""
    for name in LEXICON_FILES:
        path = Path(lm_dir) / name
        if os.path.lexists(path):
            return path
    return None


def word_list_weight(lm_dir: str | os.PathLike[str]) -> float | None:
    """The weight of the word list ``lm_dir`` carries: the one its config.yaml records, else
    :data:`~srupp_asr.decoding.settings.DEFAULT_LEXICON_WEIGHT`; None when it carries no list."""
    if lexicon_path(lm_dir) is None:
        return None
    recorded = read_lexicon_weight(lm_dir)
    return DEFAULT_LEXICON_WEIGHT if recorded is None else recorded


def read_word_list(lm_dir: str | os.PathLike[str], tokenizer: Tokenizer) -> WordList | None:
    """``lm_dir``'s word list over ``tokenizer``'s pieces, or None when it carries none."""
    path = lexicon_path(lm_dir)
    if path is None:
        return None
    special = [Tokenizer.blank_id, Tokenizer.unk_id]
    return WordList(Lexicon.read(path), tokenizer.pieces(), special, Tokenizer.sos_eos_id)
