"""What one training or validation step does: :class:`ASRLightningModule` wraps :class:`ASRModel` for Lightning.

Arguments are explicit (not one nested ``model`` dict) so that LightningCLI can show, check and override each
of them: ``--model.d_model 320``, ``--model.encoder_conf.num_layers 8``, ``--model.lr 0.002``. The network's
arguments are :class:`~srupp_asr.model.ASRModel`'s, with the same names and defaults, except ``vocab_size``,
which comes from the tokenizer. In a ``srupp-asr train`` YAML config (where ``tokenizer`` is not written
under ``model``: it is linked from ``data.tokenizer``)::

    model:
      cmvn: data/manifests/cmvn.json
      encoder: srupp
      encoder_conf: {num_layers: 10, attn_dim: 128}
      lr: 0.001

Logged metrics: ``train/loss``, ``train/loss_ctc``, ``train/loss_att``, ``train/acc``, ``train/lr``,
``train/nonfinite_skipped`` (updates skipped so far because the loss was NaN or infinite); ``valid/loss``,
``valid/loss_ctc``, ``valid/loss_att``, ``valid/acc`` and ``valid/wer`` (greedy-CTC word error rate in percent:
all word errors of the epoch over all reference words, across ranks).

Resuming (``--ckpt_path``): besides what Lightning restores, checkpoints carry the global random generators'
states (torch CPU and CUDA, numpy, Python ``random``), which dropout and SpecAugment draw from, so a run killed and
resumed from a mid-epoch checkpoint draws the same dropout and SpecAugment masks as the uninterrupted run (the data
module resumes the batch order, and the data set's augmentation depends on each batch's position only; with
``trainer.deterministic`` the weights then match exactly). Under DDP each rank's states are saved (the ranks' draws
differ, as their batches do) and each rank resumes from its own; a run resumed with another number of ranks
resumes every rank from rank 0's. A checkpoint written in the middle of a gradient accumulation cycle
(``trainer.accumulate_grad_batches``; a stop signal, or a validation between two micro-batches) also carries the
gradients accumulated so far, every rank's, which the resumed run starts from. The states are stored as tensors and
lists, so checkpoints still load with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import logging
import random
import re
from typing import Any, Literal

import jiwer
import lightning as L
import numpy as np
import torch

from srupp_asr.checks import check_int, check_number, config_options
from srupp_asr.errors import UserError
from srupp_asr.frontend import load_cmvn
from srupp_asr.graphs import GraphedLosses, ShapeBuckets
from srupp_asr.lightning_checkpoints import prepare_resume
from srupp_asr.model import ASRModel, ctc_frames_needed
from srupp_asr.model_dir import initial_weights
from srupp_asr.schedulers import OPTIMIZERS, NoamLR, build_optimizer
from srupp_asr.text import normalize_text
from srupp_asr.tokenizer import Tokenizer

log = logging.getLogger(__name__)

# lhotse's ids of the cut copies it pads the last round of a DDP epoch with (sampling/base.py mark_as_duplicate)
DUPLICATE_ID = re.compile(r"_dup\d+$")
# The batch entries transfer_batch_to_device leaves on the host, and the key of its host copy of the tokens.
HOST_KEYS = ("audio_lens", "token_lens")
HOST_TOKENS = "host_tokens"


def _graphed_losses(model: ASRModel, options: Any) -> GraphedLosses:
    """The :class:`~srupp_asr.graphs.GraphedLosses` of ``model.cuda_graphs`` (a dict: ``seconds``, ``tokens``,
    ``rows``, ``max_graphs``); a bad value is a one-line error naming the option."""
    known = {"seconds", "tokens", "rows", "max_graphs"}
    if not isinstance(options, dict) or not set(options) <= known:
        raise UserError(f"model.cuda_graphs must be a mapping of {', '.join(sorted(known))} (or {{}}), got {options!r}")
    options = dict(options)
    with config_options("model.cuda_graphs"):
        max_graphs = options.pop("max_graphs", 16)
        buckets = ShapeBuckets(**options)
        try:
            return GraphedLosses(model, buckets, max_graphs=max_graphs)
        except UserError as err:
            raise UserError(f"model.cuda_graphs: {err}") from None


class ASRLightningModule(L.LightningModule):
    """Joint CTC/attention training of an :class:`ASRModel`, with Noam LR schedule and greedy-CTC WER in validation."""

    def __init__(
        self,
        tokenizer: str,
        cmvn: str | None = None,
        n_mels: int = 80,
        d_model: int = 256,
        subsampling: int = 4,
        subsampling_channels: int | None = None,
        encoder: str = "srupp",
        encoder_conf: dict[str, Any] | None = None,
        decoder_conf: dict[str, Any] | None = None,
        ctc_weight: float = 0.3,
        lsm_weight: float = 0.1,
        specaugment: dict[str, Any] | None = {},  # noqa: B006 -- never mutated; {} = SpecAugment's defaults
        dither: float = 0.0,
        lr: float = 1e-3,
        weight_decay: float = 1e-6,
        warmup_steps: int = 25000,
        optimizer: Literal["adam", "adamw"] = "adam",
        max_consecutive_nonfinite: int = 100,
        init_from: str | None = None,
        cuda_graphs: dict[str, Any] | None = None,
    ) -> None:
        """``tokenizer``: sentencepiece model path; ``cmvn``: JSON stats from ``frontend.save_cmvn``; the
        network arguments are :class:`ASRModel`'s; ``lr`` is the Noam schedule's peak, reached at ``warmup_steps``;
        ``init_from``: a model directory or training checkpoint whose weights a new fit starts from (see
        :meth:`setup`); ``cuda_graphs``: train with the step's forward and backward in CUDA graphs
        (:mod:`srupp_asr.graphs`; SRU++, one device), a dict of :class:`~srupp_asr.graphs.ShapeBuckets`' edges
        (``seconds``, ``tokens``, ``rows``) and ``max_graphs``, ``{}`` for the defaults; None: no graphs. On a CPU
        the same padded computation runs without graphs."""
        super().__init__()
        self.save_hyperparameters()
        if optimizer not in OPTIMIZERS:
            raise UserError(f"model.optimizer: unknown optimizer {optimizer!r} (choose from {', '.join(OPTIMIZERS)})")
        with config_options("model"):  # a bad value is a ConfigValueError naming model.<option>
            check_training_options(lr, weight_decay, warmup_steps, max_consecutive_nonfinite)
            self.tokenizer = Tokenizer(tokenizer)
            self.model = ASRModel(
                vocab_size=self.tokenizer.vocab_size,
                n_mels=n_mels,
                d_model=d_model,
                subsampling=subsampling,
                subsampling_channels=subsampling_channels,
                encoder=encoder,
                encoder_conf=encoder_conf,
                decoder_conf=decoder_conf,
                ctc_weight=ctc_weight,
                lsm_weight=lsm_weight,
                specaugment=specaugment,
                dither=dither,
            )
        self._graphed: GraphedLosses | None = None
        if cuda_graphs is not None:
            self._graphed = _graphed_losses(self.model, cuda_graphs)
        if cmvn is not None:
            mean, std = load_cmvn(cmvn)
            try:
                self.model.set_cmvn(mean, std)
            except ValueError:
                detail = f"CMVN stats have {mean.numel()} dimensions, the model has n_mels={n_mels}"
                raise UserError(f"{cmvn}: {detail}") from None
        else:
            log.warning("model.cmvn is not set: training on un-normalised filterbank features")
        self.nonfinite_skipped = 0  # updates skipped over the whole run (kept in checkpoints)
        self._nonfinite_in_a_row = 0
        self._pending: torch.Tensor | None = None  # the device's non-finite counters not yet read (_guard_on_device)
        self._found_inf: torch.Tensor | None = None  # this update's skip flag on the device, over its micro-batches
        self._warned_unreachable = False  # the warning of _count_ctc_unreachable, once per process
        self._skip_backward = False
        self._wer_counts = [0, 0]  # word errors, reference words (this rank, this validation run)
        self._resumed_rng_states: dict[str, Any] | None = None
        self._resumed_gradients: dict[str, torch.Tensor] | None = None
        self._resumed_found_inf: float | None = None

    def setup(self, stage: str) -> None:
        """At the start of a fit with ``init_from``, load its weights (fine-tuning, or training an exported model
        further). Its CMVN stats come with them, since its weights were trained on features normalised with those;
        ``cmvn`` is then overridden. Resuming with ``--ckpt_path`` restores that checkpoint after this, so a resumed
        run goes on from its own weights. The optimizer and the LR schedule start afresh."""
        if stage != "fit" or not self.hparams.init_from:
            return
        source = self.hparams.init_from
        weights = initial_weights(source, self.model, self.tokenizer)
        if self.hparams.cmvn is not None:
            current = self.model.state_dict()
            if any(not torch.equal(weights[k], current[k]) for k in current if k.startswith("cmvn.")):
                log.warning("model.init_from %s: its CMVN stats replace model.cmvn's (%s)", source, self.hparams.cmvn)
        self.model.load_state_dict(weights)
        log.info("model.init_from: starting from the weights of %s", source)

    # ---------------------------------------------------------------- training

    def on_fit_start(self) -> None:
        """Refuse ``cuda_graphs`` under DDP (before any step), and say so when there is no GPU to record them on."""
        if self._graphed is None:
            return
        if self.trainer.world_size > 1:
            raise UserError("model.cuda_graphs: training on one device only (not under DDP)")
        if self.device.type != "cuda":
            log.warning("model.cuda_graphs: no CUDA device; the padded step runs without graphs")

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor | None:
        """Joint loss of one batch; a batch whose loss is not finite on any rank is skipped on every rank (by the
        optimizer on the device where it can: :meth:`_skips_on_device`)."""
        batch_size = batch["audio"].size(0)
        out = None
        if batch_size > 0:  # the dataset leaves out cuts whose audio fails to load, possibly all of them
            audio_lens, tokens, token_lens = batch["audio_lens"], batch["tokens"], batch["token_lens"]
            if self._graphed is not None:
                out = self._graphed(batch["audio"], audio_lens, tokens, token_lens)
                enc_lens = self.model.encoder_lengths(audio_lens)
            else:
                enc, enc_lens = self.model.encode(batch["audio"], audio_lens)
                if audio_lens.device.type == "cpu":  # kept on the host (transfer_batch_to_device): CTC reads them
                    enc_lens = self.model.encoder_lengths(audio_lens)
                out = self.model.losses(enc, enc_lens, tokens, token_lens)
            if self.model.ctc is not None:
                self._count_ctc_unreachable(enc_lens, batch.get(HOST_TOKENS, tokens), token_lens, batch_size)
        if self._skips_on_device():
            return self._guard_on_device(out, batch_size)
        # Every rank must take the same decision or DDP's gradient all-reduce would wait forever. The flags are read
        # back at once: the step's one host sync.
        empty, nonfinite = (x > 0 for x in self._batch_flags(out).tolist())
        if nonfinite:
            self._count_nonfinite()
        elif not empty:
            self._nonfinite_in_a_row = 0
        # Numbers are logged as host tensors: Lightning would copy a Python number to the device, blocking.
        skipped = torch.tensor(float(self.nonfinite_skipped))
        self.log("train/nonfinite_skipped", skipped, batch_size=max(batch_size, 1))
        if empty or nonfinite:
            return self._skip_update()
        self._log_training_metrics(out, batch_size)
        return out["loss"]

    def _batch_flags(self, out: dict[str, torch.Tensor | None] | None) -> torch.Tensor:
        """(empty, not finite) of this batch summed over the ranks, on the device: made there (no blocking copy
        from the host) and summed by a collective, which does not wait for the device either."""
        empty = torch.full((), float(out is None), device=self.device)
        nonfinite = torch.zeros((), device=self.device) if out is None else ~torch.isfinite(out["loss"].detach())
        return self.trainer.strategy.reduce(torch.stack([empty, nonfinite.float()]), reduce_op="sum")

    def _log_training_metrics(self, out: dict[str, torch.Tensor | None], batch_size: int) -> None:
        metrics = {f"train/{k}": v.detach() for k, v in out.items() if v is not None}
        metrics["train/lr"] = torch.tensor(float(self.trainer.optimizers[0].param_groups[0]["lr"]))
        # Not prog_bar=True: Lightning would read a progress-bar value back to the host after every batch (a sync
        # per step); srupp_asr.progress.RunProgressBar shows train/loss from the callback metrics twice a second.
        self.log("train/loss", metrics.pop("train/loss"), batch_size=batch_size)
        self.log_dict(metrics, batch_size=batch_size)

    # ------------------------------------------------- non-finite losses skipped on the device

    def _skips_on_device(self) -> bool:
        """Whether a non-finite loss can be skipped without the host reading it: the optimizer takes a ``found_inf``
        flag (fused Adam and AdamW, as on CUDA: its kernel then leaves the weights, moments and step count alone)
        and no GradScaler (fp16) sets a flag of its own."""
        optimizers = self.trainer.optimizers
        supports = len(optimizers) == 1 and getattr(optimizers[0], "_step_supports_amp_scaling", False)
        return supports and getattr(self.trainer.precision_plugin, "scaler", None) is None

    def _guard_on_device(self, out: dict[str, torch.Tensor | None] | None, batch_size: int) -> torch.Tensor | None:
        """The non-finite guard with nothing read back: the batch's flags (:meth:`_batch_flags`) become the
        optimizer's ``found_inf`` for this update, and the counters stay on the device until
        :meth:`_read_nonfinite`. Backward runs on a non-finite loss too; its gradients are never applied."""
        if out is None and self.trainer.world_size == 1:
            return None  # an empty batch: nothing to add to the update, and this process alone needs to know
        empty, nonfinite = (self._batch_flags(out) > 0).float().unbind()
        found_inf = torch.maximum(empty, nonfinite)
        if self._found_inf is not None:  # an earlier micro-batch of this update
            found_inf = torch.maximum(self._found_inf, found_inf)
        self._found_inf = found_inf
        self.trainer.optimizers[0].found_inf = found_inf
        # The run of non-finite losses: one more, unchanged by an empty batch, ended by a finite one.
        skipped, in_a_row, longest = self._pending_counters().unbind()
        in_a_row = nonfinite * (in_a_row + 1) + (1 - nonfinite) * empty * in_a_row
        self._pending = torch.stack([skipped + nonfinite, in_a_row, torch.maximum(longest, in_a_row)])
        self.log("train/nonfinite_skipped", skipped + nonfinite + self.nonfinite_skipped, batch_size=max(batch_size, 1))
        if out is None:  # an empty batch on this rank under DDP: zero gradients, so that the all-reduce completes
            return sum(p.reshape(-1)[:1].sum() for p in self.parameters() if p.requires_grad) * 0.0
        self._log_training_metrics(out, batch_size)
        return out["loss"]

    def _pending_counters(self) -> torch.Tensor:
        """(skipped, in a row, longest run) of the non-finite losses since the last read, on the device."""
        if self._pending is None or self._pending.device != self.device:
            # Fills, not torch.tensor([...]): that would be a blocking copy from the host.
            self._pending = torch.full((3,), float(self._nonfinite_in_a_row), device=self.device)
            self._pending[0] = 0.0
        return self._pending

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        """Lightning's step; then this update's ``found_inf`` is cleared for the next."""
        super().optimizer_step(*args, **kwargs)
        if self._found_inf is not None:
            self._found_inf = None
            del self.trainer.optimizers[0].found_inf

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Read the device's non-finite counters when Lightning logs (it reads the device then anyway)."""
        if self._pending is not None and (self.global_step % self.trainer.log_every_n_steps == 0):
            self._read_nonfinite()

    def on_train_epoch_end(self) -> None:
        self._read_nonfinite()

    def on_train_end(self) -> None:
        self._read_nonfinite()

    def _read_nonfinite(self) -> None:
        """Fold the device's counters into ``nonfinite_skipped`` (one read); warn of the updates skipped since the
        last read, and stop a run that has had ``max_consecutive_nonfinite`` in a row."""
        if self._pending is None:
            return
        skipped, in_a_row, longest = (int(x) for x in self._pending.tolist())
        self._pending = None
        self.nonfinite_skipped += skipped
        self._nonfinite_in_a_row = in_a_row
        if skipped:
            log.warning(
                "loss not finite in %d batches up to step %d: their updates were skipped (%d in total)",
                skipped,
                self.global_step,
                self.nonfinite_skipped,
            )
        self._check_divergence(longest)

    def _check_divergence(self, in_a_row: int) -> None:
        limit = self.hparams.max_consecutive_nonfinite
        if in_a_row >= limit:
            raise RuntimeError(
                f"the loss was not finite for {in_a_row} batches in a row"
                f" (model.max_consecutive_nonfinite={limit}); training has diverged. Lower model.lr or"
                " trainer.gradient_clip_val, raise model.warmup_steps, or check the data and the CMVN stats."
            )

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Lightning's transfer, except that a batch's ``audio_lens`` and ``token_lens`` stay on the host and a host
        copy of its ``tokens`` is kept (as ``host_tokens``): the lengths are all a step reads on the host (CTC's
        lengths, whether the batch is padded, the utterances CTC cannot emit), so it never waits for the device."""
        needed = (*HOST_KEYS, "tokens")
        if not isinstance(batch, dict) or not all(isinstance(batch.get(k), torch.Tensor) for k in needed):
            return super().transfer_batch_to_device(batch, device, dataloader_idx)
        rest = {k: v for k, v in batch.items() if k not in HOST_KEYS}
        moved = super().transfer_batch_to_device(rest, device, dataloader_idx)
        return {**moved, **{k: batch[k].cpu() for k in HOST_KEYS}, HOST_TOKENS: batch["tokens"].cpu()}

    def _count_ctc_unreachable(
        self, enc_lens: torch.Tensor, tokens: torch.Tensor, token_lens: torch.Tensor, batch_size: int
    ) -> None:
        """Log ``train/ctc_unreachable`` (summed per epoch): the utterances whose transcripts CTC cannot emit from
        their encoder frames, which then train the attention decoder only; warn the first time one comes."""
        # On the host when the batch's lengths and tokens are there (transfer_batch_to_device): no sync then.
        needed = ctc_frames_needed(tokens, token_lens)
        if enc_lens.device != needed.device:
            enc_lens = enc_lens.to(needed.device)
        unreachable = int((enc_lens < needed).sum())
        if unreachable and not self._warned_unreachable:
            self._warned_unreachable = True
            log.warning(
                "%d of %d utterances in a training batch have transcripts longer than CTC can emit from their "
                "encoder frames (subsampling x%d): they add nothing to the CTC loss (counted in "
                "train/ctc_unreachable); a smaller subsampling factor or a larger vocabulary makes fewer",
                unreachable,
                batch_size,
                self.model.subsampling.factor,
            )
        self.log(  # a device tensor made by a fill, not a blocking copy: summed across ranks at the epoch's end
            "train/ctc_unreachable",
            torch.full((), float(unreachable), device=self.device),
            on_step=False,
            on_epoch=True,
            reduce_fx="sum",
            sync_dist=True,
        )

    def _count_nonfinite(self) -> None:
        self.nonfinite_skipped += 1
        self._nonfinite_in_a_row += 1
        log.warning(
            "step %d: loss is not finite; update skipped (%d in a row, %d in total)",
            self.global_step,
            self._nonfinite_in_a_row,
            self.nonfinite_skipped,
        )
        self._check_divergence(self._nonfinite_in_a_row)

    def _skip_update(self) -> torch.Tensor | None:
        if self.trainer.world_size == 1:
            return None  # Lightning then skips backward and the optimizer step
        # DDP refuses None (a rank skipping alone would hang the others); every rank reached this point together,
        # so each returns a stand-in loss and `backward` clears the gradients instead of computing them: the
        # optimizer steps only parameters that have a gradient, so nothing changes, on any rank.
        self._skip_backward = True
        return torch.zeros((), device=self.device)

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Lightning's backward, left out for a batch that :meth:`training_step` skipped under DDP."""
        if not self._skip_backward:
            super().backward(loss, *args, **kwargs)
            return
        self._skip_backward = False
        if getattr(self.trainer.precision_plugin, "scaler", None) is not None:
            # fp16's GradScaler insists on seeing gradients; NaN ones make it skip the step (on every rank,
            # since gradients are all-reduced) exactly as for an overflow.
            params = [p for p in self.parameters() if p.requires_grad]
            super().backward(sum(p.reshape(-1)[0] for p in params) * float("nan"), *args, **kwargs)
        else:
            # With gradient accumulation, earlier micro-batches left gradients that only this backward would have
            # all-reduced; stepping on them would move each rank differently. Drop them on every rank.
            self.zero_grad(set_to_none=True)

    def configure_optimizers(self) -> dict[str, Any]:
        """Adam or AdamW (fused on CUDA) at peak ``lr`` with the Noam warm-up / inverse-sqrt schedule, stepped every
        update."""
        hp = self.hparams
        optimizer = build_optimizer(hp.optimizer, self.parameters(), hp.lr, hp.weight_decay)
        scheduler = NoamLR(optimizer, warmup_steps=hp.warmup_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep the skipped-update counters, the random generators' states (every rank's) and, in the middle of an
        accumulation cycle, the gradients accumulated so far (every rank's) across a resume. Lightning calls this on
        every rank, and the ranks gather what they hold here (rank 0 writes the file)."""
        self._read_nonfinite()
        checkpoint["nonfinite_skipped"] = self.nonfinite_skipped
        checkpoint["nonfinite_in_a_row"] = self._nonfinite_in_a_row
        states = rng_states()
        checkpoint["rng_states"] = states
        trainer = self._trainer
        world_size = trainer.world_size if trainer is not None else 1
        if world_size > 1 and not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            world_size = 1  # ranks that are not torch.distributed processes: each keeps its own
        if world_size > 1:
            checkpoint["rng_states_per_rank"] = self._gather(states, world_size)
        if self._in_accumulation_cycle():
            grads = {n: p.grad.detach().cpu().clone() for n, p in self.named_parameters() if p.grad is not None}
            checkpoint["accumulated_gradients"] = self._gather(grads, world_size) if world_size > 1 else [grads]
            if self._found_inf is not None:  # a non-finite micro-batch already in them: the update is to be skipped
                checkpoint["accumulated_found_inf"] = float(self._found_inf)

    @staticmethod
    def _gather(obj: Any, world_size: int) -> list[Any]:
        """``obj`` of every rank, in rank order (CPU tensors, lists and numbers only)."""
        gathered: list[Any] = [None] * world_size
        torch.distributed.all_gather_object(gathered, obj)
        return gathered

    def _in_accumulation_cycle(self) -> bool:
        """Whether a fit is between two micro-batches of one optimizer step (gradients accumulated, not yet used)."""
        trainer = self._trainer
        if trainer is None or trainer.accumulate_grad_batches <= 1 or trainer.state.fn != "fit":
            return False
        loop = trainer.fit_loop.epoch_loop
        return loop.batch_progress.current.ready > 0 and loop._should_accumulate()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore the skipped-update counters; keep the random states (this rank's) and any accumulated gradients
        for the first step of a resumed fit."""
        self.nonfinite_skipped = int(checkpoint.get("nonfinite_skipped", 0))
        self._nonfinite_in_a_row = int(checkpoint.get("nonfinite_in_a_row", 0))
        if self._trainer is None:  # load_from_checkpoint, not a resumed fit: it must not touch the RNGs
            return
        rank, world_size = self.trainer.global_rank, self.trainer.world_size
        per_rank = checkpoint.get("rng_states_per_rank")
        same_world = isinstance(per_rank, list) and len(per_rank) == world_size
        if per_rank is not None and not same_world:
            log.warning(
                "the checkpoint was written by %d processes, this run has %d: every rank resumes from rank 0's random"
                " states, so the run will not match an uninterrupted one exactly",
                len(per_rank),
                world_size,
            )
        self._resumed_rng_states = per_rank[rank] if same_world else checkpoint.get("rng_states")
        grads = checkpoint.get("accumulated_gradients")
        if grads is not None:
            if len(grads) == world_size:
                self._resumed_gradients = grads[rank]
                self._resumed_found_inf = checkpoint.get("accumulated_found_inf")
            else:
                log.warning(
                    "the checkpoint was written in the middle of a gradient accumulation cycle by %d processes; this"
                    " run has %d and starts that cycle's accumulated gradients from zero",
                    len(grads),
                    world_size,
                )
        prepare_resume(checkpoint)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """Before the first step of a resumed fit, set the random generators to their checkpointed states and put
        back the gradients a checkpoint written in mid-accumulation holds."""
        # Not in on_load_checkpoint: between loading and this point the resumed run builds its data loaders and
        # prefetches batches, which may draw from the global generators where the uninterrupted run, past its
        # checkpoint, drew nothing. (The loaders' iterators draw their seeds from their own generator: see
        # ASRDataModule._loader; the data set keeps its draws off the global generators.)
        if self._resumed_rng_states is not None:
            set_rng_states(self._resumed_rng_states)
            self._resumed_rng_states = None
        if self._resumed_gradients is not None:
            # Lightning zeroes gradients at a cycle's first micro-batch only, so these are added to, as they were.
            params = dict(self.named_parameters())
            for name, grad in self._resumed_gradients.items():
                param = params[name]
                param.grad = grad.to(device=param.device, dtype=param.dtype).clone()
            self._resumed_gradients = None
            if self._resumed_found_inf and self._skips_on_device():  # they hold a non-finite micro-batch's
                self._found_inf = torch.ones((), device=self.device)
                self.trainer.optimizers[0].found_inf = self._found_inf
            self._resumed_found_inf = None

    # ---------------------------------------------------------------- validation

    def on_validation_epoch_start(self) -> None:
        """Reset the WER counts of this validation run."""
        self._wer_counts = [0, 0]

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        """Losses and accuracy of one batch; greedy-CTC word errors added to the run's counts."""
        batch_size = batch["audio"].size(0)
        if batch_size == 0:
            return
        enc, enc_lens = self.model.encode(batch["audio"], batch["audio_lens"])
        out = self.model.losses(enc, enc_lens, batch["tokens"], batch["token_lens"])
        metrics = {f"valid/{k}": v for k, v in out.items() if v is not None}
        self.log_dict(metrics, batch_size=batch_size, sync_dist=True)
        if self.model.ctc is None:
            return  # an attention-only model: no greedy CTC hypotheses to score
        hyps = self.model.ctc_greedy_encoded(enc, enc_lens)
        for ids, ref, cut_id in zip(hyps, batch["texts"], batch["cut_ids"], strict=True):
            if DUPLICATE_ID.search(cut_id):
                continue  # a copy lhotse gives a rank left without cuts in the last DDP round: counted once
            errors, words = word_errors(ref, self.tokenizer.decode(ids))
            self._wer_counts[0] += errors
            self._wer_counts[1] += words

    def on_validation_epoch_end(self) -> None:
        """Log ``valid/wer``: total errors over total reference words, summed over every rank."""
        counts = torch.tensor(self._wer_counts, dtype=torch.float64, device=self.device)
        errors, words = self.trainer.strategy.reduce(counts, reduce_op="sum").tolist()
        if words > 0:
            # Already summed over ranks, so every rank holds the same value; sync_dist only averages equal values
            # (and tells Lightning the metric is global, which ModelCheckpoint on every rank relies on).
            self.log("valid/wer", 100.0 * errors / words, prog_bar=True, sync_dist=True)


def check_training_options(lr: float, weight_decay: float, warmup_steps: int, max_consecutive_nonfinite: int) -> None:
    """A ConfigValueError naming the first of the optimisation arguments out of range."""
    check_number("lr", lr, above=0.0)
    check_number("weight_decay", weight_decay, at_least=0.0)
    check_int("warmup_steps", warmup_steps)
    check_int("max_consecutive_nonfinite", max_consecutive_nonfinite)


def rng_states() -> dict[str, Any]:
    """The global random generators' states as tensors and plain lists (safe for ``torch.load(weights_only=True)``)."""
    _, keys, pos, has_gauss, cached_gaussian = np.random.get_state()  # numpy's legacy MT19937 global state
    version, internal, gauss_next = random.getstate()
    states: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": [torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached_gaussian)],
        "python": [version, list(internal), gauss_next],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore generator states written by :func:`rng_states` (CUDA ones only where there are CUDA devices)."""
    torch.set_rng_state(states["torch"])
    keys, pos, has_gauss, cached_gaussian = states["numpy"]
    np.random.set_state(("MT19937", keys.numpy().astype(np.uint32), pos, has_gauss, cached_gaussian))
    version, internal, gauss_next = states["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"][: torch.cuda.device_count()])


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(substitutions + deletions + insertions, reference words) between the normalised texts."""
    ref, hyp = normalize_text(reference), normalize_text(hypothesis)
    if not ref or not hyp:  # nothing to align: every word of the other side is an error
        return len(hyp.split()) + len(ref.split()), len(ref.split())
    out = jiwer.process_words(ref, hyp)
    return out.substitutions + out.deletions + out.insertions, out.substitutions + out.deletions + out.hits
