"""benchmarks/decoding_defaults.py: what its children pass to transcribe (device, the untimed warm-up pass) and how
the table prints a GPU's real-time factor (the measuring itself is a benchmark, run by hand)."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.helpers import benchmark_module


@pytest.fixture(scope="module")
def dd():
    with benchmark_module("decoding_defaults") as module:
        yield module


@pytest.mark.parametrize("warmup", [False, True])
def test_child_passes_the_device_and_times_only_the_pass_after_the_warm_up(dd, monkeypatch, warmup):
    calls = []

    def fake_transcribe(paths, model, **kwargs):
        calls.append(kwargs)
        seconds = 5.0 if len(calls) == 1 else 0.01  # the first pass is the slow one (a GPU's start)
        return [
            SimpleNamespace(path=p, text="a cat", duration=2.0, processing_seconds=seconds, decoding={"mode": "joint"})
            for p in paths
        ]

    monkeypatch.setattr(importlib.import_module("srupp_asr.transcribe"), "transcribe", fake_transcribe)
    files = [(Path("a.wav"), "a cat"), (Path("b.wav"), "the cat")]
    r = dd.run_child(files, "default", 2, None, None, None, device="cuda", warmup=warmup)
    assert len(calls) == (2 if warmup else 1)
    assert all(c["device"] == "cuda" and c["threads"] == 2 for c in calls)
    assert r["decoding"] == pytest.approx(0.02 if warmup else 10.0)
    assert (r["errors"], r["words"], r["audio"]) == (1, 4, 4.0)


def test_child_sets_the_ctc_recursion_and_the_batch_size_it_is_given(dd, monkeypatch):
    from srupp_asr.decoding import scorers

    seen = []

    def fake_transcribe(paths, model, **kwargs):
        seen.append((scorers.CTC_RECURSION, kwargs["batch_size"]))
        return [
            SimpleNamespace(path=p, text="a", duration=1.0, processing_seconds=0.1, decoding={"mode": "joint"})
            for p in paths
        ]

    monkeypatch.setattr(importlib.import_module("srupp_asr.transcribe"), "transcribe", fake_transcribe)
    monkeypatch.setattr(scorers, "CTC_RECURSION", "auto")  # (the child sets a module setting: restored after)
    dd.run_child([(Path("a.wav"), "a")], "default", 1, None, None, None, ctc_recursion="scan", batch_size=4)
    dd.run_child([(Path("a.wav"), "a")], "default", 1, None, None, None)
    assert seen == [("scan", 4), ("scan", None)]  # a child is a process of its own: it sets, never resets


def test_table_row_gives_a_gpus_rtf_four_decimals(dd):
    r = {"errors": 3, "words": 190, "audio": 66.0, "decoding": 0.2, "load": 9.5, "rss_gb": 2.5}
    assert dd.table_row("short", "default", r) == "| short | default | 1.6 (3 / 190) | 66 | 0.0030 | 9.5 | 2.50 |"
    r["decoding"] = 2.0
    assert dd.table_row("short", "default", r).split(" | ")[4] == "0.030"
    assert dd.table_row("3 min", "joint", "failed: x") == "| 3 min | joint | failed: x | | | | |"
