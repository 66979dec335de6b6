"""Samplers of training batches: lhotse's duration bucketing kept to a padded-duration budget, resumable mid-epoch,
each batch carrying a seed for its augmentation.

:class:`BucketingSampler` groups cuts of similar duration into batches of at most ``max_duration`` seconds, padding
included (:func:`duration_bins` places the buckets); :class:`ResumableSampler` wraps it, follows the trainer's epoch,
skips the batches a resumed run already saw and yields :class:`SeededBatch` es whose seed depends only on where the
batch sits in the run (:func:`batch_seed`); :class:`MaxDurationFilter` drops cuts that are too long, counting them.
:mod:`srupp_asr.data` builds them for the DataModule.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import NamedTuple

import torch
from lhotse import CutSet
from lhotse.cut import Cut
from lhotse.dataset import DynamicBucketingSampler

log = logging.getLogger(__name__)

_BINS_ESTIMATE_CUTS = 10000  # lhotse's default number of cuts read to place the bucket boundaries


class SeededBatch(NamedTuple):
    """A batch of cuts with the seed of its augmentation, derived from where it sits in the run."""

    cuts: CutSet
    seed: int


def batch_seed(base: int, rank: int, epoch: int, index: int) -> int:
    """A seed for batch ``index`` of ``epoch`` on ``rank`` (deterministic, distinct per position)."""
    seed = 0
    for part in (base, rank, epoch, index):
        seed = (seed * 1_000_003 + part) % 2**63
    return seed


class ResumableSampler(torch.utils.data.Sampler):
    """A lhotse sampler that follows the trainer's epoch and can skip the batches a resumed run already saw.

    Lightning creates the training iterator before it calls ``set_epoch``, so after a resume the first epoch
    would be shuffled as epoch 0; reading the epoch from ``epoch_fn`` when iteration starts avoids that.
    """

    def __init__(
        self,
        sampler: BucketingSampler,
        epoch_fn: Callable[[], int] | None = None,
        epoch_done: Callable[[int, int], None] | None = None,
    ) -> None:
        """Wrap ``sampler``; ``epoch_fn()`` (optional) gives the epoch to use when iteration starts, and
        ``epoch_done(epoch, rank)`` (optional) is called when an iteration has gone through the whole epoch."""
        super().__init__()
        self.sampler = sampler
        self.epoch_fn = epoch_fn
        self.epoch_done = epoch_done
        self._skip: tuple[int, int] | None = None  # (epoch, batches to skip)
        self._iterating: int | None = None  # the epoch of the iteration under way (set_epoch may change the next)

    @property
    def epoch(self) -> int:
        """The epoch the wrapped sampler shuffles for."""
        return self.sampler.epoch

    @property
    def iterating_epoch(self) -> int:
        """The epoch of the iteration under way (or the last one); :attr:`epoch` when none has started."""
        return self.epoch if self._iterating is None else self._iterating

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (its shuffling order) of the next iteration."""
        self.sampler.set_epoch(epoch)

    def skip_batches(self, epoch: int, batches: int) -> None:
        """On the next iteration of ``epoch``, leave out its first ``batches`` batches (a resumed epoch)."""
        self._skip = (epoch, batches)
        self.set_epoch(epoch)

    def __iter__(self) -> Iterator[SeededBatch]:
        if self.epoch_fn is not None:
            self.set_epoch(self.epoch_fn())
        batches = iter(self.sampler)
        self._iterating = current = self.epoch
        index = 0
        if self._skip is not None:
            epoch, n = self._skip
            self._skip = None
            if epoch == current and n > 0:
                log.info("resuming epoch %d after %d batches", epoch, n)
                for _ in range(n):
                    if next(batches, None) is None:
                        return
                index = n
        # Not ``yield from``: a lhotse sampler is its own iterator and calling iter() on it again restarts it.
        while (batch := next(batches, None)) is not None:
            yield SeededBatch(batch, batch_seed(self.sampler.seed, self.sampler.rank, current, index))
            index += 1
        if self.epoch_done is not None:
            self.epoch_done(current, self.sampler.rank)


class ResumableTrainingData:
    """What a LightningDataModule whose training batches come from a :class:`ResumableSampler` needs to resume in
    mid-epoch (mixed in before ``LightningDataModule``: :class:`~srupp_asr.data.ASRDataModule`,
    :class:`~srupp_asr.lm_lightning.LMDataModule`).

    Its ``state_dict`` (stored in Lightning checkpoints under the module's class name) records the epoch being
    iterated and how many of its training batches were processed; a resumed run's next training iteration of that
    epoch skips them. The sampler reads the epoch from the trainer when an iteration starts (:meth:`_trainer_epoch`).
    """

    trainer: object | None
    _train_sampler: ResumableSampler | None = None
    _resume: dict | None = None

    def _trainer_epoch(self) -> int:
        # The epoch Lightning is in (``trainer.current_epoch``), read when an iteration starts. Not the count
        # Lightning passes to ``set_epoch``: that one is ahead after a resume from a checkpoint written at a
        # ``max_steps``/``max_time`` stop in mid-epoch (the epoch was counted as processed, not completed), and the
        # resumed run would draw the next epoch's batches for the rest of this one.
        return self.trainer.fit_loop.epoch_progress.current.completed

    def _resumable(self, sampler, epoch_done: Callable[[int, int], None] | None = None) -> ResumableSampler:
        """``sampler`` wrapped in a :class:`ResumableSampler` that follows the trainer's epoch and skips what a
        resumed checkpoint had done (the one this module trains from)."""
        epoch_fn = self._trainer_epoch if self.trainer is not None else None
        self._train_sampler = ResumableSampler(sampler, epoch_fn=epoch_fn, epoch_done=epoch_done)
        if self._resume is not None:
            self._train_sampler.skip_batches(self._resume["epoch"], self._resume["batches_done"])
            self._resume = None
        return self._train_sampler

    def state_dict(self) -> dict:
        """Where training stands in the current epoch (saved in Lightning checkpoints)."""
        trainer = self.trainer
        if trainer is None or self._train_sampler is None:
            return {}
        # The epoch being iterated, not the trainer's count: Lightning counts an epoch as processed before its
        # end-of-epoch checkpoints (and those of a ``max_steps``/``max_time`` stop in mid-epoch) are written.
        return {
            "epoch": self._train_sampler.iterating_epoch,
            "batches_done": trainer.fit_loop.epoch_loop.batch_progress.current.processed,
        }

    def load_state_dict(self, state_dict: dict) -> None:
        """Resume: the next training iteration of the saved epoch skips the batches already processed."""
        if state_dict:
            self._resume = {"epoch": int(state_dict["epoch"]), "batches_done": int(state_dict["batches_done"])}
            if self._train_sampler is not None:
                self._train_sampler.skip_batches(self._resume["epoch"], self._resume["batches_done"])
                self._resume = None


def padded_duration(cuts: Iterable[Cut]) -> float:
    """Seconds of audio a batch of ``cuts`` takes once padded: the number of cuts times the longest one (what lhotse's
    ``max_duration`` limits)."""
    durations = [cut.duration for cut in cuts]
    return len(durations) * max(durations, default=0.0)


class BucketingSampler(DynamicBucketingSampler):
    """lhotse's ``DynamicBucketingSampler`` whose batches keep to ``max_duration`` counting padding
    (:func:`padded_duration`), except a single cut longer than that, which is a batch of its own.

    lhotse adds the cut that crosses the limit to the batch it is filling (lhotse issue #1590): where a bucket spans
    a wide range of durations (the last one, or any bucket of a small corpus) a batch of a 1 s and a 50 s cut came
    out under ``max_duration=8`` (100 s padded). Such a batch is split here into the cuts before that one, which
    keep to the limit, and that cut, next. The split happens before the ranks take their share of a round of
    batches, so under DDP every rank still sees the same sequence and as many batches as the others."""

    def __iter__(self) -> BucketingSampler:
        """Start an epoch (lhotse's sampler is its own iterator)."""
        self._held: deque[CutSet] = deque()
        return super().__iter__()

    def _next_batch(self) -> CutSet:
        """The next batch of the whole run (lhotse's ``__next__`` then picks this rank's of each round)."""
        if self._held:
            return self._held.popleft()
        batch = super()._next_batch()
        if len(batch) > 1 and padded_duration(batch) > self.max_duration:
            cuts = list(batch)  # in the order lhotse added them: the last one crossed the limit
            self._held.append(CutSet.from_cuts(cuts[-1:]))
            return CutSet.from_cuts(cuts[:-1])
        return batch


def duration_bins(cuts: CutSet, wanted: int) -> list[float]:
    """Bucket boundaries (seconds) for ``wanted`` buckets (at most one per cut), placed as lhotse places them (on
    the first ``_BINS_ESTIMATE_CUTS`` cuts). Where lhotse would place none (one bucket: lhotse asserts on that, or
    warns "Mean of empty slice" at every epoch), a boundary above the longest cut makes the one bucket."""
    from lhotse.dataset.sampling.dynamic_bucketing import estimate_duration_buckets

    sample = list(islice(cuts, _BINS_ESTIMATE_CUTS))
    buckets = min(wanted, len(sample))
    bins = estimate_duration_buckets(sample, num_buckets=buckets) if buckets >= 2 else []
    return bins or [max((c.duration for c in sample), default=0.0) + 1.0]


class MaxDurationFilter:
    """Sampler filter: drop cuts longer than ``limit`` seconds, naming the first few in the log; :meth:`epoch_done`
    logs how many an epoch dropped."""

    def __init__(self, limit: float, manifest: str, show: int = 10) -> None:
        self.limit, self.manifest, self.show, self.dropped = limit, manifest, show, 0
        self.dropped_this_epoch = 0
        self.seconds_this_epoch = 0.0

    def __call__(self, cut: Cut) -> bool:
        if cut.duration <= self.limit:
            return True
        self.dropped += 1
        self.dropped_this_epoch += 1
        self.seconds_this_epoch += cut.duration
        if self.dropped <= self.show:
            more = "; further ones are counted at the epoch's end" if self.dropped == self.show else ""
            log.warning(
                "%s: dropping cut %s (%.1f s > max_cut_duration %.1f s)%s",
                self.manifest,
                cut.id,
                cut.duration,
                self.limit,
                more,
            )
        return False

    def epoch_done(self, epoch: int, rank: int) -> None:
        """Log (on rank 0: every rank's sampler sees every cut) the cuts the epoch ``epoch`` dropped, and start
        counting afresh."""
        if self.dropped_this_epoch and rank == 0:
            log.warning(
                "%s: epoch %d dropped %d cuts (%.1f h) longer than max_cut_duration %.1f s",
                self.manifest,
                epoch,
                self.dropped_this_epoch,
                self.seconds_this_epoch / 3600,
                self.limit,
            )
        self.dropped_this_epoch, self.seconds_this_epoch = 0, 0.0
