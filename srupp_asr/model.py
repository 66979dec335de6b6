"""The speech recognition network alone: raw 16 kHz audio in, CTC and attention-decoder losses out.

``ASRModel`` is what inference loads. Its constructor takes plain config values only (they are written
to the ``config.yaml`` of an exported model), and it owns its frontend, so training, evaluation and
transcription compute the same features::

    audio (B, S) -> Fbank -> GlobalCMVN -> SpecAugment (training only) -> Conv2dSubsampling
        -> encoder (srupp | conformer | blstm) -> CTC head Linear(vocab)  ;  TransformerDecoder

The loss is ``ctc_weight * CTC + (1 - ctc_weight) * label-smoothed CE``, each summed over an utterance
and averaged over the batch (ESPnet's normalisation). As in ESPnet, ``ctc_weight=1`` builds no decoder
and ``ctc_weight=0`` no CTC head, so every parameter receives a gradient (DDP needs that).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from srupp_asr.checks import check_choice, check_keywords, check_number, config_options
from srupp_asr.decoder import IGNORE_ID, LabelSmoothingLoss, TransformerDecoder, add_sos_eos
from srupp_asr.encoders import ENCODER_NAMES, build_encoder
from srupp_asr.frontend import Fbank, GlobalCMVN, SpecAugment, num_frames
from srupp_asr.subsampling import Conv2dSubsampling, fewest_frames, subsampled_length
from srupp_asr.tokenizer import Tokenizer

BLANK_ID = Tokenizer.blank_id
SOS_EOS_ID = Tokenizer.sos_eos_id
# Conv2dSubsampling's arguments under the names ASRModel's config gives them.
SUBSAMPLING_OPTIONS = {"in_features": "n_mels", "factor": "subsampling", "channels": "subsampling_channels"}


class ASRModel(nn.Module):
    """Frontend + subsampling + encoder with a CTC head and a Transformer attention decoder."""

    def __init__(
        self,
        vocab_size: int,
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
    ) -> None:
        super().__init__()
        check_number("ctc_weight", ctc_weight, at_least=0.0, at_most=1.0)
        check_choice("encoder", encoder, ENCODER_NAMES)
        if vocab_size <= SOS_EOS_ID:
            raise ValueError(f"vocab_size must exceed the special ids (0-{SOS_EOS_ID}), got {vocab_size}")
        # The constructor arguments, as given: what an exported model's config.yaml holds.
        self.config: dict[str, Any] = {
            "vocab_size": vocab_size,
            "n_mels": n_mels,
            "d_model": d_model,
            "subsampling": subsampling,
            "subsampling_channels": subsampling_channels,
            "encoder": encoder,
            "encoder_conf": dict(encoder_conf or {}),
            "decoder_conf": dict(decoder_conf or {}),
            "ctc_weight": ctc_weight,
            "lsm_weight": lsm_weight,
            "specaugment": None if specaugment is None else dict(specaugment),
            "dither": dither,
        }
        self.vocab_size = vocab_size
        self.ctc_weight = ctc_weight
        # Each part checks its own arguments; a bad one is a ConfigValueError under the name this config gives it.
        self.fbank = Fbank(dither=dither, n_mels=n_mels)
        self.cmvn = GlobalCMVN(num_features=n_mels)
        with config_options("specaugment"):
            self.specaugment = _build(SpecAugment, specaugment) if specaugment is not None else None
        with config_options(names=SUBSAMPLING_OPTIONS):
            self.subsampling = Conv2dSubsampling(n_mels, d_model, subsampling, channels=subsampling_channels)
        with config_options("encoder_conf"):
            # The encoder's width defaults to the subsampling's, so no projection sits between them.
            self.encoder = build_encoder(encoder, d_model, **{"d_model": d_model, **(encoder_conf or {})})
        enc_dim = self.encoder.output_size
        self.ctc = nn.Linear(enc_dim, vocab_size) if ctc_weight > 0.0 else None
        if ctc_weight < 1.0:
            with config_options("decoder_conf"):
                self.decoder = _build(TransformerDecoder, decoder_conf, vocab_size, memory_dim=enc_dim)
            with config_options(names={"smoothing": "lsm_weight"}):
                self.att_loss = LabelSmoothingLoss(vocab_size, smoothing=lsm_weight)
        else:
            self.decoder = None
            self.att_loss = None
        # The dtype :meth:`encode` runs the encoder in under autocast (``--compute-type bfloat16`` sets it, for
        # inference; :mod:`srupp_asr.compute_types`); None: the caller's precision (training's own autocast).
        self.encoder_autocast: torch.dtype | None = None

    def set_cmvn(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        """Load global CMVN stats (from :func:`srupp_asr.frontend.load_cmvn`) into the model's buffers."""
        self.cmvn.set_stats(mean, std)

    @property
    def frame_shift(self) -> float:
        """Seconds per encoder frame: the filterbank's frame shift times the subsampling factor (0.04 s at x4)."""
        return self.fbank.frame_shift * self.subsampling.factor

    def num_params(self) -> int:
        """Number of parameters (elements), shared ones counted once."""
        return sum(p.numel() for p in self.parameters())

    def encode(
        self, audio: torch.Tensor, audio_lens: torch.Tensor, padded: bool | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, S) 16 kHz waveforms and (B,) sample counts -> ((B, T', D) encoder output, (B,) frame counts), T' >= 1.

        The frame counts are on ``audio``'s device. ``audio_lens`` may stay on the host (CPU) while ``audio`` is on an
        accelerator, as a training batch's do (see ``ASRLightningModule.transfer_batch_to_device``): the encoder then
        learns on the host whether the batch is padded, and the host never waits for the device here.

        ``padded`` (SRU++ only): whether any utterance is shorter than the batch, when the caller knows; then the
        encoder does not read the lengths to learn it (a CUDA graph cannot read them: :mod:`srupp_asr.graphs`).

        With :attr:`encoder_autocast` set, the encoder runs under that dtype's autocast and its output is float32."""
        if self.encoder_autocast is None:
            return self._encode(audio, audio_lens, padded)
        with torch.autocast(audio.device.type, dtype=self.encoder_autocast):
            enc, lens = self._encode(audio, audio_lens, padded)
        return enc.float(), lens

    def _encode(
        self, audio: torch.Tensor, audio_lens: torch.Tensor, padded: bool | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        feats, lens = self.fbank(audio, audio_lens)
        feats = self.cmvn(feats, lens)
        if self.specaugment is not None:
            feats = self.specaugment(feats, lens)
        # A batch too short for one subsampled frame (every utterance under ~85 ms at x4) is padded up to one frame
        # that every length excludes: an empty time axis would stop F.ctc_loss, torchaudio's attention and LSTM
        # packing, and would leave the subsampling and encoder parameters without a gradient (DDP waits for them).
        shortfall = fewest_frames(self.subsampling.factor) - feats.shape[1]
        if shortfall > 0:
            feats = F.pad(feats, (0, 0, 0, shortfall))
        x, lens = self.subsampling(feats, lens)
        # The same counts, on the host when the batch's are (the encoders read them there for free).
        lengths = self.encoder_lengths(audio_lens) if _on_host(audio_lens) else lens
        enc, _ = self.encoder(x, lengths) if padded is None else self.encoder(x, lengths, padded=padded)
        return enc, lens

    def encoder_lengths(self, audio_lens: torch.Tensor) -> torch.Tensor:
        """(B,) sample counts -> (B,) encoder frame counts, computed where ``audio_lens`` lies (the counts
        :meth:`encode` gives: Fbank frames, then the subsampling's)."""
        return subsampled_length(num_frames(audio_lens), self.subsampling.factor)

    def ctc_log_probs(self, enc: torch.Tensor) -> torch.Tensor:
        """(B, T', D) encoder output -> (B, T', V) float32 CTC log-probabilities."""
        if self.ctc is None:
            raise RuntimeError("this model has no CTC head (ctc_weight=0)")
        return self.ctc(enc).float().log_softmax(-1)

    def forward(
        self, audio: torch.Tensor, audio_lens: torch.Tensor, tokens: torch.Tensor, token_lens: torch.Tensor
    ) -> dict[str, torch.Tensor | None]:
        """Joint loss on a batch: dict(loss, loss_ctc, loss_att, acc); the parts a model lacks are None.

        The lengths may stay on the host while the audio and tokens are on an accelerator (no host sync then)."""
        enc, enc_lens = self.encode(audio, audio_lens)
        if _on_host(audio_lens):
            enc_lens = self.encoder_lengths(audio_lens)  # CTC reads its lengths on the host
        return self.losses(enc, enc_lens, tokens, token_lens)

    def losses(
        self, enc: torch.Tensor, enc_lens: torch.Tensor, tokens: torch.Tensor, token_lens: torch.Tensor
    ) -> dict[str, torch.Tensor | None]:
        """:meth:`forward` from an :meth:`encode` output (so validation can decode the same encoding).

        ``enc_lens`` and ``token_lens`` may be on the host (CPU) with ``enc`` and ``tokens`` on an accelerator: CUDA's
        CTC reads its lengths on the host, so host lengths spare it a blocking copy of each (a host sync); the
        decoder's masks get a copy that does not block."""
        loss_ctc = loss_att = acc = None
        if self.ctc is not None:
            loss_ctc = self.ctc_loss(self.ctc_log_probs(enc), enc_lens, tokens, token_lens)
        if self.decoder is not None:
            enc_lens = enc_lens.to(enc.device, non_blocking=enc_lens.device.type == "cpu")
            token_lens = token_lens.to(tokens.device, non_blocking=token_lens.device.type == "cpu")
            ys_in, ys_out, _ = add_sos_eos(tokens, token_lens, SOS_EOS_ID)
            loss_att, acc = self.attention_loss(enc, enc_lens, ys_in, ys_out)
        return self.joint_loss(loss_ctc, loss_att, acc)

    def joint_loss(
        self, loss_ctc: torch.Tensor | None, loss_att: torch.Tensor | None, acc: torch.Tensor | None
    ) -> dict[str, torch.Tensor | None]:
        """The dict :meth:`losses` returns, from its parts: ``ctc_weight`` * CTC + (1 - ``ctc_weight``) * attention."""
        if loss_ctc is None:
            loss = loss_att
        elif loss_att is None:
            loss = loss_ctc
        else:
            loss = self.ctc_weight * loss_ctc + (1.0 - self.ctc_weight) * loss_att
        return {"loss": loss, "loss_ctc": loss_ctc, "loss_att": loss_att, "acc": acc}

    def ctc_loss(
        self, log_probs: torch.Tensor, enc_lens: torch.Tensor, tokens: torch.Tensor, token_lens: torch.Tensor
    ) -> torch.Tensor:
        """CTC of :meth:`ctc_log_probs` ``(B, T', V)``, summed per utterance and averaged over the ``B`` rows."""
        targets = tokens.masked_fill(tokens == IGNORE_ID, BLANK_ID)  # padding past token_lens is never read
        # An utterance whose transcript cannot fit its frames has an infinite loss; zero_infinity drops it
        # from the gradient instead of turning the whole batch into NaN. ctc_loss wants (T', B, V).
        total = F.ctc_loss(
            log_probs.transpose(0, 1),
            targets,
            enc_lens,
            token_lens,
            blank=BLANK_ID,
            reduction="sum",
            zero_infinity=True,
        )
        return total / tokens.size(0)

    def attention_loss(
        self, enc: torch.Tensor, enc_lens: torch.Tensor, ys_in: torch.Tensor, ys_out: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(label-smoothed loss summed per utterance and divided by the ``B`` rows, token accuracy) of the decoder
        teacher-forced on :func:`~srupp_asr.decoder.add_sos_eos`'s ``ys_in`` against ``ys_out``, over ``enc``."""
        logits = self.decoder(enc, enc_lens, ys_in, None)  # the decoder needs no ys_in lengths (causal masks)
        loss = self.att_loss(logits, ys_out)
        keep = ys_out != IGNORE_ID
        correct = (logits.argmax(-1) == ys_out) & keep
        acc = correct.sum().float() / keep.sum().clamp(min=1)
        return loss, acc.detach()

    @torch.no_grad()
    def ctc_greedy(self, audio: torch.Tensor, audio_lens: torch.Tensor) -> list[list[int]]:
        """Best-path CTC decoding: per utterance, the argmax tokens with repeats collapsed and blanks dropped."""
        return self.ctc_greedy_encoded(*self.encode(audio, audio_lens))

    @torch.no_grad()
    def ctc_greedy_encoded(self, enc: torch.Tensor, enc_lens: torch.Tensor) -> list[list[int]]:
        """:meth:`ctc_greedy` from an :meth:`encode` output."""
        return collapse_ctc_paths(self.ctc_log_probs(enc).argmax(-1), enc_lens)


def _on_host(lengths: torch.Tensor) -> bool:
    """Whether ``lengths`` lie on the host (reading them makes no accelerator wait; on a CPU run, always)."""
    return lengths.device.type == "cpu"


def _build(cls: type[nn.Module], conf: dict[str, Any] | None, *args: Any, **internal: Any) -> nn.Module:
    """``cls(*args, **conf, **internal)``, refusing a key of the config block ``conf`` that ``cls`` does not take
    (or that the model sets itself: the positional ``args`` and the ``internal`` keywords)."""
    conf = dict(conf or {})
    names = list(inspect.signature(cls).parameters)
    check_keywords(cls, conf, internal=[*names[: len(args)], *internal])
    return cls(*args, **conf, **internal)


def ctc_frames_needed(tokens: torch.Tensor, token_lens: torch.Tensor) -> torch.Tensor:
    """(B,) the fewest encoder frames from which CTC can emit each padded transcript of ``tokens`` (B, U): its
    tokens plus a blank between each two equal neighbours."""
    if token_lens.device != tokens.device:
        token_lens = token_lens.to(tokens.device)
    # max(U, 1): a batch of silences (every transcript empty) has U = 0 and no neighbours.
    inside = torch.arange(1, max(tokens.size(1), 1), device=tokens.device)[None, :] < token_lens[:, None]
    return token_lens + ((tokens[:, 1:] == tokens[:, :-1]) & inside).sum(1)


def collapse_ctc_paths(best: torch.Tensor, lens: torch.Tensor) -> list[list[int]]:
    """Per utterance, the tokens of a frame-level CTC path ``best`` ``(B, T)`` (e.g. the per-frame argmax): frames
    past ``lens`` dropped, repeats collapsed, blanks removed."""
    hyps = []
    for path, length in zip(best.cpu(), lens.tolist(), strict=True):
        ids = torch.unique_consecutive(path[:length])
        hyps.append(ids[ids != BLANK_ID].tolist())
    return hyps
