"""Quiet training: the run's progress bar measures the run against whichever limit ends it first (its ETA), draws
only on a terminal, replaces Lightning's per-epoch bar, and Lightning's adverts and known deprecation warnings are
dropped at their source."""

from __future__ import annotations

import logging
import warnings

import pytest
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import TQDMProgressBar

from srupp_asr.progress import RunProgressBar, quiet_lightning, run_fraction, use_run_progress_bar


def test_the_first_limit_to_end_the_run_sets_its_fraction():
    none = {"max_steps": -1, "max_time": None, "max_epochs": None}
    assert run_fraction(10, 10, 0, 5.0, none, None) == (None, None)
    assert run_fraction(25, 5, 1, 5.0, {**none, "max_steps": 100}, None) == (0.25, "max_steps")
    assert run_fraction(25, 5, 1, 30.0, {"max_steps": 100, "max_time": 60.0}, None) == (0.5, "max_time")
    # epochs count once an epoch's length is known: epoch 2 of 4 (0-based 1), half done
    assert run_fraction(15, 5, 1, 1.0, {"max_epochs": 4}, 10) == (0.375, "max_epochs")
    assert run_fraction(15, 5, 1, 1.0, {"max_epochs": 4}, None) == (None, None)
    assert run_fraction(500, 5, 1, 100.0, {"max_steps": 100}, None) == (1.0, "max_steps")  # never past the end


def test_the_bar_replaces_lightnings_and_draws_only_on_a_terminal(monkeypatch, tmp_path):
    trainer = Trainer(default_root_dir=tmp_path, logger=False, enable_checkpointing=False, enable_model_summary=False)
    assert any(type(c) is TQDMProgressBar for c in trainer.callbacks)
    use_run_progress_bar(trainer)
    bars = [c for c in trainer.callbacks if isinstance(c, RunProgressBar)]
    assert len(bars) == 1 and trainer.progress_bar_callback is bars[0]
    assert not any(type(c) is TQDMProgressBar for c in trainer.callbacks)
    assert not bars[0].is_enabled  # pytest's stderr is no terminal: logs get no carriage-return spam
    monkeypatch.setattr("sys.stderr.isatty", lambda: True, raising=False)
    assert RunProgressBar().is_enabled
    off = Trainer(default_root_dir=tmp_path, logger=False, enable_progress_bar=False, enable_checkpointing=False)
    use_run_progress_bar(off)
    assert off.progress_bar_callback is None  # --trainer.enable_progress_bar false keeps it off


def test_lightnings_advert_and_known_deprecations_are_dropped(caplog):
    quiet_lightning()
    quiet_lightning()  # idempotent
    from lightning.pytorch.utilities.rank_zero import rank_zero_info

    with caplog.at_level(logging.INFO):
        rank_zero_info("💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]")
        rank_zero_info("GPU available: False, used: False")
    assert [r.getMessage() for r in caplog.records] == ["GPU available: False, used: False"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_lightning()  # the filters go in front of "always"
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning, stacklevel=1)
        warnings.warn("something else is deprecated", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["something else is deprecated"]


@pytest.mark.parametrize("seconds", [5, 65, 3725])
def test_clock(seconds):
    from srupp_asr.progress import _clock

    assert _clock(seconds) == {5: "00:05", 65: "01:05", 3725: "1:02:05"}[seconds]
