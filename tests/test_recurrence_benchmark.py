"""benchmarks/recurrence_speed.py: the command line's kernel variants and its environment handling."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "recurrence_speed.py"
spec = importlib.util.spec_from_file_location("recurrence_speed", SCRIPT)
rs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rs)


def test_variants_parse_as_columns_by_chunk():
    assert rs.parse_variants("1x4,2x4") == [(1, 4), (2, 4)]
    assert rs.parse_variants(" 2x8 ") == [(2, 8)]


@pytest.mark.parametrize("text", ["3x4", "2", "x4", "2x0", "2x65", "twoxfour"])
def test_bad_variants_stop_with_one_line(text):
    with pytest.raises(SystemExit, match="--gpu-variants"):
        rs.parse_variants(text)


def test_a_variant_sets_the_kernel_environment_and_restores_it(monkeypatch):
    monkeypatch.setenv("SRUPP_CUDA_CHUNK", "8")
    monkeypatch.delenv("SRUPP_CUDA_COLS", raising=False)
    with rs._cuda_variant(2, 3):
        assert (os.environ["SRUPP_CUDA_COLS"], os.environ["SRUPP_CUDA_CHUNK"]) == ("2", "3")
    assert os.environ["SRUPP_CUDA_CHUNK"] == "8" and "SRUPP_CUDA_COLS" not in os.environ
