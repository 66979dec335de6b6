"""benchmarks/lm_train_speed.py: the text it trains on is the same every run and shaped like sentences."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import lm_train_speed


def test_the_benchmark_text_is_the_same_every_run_and_sentence_shaped() -> None:
    first, again, other = lm_train_speed.sentences(50), lm_train_speed.sentences(50), lm_train_speed.sentences(50, 1)
    assert first == again != other
    assert all(5 <= len(s.split()) <= 20 and s == s.lower() for s in first)
