"""The srupp-asr command line."""

from __future__ import annotations

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
