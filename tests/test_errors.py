"""Errors a user can cause (srupp_asr.errors): running out of memory is told apart from a bug, and said in one line;
a script's UserError is one line and exit status 2."""

from __future__ import annotations

import resource
import subprocess
import sys
from collections.abc import Callable

import pytest

from srupp_asr.errors import UserError, is_out_of_memory, out_of_memory_line
from tests.helpers import write_tone


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


def _limit_address_space(mib: int) -> Callable[[], None]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (mib * 2**20, mib * 2**20))

    return limit


@pytest.mark.parametrize(
    ("engine", "mib"),
    [
        ("torch", 600),  # too small to map libtorch
        ("auto", 200),  # float32 on the CPU: numpy, no torch; too small to load the built-in model
    ],
)
def test_start_up_under_a_small_ulimit_v_is_one_line_saying_out_of_memory(tmp_path, engine, mib):
    """It was an ImportError traceback (libtorch_python.so: failed to map segment from shared object)."""
    wav = write_tone(tmp_path / "a.wav", 0.5)  # readable: the model is loaded
    argv = [sys.executable, "-m", "srupp_asr.cli", "transcribe", "--device", "cpu", "--engine", engine, str(wav)]
    argv += ["-o", str(tmp_path / "out")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, preexec_fn=_limit_address_space(mib))
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("srupp-asr transcribe: error: out of memory while running transcribe (")
    assert done.stderr.endswith("); free memory or raise the process's limit (ulimit -v)\n")
    assert done.stderr.count("\n") == 1


def test_run_script_exits_with_main_and_turns_a_user_error_into_one_line(capsys) -> None:
    from srupp_asr.errors import run_script

    def bad() -> int:
        raise UserError("data/brown: no Brown Corpus sample files")

    for main, code, err in [(lambda: 0, 0, ""), (lambda: 3, 3, ""), (bad, 2, "x.py: error: data/brown: no Brown")]:
        with pytest.raises(SystemExit) as exit_:
            run_script(main, "x.py")
        assert exit_.value.code == code
        assert capsys.readouterr().err.startswith(err)
