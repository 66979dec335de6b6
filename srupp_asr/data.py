"""Training data: lhotse cut manifests in, padded batches of raw 16 kHz waveforms and token ids out.

Manifests are read with :mod:`srupp_asr.manifest` (checked line by line first).
:class:`ASRDataset` turns a batch of cuts (as a lhotse sampler yields them) into tensors, applying the on-the-fly
augmentations (speed perturbation, noise, reverberation) on the cuts before their audio is loaded;
:class:`ASRDataModule` wires manifests, the samplers of :mod:`srupp_asr.samplers` and data loaders for Lightning.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
from collections.abc import Iterator, Sequence

import lightning as L
import numpy as np
import torch
from lhotse import CutSet
from lhotse.dataset import CutMix

from srupp_asr.audio import SAMPLE_RATE, prepare_waveform
from srupp_asr.augment import ChannelAugment, SeededReverb
from srupp_asr.checks import check_int, check_number, config_options
from srupp_asr.errors import UserError
from srupp_asr.manifest import CUT_SUFFIXES, check_cuts_manifest, cut_text, load_cut_audio, load_cuts
from srupp_asr.samplers import (
    BucketingSampler,
    MaxDurationFilter,
    ResumableTrainingData,
    SeededBatch,
    duration_bins,
)
from srupp_asr.tokenizer import Tokenizer

log = logging.getLogger(__name__)

TOKEN_PAD = -1  # padding value of ``tokens``; never a real id


class ASRDataset(torch.utils.data.Dataset):
    """Map a lhotse batch of cuts to padded audio and token tensors (the sampler chooses the cuts).

    ``dataset[cuts]`` returns a dict: ``audio`` (B, S) float32 zero-padded (mono, clipped to [-1, 1] by
    :func:`srupp_asr.audio.prepare_waveform` as in transcription and the CMVN statistics), ``audio_lens`` (B,) int64,
    ``tokens`` (B, U) int64 padded with ``TOKEN_PAD`` (-1), ``token_lens`` (B,) int64, ``texts`` (normalised)
    and ``cut_ids``. A cut whose audio cannot be loaded is left out with a warning naming it; if no cut of the
    batch loads, B is 0 and the training step should skip the batch.

    Augmentations, when given, run on the cuts before any audio is read: speed perturbation (one factor of
    ``speed_perturb`` drawn per cut; 1.0 leaves it alone), noise from ``noise_cuts`` (a random stretch of a longer
    recording) mixed in with probability ``noise_prob`` at an SNR drawn from ``snr_range``, and reverberation with
    probability ``reverb_prob`` using impulse responses lhotse generates (:class:`srupp_asr.augment.SeededReverb`).
    Training batches come from :class:`srupp_asr.samplers.ResumableSampler` as :class:`SeededBatch` es whose seed
    depends on (sampler seed, rank, epoch, batch index) only, so their random choices do not depend on the
    DataLoader worker and a resumed run augments every batch exactly as the uninterrupted run did; other batches
    draw from a per-process generator seeded from torch's RNG. ``channel_augment`` (a dict of
    :class:`srupp_asr.augment.ChannelAugment` settings) then changes each loaded waveform: pitch, vocal tract
    length, microphone/loudspeaker response, codec. Augmented audio is loaded under :func:`reproducible_loading`:
    it does not depend on the process's global generators or thread count (so not on ``num_workers``), and
    loading it leaves those generators alone.
    """

    def __init__(
        self,
        tokenizer: str | os.PathLike | Tokenizer,
        speed_perturb: Sequence[float] | None = None,
        noise_cuts: CutSet | None = None,
        snr_range: tuple[float, float] = (10.0, 20.0),
        noise_prob: float = 0.5,
        reverb_prob: float = 0.0,
        channel_augment: dict | ChannelAugment | None = None,
    ) -> None:
        """Build the dataset; augmentations are off unless their arguments are given."""
        self.tokenizer = tokenizer if isinstance(tokenizer, Tokenizer) else Tokenizer(tokenizer)
        self.speed_perturb = tuple(float(f) for f in speed_perturb) if speed_perturb else ()
        if any(f <= 0 for f in self.speed_perturb):
            raise UserError(f"speed_perturb: factors must be positive, got {list(self.speed_perturb)}")
        self.noise_cuts = None
        if noise_cuts is not None:
            # Noise carries no transcript, and lhotse mixes only cuts of equal sampling rates.
            self.noise_cuts = noise_cuts.drop_supervisions().resample(SAMPLE_RATE).to_eager()
        self.snr_range = (float(snr_range[0]), float(snr_range[1]))
        self.noise_prob = noise_prob
        self.reverb_prob = reverb_prob
        if not isinstance(channel_augment, ChannelAugment):
            channel_augment = ChannelAugment.from_config(channel_augment)
        self.channel_augment = channel_augment if channel_augment is not None and channel_augment.active else None
        self._rng_pid: int | None = None

    @property
    def augments(self) -> bool:
        """Whether any augmentation is configured (without one, the dataset draws no random numbers)."""
        noise = self.noise_cuts is not None and self.noise_prob > 0
        return bool(self.speed_perturb) or noise or self.reverb_prob > 0 or self.channel_augment is not None

    def _random(self, seed: int | None = None) -> random.Random:
        """The per-process random generator (created lazily so that every DataLoader worker draws its own), seeded
        with ``seed`` when given, else, once per process, from torch's global generator."""
        if self._rng_pid == os.getpid():
            if seed is not None:
                self._rng.seed(seed)
            return self._rng
        self._rng = random.Random(int(torch.randint(0, 2**62, ())) if seed is None else seed)
        self._rng_pid = os.getpid()
        self._mix = None
        if self.noise_cuts is not None and self.noise_prob > 0:
            self._mix = CutMix(
                self.noise_cuts,
                snr=self.snr_range,
                p=self.noise_prob,
                pad_to_longest=False,
                preserve_id=True,
                seed=self._rng,
                # A noise recording longer than the cut contributes a random stretch of itself, not always its start.
                random_mix_offset=True,
            )
        self._reverb = None
        if self.reverb_prob > 0:
            self._reverb = SeededReverb(p=self.reverb_prob, randgen=self._rng, preserve_id=True)
        return self._rng

    def augment(self, cuts: CutSet) -> CutSet:
        """Apply the configured augmentations to a batch of cuts (no audio is read)."""
        if not self.augments:
            return cuts  # and no draw from torch's generator, which would shift the training run's dropout masks
        rng = self._random()
        if self.speed_perturb:
            perturbed = []
            for cut in cuts:
                factor = rng.choice(self.speed_perturb)
                perturbed.append(cut if factor == 1.0 else cut.perturb_speed(factor, affix_id=False))
            cuts = CutSet.from_cuts(perturbed)
        if self._reverb is not None:
            cuts = self._reverb(cuts)
        if self._mix is not None:
            cuts = self._mix(cuts)
        return cuts

    def __getitem__(self, cuts: CutSet | SeededBatch) -> dict:
        """Load, augment, tokenise and pad one batch of cuts (a :class:`SeededBatch` fixes its augmentation)."""
        if isinstance(cuts, SeededBatch):
            # The batch's own seed, not the process's stream: a resumed run augments it as the first run did.
            if self.augments:
                self._random(cuts.seed)
            cuts = cuts.cuts
        cuts = CutSet.from_cuts(c if c.sampling_rate == SAMPLE_RATE else c.resample(SAMPLE_RATE) for c in cuts)
        cuts = self.augment(cuts)
        if self.augments:
            # lhotse applies the augmentations as it loads the audio (see reproducible_loading): the audio then
            # depends on the batch alone, and training's own draws (dropout, SpecAugment) are not moved.
            with reproducible_loading(self._random().randrange(2**63)):
                audios, texts, ids = self._load(cuts)
        else:
            audios, texts, ids = self._load(cuts)
        tokens = [torch.tensor(self.tokenizer.encode(t), dtype=torch.int64) for t in texts]
        return {
            "audio": _pad(audios, 0.0, torch.float32),
            "audio_lens": torch.tensor([len(a) for a in audios], dtype=torch.int64),
            "tokens": _pad(tokens, TOKEN_PAD, torch.int64),
            "token_lens": torch.tensor([len(t) for t in tokens], dtype=torch.int64),
            "texts": texts,
            "cut_ids": ids,
        }

    def _load(self, cuts: CutSet) -> tuple[list[torch.Tensor], list[str], list[str]]:
        """The audio (mono float32), texts and ids of the cuts whose audio loads; the others are left out."""
        audios, texts, ids = [], [], []
        for cut in cuts:
            try:
                audio = load_cut_audio(cut)
            except UserError as err:  # lose the cut, not the epoch
                log.warning("skipping %s", err)
                continue
            # What transcribe and the CMVN statistics hear: mono, clipped to full scale as a 16-bit encoder would.
            audio = prepare_waveform(audio, cut.sampling_rate)
            if self.channel_augment is not None:  # seeded per cut from the batch's generator
                rng = np.random.default_rng(self._random().randrange(2**63))
                audio = self.channel_augment(audio, rng, cut.sampling_rate)
            audios.append(torch.from_numpy(audio))
            texts.append(cut_text(cut))
            ids.append(cut.id)
        return audios, texts, ids


@contextlib.contextmanager
def reproducible_loading(seed: int) -> Iterator[None]:
    """Within the block, the process's global generators (torch's CPU one, numpy's legacy one, Python's
    ``random``) start from ``seed`` and torch computes on one thread; after it, the generators are where they were
    before it and the thread count is back.

    lhotse applies augmentations as it loads the audio, and generating an impulse response both draws from torch's
    global generator and, on several threads, races (an ``index_put_`` with repeated indices: which write wins
    varies from call to call); resampling and mixing round differently on one thread than on several. On one thread
    (what a DataLoader worker has anyway) the audio is the same whatever ``num_workers`` and however often it is
    loaded. CUDA generators are left alone (``torch.manual_seed`` would reseed them too)."""
    torch_state, numpy_state, python_state = torch.get_rng_state(), np.random.get_state(), random.getstate()
    threads = torch.get_num_threads()
    torch.default_generator.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.set_rng_state(torch_state)
        np.random.set_state(numpy_state)
        random.setstate(python_state)


def _pad(seqs: list[torch.Tensor], value: float, dtype: torch.dtype) -> torch.Tensor:
    out = torch.full((len(seqs), max((len(s) for s in seqs), default=0)), value, dtype=dtype)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return out


class ASRDataModule(ResumableTrainingData, L.LightningDataModule):
    """Manifests, samplers and loaders for training and validation (LightningCLI maps its arguments to YAML).

    Training batches come from lhotse's ``DynamicBucketingSampler`` (as :class:`BucketingSampler`): cuts of similar
    duration are grouped into batches of at most ``max_duration`` seconds of audio, padding included. Validation
    uses the same sampler without shuffling.

    Multi-GPU: the samplers split batches between ranks themselves, so the Trainer must be built with
    ``use_distributed_sampler=False`` (LightningCLI: ``trainer.use_distributed_sampler: false``); otherwise
    Lightning would wrap them in a ``DistributedSampler``, which cannot work on lhotse samplers.

    Resuming (:class:`~srupp_asr.samplers.ResumableTrainingData`): the module's ``state_dict`` records the epoch and
    how many training batches of it were processed; a run resumed from a mid-epoch checkpoint continues the same
    epoch's shuffling order after those batches. Each epoch is shuffled differently (``seed`` + epoch).
    """

    def __init__(
        self,
        train_cuts: str | None,
        valid_cuts: str | None,
        tokenizer: str,
        max_duration: float = 200.0,
        num_buckets: int = 30,
        shuffle: bool = True,
        speed_perturb: Sequence[float] | None = (0.9, 1.0, 1.1),
        noise_cuts: str | None = None,
        snr_range: tuple[float, float] = (10.0, 20.0),
        noise_prob: float = 0.5,
        reverb_prob: float = 0.0,
        channel_augment: dict | None = None,
        num_workers: int = 2,
        seed: int = 0,
        max_cut_duration: float | None = 30.0,
        check_manifests: bool = True,
        audio_roots: Sequence[str] | None = None,
        allow_command_sources: bool = False,
    ) -> None:
        """Store the configuration; manifests are checked and opened in :meth:`setup`.

        ``check_manifests``: read every line of each manifest before training starts and stop at the first bad one
        (:func:`srupp_asr.manifest.check_cuts_manifest`); ``audio_roots``: the corpus directories audio files
        must lie in (None: anywhere); ``allow_command_sources``: accept lhotse ``command`` audio sources, which run a
        shell command per recording (off: a manifest from a stranger cannot run commands)."""
        super().__init__()
        self.save_hyperparameters()
        with config_options("data"):  # a bad value is a ConfigValueError naming data.<option>
            check_number("max_duration", max_duration, above=0.0)
            check_int("num_buckets", num_buckets)
            check_int("num_workers", num_workers, minimum=0)
        self.train_cuts_path = train_cuts
        self.valid_cuts_path = valid_cuts
        self.tokenizer_path = tokenizer
        self.max_duration = max_duration
        self.num_buckets = num_buckets
        self.shuffle = shuffle
        self.speed_perturb = list(speed_perturb) if speed_perturb else None
        self.noise_cuts_path = noise_cuts
        self.snr_range = tuple(snr_range)
        self.noise_prob = noise_prob
        self.reverb_prob = reverb_prob
        self.channel_augment = ChannelAugment.from_config(channel_augment)  # checked before training starts
        self.num_workers = num_workers
        self.seed = seed
        self.max_cut_duration = max_cut_duration
        self.check_manifests = check_manifests
        self.audio_roots = list(audio_roots) if audio_roots is not None else None
        self.allow_command_sources = allow_command_sources
        self.tokenizer: Tokenizer | None = None
        self.train_cuts: CutSet | None = None
        self.valid_cuts: CutSet | None = None

    def setup(self, stage: str | None = None) -> None:
        """Load the tokenizer and open the manifests the stage needs (lazily; read as batches are drawn)."""
        if self.tokenizer is None:
            self.tokenizer = Tokenizer(self.tokenizer_path)
        if stage in (None, "fit") and self.train_cuts_path and self.train_cuts is None:
            self.train_cuts = self._open(self.train_cuts_path)
            if self.noise_cuts_path:
                self._open(self.noise_cuts_path)
        if stage in (None, "fit", "validate") and self.valid_cuts_path and self.valid_cuts is None:
            self.valid_cuts = self._open(self.valid_cuts_path)

    def _open(self, path: str) -> CutSet:
        """A manifest, checked line by line first (unless ``check_manifests`` is off), opened lazily."""
        if self.check_manifests and str(path).endswith(CUT_SUFFIXES):
            count = check_cuts_manifest(path, self.audio_roots, self.allow_command_sources)
            log.info("%s: %d cuts checked", path, count)
        return load_cuts(path, lazy=True, check=False)

    def _distribution(self) -> dict:
        """world_size / rank for the samplers: the trainer's when there is one, else lhotse infers them."""
        trainer = self.trainer
        if trainer is None:
            return {}
        connector = getattr(trainer, "_accelerator_connector", None)
        if trainer.world_size > 1 and getattr(connector, "use_distributed_sampler", False):
            raise UserError(
                "trainer: use_distributed_sampler must be false with ASRDataModule (its lhotse samplers shard"
                " batches across ranks themselves)"
            )
        return {"world_size": trainer.world_size, "rank": trainer.global_rank}

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        """Shuffled, duration-bucketed, augmented training batches."""
        if self.train_cuts is None:
            self.setup("fit")
        if self.train_cuts is None:
            raise UserError("data: train_cuts is not set; training needs a cut manifest")
        cuts = self.train_cuts
        sampler = BucketingSampler(
            cuts,
            max_duration=self.max_duration,
            duration_bins=duration_bins(cuts, self.num_buckets),
            shuffle=self.shuffle,
            drop_last=False,
            seed=self.seed,
            **self._distribution(),
        )
        too_long = None
        if self.max_cut_duration is not None:
            too_long = MaxDurationFilter(self.max_cut_duration, str(self.train_cuts_path))
            sampler.filter(too_long)
        noise = load_cuts(self.noise_cuts_path) if self.noise_cuts_path else None
        dataset = ASRDataset(
            self.tokenizer,
            speed_perturb=self.speed_perturb,
            noise_cuts=noise,
            snr_range=self.snr_range,
            noise_prob=self.noise_prob,
            reverb_prob=self.reverb_prob,
            channel_augment=self.channel_augment,
        )
        epoch_done = too_long.epoch_done if too_long is not None else None
        return self._loader(dataset, self._resumable(sampler, epoch_done))

    def val_dataloader(self) -> torch.utils.data.DataLoader | list:
        """Validation batches: bucketed by duration, not shuffled, not augmented (none without valid_cuts)."""
        if self.valid_cuts is None:
            self.setup("validate")
        if self.valid_cuts is None:
            log.warning("data: valid_cuts is not set; validation is skipped")
            return []
        sampler = BucketingSampler(
            self.valid_cuts,
            max_duration=self.max_duration,
            duration_bins=duration_bins(self.valid_cuts, self.num_buckets),
            shuffle=False,
            drop_last=False,
            **self._distribution(),
        )
        return self._loader(ASRDataset(self.tokenizer), sampler)

    def _loader(self, dataset: ASRDataset, sampler: torch.utils.data.Sampler) -> torch.utils.data.DataLoader:
        # batch_size=None: the sampler yields whole batches (CutSets) and the dataset collates them itself.
        # generator: each new iterator (one per epoch) draws its base seed from the loader's own generator, not
        # from torch's global one, which the uninterrupted run would otherwise draw from between an epoch's last
        # step and the next epoch's first, and a run resumed from that last step's checkpoint would not.
        return torch.utils.data.DataLoader(
            dataset,
            sampler=sampler,
            batch_size=None,
            num_workers=self.num_workers,
            persistent_workers=False,
            generator=torch.Generator().manual_seed(self.seed),
        )
