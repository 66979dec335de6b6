"""The Lightning side of training checkpoints: written atomically, resumed exactly.

:class:`AtomicCheckpointIO` is the Lightning ``CheckpointIO`` plugin ``srupp-asr train`` always uses. A checkpoint
is first written to a hidden ``.NAME.<random>.partial`` file in the checkpoint directory, flushed to disk
(``fsync``) and only then renamed over ``NAME``, and the directory entry is synced too. A run killed at any moment
(``kill -9``, power loss, a full disk) therefore leaves every ``*.ckpt`` either as it was or complete, never half
written; the leftover ``.partial`` file matches no pattern Lightning (``--ckpt_path last``) or ``srupp-asr average``
looks for, and the next save in that directory removes it. Lightning's own writer builds the file in the system
temporary directory and moves it, which is a copy (not atomic) when that is another file system.

:class:`ResumableModelCheckpoint` is the ``ModelCheckpoint`` ``srupp-asr train`` configures (its ``checkpoint`` block):
Lightning's, except that a resumed run knows the monitored metric's value at the checkpoint it resumes from.
Lightning defers a step checkpoint (``every_n_train_steps``) until the monitored metric (``valid/loss``) has been
logged, and a resumed run has logged none until its first validation: resumed in mid-epoch, it saved nothing
until then (or, without another validation, only a ``last`` at the end), so a second kill lost everything since
the resume.

:func:`prepare_resume` mends Lightning's saved loop counters where a training loader without a length (lhotse's)
leaves them wrong, so that a resumed run goes on exactly where the checkpoint was written.

The plugin's ``load_checkpoint`` reads with :func:`srupp_asr.checkpoints.load_checkpoint` (``weights_only``, one-line
errors). Only training imports this module: inference reads checkpoints through :mod:`srupp_asr.checkpoints`.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint

from srupp_asr.checkpoints import PARTIAL_SUFFIX, load_checkpoint, remove_partials
from srupp_asr.errors import UserError, first_line
from srupp_asr.fileio import atomic_output, fsync_directory

MONITOR_VALUE_KEY = "monitor_value"  # in a ModelCheckpoint's saved state: the monitored metric's value at the save


class ResumableModelCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` that also saves, and restores on resume, the monitored metric's latest value.

    Its state key is Lightning's (``ModelCheckpoint{...}``), so checkpoints of either class resume and ``average``
    reads both; its step checkpoints go on after a resume (see the module's docstring).
    """

    _resumed_value: torch.Tensor | None = None

    def _generate_state_key(self, **kwargs: Any) -> str:
        return f"ModelCheckpoint{kwargs!r}"

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        """Store the monitored metric's current value (the last validation's) beside Lightning's state."""
        state = checkpoint.get("callbacks", {}).get(self.state_key)
        value = self._monitor_candidates(trainer).get(self.monitor) if self.monitor else None
        if isinstance(state, dict) and isinstance(value, torch.Tensor):
            state[MONITOR_VALUE_KEY] = value.detach().cpu().clone()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        value = state_dict.get(MONITOR_VALUE_KEY)
        same = state_dict.get("monitor") == self.monitor and state_dict.get("dirpath", self.dirpath) == self.dirpath
        self._resumed_value = value if same and isinstance(value, torch.Tensor) else None

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        """The checkpoint resumed from was saved at its step: do not save that step again (the resumed run
        re-enters the end of an epoch whose last step it holds, and would write ``...-v1.ckpt`` beside it)."""
        self._last_global_step_saved = int(checkpoint.get("global_step", 0))

    def _monitor_candidates(self, trainer) -> dict[str, torch.Tensor]:
        """Lightning's, plus the resumed value of the monitored metric until this run logs it."""
        candidates = super()._monitor_candidates(trainer)
        if self.monitor and self.monitor not in candidates and self._resumed_value is not None:
            candidates[self.monitor] = self._resumed_value
        return candidates


class StateFileCheckpoint(ResumableModelCheckpoint):
    """A checkpoint callback that keeps one file, ``path`` (any name), written after every validation and, through
    :class:`~srupp_asr.train.StopCheckpoint`, at a stop: ``srupp-asr train-lm``'s ``OUT_DIR.train.pt``. (Lightning's
    own writes a ``last`` checkpoint only beside a top-k one.)"""

    def __init__(self, path: str | os.PathLike) -> None:
        path = Path(path)
        super().__init__(dirpath=path.parent, save_top_k=0, save_last=True, save_on_train_epoch_end=False)
        self._enable_version_counter = False  # one file, rewritten
        self.CHECKPOINT_NAME_LAST, self.FILE_EXTENSION = path.stem, path.suffix

    def on_validation_end(self, trainer, pl_module) -> None:
        if not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))


class AtomicCheckpointIO(CheckpointIO):
    """Lightning ``CheckpointIO``: atomic, fsynced checkpoint files; ``weights_only`` loading with one-line errors."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None) -> None:
        """Write ``checkpoint`` to ``path``: all of it or, should the process die first, nothing."""
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        path = Path(path)
        try:
            with atomic_output(path, temp_suffix=PARTIAL_SUFFIX) as tmp:
                remove_partials(path.parent, keep=tmp)
                self._dump(checkpoint, tmp)
        except OSError as err:  # a full disk, a quota, a read-only folder
            kept = "the previous one is kept" if path.exists() else "nothing was written"
            reason = err.strerror or first_line(err)
            raise UserError(f"{path}: cannot write the checkpoint ({reason}); {kept}") from None
        fsync_directory(path.parent)

    def _dump(self, checkpoint: dict[str, Any], tmp: Path) -> None:
        """Serialise ``checkpoint`` into the temporary file ``tmp`` (the step a test interrupts)."""
        buffer = io.BytesIO()  # serialised first (as Lightning does), so a full disk is a plain OSError from write()
        torch.save(checkpoint, buffer)
        with open(tmp, "wb") as f:
            f.write(buffer.getbuffer())

    def load_checkpoint(
        self, path: str | os.PathLike, map_location: Callable | Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Load with ``weights_only=True`` whatever the caller asks (a resumed checkpoint may come from anyone)."""
        if not Path(path).exists():
            raise FileNotFoundError(f"Checkpoint file not found: {path}")  # Lightning's contract for a missing file
        return load_checkpoint(path, map_location=map_location, mmap=False, lightning=False)

    def remove_checkpoint(self, path: str | os.PathLike) -> None:
        """Delete a checkpoint (ModelCheckpoint dropping one out of its top k)."""
        with contextlib.suppress(FileNotFoundError):
            Path(path).unlink()


def prepare_resume(checkpoint: dict, data_module: str = "ASRDataModule") -> None:
    """Make Lightning resume a run whose data module (its class name ``data_module``:
    :class:`~srupp_asr.data.ASRDataModule`, :class:`~srupp_asr.lm_lightning.LMDataModule`; a
    :class:`~srupp_asr.samplers.ResumableTrainingData`) draws training batches without a length exactly where the
    checkpoint was written (call it before Lightning restores its loops from ``checkpoint``, e.g. in
    ``LightningModule.on_load_checkpoint``).

    The training loader has no length (lhotse's batches are made on the fly; the LM's follow suit), and Lightning's
    loop counters then go wrong in two cases, both mended here from the data module's own record (the epoch its
    sampler was in and the batches of it done):

    - a checkpoint of an epoch's last training batch is marked ``is_last_batch``, and resuming, Lightning counts
      that epoch as finished and then finds the next one finished too, before it has drawn a batch: the resumed run
      would train on epoch e + 2's batches where the uninterrupted run trained on e + 1's. With the flag cleared
      Lightning re-enters epoch e, :class:`~srupp_asr.samplers.ResumableSampler` skips its batches (all of them), the
      epoch's end hooks run (they had not when the checkpoint was written) and epoch e + 1 follows as it did
      uninterrupted;
    - a checkpoint written when training ended in mid-epoch (``max_steps``, ``max_time``) counts that epoch as
      completed: resumed with a larger budget, Lightning would go on with the next epoch and the rest of this one
      would never be trained. Its completed-epoch count is set back to the epoch the sampler was in.

    And one more: a checkpoint written after an epoch's end was processed (at the epoch-end save, or as training
    ended on the epoch's last batch) makes Lightning start the next epoch, but, restarting, it keeps the finished
    epoch's in-epoch counts (it would reset them only if it knew the epoch's length): the next epoch's batches were
    numbered from 6 on instead of 0, gradient accumulation would count its micro-batches from there, and the
    data module's record of the batches done in that epoch (which a later checkpoint stores) was too large by the
    finished epoch's length, so a run stopped again in that epoch and resumed skipped the rest of it. The counts
    are set to a new epoch's (zero), as Lightning sets them when an epoch starts.
    """
    data = checkpoint.get(data_module)
    fit = checkpoint.get("loops", {}).get("fit_loop", {})
    progress = fit.get("epoch_loop.batch_progress")
    if not data or not isinstance(progress, dict):
        return
    if progress.get("is_last_batch"):
        progress["is_last_batch"] = False
        if fit.get("epoch_progress", {}).get("current", {}).get("processed", 0) > int(data["epoch"]):
            _start_next_epoch(fit)
        return
    epochs = fit.get("epoch_progress", {})
    ahead = epochs.get("current", {}).get("completed", 0) - int(data["epoch"])
    if ahead > 0 and int(data["batches_done"]) > 0:  # stopped in mid-epoch, counted as completed
        for counts in (epochs["current"], epochs["total"]):
            counts["completed"] -= ahead


def _start_next_epoch(fit: dict) -> None:
    """Set a fit loop's saved in-epoch counts to those of an epoch about to start (what Lightning's
    ``_TrainingEpochLoop.reset`` does when it starts an epoch without restarting)."""

    def zero(counts: dict | None) -> None:
        for key in counts or {}:
            counts[key] = 0

    for key in ("epoch_loop.batch_progress", "epoch_loop.scheduler_progress"):
        zero(fit.get(key, {}).get("current"))
    for part in fit.get("epoch_loop.automatic_optimization.optim_progress", {}).get("optimizer", {}).values():
        zero(part.get("current"))
    zero(fit.get("epoch_loop.val_loop.batch_progress", {}).get("total"))
