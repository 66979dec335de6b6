"""Signal handling (srupp_asr.interrupts): SIGTERM raises in the parent and gets its default action back in
forked workers; a deferred Ctrl-C."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

from tests.helpers import REPO

# ----------------------------------------------------------------------------------------------------
# moved from tests/test_reliability_stops.py


def test_a_forked_worker_gets_sigterms_default_action_back():
    """A Python handler runs only between bytecodes: a pool worker blocked in C would never die of the SIGTERM
    its parent's ``Pool.terminate`` sends, and the parent would wait for ever (a synth-corpus run hung so)."""
    script = textwrap.dedent(
        """
        import os, signal, sys
        from srupp_asr.interrupts import sigterm_raises

        with sigterm_raises():
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
            pid = os.fork()
            if pid == 0:
                os._exit(0 if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL else 3)
            _, status = os.waitpid(pid, 0)
            sys.exit(os.waitstatus_to_exitcode(status))
        """
    )
    assert subprocess.run([sys.executable, "-c", script], cwd=REPO, timeout=60).returncode == 0


def test_a_deferred_ctrl_c_notices_once_raises_the_second_time_and_forked_workers_ignore_it():
    script = textwrap.dedent(
        """
        import os, signal, sys
        from srupp_asr.interrupts import defer_sigint

        notices = []
        defer_sigint(lambda: notices.append(1))
        pid = os.fork()
        if pid == 0:  # a data-loader worker: the terminal's Ctrl-C reaches it too, and must not kill it
            os._exit(0 if signal.getsignal(signal.SIGINT) is signal.SIG_IGN else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the forked child does not ignore SIGINT"
        os.kill(os.getpid(), signal.SIGINT)
        assert notices == [1]
        try:
            os.kill(os.getpid(), signal.SIGINT)
            sys.exit(4)
        except KeyboardInterrupt:
            pass
        defer_sigint(None)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        """
    )
    # The child starts with SIGINT's default action, as from a terminal: a pytest-xdist worker ignores SIGINT, and
    # an ignored signal stays ignored across exec (Python then installs no handler of its own).
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        timeout=60,
        capture_output=True,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.returncode == 0, proc.stderr
