"""SIGTERM (``kill``, a batch scheduler's stop, ``timeout``) as an exception, so a command stops cleanly.

Python's default for SIGTERM ends the process at once: no ``finally`` block runs, so temporary files stay behind
and a training run saves nothing. :func:`sigterm_raises` turns the signal into :class:`Terminated` in the main
process, which the CLI reports as one line and exit status 143 (128 + 15, what shells show for a SIGTERM death).

Training stops at the end of the current step instead (``StopCheckpoint`` in :mod:`srupp_asr.train`, in the place
of Lightning's handler): :func:`defer_sigterm` makes the CLI's handler leave the signal to it. Forked children
(pool and data-loader workers) get the default action back.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

EXIT_STATUS = 128 + signal.SIGTERM


class Terminated(BaseException):
    """The process received SIGTERM; the message says what was saved, if anything."""


_state = {"defer": False, "pending": False}


def _handle(signum: int, frame) -> None:
    """The handler :func:`sigterm_raises` installs (forked children get the default back: ``_default_in_child``)."""
    if not _state["defer"]:
        raise Terminated("terminated (SIGTERM)")
    _state["pending"] = True  # the deferring loop stops at its next safe point (see sigterm_pending)


def _default_in_child() -> None:
    """After a fork, give the child SIGTERM's default action back: a Python handler runs only between bytecodes,
    so a worker blocked in C (a lock, a library call) would never act on it, and the parent that terminates its
    pool (``Pool.terminate`` sends SIGTERM, then waits) would wait for ever."""
    if signal.getsignal(signal.SIGTERM) is _handle:
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


os.register_at_fork(after_in_child=_default_in_child)


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` in this process (a no-op outside the main thread)."""
    try:
        previous = signal.signal(signal.SIGTERM, _handle)
    except ValueError:  # not the main thread: signals cannot be handled here
        yield
        return
    _state["pending"] = False
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        _state["defer"] = _state["pending"] = False


def defer_sigterm(defer: bool = True) -> None:
    """Let SIGTERM pass without raising: the work stops at its next safe point (a training step's end), which
    :func:`sigterm_pending` (or Lightning's flag, in training) tells it to."""
    _state["defer"] = defer


def sigterm_pending() -> bool:
    """Whether a SIGTERM came while it was deferred (:func:`defer_sigterm`)."""
    return _state["pending"]
