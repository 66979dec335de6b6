"""The CPU threads decoding computes on: torch's intra-op threads, and the BLAS threads numpy's matrix products use
(:mod:`srupp_asr.runtime`, which decodes on the CPU without torch). ``--threads`` sets both; the decode workers
(:mod:`srupp_asr.decoding.batch`) share them out. Light to import: torch is only asked when something has imported it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

_blas_limits = None  # threadpoolctl's handle on the BLAS libraries, made at the first use


def _blas():
    global _blas_limits
    if _blas_limits is None:
        import numpy  # noqa: F401 -- loads the BLAS library the controller finds
        from threadpoolctl import ThreadpoolController

        _blas_limits = ThreadpoolController()
    return _blas_limits


def cpu_threads() -> int:
    """The threads decoding computes on: torch's when torch is in use, else the BLAS libraries' (at least 1)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch.get_num_threads()
    counts = [pool["num_threads"] for pool in _blas().info() if pool["user_api"] == "blas"]
    return max(1, min(counts, default=1))


def set_cpu_threads(count: int) -> None:
    """Compute on ``count`` threads: torch's (when torch is in use) and the BLAS libraries' (numpy's)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(count)
    _blas().limit(limits=count, user_api="blas")


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Compute on one thread inside: for a search's small operations (a few hundred rows of a few hundred numbers),
    far too small to gain from threads, where each parallel operation waits for every thread of the pool; where other
    processes share the cores, that wait is a scheduler time slice per operation (measured: 0.59 s per decoder step
    on 2 threads against 0.026 s on one, on 2 cores that other jobs used; numpy's small matrix products: 11 ms against
    0.6 ms)."""
    threads = cpu_threads()
    if threads == 1:
        yield
        return
    set_cpu_threads(1)
    try:
        yield
    finally:
        set_cpu_threads(threads)
