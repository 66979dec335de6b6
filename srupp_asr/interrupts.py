"""SIGTERM (``kill``, a batch scheduler's stop, ``timeout``) as an exception, so a command stops cleanly; Ctrl-C
in training as a request to stop at the next safe point.

Python's default for SIGTERM ends the process at once: no ``finally`` block runs, so temporary files stay behind
and a training run saves nothing. :func:`sigterm_raises` turns the signal into :class:`Terminated` in the main
process, which the CLI reports as one line and exit status 143 (128 + 15, what shells show for a SIGTERM death).

Training stops at the end of the current step instead (``StopCheckpoint`` in :mod:`srupp_asr.train`, in the place
of Lightning's handler): :func:`defer_sigterm` makes the CLI's handler leave the signal to it, and
:func:`defer_sigint` makes a first Ctrl-C a stop request too (a second one raises ``KeyboardInterrupt`` at once).
Forked children (pool and data-loader workers) get SIGTERM's default action back, and ignore SIGINT while it is
deferred: a Ctrl-C reaches the terminal's whole process group, and a data-loader worker that died of it would
end the run the parent was stopping cleanly.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator

EXIT_STATUS = 128 + signal.SIGTERM


INTERRUPTED_STATUS = 128 + signal.SIGINT


class Terminated(BaseException):
    """The process received SIGTERM (or, in training, Ctrl-C); the message says what was saved, if anything, and
    ``status`` is the exit status (143 for SIGTERM, 130 for Ctrl-C)."""

    def __init__(self, message: str = "", status: int = EXIT_STATUS) -> None:
        super().__init__(message)
        self.status = status


_state: dict = {"defer": False, "pending": False, "sigint_notice": None, "sigint_seen": False, "sigint_previous": None}


def _handle(signum: int, frame) -> None:
    """The handler :func:`sigterm_raises` installs (forked children get the default back: ``_default_in_child``)."""
    if not _state["defer"]:
        raise Terminated("terminated (SIGTERM)")
    _state["pending"] = True  # the deferring loop stops at its next safe point (see sigterm_pending)


def _on_sigint(signum: int, frame) -> None:
    """The handler :func:`defer_sigint` installs: the first Ctrl-C is a stop request, the next one stops at once."""
    notice = _state["sigint_notice"]
    if notice is None or _state["sigint_seen"]:
        raise KeyboardInterrupt
    _state["sigint_seen"] = True
    notice()


def _default_in_child() -> None:
    """After a fork, give the child SIGTERM's default action back: a Python handler runs only between bytecodes,
    so a worker blocked in C (a lock, a library call) would never act on it, and the parent that terminates its
    pool (``Pool.terminate`` sends SIGTERM, then waits) would wait for ever. While the parent defers Ctrl-C, the
    child ignores it: the parent stops its workers itself, after the step under way."""
    with contextlib.suppress(ValueError):
        if signal.getsignal(signal.SIGTERM) is _handle:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if signal.getsignal(signal.SIGINT) is _on_sigint:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


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


def defer_sigint(notice: Callable[[], None] | None) -> None:
    """With ``notice``: a first Ctrl-C (SIGINT) calls it instead of raising ``KeyboardInterrupt`` (the work stops
    at its next safe point); a second one raises as usual. With ``None``: the previous handler is back. A no-op
    outside the main thread, where signals cannot be handled."""
    if notice is not None:
        try:
            previous = signal.signal(signal.SIGINT, _on_sigint)
        except ValueError:
            return
        if previous is not _on_sigint:
            _state["sigint_previous"] = previous
        _state.update(sigint_notice=notice, sigint_seen=False)
        return
    if _state["sigint_notice"] is None:
        return
    _state.update(sigint_notice=None, sigint_seen=False)
    with contextlib.suppress(ValueError):
        if signal.getsignal(signal.SIGINT) is _on_sigint:
            signal.signal(signal.SIGINT, _state["sigint_previous"] or signal.default_int_handler)
    _state["sigint_previous"] = None
