"""CUDA graphs of the training step: the model's forward and backward recorded once per batch shape, then replayed.

On a GPU the SRU++ training step is launch-bound (docs/design.md, "Open": the GPU busy 29 ms of a 61-72 ms step at
the LibriSpeech shape): the host spends the step launching some 1,500 kernels one by one. A CUDA graph launches a
recorded sequence of kernels in one call, but only at the shapes and memory addresses it was recorded with. So
:class:`GraphedLosses` computes :meth:`ASRModel.forward <srupp_asr.model.ASRModel.forward>`'s losses this way:

* the batch is padded up to the edges of :class:`ShapeBuckets`: its audio to a multiple of ``seconds``, its
  transcripts to a multiple of ``tokens`` pieces, its rows to a multiple of ``rows`` (empty utterances with empty
  transcripts), so that the shapes a run meets repeat (the sampler already groups utterances of like duration);
* per padded shape, :class:`_Core` (Fbank, CMVN, SpecAugment, subsampling, SRU++ encoder, CTC head, attention
  decoder and its label-smoothed loss: everything but CTC's loss) is recorded, forward and backward, by
  ``torch.cuda.make_graphed_callables`` the first time and replayed after; the graphs share one memory pool, and
  the least recently used is dropped beyond ``max_graphs``;
* CTC's loss runs eagerly on the graph's log-probabilities: PyTorch's CUDA CTC reads its lengths on the host, and a
  graph would replay the lengths it was recorded with.

The padding changes no number beyond rounding (random draws aside: SpecAugment and dropout draw for the padded
shape, so their masks differ from an unpadded step's, as they would with another seed): padded samples, frames and
tokens are masked as a batch's shorter utterances always are, the empty rows add nothing to the sums, and the sums
are divided by the real rows (tests/test_graphs.py checks the losses and gradients against
:class:`~srupp_asr.model.ASRModel` on the CPU, where :class:`GraphedLosses` runs the same padded computation without
graphs). The core reads nothing back to the host (tests/test_graphs.py counts), which recording requires. Dropout
and SpecAugment draw from the CUDA generator, which graphs advance at each replay. The SRU++ encoder only: the
Conformer's BatchNorm and the BLSTM's packing read lengths on the host.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from srupp_asr.audio import SAMPLE_RATE
from srupp_asr.checks import check_int, check_number
from srupp_asr.decoder import IGNORE_ID, add_sos_eos
from srupp_asr.errors import UserError
from srupp_asr.model import SOS_EOS_ID, ASRModel
from srupp_asr.sru import SRUppEncoder

WARMUP_ITERS = 3  # make_graphed_callables' default: forward and backward run this often before recording


@dataclass(frozen=True)
class ShapeBuckets:
    """The edges a batch is padded up to: audio to a multiple of ``seconds``, transcripts to a multiple of
    ``tokens`` pieces, rows to a multiple of ``rows``. Coarser edges mean fewer shapes (fewer graphs to record and
    keep) and more padding (more work per step)."""

    seconds: float = 1.0
    tokens: int = 16
    rows: int = 8

    def __post_init__(self) -> None:
        check_number("seconds", self.seconds, above=0.0)
        check_int("tokens", self.tokens)
        check_int("rows", self.rows)

    def shape(self, rows: int, samples: int, tokens: int) -> tuple[int, int, int]:
        """(rows, samples, tokens) of a batch -> the same rounded up to the edges."""
        step = max(1, round(self.seconds * SAMPLE_RATE))
        return _round_up(rows, self.rows), _round_up(max(samples, 1), step), _round_up(tokens, self.tokens)


def _round_up(n: int, multiple: int) -> int:
    return math.ceil(n / multiple) * multiple


class _Core(nn.Module):
    """The part of the loss a graph can hold: padded device tensors in, ``(CTC log-probabilities, attention loss
    over the padded rows, accuracy)`` out (the parts the model has), with nothing read back to the host."""

    def __init__(self, model: ASRModel) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        audio: torch.Tensor,
        audio_lens: torch.Tensor,
        tokens: torch.Tensor,
        token_lens: torch.Tensor,
        real_rows: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        model = self.model
        enc, enc_lens = model.encode(audio, audio_lens, padded=True)
        outputs: tuple[torch.Tensor, ...] = ()
        if model.ctc is not None:
            outputs += (model.ctc_log_probs(enc),)
        if model.decoder is not None:
            ys_in, ys_out, _ = add_sos_eos(tokens, token_lens, SOS_EOS_ID)
            # An empty row's transcript is empty, but add_sos_eos still gives it an eos to predict: ignore it.
            ys_out = ys_out.masked_fill(~real_rows[:, None], IGNORE_ID)
            outputs += model.attention_loss(enc, enc_lens, ys_in, ys_out)
        return outputs


class GraphedLosses:
    """``losses(audio, audio_lens, tokens, token_lens)``: :meth:`ASRModel.forward <srupp_asr.model.ASRModel.forward>`'s
    dict, computed on the batch padded to ``buckets`` with the core in CUDA graphs (see the module docstring).

    Graphs are recorded and replayed when the batch is on a CUDA device and the model is training; otherwise the same
    padded computation runs eagerly. The lengths may stay on the host, as a training batch's do."""

    def __init__(
        self,
        model: ASRModel,
        buckets: ShapeBuckets | None = None,
        max_graphs: int = 16,
    ) -> None:
        if not isinstance(model.encoder, SRUppEncoder):
            raise UserError(
                f"CUDA graphs of the training step need the srupp encoder, not {type(model.encoder).__name__} "
                "(its lengths are read on the host)"
            )
        self.model = model
        self.buckets = buckets if buckets is not None else ShapeBuckets()
        self.max_graphs = check_int("max_graphs", max_graphs)
        self.recorded = 0  # graphs recorded so far (each costs WARMUP_ITERS + 1 steps of time)
        self._cores: collections.OrderedDict[tuple, nn.Module] = collections.OrderedDict()
        self._pool: Any = None
        self._eager = _Core(model)

    def __call__(
        self, audio: torch.Tensor, audio_lens: torch.Tensor, tokens: torch.Tensor, token_lens: torch.Tensor
    ) -> dict[str, torch.Tensor | None]:
        batch = audio.size(0)
        rows, samples, units = self.buckets.shape(batch, audio.size(1), tokens.size(1))
        device = audio.device
        args = (
            F.pad(audio, (0, samples - audio.size(1), 0, rows - batch)),
            _padded_rows(audio_lens, rows, device),
            F.pad(tokens, (0, units - tokens.size(1), 0, rows - batch), value=IGNORE_ID),
            _padded_rows(token_lens, rows, device),
            torch.arange(rows, device=device) < batch,
        )
        graphed = device.type == "cuda" and self.model.training
        outputs = list(self._graphed_core(args) if graphed else self._eager(*args))
        loss_ctc = loss_att = acc = None
        if self.model.ctc is not None:
            log_probs = outputs.pop(0)[:batch]
            loss_ctc = self.model.ctc_loss(log_probs, self.model.encoder_lengths(audio_lens), tokens, token_lens)
        if self.model.decoder is not None:
            # The core divided the summed loss by the padded rows. A graph's outputs are overwritten at its next
            # replay: what leaves here (and may be logged later) is a new tensor.
            loss_att, acc = outputs[0] * (rows / batch), outputs[1].clone()
        return self.model.joint_loss(loss_ctc, loss_att, acc)

    def _graphed_core(self, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """The core of this shape, recorded the first time the shape is met (with the autocast in force)."""
        device_type = args[0].device.type
        autocast = torch.is_autocast_enabled(device_type)
        dtype = torch.get_autocast_dtype(device_type)
        key = (*(tuple(a.shape) for a in args), autocast, dtype)
        core = self._cores.get(key)
        if core is None:
            if len(self._cores) >= self.max_graphs:
                self._cores.popitem(last=False)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            # A new wrapper per shape: make_graphed_callables replaces the forward of the module it is given.
            core = _Core(self.model)
            # Recording refuses autocast's weight-cast cache (a cached cast would be freed after the step).
            with torch.autocast(device_type, dtype=dtype, enabled=autocast, cache_enabled=False):
                core = torch.cuda.make_graphed_callables(
                    core,
                    tuple(a.clone() for a in args),
                    num_warmup_iters=WARMUP_ITERS,
                    allow_unused_input=True,
                    pool=self._pool,
                )
            self._cores[key] = core
            self.recorded += 1
        else:
            self._cores.move_to_end(key)
        return core(*args)


def _padded_rows(lengths: torch.Tensor, rows: int, device: torch.device) -> torch.Tensor:
    """(B,) lengths, on ``device`` (a host tensor copied without blocking), with zeros for the empty rows."""
    lengths = lengths.to(device, non_blocking=lengths.device.type == "cpu")
    return F.pad(lengths, (0, rows - lengths.numel()))
