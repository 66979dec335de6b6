"""benchmarks/stop_agreement_cost.py runs and prints its table (a short run: the numbers are not checked)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "stop_agreement_cost.py"


@pytest.mark.process  # the benchmark script, whole, in a child process (two gloo ranks)
def test_the_benchmark_prints_both_rows():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--repeats", "3", "--warmup", "1", "--grad-mib", "0.1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and "median" not in line]
    assert [row.split("|")[1].strip() for row in rows] == [
        "stop agreement (one flag, each step)",
        "0.1 MiB of float32 (a step's gradients)",
    ]
    assert all(float(row.split("|")[2]) > 0 for row in rows)
    assert "2 processes, gloo" in proc.stdout
