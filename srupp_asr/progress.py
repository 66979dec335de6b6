"""What ``srupp-asr train`` shows on a terminal: one progress bar for the whole run, with its ETA, and none of
Lightning's advertising or known deprecation noise.

Lightning's own bar counts the batches of one epoch, and lhotse's dynamic batches have no known number, so it
shows neither a total nor an ETA. :class:`RunProgressBar` measures the run against its budget instead: whichever of
``max_steps``, ``max_time`` and ``max_epochs`` ends it first (an epoch's number of steps is known once the first
epoch has ended), and prints ``step``, ``epoch``, the loss and the time left. It draws only when stderr is a
terminal: logs and pipes get no carriage-return spam (the CSV and TensorBoard logs hold the numbers).
"""

from __future__ import annotations

import logging
import sys
import time
import warnings
from typing import Any

from lightning.pytorch.callbacks import ProgressBar

# Lightning's advertisements, logged at INFO through its rank-zero loggers (rank_zero_info)
_ADVERT_PREFIX = "💡 Tip:"
_RANK_ZERO_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")
# Deprecation warnings of our pinned versions that a user cannot act on (message regular expressions)
KNOWN_DEPRECATIONS = (
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",  # lightning 2.6's _pytree on torch 2.11
)


class _NoAdverts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_ADVERT_PREFIX)


_NO_ADVERTS = _NoAdverts()


def quiet_lightning() -> None:
    """Drop Lightning's "Tip: try litlogger / litmodels" adverts and the known deprecation warnings (idempotent)."""
    for name in _RANK_ZERO_LOGGERS:
        logger = logging.getLogger(name)
        if _NO_ADVERTS not in logger.filters:
            logger.addFilter(_NO_ADVERTS)
    for pattern in KNOWN_DEPRECATIONS:
        warnings.filterwarnings("ignore", message=pattern)


def _clock(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60:02d}:{rest % 60:02d}"


def _max_time_seconds(trainer: Any) -> float | None:
    """``trainer.max_time`` in seconds (Lightning keeps it in its Timer callback), or None."""
    from lightning.pytorch.callbacks import Timer

    for callback in trainer.callbacks:
        if isinstance(callback, Timer) and callback._duration is not None:
            return float(callback._duration)
    return None


def run_fraction(
    step: int, epoch_step: int, epoch: int, elapsed: float, limits: dict[str, float | None], steps_per_epoch: int | None
) -> tuple[float | None, str | None]:
    """How much of the run is done (0-1) and which limit ends it first, from the step, the epoch (0-based) and the
    steps done in it, the seconds spent and the limits (``max_steps``, ``max_time`` in seconds, ``max_epochs``;
    None or <= 0: no limit); ``(None, None)`` while no limit can be measured yet."""
    fractions: dict[str, float] = {}
    if limits.get("max_steps") and limits["max_steps"] > 0:
        fractions["max_steps"] = step / limits["max_steps"]
    if limits.get("max_time"):
        fractions["max_time"] = elapsed / limits["max_time"]
    if limits.get("max_epochs") and limits["max_epochs"] > 0 and steps_per_epoch:
        fractions["max_epochs"] = (epoch + min(epoch_step / steps_per_epoch, 1.0)) / limits["max_epochs"]
    if not fractions:
        return None, None
    limit = max(fractions, key=fractions.__getitem__)
    return min(fractions[limit], 1.0), limit


class RunProgressBar(ProgressBar):
    """One tqdm bar over the whole run (see the module's docstring); on a terminal only."""

    def __init__(self, refresh_seconds: float = 0.5) -> None:
        super().__init__()
        self._enabled = sys.stderr.isatty()
        self.refresh_seconds = refresh_seconds
        self._bar: Any = None
        self._start = 0.0
        self._last = 0.0
        self._epoch_start_step = 0
        self._steps_per_epoch: int | None = None

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = sys.stderr.isatty()

    @property
    def is_enabled(self) -> bool:
        return self._enabled

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if not self._enabled or not trainer.is_global_zero:
            return
        from tqdm import tqdm

        self._start = time.monotonic()
        self._limits = {
            "max_steps": trainer.max_steps,
            "max_time": _max_time_seconds(trainer),
            "max_epochs": trainer.max_epochs,
        }
        self._bar = tqdm(total=1000, file=sys.stderr, dynamic_ncols=True, leave=True, bar_format=_BAR)
        self._bar.set_description_str("training", refresh=False)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._epoch_start_step = trainer.global_step

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        done = trainer.global_step - self._epoch_start_step  # an epoch begun by a resume counts less: keep the most
        if done > 0:
            self._steps_per_epoch = max(self._steps_per_epoch or 0, done)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._bar is None:
            return
        now = time.monotonic()
        if now - self._last < self.refresh_seconds:
            return
        self._last = now
        self._draw(trainer, now)

    def _draw(self, trainer: Any, now: float) -> None:
        elapsed = now - self._start
        step = trainer.global_step
        fraction, limit = run_fraction(
            step, step - self._epoch_start_step, trainer.current_epoch, elapsed, self._limits, self._steps_per_epoch
        )
        loss = trainer.callback_metrics.get("train/loss") if trainer.callback_metrics else None
        epoch = trainer.current_epoch + 1
        if trainer.max_epochs and trainer.max_epochs > 0:
            epoch = min(epoch, trainer.max_epochs)  # after the last epoch Lightning counts one more
        parts = [f"training: step {step}", f"epoch {epoch}"]
        if loss is not None:
            parts.append(f"loss {float(loss):.3g}")
        if fraction:
            parts.append(f"{_clock(elapsed)} < {_clock(elapsed * (1 - fraction) / fraction)} left ({limit})")
            self._bar.n = round(1000 * fraction)
        else:
            parts.append(f"{_clock(elapsed)}, ETA after the first epoch")
        self._bar.set_description_str(", ".join(parts), refresh=False)
        self._bar.refresh()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self._bar is not None:
            self._draw(trainer, time.monotonic())
            self._bar.close()
            self._bar = None

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


_BAR = "{desc} |{bar}| {percentage:3.0f}%"


def use_run_progress_bar(trainer: Any) -> None:
    """Put :class:`RunProgressBar` in place of Lightning's default bar (kept off by
    ``--trainer.enable_progress_bar false``; another bar a config names, e.g. RichProgressBar, is kept)."""
    from lightning.pytorch.callbacks import TQDMProgressBar

    for i, callback in enumerate(trainer.callbacks):
        if type(callback) is TQDMProgressBar:
            trainer.callbacks[i] = RunProgressBar()
