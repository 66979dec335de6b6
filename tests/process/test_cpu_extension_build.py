"""Building and loading the CPU extension: a build killed mid-way (holding torch's build lock) must not make
later processes wait forever, and a finished build is imported without torch's build step."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from srupp_asr import kernels

ROOT = Path(__file__).resolve().parents[2]
LOAD = "from srupp_asr import kernels; kernels.cpu_extension(); print('loaded')"


def _python(code: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def built_dir() -> Path:
    kernels.cpu_extension()
    return kernels._cpu_build_dir(kernels._cpu_flags())


def test_a_finished_build_is_imported_without_torchs_build_step(built_dir):
    assert (built_dir / kernels.BUILT_MARKER).exists()
    code = "import torch.utils.cpp_extension as c\nc.load = None  # any call fails\n" + LOAD
    result = _python(code, timeout=120)
    assert result.returncode == 0 and "loaded" in result.stdout, result.stderr


def test_a_stale_torch_lock_beside_a_finished_build_is_ignored(built_dir):
    lock = built_dir / "lock"
    existed = lock.exists()
    lock.touch()
    try:
        result = _python(LOAD, timeout=120)  # torch's load would poll for the lock's removal forever
    finally:
        if not existed:
            lock.unlink(missing_ok=True)
    assert result.returncode == 0 and "loaded" in result.stdout, result.stderr


def test_a_build_killed_while_holding_torchs_lock_is_built_again(tmp_path):
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path)}
    first = subprocess.Popen(
        [sys.executable, "-c", LOAD],
        cwd=ROOT,
        env={**os.environ, **env},
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("*/lock")) and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(tmp_path.glob("*/lock")), "the first build never took torch's lock"
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the compiler too
        first.wait()
    assert list(tmp_path.glob("*/lock")) and not list(tmp_path.glob(f"*/{kernels.BUILT_MARKER}"))
    second = _python(LOAD, env=env, timeout=600)
    assert second.returncode == 0 and "loaded" in second.stdout, second.stderr
    assert list(tmp_path.glob(f"*/{kernels.BUILT_MARKER}"))
