"""The srupp-asr command line."""

from __future__ import annotations

import os
import subprocess
import sys

from srupp_asr import __version__
from srupp_asr.cli import main


def test_version_and_help_from_the_installed_script():
    out = subprocess.run(
        [sys.executable, "-m", "srupp_asr.cli", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == f"srupp-asr {__version__}"
    out = subprocess.run([sys.executable, "-m", "srupp_asr.cli", "--help"], capture_output=True, text=True, check=True)
    assert "usage: srupp-asr" in out.stdout and "info" in out.stdout


def test_info_reports_the_cpu_backend(capsys):
    assert main(["info"]) == 0
    assert "recurrence cpu: native C++ extension" in capsys.readouterr().out


def test_no_command_prints_help(capsys):
    assert main([]) == 0
    assert "COMMAND" in capsys.readouterr().out


def _score_files(tmp_path):
    ref, hyp = tmp_path / "ref.txt", tmp_path / "hyp.txt"
    ref.write_text("u1 hello world\nu2 the cat sat\n", encoding="utf-8")
    hyp.write_text("u1 hello word\nu2 the cat sat\n", encoding="utf-8")
    return ["score", "--ref", str(ref), "--hyp", str(hyp)]


def test_an_output_folder_that_cannot_be_made_is_one_line(tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.write_text("a file, not a folder")
    assert main([*_score_files(tmp_path), "--out-dir", str(taken)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"srupp-asr score: error: {taken}: exists and is not a folder (the report goes into a folder)"
    assert main([*_score_files(tmp_path), "--out-dir", str(taken / "below")]) == 1  # an OSError from the system
    assert capsys.readouterr().err.strip() == f"srupp-asr score: error: {taken / 'below'}: Not a directory"


def test_a_report_that_cannot_be_written_leaves_the_folder_as_it_was(tmp_path, capsys):
    out = tmp_path / "report"
    (out / "results.json").mkdir(parents=True)
    assert main([*_score_files(tmp_path), "--out-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"srupp-asr score: error: {out / 'results.json'}: is a folder; " + (
        "the report's file of that name cannot replace it"
    )
    assert [p.name for p in out.iterdir()] == ["results.json"]  # nothing else written


def test_a_full_stdout_is_one_line_and_exit_1(tmp_path):
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [sys.executable, "-m", "srupp_asr.cli", *_score_files(tmp_path), "--out-dir", str(tmp_path / "o")],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
        )
    assert result.returncode == 1
    assert result.stderr.strip() == "srupp-asr score: error: cannot write or read: No space left on device"


def test_a_closed_pipe_stops_quietly(tmp_path):
    reader = subprocess.Popen(["head", "-c", "0"], stdin=subprocess.PIPE)
    result = subprocess.run(
        [sys.executable, "-m", "srupp_asr.cli", *_score_files(tmp_path), "--out-dir", str(tmp_path / "o")],
        stdout=reader.stdin,
        stderr=subprocess.PIPE,
        text=True,
    )
    reader.stdin.close()
    reader.wait()
    assert result.returncode in (0, 1) and "Traceback" not in result.stderr


def test_a_negative_worst_count_is_refused(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit) as stop:
        main([*_score_files(tmp_path), "--worst", "-1"])
    assert stop.value.code == 2 and "--worst: must be a whole number >= 0, got '-1'" in capsys.readouterr().err


def test_ctrl_c_is_one_line_and_exit_130(capsys):
    from srupp_asr.cli import _run

    def interrupted():
        raise KeyboardInterrupt

    assert _run("transcribe", interrupted) == 130
    assert capsys.readouterr().err == "srupp-asr transcribe: interrupted\n"


def test_the_console_script_exits_without_teardown():
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "srupp-asr"]
    assert script.value == "srupp_asr.cli:console_main"


def _exit_child(body: str, stdout: int = subprocess.PIPE) -> subprocess.CompletedProcess:
    code = "import atexit, sys, threading, time\nfrom srupp_asr.cli import exit_without_teardown\n" + body
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout buffered, as usual
    return subprocess.run(
        [sys.executable, "-c", code], stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=60, env=env
    )


def test_exit_without_teardown_runs_atexit_handlers_and_flushes_the_streams():
    # A buffered write (no newline, stdout a pipe) and an atexit handler's output both arrive; the code is kept.
    result = _exit_child(
        "atexit.register(lambda: print('handler', end=''))\n"
        "class Torn:\n    def __del__(self):\n        print('teardown', end='')\n"
        "kept = Torn()\nsys.stdout.write('written ')\nexit_without_teardown(3)\n"
    )
    assert (result.returncode, result.stdout) == (3, "written handler")  # no module teardown: no 'teardown'


def test_exit_without_teardown_waits_for_a_running_thread_the_usual_way():
    result = _exit_child(
        "t = threading.Thread(target=lambda: (time.sleep(0.5), print('thread done')))\nt.start()\n"
        "exit_without_teardown(4)\n"
    )
    assert (result.returncode, result.stdout) == (4, "thread done\n")


def test_exit_without_teardown_reports_a_stdout_it_cannot_flush():
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader went away: the buffered write fails at the flush
    try:
        result = _exit_child("sys.stdout.write('x')\nexit_without_teardown(0)\n", stdout=write_end)
    finally:
        os.close(write_end)
    assert result.returncode == 120  # as Python's own exit when stdout cannot be flushed
