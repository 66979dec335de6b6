"""benchmarks/decoding_speed.py runs and prints one table row per decoding mode (slow: it decodes 8 utterances
four ways with an untrained model, whose beam searches run to their length limit)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from srupp_asr.decoding import MODES

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "decoding_speed.py"


@pytest.mark.slow
def test_benchmark_prints_a_row_per_mode(capsys: pytest.CaptureFixture[str]) -> None:
    """The markdown table has a header, a rule and one row per mode with a positive real-time factor."""
    spec = importlib.util.spec_from_file_location("decoding_speed", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    assert module.main(["--repeat", "1", "--beam", "2"]) == 0
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [r[0].strip() for r in rows[2:]] == list(MODES)
    assert all(float(r[2]) > 0 for r in rows[2:])
