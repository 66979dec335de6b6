"""What one step of LM training does, for Lightning: :class:`LMLightningModule` wraps :class:`~srupp_asr.lm.SRUppLM`,
:class:`LMDataModule` serves tokenised sentences.

``srupp-asr train-lm`` (:mod:`srupp_asr.lm_train`) trains them with a Lightning ``Trainer`` and the ASR trainer's
own pieces (:mod:`srupp_asr.train`, :mod:`srupp_asr.lightning_checkpoints`): atomic checkpoints, the stop on SIGTERM
or Ctrl-C after a step, exact mid-epoch resume.

- Training batches: sentences grouped by length into batches of at most ``batch_tokens`` padded tokens
  (:func:`make_batches`), the batches shuffled per epoch (``seed`` and the epoch: :class:`ShuffledBatches`) and
  drawn through :class:`~srupp_asr.samplers.ResumableSampler`, so a run resumed in mid-epoch goes on with the same
  epoch's order after the batches already done. The loader has no length (as the ASR one): Lightning validates at
  each epoch's last batch and, with ``val_check_interval`` N, after every N batches of an epoch.
- A step: the summed negative log-likelihood of the batch's tokens (``<sos/eos>`` at the end included) over their
  number; Adam with the Noam schedule, stepped every update. Gradient clipping is the trainer's.
- Validation: the per-token perplexity of the validation sentences, ``exp(sum of NLL / tokens)`` summed in
  float64; logged as ``valid/ppl``. In a fit, when it is the lowest so far the LM is written to ``out_dir``
  (:func:`srupp_asr.lm.save_lm`, atomically).
- Checkpoints carry, besides Lightning's state, the random generators' states (dropout draws from them; set back
  before the first step of a resumed fit), the best perplexity so far and ``train_lm``: the settings a resumed run
  must share (:mod:`srupp_asr.lm_train` compares them before anything is read).
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Iterator, Sequence
from typing import Any

import lightning as L
import torch

from srupp_asr.lightning_checkpoints import prepare_resume
from srupp_asr.lightning_module import rng_states, set_rng_states
from srupp_asr.lm import SRUppLM, save_lm
from srupp_asr.samplers import ResumableTrainingData, SeededBatch
from srupp_asr.schedulers import NoamLR, build_optimizer

log = logging.getLogger("srupp_asr.lm_train")  # the command's log lines, under its name

SETTINGS_KEY = "train_lm"  # in a checkpoint: what a resumed run must share with the saved one, and the best so far


def make_batches(sentences: Sequence[Sequence[int]], batch_tokens: int) -> list[list[int]]:
    """Indices of ``sentences`` grouped by length so that a batch holds at most ``batch_tokens`` padded tokens
    (``<sos/eos>`` included; a sentence longer than that is a batch by itself)."""
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        width = len(sentences[i]) + 1  # sorted: the newest sentence is the longest of the batch
        if current and width * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def token_count(sentences: Sequence[Sequence[int]]) -> int:
    """Tokens an LM predicts for ``sentences``: each one's pieces and its ``<sos/eos>``."""
    return sum(len(y) + 1 for y in sentences)


class ShuffledBatches:
    """The batches of :func:`make_batches` in an order drawn from ``seed`` and the epoch (``set_epoch``): the
    sampler :class:`~srupp_asr.samplers.ResumableSampler` wraps (one process: rank 0)."""

    rank = 0

    def __init__(self, batches: Sequence[list[int]], seed: int) -> None:
        self.batches, self.seed, self.epoch = list(batches), seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        order = list(range(len(self.batches)))
        random.Random(self.seed * 100003 + self.epoch).shuffle(order)
        return (self.batches[i] for i in order)


class _Sentences(torch.utils.data.Dataset):
    """Token id lists by index; a sampler's batch (a list of indices, or a SeededBatch of one) -> its sentences."""

    def __init__(self, sentences: Sequence[Sequence[int]]) -> None:
        self.sentences = sentences

    def __getitem__(self, batch: SeededBatch | list[int]) -> list[Sequence[int]]:
        indices = batch.cuts if isinstance(batch, SeededBatch) else batch
        return [self.sentences[i] for i in indices]


class LMDataModule(ResumableTrainingData, L.LightningDataModule):
    """Training and validation sentences (token ids) in batches of at most ``batch_tokens`` padded tokens; training
    shuffled per epoch and resumable in mid-epoch (:class:`~srupp_asr.samplers.ResumableTrainingData`)."""

    def __init__(
        self, train: Sequence[Sequence[int]], valid: Sequence[Sequence[int]], batch_tokens: int, seed: int
    ) -> None:
        super().__init__()
        self.train, self.valid, self.batch_tokens, self.seed = train, valid, batch_tokens, seed

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        sampler = ShuffledBatches(make_batches(self.train, self.batch_tokens), self.seed)
        return self._loader(self.train, self._resumable(sampler))

    def val_dataloader(self) -> torch.utils.data.DataLoader:
        return self._loader(self.valid, make_batches(self.valid, self.batch_tokens))

    def _loader(self, sentences, sampler) -> torch.utils.data.DataLoader:
        # batch_size=None: the sampler yields whole batches; the loader's own generator keeps each new iterator's
        # seed draw off torch's global one, which dropout draws from (see ASRDataModule._loader).
        return torch.utils.data.DataLoader(
            _Sentences(sentences),
            sampler=sampler,
            batch_size=None,
            collate_fn=lambda batch: batch,
            generator=torch.Generator().manual_seed(self.seed),
        )


class LMLightningModule(L.LightningModule):
    """One SRU++ LM (``lm_config``: :class:`~srupp_asr.lm.SRUppLM`'s arguments) trained with Adam and the Noam
    schedule; writes the LM to ``out_dir`` with ``tokenizer`` whenever validation finds the best perplexity so far.

    ``settings``: what a resumed run must share with this one (stored in checkpoints under :data:`SETTINGS_KEY`);
    ``log_every``: a log line with the training perplexity every that many steps (0: none)."""

    def __init__(
        self,
        lm_config: dict[str, Any],
        lr: float,
        warmup_steps: int,
        weight_decay: float,
        out_dir: str,
        tokenizer: str,
        settings: dict[str, Any] | None = None,
        log_every: int = 100,
    ) -> None:
        super().__init__()
        self.lm = SRUppLM(**lm_config)
        self.lr, self.warmup_steps, self.weight_decay = lr, warmup_steps, weight_decay
        self.out_dir, self.tokenizer_path = out_dir, tokenizer
        self.settings = dict(settings or {})
        self.log_every = log_every
        self.best = math.inf
        self.best_reset = False  # True: a resumed run forgets the saved best perplexity (its LM directory is gone)
        self._valid = [0.0, 0]  # this validation's summed NLL and tokens
        self._train = [0.0, 0]  # the same for the training steps since the last log line
        self._resumed_rng_states: dict[str, Any] | None = None

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = build_optimizer("adam", self.parameters(), self.lr, self.weight_decay)
        scheduler = NoamLR(optimizer, self.warmup_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """Before the first step of a resumed fit, set the random generators to their checkpointed states (not at
        load: the resumed run builds its loaders in between)."""
        if self._resumed_rng_states is not None:
            set_rng_states(self._resumed_rng_states)
            self._resumed_rng_states = None

    def training_step(self, batch: list[Sequence[int]], batch_idx: int) -> torch.Tensor:
        tokens = token_count(batch)
        loss = self.lm.sentence_nll(batch).sum() / tokens
        self._train[0] += float(loss.detach()) * tokens
        self._train[1] += tokens
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = self.trainer.global_step
        if self.log_every and step % self.log_every == 0 and self._train[1]:
            lr = self.trainer.lr_scheduler_configs[0].scheduler.get_last_lr()[0]
            log.info(
                "train-lm: epoch %d step %d train ppl %.2f lr %.2e",
                self.current_epoch,
                step,
                math.exp(self._train[0] / self._train[1]),
                lr,
            )
            self._train = [0.0, 0]

    def on_validation_epoch_start(self) -> None:
        self._valid = [0.0, 0]

    def validation_step(self, batch: list[Sequence[int]], batch_idx: int) -> None:
        self._valid[0] += float(self.lm.sentence_nll(batch).double().sum())
        self._valid[1] += token_count(batch)

    def on_validation_epoch_end(self) -> None:
        """The perplexity, logged; in a fit, the LM written when it is the best so far."""
        if self.trainer.sanity_checking:
            return
        ppl = math.exp(self._valid[0] / max(self._valid[1], 1))
        self.log("valid/ppl", ppl)
        if self.trainer.state.fn != "fit":
            return
        improved = ppl < self.best
        if improved:
            self.best = ppl
            save_lm(self.lm, self.tokenizer_path, self.out_dir)
        log.info(
            "train-lm: epoch %d step %d valid ppl %.2f%s",
            self.current_epoch,
            self.trainer.global_step,
            ppl,
            f" (best; wrote {self.out_dir})" if improved else f" (best {self.best:.2f})",
        )

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["rng_states"] = rng_states()
        checkpoint[SETTINGS_KEY] = {"settings": dict(self.settings), "config": dict(self.lm.config), "best": self.best}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        saved = checkpoint.get(SETTINGS_KEY, {})
        self.best = float(saved.get("best", math.inf)) if not self.best_reset else math.inf
        if self._trainer is not None:
            self._resumed_rng_states = checkpoint.get("rng_states")
            prepare_resume(checkpoint, LMDataModule.__qualname__)
