"""Run every GPU test (pytest marker ``gpu``) in one go and print a short table.

Usage, on a machine with a CUDA GPU and CuPy:  python tests/run_gpu_tests.py  (or `make gpu-test`)

A test module that cannot be imported (a package missing on the GPU machine, say) does not stop the others:
pytest goes on collecting, the run prints each module that failed and why, and exits non-zero.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest


class _Collect:
    def __init__(self) -> None:
        self.rows: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.failures: list[str] = []
        self.collection_errors: list[tuple[str, str]] = []

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            lines = str(report.longrepr).strip().splitlines()
            self.collection_errors.append((report.nodeid, lines[-1] if lines else "?"))

    def pytest_runtest_logreport(self, report) -> None:
        if report.when != "call" and not (report.when == "setup" and report.outcome != "passed"):
            return
        test = report.nodeid.split("::")[-1].split("[")[0]
        self.rows[test][report.outcome] += 1
        self.rows[test]["seconds"] += report.duration
        if report.outcome == "failed":
            self.failures.append(report.nodeid)


def main() -> int:
    """Run the GPU tests and print one row per test function."""
    import torch

    root = Path(__file__).resolve().parent.parent
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    collect = _Collect()
    start = time.perf_counter()
    args = ["-q", "-m", "gpu", "-p", "no:cacheprovider", "--continue-on-collection-errors", str(root / "tests")]
    code = pytest.main(args, plugins=[collect])
    print(f"\nGPU tests on {device} (torch {torch.__version__}), {time.perf_counter() - start:.0f} s")
    print(f"| {'test':<62} | passed | failed | skipped | seconds |")
    print(f"|{'-' * 64}|--------|--------|---------|---------|")
    for test, r in collect.rows.items():
        print(f"| {test:<62} | {r['passed']:6.0f} | {r['failed']:6.0f} | {r['skipped']:7.0f} | {r['seconds']:7.1f} |")
    for nodeid in collect.failures:
        print(f"FAILED {nodeid}")
    for nodeid, reason in collect.collection_errors:
        print(f"NOT COLLECTED {nodeid}: {reason}")
    if collect.collection_errors and code == 0:
        code = 1
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
