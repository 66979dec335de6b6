"""Native code of the SRU recurrence: CUDA kernels (CuPy/NVRTC) and the CPU extension.

The sources live beside this file, in the package (setup.cfg's package data ships them), so a plain
checkout imports ``srupp_asr.kernels`` as an installed wheel does. ``sru_step.h`` holds the per-step
arithmetic that both the CUDA kernels (``sru_cuda.cu``) and the CPU extension (``sru_cpu.cpp``) include.

Nothing here is imported eagerly by CPU users: CuPy is only touched when a CUDA tensor arrives,
and the CPU extension is built (once, cached by torch) the first time it is needed.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from pathlib import Path

import torch

KERNEL_DIR = Path(__file__).resolve().parent
CUDA_SOURCE = KERNEL_DIR / "sru_cuda.cu"
CPU_SOURCE = KERNEL_DIR / "sru_cpu.cpp"
STEP_HEADER = KERNEL_DIR / "sru_step.h"
THREADS_PER_BLOCK = 128

# torch dtype -> (storage type in the kernel, compute type)
CUDA_TYPES = {
    torch.float32: ("float", "float"),
    torch.float64: ("double", "double"),
    torch.float16: ("half_t", "float"),
    torch.bfloat16: ("bf16_t", "float"),
}

log = logging.getLogger(__name__)


class BackendUnavailable(RuntimeError):
    """A native backend of the recurrence cannot be used on this machine."""


def cuda_source() -> str:
    """The CUDA source with ``sru_step.h`` inlined, so CuPy's cache key covers the header."""
    include = '#include "sru_step.h"'
    source = CUDA_SOURCE.read_text()
    if include not in source:
        raise AssertionError(f"{CUDA_SOURCE} no longer includes sru_step.h")
    return source.replace(include, STEP_HEADER.read_text())


def nvrtc_options(dtype: torch.dtype, cols: int = 1) -> tuple[str, ...]:
    """NVRTC options that select the storage and compute types for ``dtype`` and the columns per thread."""
    if dtype not in CUDA_TYPES:
        raise TypeError(f"SRU recurrence: unsupported dtype {dtype}")
    if cols not in CUDA_COLUMN_CHOICES:
        raise ValueError(f"SRU recurrence: {cols} columns per CUDA thread; choose one of {CUDA_COLUMN_CHOICES}")
    storage, compute = CUDA_TYPES[dtype]
    return (
        "--std=c++17",
        f"-DSRU_T={storage}",
        f"-DSRU_F={compute}",
        f"-DSRU_CHUNK={cuda_chunk(dtype)}",
        f"-DSRU_COLS={cols}",
    )


# The kernel variant per storage dtype: (columns per thread, time steps per chunk). Measured on H100s
# (benchmarks/recurrence_speed.py --gpu-variants, benchmarks/RESULTS.md "GPU: the recurrence's kernel variants"):
# 2x8 moves 16-bit data fastest (bf16 fwd+bwd 1.30-1.44 ms against 1.44-1.65 for 1x4) and float32 at least as fast
# (2.06-2.11 ms against 1.94-2.39) with less spread; float64 (tests and gradcheck only) keeps 1x4.
# SRUPP_CUDA_COLS / SRUPP_CUDA_CHUNK override the table for every dtype.
CUDA_VARIANTS: dict[torch.dtype, tuple[int, int]] = {
    torch.float32: (2, 8),
    torch.float64: (1, 4),
    torch.float16: (2, 8),
    torch.bfloat16: (2, 8),
}
CUDA_COLUMN_CHOICES = (1, 2, 4)


def cuda_chunk(dtype: torch.dtype = torch.float32) -> int:
    """Time steps whose loads each CUDA thread issues together: ``SRUPP_CUDA_CHUNK`` (1..64) when set, else
    ``dtype``'s entry in :data:`CUDA_VARIANTS`."""
    value = os.environ.get("SRUPP_CUDA_CHUNK")
    if value is None:
        return CUDA_VARIANTS.get(dtype, (1, 4))[1]
    if not value.isdigit() or not 1 <= int(value) <= 64:
        raise ValueError(f"SRUPP_CUDA_CHUNK must be an integer in 1..64, got {value!r}")
    return int(value)


def cuda_columns(dtype: torch.dtype = torch.float32) -> int:
    """Adjacent columns each CUDA thread owns: ``SRUPP_CUDA_COLS`` (1, 2 or 4) when set, else ``dtype``'s entry in
    :data:`CUDA_VARIANTS`.

    The launcher falls back to 1 where the shape or the tensors' alignment does not allow more
    (``srupp_asr.recurrence.cuda_columns_for``)."""
    value = os.environ.get("SRUPP_CUDA_COLS")
    if value is None:
        return CUDA_VARIANTS.get(dtype, (1, 4))[0]
    if not value.isdigit() or int(value) not in CUDA_COLUMN_CHOICES:
        raise ValueError(f"SRUPP_CUDA_COLS must be one of {CUDA_COLUMN_CHOICES}, got {value!r}")
    return int(value)


def compile_ptx(dtype: torch.dtype, arch: str = "compute_80", cols: int = 1) -> str:
    """Compile the CUDA source to PTX for ``arch`` without a GPU (NVRTC only); return the PTX.

    Raises ``RuntimeError`` with NVRTC's log when the source does not compile.
    """
    try:
        from cupy_backends.cuda.libs import nvrtc
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise BackendUnavailable("compiling the CUDA kernels needs CuPy: pip install 'srupp-asr[gpu]'") from err
    prog = nvrtc.createProgram(cuda_source(), "sru_cuda.cu", [], [])
    try:
        options = (*nvrtc_options(dtype, cols), f"--gpu-architecture={arch}")
        try:
            nvrtc.compileProgram(prog, list(options))
        except nvrtc.NVRTCError as err:
            raise RuntimeError(f"NVRTC failed for {dtype} on {arch}:\n{nvrtc.getProgramLog(prog)}") from err
        ptx = nvrtc.getPTX(prog)
        return ptx.decode() if isinstance(ptx, bytes) else ptx
    finally:
        nvrtc.destroyProgram(prog)


@functools.cache
def _cuda_module(options: tuple[str, ...], device_index: int):
    import cupy

    with cupy.cuda.Device(device_index):
        module = cupy.RawModule(code=cuda_source(), options=options)
        module.compile()
    return module


def cuda_function(name: str, dtype: torch.dtype, device_index: int, cols: int = 1):
    """The compiled kernel ``name`` for ``dtype`` with ``cols`` columns per thread on a device (compiled once per
    set of NVRTC options, then cached)."""
    try:
        import cupy  # noqa: F401
    except ImportError as err:
        raise BackendUnavailable(
            "the SRU recurrence on CUDA needs CuPy: pip install 'srupp-asr[gpu]' (cupy-cuda13x)"
        ) from err
    return _cuda_kernel(name, nvrtc_options(dtype, cols), device_index)


@functools.cache
def _cuda_kernel(name: str, options: tuple[str, ...], device_index: int):
    # One lookup per kernel, not per launch: a training step launches the recurrence twice per layer.
    return _cuda_module(options, device_index).get_function(name)


def _cpu_build_dir(flags: list[str]) -> Path:
    """A build folder named for the sources, the flags, torch's and Python's versions, holding copies of the
    sources.

    torch keys its build cache by extension name and rebuilds (20 s, 1.5 GB of compiler) whenever the sources'
    absolute paths or flags change, so two checkouts (a fresh clone in CI, a second worktree) used by turns would
    rebuild at every switch. With the sources copied into a folder named by their content, every checkout with
    the same code shares one build; once it is built, :func:`cpu_extension` imports it without asking ninja, whose
    build lines name the virtualenv's include paths (a second virtualenv would otherwise rebuild it)."""
    import hashlib

    sources = {path.name: path.read_bytes() for path in (CPU_SOURCE, STEP_HEADER)}
    digest = hashlib.sha256()
    for name, data in sorted(sources.items()):
        digest.update(name.encode() + b"\0" + data + b"\0")
    digest.update(" ".join([*flags, torch.__version__, sys.version]).encode())
    if "-march=native" in flags:  # a build folder per kind of CPU
        digest.update(_cpu_features_digest().encode())
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or _default_build_root())
    folder = root / f"srupp_sru_cpu_py{sys.version_info[0]}{sys.version_info[1]}_{digest.hexdigest()[:16]}"
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in sources.items():
        target = folder / name
        if not target.exists() or target.read_bytes() != data:
            tmp = folder / f".{name}.{os.getpid()}.tmp"
            tmp.write_bytes(data)
            os.replace(tmp, target)  # atomic: a concurrent build sees the old copy or the new one
    return folder


def _default_build_root() -> str:
    """torch's default root for extension builds (``cpp_extension.get_default_build_root``), found without
    importing ``torch.utils.cpp_extension``: that module imports setuptools (0.6 s and 25 MB at every model load),
    and it is needed only to build, once per machine."""
    try:
        from torch import _appdirs
    except ImportError:  # a torch without its private copy of appdirs: ask cpp_extension
        from torch.utils import cpp_extension

        return cpp_extension.get_default_build_root()
    return os.path.realpath(_appdirs.user_cache_dir(appname="torch_extensions"))


def cpu_pool_limit() -> int | None:
    """The CPU output pool's limit in bytes from ``$SRUPP_CPU_POOL_MB`` (None: unset, keep the extension's
    default of 1024 MiB; 0 turns the pool off). Anything but a whole number of MiB is a ``UserError``."""
    value = os.environ.get("SRUPP_CPU_POOL_MB", "").strip()
    if not value:
        return None
    if not value.isdigit():
        from srupp_asr.errors import UserError

        raise UserError(f"SRUPP_CPU_POOL_MB={value!r}: not a whole number of MiB (0 turns the output pool off)")
    return int(value) * 2**20


CPU_MODULE = "srupp_sru_cpu"
BUILT_MARKER = "built.ok"  # written into the build folder once its extension has been built and loaded


def _cpu_flags() -> list[str]:
    flags = ["-O3", "-fopenmp", "-ffast-math"]  # fast-math: vectorised expf (libmvec)
    if os.environ.get("SRUPP_NATIVE_ARCH", "1") == "1":
        flags.append("-march=native")
    return flags


def _cpu_features_digest() -> str:
    """A short digest of this CPU's feature flags, so machines sharing a home folder do not share a
    ``-march=native`` build their CPU cannot run."""
    import hashlib

    try:
        with open("/proc/cpuinfo") as f:
            line = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        line = ""
    return hashlib.sha256(line.encode()).hexdigest()[:12]


def _import_built(build_dir: Path):
    """The extension module already built in ``build_dir``, or None when no complete build is there.

    Importing it directly, without ``torch.utils.cpp_extension.load``, skips torch's build lock: a process
    killed while holding that lock leaves its file behind, and every later ``load`` then waits for it forever."""
    import importlib.util

    library = build_dir / f"{CPU_MODULE}.so"
    if not (build_dir / BUILT_MARKER).exists() or not library.exists():
        return None
    try:
        spec = importlib.util.spec_from_file_location(CPU_MODULE, library)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (ImportError, OSError) as err:
        log.warning("the built SRU CPU extension %s does not load (%s); building it again", library, err)
        return None
    return module


@functools.cache
def cpu_extension():
    """Build (first call on a machine; cached on disk) and load the CPU extension of the recurrence.

    Raises ``BackendUnavailable`` with a one-line reason when it cannot be built, e.g. no C++
    compiler is installed. Its output pool gets the limit of ``$SRUPP_CPU_POOL_MB`` (see :func:`cpu_pool_limit`).
    Builds are serialised by an ``flock`` on the build folder, which the kernel releases if the process dies.
    """
    import fcntl

    limit = cpu_pool_limit()  # a bad value fails before the build
    flags = _cpu_flags()
    try:
        build_dir = _cpu_build_dir(flags)
        ext = _import_built(build_dir)
        if ext is None:
            with open(build_dir / "build.lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building: wait for it
                ext = _import_built(build_dir)
                if ext is None:
                    log.info("building the SRU CPU extension (once; cached in %s)", build_dir)
                    (build_dir / BUILT_MARKER).unlink(missing_ok=True)
                    (build_dir / "lock").unlink(missing_ok=True)  # torch's lock, left by a killed build
                    # Importing cpp_extension on a machine without the CUDA toolkit logs a warning about
                    # CUDA_HOME that does not concern this CPU-only build.
                    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
                    from torch.utils import cpp_extension

                    ext = cpp_extension.load(
                        name=CPU_MODULE,
                        sources=[str(build_dir / CPU_SOURCE.name)],
                        extra_include_paths=[str(build_dir)],
                        extra_cflags=flags,
                        extra_ldflags=["-fopenmp"],
                        build_directory=str(build_dir),
                        verbose=False,
                    )
                    (build_dir / BUILT_MARKER).touch()
    except (OSError, RuntimeError, ImportError) as err:  # no compiler, failed build, ...
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise BackendUnavailable(f"cannot build the SRU CPU extension ({first}); is g++ installed?") from err
    if limit is not None:
        ext.set_pool_limit(limit)
    return ext
