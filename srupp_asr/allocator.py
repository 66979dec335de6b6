"""glibc's malloc tuned for decoding on the CPU: freed blocks stay in the heap for the next step to reuse.

A beam search step allocates and frees the same few megabyte-sized tensors every step (the reordered key/value caches of
the decoder and the LM, the CTC forward variables). By default glibc serves blocks above its mmap threshold (128 KB,
raised as such blocks are freed) with fresh pages from the kernel and hands the top of the heap back once more than
128 KB of it is free, so each step's tensors land on new pages that the kernel must zero: about 350,000 page faults
for the 32 LJ Speech files. With the mmap threshold fixed at 32 MB (the largest value glibc itself would raise it
to) and the trim threshold at 256 MB, those blocks are reused from the heap: 160,000 faults, decoding about 20%
faster (10.8-11.0 s -> 8.3-8.4 s), the same peak memory (docs/benchmarks.md, "CPU inference"). Setting the trim
threshold alone would be worse than nothing: it also stops the mmap threshold from adapting.

The decode threads (:mod:`srupp_asr.decoding.batch` decodes two batches at once on 2 CPU threads) share one arena:
by default each thread gets its own, which keeps its own freed blocks: the peak was 50-90 MB higher with two.

The settings are process-wide, so the commands that decode set them (``transcribe``, ``evaluate``), not the
library's ``load_model``. Where the C library is not glibc (musl, macOS) nothing is changed.
"""

from __future__ import annotations

import ctypes
import platform

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit systems
TRIM_THRESHOLD = 256 * 1024 * 1024


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds for decoding; False (nothing changed) where that cannot be done."""
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mmap first: once either is set, glibc stops adapting the mmap threshold.
    return (
        bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
        and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
        and bool(mallopt(M_ARENA_MAX, 1))
    )
