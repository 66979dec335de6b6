"""Errors a user can cause (bad files, bad configs): the CLI prints them as one line, no traceback."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn


class UserError(Exception):
    """A problem with the user's input; its message names the file or option and what is wrong."""


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (its type name when the message is empty)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


# What the C and C++ layers say when memory runs out: the dynamic loader mapping libtorch under a small `ulimit -v`,
# PyTorch's CPU allocator, CUDA, mmap and malloc (ENOMEM).
_OUT_OF_MEMORY_MARKS = ("failed to map segment", "can't allocate memory", "cannot allocate memory", "out of memory")


def is_out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` says memory ran out: a MemoryError, torch's OutOfMemoryError, or an error whose message is
    the C library's or PyTorch's for it (a RuntimeError from the CPU allocator, an ImportError when libtorch cannot
    be mapped, safetensors failing to map a weights file)."""
    if isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError":
        return True
    text = str(err).lower()
    return not isinstance(err, UserError) and any(mark in text for mark in _OUT_OF_MEMORY_MARKS)


def out_of_memory_line(err: BaseException, doing: str, remedy: str) -> str:
    """One line for running out of memory while ``doing`` something, with what to try (``remedy``)."""
    detail = first_line(err) if str(err).strip() else type(err).__name__
    return f"out of memory while {doing} ({detail}); {remedy}"


DECODING_MEMORY_REMEDY = "try a smaller --batch-size, --beam or --max-chunk-seconds"
PROCESS_MEMORY_REMEDY = "free memory or raise the process's limit (ulimit -v)"


def run_script(main: Callable[[], int], name: str) -> NoReturn:
    """Exit with a script's ``main()``: a UserError is one line, ``NAME: error: ...`` on stderr, and exit status 2."""
    try:
        code = main()
    except UserError as err:
        print(f"{name}: error: {err}", file=sys.stderr)
        code = 2
    sys.exit(code)
