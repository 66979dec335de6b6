"""Subword tokenizer: a thin wrapper over a sentencepiece model with the ids the model heads rely on.

Id conventions (fixed; checked when a model is loaded):

- ``0`` = ``<blank>``: the CTC blank (sentencepiece's pad piece, never produced by encoding);
- ``1`` = ``<unk>``: characters the model has not seen;
- ``2`` = ``<sos/eos>``: start and end of the attention decoder's sequences (a user-defined symbol that
  normalised text can never contain, since ``<``, ``/`` and ``>`` become spaces).

sentencepiece's own bos/eos are disabled and its normalisation is the identity: every text goes through
:func:`srupp_asr.text.normalize_text` first, so training, targets, decoding and scoring see the same text.

``model_type="char"`` with a ``vocab_size`` larger than the text's character inventory gives a vocabulary of
exactly that inventory (plus the special pieces), which is what sentencepiece does for char models; a smaller
``vocab_size`` keeps the most frequent characters and maps the rest to ``<unk>``. For ``unigram`` and ``bpe`` a
``vocab_size`` the text cannot fill is an error naming the largest size that works.
"""

from __future__ import annotations

import argparse
import io
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import sentencepiece as spm

from srupp_asr.errors import UserError
from srupp_asr.fileio import MAX_TOKENIZER_BYTES, atomic_output, check_regular_file, read_bytes
from srupp_asr.text import normalize_text

BLANK = "<blank>"
UNK = "<unk>"
SOS_EOS = "<sos/eos>"
MODEL_TYPES = ("unigram", "bpe", "char")
WORD_START = "▁"  # sentencepiece's mark at the start of a piece that begins a word
# A fixed thread count: sentencepiece's result may depend on how the work is split, so it must not follow
# the machine's core count if the same text is to give the same model everywhere.
_TRAIN_THREADS = 8


class Tokenizer:
    """A sentencepiece model with ``<blank>``=0, ``<unk>``=1, ``<sos/eos>``=2; texts are normalised first."""

    blank_id = 0
    unk_id = 1
    sos_eos_id = 2

    def __init__(self, path: str | os.PathLike) -> None:
        """Load a tokenizer model written by :meth:`Tokenizer.train`."""
        self.path = Path(path)
        self._init_from_proto(read_bytes(self.path, "tokenizer model", MAX_TOKENIZER_BYTES))

    @classmethod
    def load(cls, path: str | os.PathLike) -> Tokenizer:
        """Load a tokenizer model written by :meth:`Tokenizer.train`."""
        return cls(path)

    def _init_from_proto(self, proto: bytes) -> None:
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(proto)
        except RuntimeError:
            raise UserError(f"{self.path}: not a sentencepiece model") from None
        self.vocab_size: int = self._sp.get_piece_size()
        expected = {self.blank_id: BLANK, self.unk_id: UNK, self.sos_eos_id: SOS_EOS}
        for i, piece in expected.items():
            found = self._sp.id_to_piece(i) if i < self.vocab_size else None
            if found != piece:
                raise UserError(f"{self.path}: id {i} is {found!r}, expected {piece!r} (not a srupp-asr tokenizer)")

    def __getstate__(self) -> dict:
        # The sentencepiece processor itself does not pickle; DataLoader workers need a copy of the tokenizer.
        return {"path": str(self.path), "proto": self._sp.serialized_model_proto()}

    def __setstate__(self, state: dict) -> None:
        self.path = Path(state["path"])
        self._init_from_proto(state["proto"])

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        out_path: str | os.PathLike,
        vocab_size: int,
        model_type: str = "unigram",
        character_coverage: float = 1.0,
    ) -> Tokenizer:
        """Train on normalised ``texts``, write the model to ``out_path`` atomically, and return it loaded."""

        if model_type not in MODEL_TYPES:
            raise UserError(f"{out_path}: unknown model type {model_type!r} (choose from {', '.join(MODEL_TYPES)})")
        if vocab_size < 4:
            raise UserError(f"{out_path}: vocabulary size {vocab_size} is too small (at least 4)")
        sentences = _nonempty_normalised(texts)
        try:
            first = next(sentences)
        except StopIteration:
            raise UserError(f"{out_path}: no training text (every text was empty after normalisation)") from None
        model = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=_chain(first, sentences),
                model_writer=model,
                vocab_size=vocab_size,
                model_type=model_type,
                character_coverage=character_coverage,
                pad_id=cls.blank_id,
                pad_piece=BLANK,
                unk_id=cls.unk_id,
                unk_piece=UNK,
                bos_id=-1,
                eos_id=-1,
                user_defined_symbols=[SOS_EOS],
                normalization_rule_name="identity",
                input_sentence_size=0,
                max_sentence_length=1 << 16,
                num_threads=_TRAIN_THREADS,
                minloglevel=2,
            )
        except RuntimeError as err:
            raise UserError(f"{out_path}: {_explain_training_error(str(err), vocab_size, model_type)}") from None
        out_path = Path(out_path)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_output(out_path) as tmp:
            tmp.write_bytes(model.getvalue())
        return cls(out_path)

    def encode(self, text: str) -> list[int]:
        """Token ids of the normalised ``text``; never contains the blank or ``<sos/eos>`` id."""
        ids = self._sp.encode(normalize_text(text))
        return [i for i in ids if i != self.blank_id and i != self.sos_eos_id]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, dropping blanks, ``<sos/eos>`` and negative (padding) ids."""
        return self._sp.decode([int(i) for i in ids if i > self.sos_eos_id or i == self.unk_id])

    def id_to_piece(self, token_id: int) -> str:
        """The sentencepiece piece of ``token_id`` (``▁`` marks a word start)."""
        return self._sp.id_to_piece(int(token_id))

    def pieces(self) -> list[str]:
        """Every piece, in id order: where two tokenizers have the same pieces, an id means the same text in both."""
        return [self._sp.id_to_piece(i) for i in range(self.vocab_size)]

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"Tokenizer({str(self.path)!r}, vocab_size={self.vocab_size})"


def _nonempty_normalised(texts: Iterable[str]) -> Iterator[str]:
    for text in texts:
        text = normalize_text(text)
        if text:
            yield text


def _chain(first: str, rest: Iterator[str]) -> Iterator[str]:
    yield first
    yield from rest


def _explain_training_error(message: str, vocab_size: int, model_type: str) -> str:
    """Turn sentencepiece's internal error text into a one-line explanation."""
    if m := re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", message):
        return f"vocabulary size {vocab_size} is too large for this text with model type {model_type}; use <= {m[2]}"
    if m := re.search(r"smaller than required_chars\. (\d+) vs (\d+)", message):
        return (
            f"vocabulary size {vocab_size} is smaller than the text's characters plus special pieces ({m[2]});"
            " raise --vocab-size or use --model-type char"
        )
    return "sentencepiece training failed: " + message.splitlines()[-1].strip()


def texts_from_sources(cuts: Sequence[str], text_files: Sequence[str]) -> Iterator[str]:
    """The supervision texts of cut manifests, then the lines of text files (not normalised); unreadable files are
    one-line UserErrors."""
    from srupp_asr.manifest import load_cuts

    for path in cuts:
        for cut in load_cuts(path, lazy=True, allow_command_sources=True):  # texts only: no audio is read
            for sup in cut.supervisions:
                if sup.text:
                    yield sup.text
    for path in text_files:
        if os.path.lexists(path):  # a named pipe would be waited on for ever (a missing file: open's error below)
            check_regular_file(path, "text file")
        try:
            with open(path, encoding="utf-8") as f:
                yield from f
        except OSError as err:
            raise UserError(f"{path}: cannot read text file ({err.strerror or err})") from None
        except UnicodeDecodeError as err:
            raise UserError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None


def tokenizer_command(args: argparse.Namespace) -> int:
    """``srupp-asr tokenizer``: train a tokenizer on the transcripts of cut manifests and/or text files."""
    if not args.cuts and not args.text:
        raise UserError("tokenizer: give training text with --cuts and/or --text")
    texts = texts_from_sources(args.cuts or [], args.text or [])
    tok = Tokenizer.train(texts, args.out, vocab_size=args.vocab_size, model_type=args.model_type)
    print(f"wrote {tok.path} ({args.model_type}, {tok.vocab_size} pieces)")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the ``tokenizer`` sub-command."""
    p = subparsers.add_parser("tokenizer", help="train a sentencepiece tokenizer on transcripts")
    p.add_argument("--cuts", nargs="+", metavar="CUTS", help="lhotse cut manifests (.jsonl.gz) whose texts to use")
    p.add_argument("--text", nargs="+", metavar="TXT", help="plain text files, one transcript per line")
    p.add_argument("--out", required=True, metavar="MODEL", help="where to write the model (e.g. DIR/tokenizer.model)")
    p.add_argument("--vocab-size", type=int, default=500, help="number of pieces, specials included (default 500)")
    p.add_argument("--model-type", choices=MODEL_TYPES, default="unigram", help="sentencepiece model type")
    p.set_defaults(func=tokenizer_command)
    return p
