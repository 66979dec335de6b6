"""Errors a user can cause (srupp_asr.errors): running out of memory is told apart from a bug, and said in one line."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from srupp_asr.errors import UserError, is_out_of_memory, out_of_memory_line


@pytest.mark.parametrize(
    "err",
    [
        MemoryError(),
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 25769803776 bytes."),
        ImportError("libtorch_python.so: failed to map segment from shared object"),
        OSError(12, "Cannot allocate memory"),
        type("OutOfMemoryError", (RuntimeError,), {})("CUDA out of memory. Tried to allocate 20.00 GiB"),
    ],
)
def test_what_the_libraries_say_when_memory_runs_out_is_out_of_memory(err):
    assert is_out_of_memory(err)


@pytest.mark.parametrize(
    "err", [RuntimeError("simulated bug"), ImportError("No module named 'torch'"), ValueError("out of range")]
)
def test_other_errors_are_not_out_of_memory(err):
    assert not is_out_of_memory(err)


def test_the_out_of_memory_line_names_the_work_the_cause_and_a_remedy():
    line = out_of_memory_line(MemoryError(), "decoding", "try a smaller --beam")
    assert line == "out of memory while decoding (MemoryError); try a smaller --beam"
    assert not isinstance(MemoryError(), UserError)  # not the user's input: exit 1, not 2


def _limit_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (600 * 2**20, 600 * 2**20))  # too small to map libtorch


def test_start_up_under_a_small_ulimit_v_is_one_line_saying_out_of_memory(tmp_path):
    """It was an ImportError traceback (libtorch_python.so: failed to map segment from shared object)."""
    (tmp_path / "a.wav").write_bytes(b"RIFF")
    argv = [sys.executable, "-m", "srupp_asr.cli", "transcribe", "--device", "cpu", str(tmp_path / "a.wav")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, preexec_fn=_limit_address_space)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("srupp-asr transcribe: error: out of memory while running transcribe (")
    assert done.stderr.endswith("); free memory or raise the process's limit (ulimit -v)\n")
    assert done.stderr.count("\n") == 1
