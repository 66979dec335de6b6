"""What ``transcribe`` is given: the audio files named by its inputs (files, directories searched recursively,
``@LIST`` files) and, when no model is named, the built-in model's directory. Light to import (no torch), so
``srupp-asr transcribe --help`` can name the built-in model and start fast."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from srupp_asr.errors import UserError
from srupp_asr.fileio import MAX_LIST_BYTES, read_lines

DEFAULT_MODEL_ENV = "SRUPP_ASR_DEFAULT_MODEL"


def default_model_candidates() -> list[Path]:
    """Where the built-in default model is looked for, in order: ``$SRUPP_ASR_DEFAULT_MODEL``, the model shipped in
    the package (``srupp_asr/default_model``, trained on a GPU by ``recipes/synth_en/local/device_run.sh``),
    the offline recipe's ``exp/synth_en/model`` beside the package, ``~/.cache/srupp-asr/default_model``."""
    env = os.environ.get(DEFAULT_MODEL_ENV)
    if env:
        return [Path(env)]  # an explicit choice: no falling back to another model
    package_dir = Path(__file__).resolve().parent
    return [
        package_dir / "default_model",
        package_dir.parent / "exp" / "synth_en" / "model",
        Path.home() / ".cache" / "srupp-asr" / "default_model",
    ]


def default_model_dir() -> Path:
    """The built-in default model directory; a UserError saying how to build one when there is none (never a
    download)."""
    candidates = default_model_candidates()
    for path in candidates:
        if (path / "config.yaml").is_file():
            return path
    where = ", ".join(str(p) for p in candidates)
    raise UserError(
        f"no model given (--model DIR) and no default model found (looked in {where}); build one offline with "
        "`make demo` or `recipes/synth_en/run.sh`, or set $" + DEFAULT_MODEL_ENV
    )


class FoundInputs(NamedTuple):
    """What :func:`find_inputs` found: the audio files, and one-line problems for inputs that name none. Given to
    :func:`srupp_asr.transcribe` as its inputs, it is used as it is (the command line looks once, to choose how to
    print, and transcribes what it saw)."""

    files: list[str]
    problems: list[str]


def find_inputs(inputs: Sequence[str | os.PathLike[str]]) -> FoundInputs:
    """The audio files named by ``inputs``, in a fixed order, and one-line problems for inputs that name none
    (a directory without audio, a ``@LIST`` that cannot be read: the other inputs still count).

    An input is a file (taken as it is, whatever its name), a directory (searched recursively for audio file
    names, sorted, hidden entries skipped) or ``@LIST``, a text file of inputs, one per line (blank lines and
    ``#`` comments skipped; relative paths are relative to the current directory, as on the command line).
    A file named twice, or reached twice through symbolic links, is transcribed once; links to directories met
    inside a directory are not followed, so a link loop ends the search.
    """
    from srupp_asr.audio import AUDIO_EXTENSIONS

    files: list[str] = []
    problems: list[str] = []
    seen: set[str] = set()

    def add(path: str) -> None:
        key = os.path.realpath(path)
        if key not in seen:
            seen.add(key)
            files.append(path)

    for entry in _expand_lists(inputs, problems):
        if os.path.isdir(entry):
            found = [path for path in _walk_sorted(entry) if path.lower().endswith(AUDIO_EXTENSIONS)]
            if not found:
                problems.append(f"{entry}: no audio files ({', '.join(AUDIO_EXTENSIONS)}) in this directory")
            for path in found:
                add(path)
        else:
            add(entry)  # a missing or unreadable file is reported when it is opened
    return FoundInputs(files, problems)


def _expand_lists(inputs: Sequence[str | os.PathLike[str]], problems: list[str]) -> Iterator[str]:
    """``inputs`` with each ``@LIST`` replaced by its entries; a list that cannot be read adds its one-line problem
    to ``problems`` and nothing else."""
    for item in inputs:
        entry = os.fspath(item)
        if entry.startswith("@") and len(entry) > 1:
            try:
                # A byte-order mark (Notepad) is not in a file name; /dev/zero must end in a bound, not a MemoryError.
                lines = read_lines(entry[1:], "list file", max_bytes=MAX_LIST_BYTES)
            except UserError as err:
                problems.append(str(err))
                continue
            for line in lines:
                line = line.strip()
                if line and not line.startswith("#"):
                    yield line
        else:
            yield entry


def _walk_sorted(folder: str) -> list[str]:
    """Files under ``folder`` (hidden entries skipped), sorted by their path components below it."""
    found = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [os.path.join(root, name) for name in names if not name.startswith(".")]
    return sorted(found, key=lambda path: Path(os.path.relpath(path, folder)).parts)
