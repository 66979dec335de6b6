"""Run the CUDA kernels' source on the CPU: every thread of the grid in turn, one after another.

The kernels share no memory between threads and never synchronise, so running the threads one at a time
computes exactly what the GPU computes (up to the GPU-only exp and reciprocal approximations and the
conversion instructions, which the source replaces by host code where ``__CUDA_ARCH__`` is undefined).
That lets CI, which has no GPU, check the kernels' indexing, chunked loads, column grouping and padding
against the float64 reference. The source is compiled by g++ with the same macros NVRTC gets
(``kernels.nvrtc_options``); :func:`emulated_launch` stands in for ``srupp_asr.recurrence._launch``.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import subprocess
import tempfile
from pathlib import Path

import torch

from srupp_asr import kernels

# Host stand-ins for the CUDA built-ins the kernels use, and a grid runner per kernel whose parameters are
# deduced from the kernel itself.
SHIM = r"""
#include <cstring>
struct EmuDim3 { unsigned int x, y, z; };
static EmuDim3 blockIdx, blockDim, threadIdx;
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
inline float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned int __float_as_uint(float f) { unsigned int u; std::memcpy(&u, &f, 4); return u; }
"""

RUNNER = r"""
template <auto K> struct Grid;
template <typename... A, void (*K)(A...)>
struct Grid<K> {
  static void run(unsigned int blocks, unsigned int threads, A... args) {
    blockDim.x = threads;
    for (unsigned int b = 0; b < blocks; ++b) {
      blockIdx.x = b;
      for (unsigned int t = 0; t < threads; ++t) {
        threadIdx.x = t;
        K(args...);
      }
    }
  }
};
extern "C" {
void* emu_sru_forward = (void*)&Grid<sru_forward>::run;
void* emu_sru_backward = (void*)&Grid<sru_backward>::run;
}
"""

BUILD_DIR = Path(tempfile.gettempdir()) / "srupp_cuda_emulation"


@functools.cache
def emulation_library(options: tuple[str, ...]) -> ctypes.CDLL:
    """The kernels' source built as a host shared library with NVRTC's ``options`` (cached by content)."""
    source = SHIM + kernels.cuda_source() + RUNNER
    flags = ["-std=c++17" if o == "--std=c++17" else o for o in options]
    key = hashlib.sha256((source + " ".join(flags)).encode()).hexdigest()[:16]
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    lib = BUILD_DIR / f"sru_cuda_emu_{key}.so"
    if not lib.exists():
        src = BUILD_DIR / f"sru_cuda_emu_{key}.cpp"
        src.write_text(source)
        tmp = lib.with_suffix(f".{id(flags)}.tmp")
        cmd = ["g++", "-O1", "-fno-strict-aliasing", "-shared", "-fPIC", *flags, str(src), "-o", str(tmp)]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        tmp.replace(lib)  # atomic: a concurrent test run sees no half-written library
    return ctypes.CDLL(str(lib))


def emulated_launch(name, dtype, device, n, args, cols) -> None:
    """Drop-in for ``srupp_asr.recurrence._launch`` on CPU tensors: run kernel ``name`` over ``n`` threads."""
    assert device.type == "cpu", "the emulation reads and writes host memory"
    lib = emulation_library(kernels.nvrtc_options(dtype, cols))
    address = ctypes.c_void_p.in_dll(lib, f"emu_{name}").value
    types, values = [ctypes.c_uint, ctypes.c_uint], []
    for a in args:
        if a is None or isinstance(a, torch.Tensor):
            types.append(ctypes.c_void_p)
            values.append(None if a is None else a.data_ptr())
        else:
            types.append(ctypes.c_int)
            values.append(int(a))
    threads = kernels.THREADS_PER_BLOCK
    run = ctypes.CFUNCTYPE(None, *types)(address)
    run((n + threads - 1) // threads, threads, *values)
