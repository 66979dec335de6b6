"""The acoustic model in numpy (float32): the part of :class:`srupp_asr.model.ASRModel` that inference runs before
the search, from log-mel features to the encoder output and the CTC log-probabilities::

    feats (B, T, n_mels) -> GlobalCMVN -> Conv2dSubsampling -> SRU++ encoder -> CTC head (log-softmax)

The subsampling runs as the torch one does on the CPU in inference, an utterance and a block of output frames at a
time (:data:`INFERENCE_BLOCK_FRAMES`, fewer than torch's; its unpadded convolutions make that exact, see
:mod:`srupp_asr.subsampling`), each convolution a matrix product over the windows of its input (im2col).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from srupp_asr.checks import ConfigValueError, check_choice, check_number, check_size, config_options
from srupp_asr.runtime.features import apply_cmvn
from srupp_asr.runtime.ops import Weights, linear, log_softmax
from srupp_asr.runtime.sru import SRUppEncoder

FEATURE_SHIFT = 0.01  # seconds between feature frames (the Fbank's 160 samples at 16 kHz)
# (kernel, stride) of each Conv2d, over time and frequency alike (srupp_asr.subsampling.CONV_LAYERS).
CONV_LAYERS: dict[int, tuple[tuple[int, int], ...]] = {
    4: ((3, 2), (3, 2)),
    6: ((3, 2), (5, 3)),
    8: ((3, 2), (3, 2), (3, 2)),
}
# Output frames per block (2.6 s at x4): the im2col windows of a block of the torch subsampling's 256 frames hold
# 44 MB for the built-in model's second convolution, a quarter of that here, no slower (the outputs are the same).
INFERENCE_BLOCK_FRAMES = 64
# ASRModel's arguments and their defaults (those of the decoder, the losses and the augmentation not read here).
MODEL_DEFAULTS: dict[str, Any] = {
    "vocab_size": None,
    "n_mels": 80,
    "d_model": 256,
    "subsampling": 4,
    "subsampling_channels": None,
    "encoder": "srupp",
    "encoder_conf": None,
    "decoder_conf": None,
    "ctc_weight": 0.3,
    "lsm_weight": 0.1,
    "specaugment": {},
    "dither": 0.0,
}


def subsampled_length(length: int | np.ndarray, factor: int) -> int | np.ndarray:
    """Output length of the factor-``factor`` conv stack for input ``length`` (0 when too short)."""
    for kernel, stride in CONV_LAYERS[factor]:
        length = (length - kernel) // stride + 1
    return np.maximum(length, 0)


def receptive_field(factor: int) -> tuple[int, int]:
    """``(span, step)``: output frame ``j`` of the factor-``factor`` stack reads input frames
    ``[j * step, j * step + span)``."""
    span, step = 1, 1
    for kernel, stride in CONV_LAYERS[factor]:
        span, step = span + (kernel - 1) * step, step * stride
    return span, step


class Conv2dSubsampling:
    """Conv2d stack (ReLU after each) over (time, freq), then Linear(d_model) of the flattened channels x freq
    (:class:`srupp_asr.subsampling.Conv2dSubsampling` in eval mode)."""

    def __init__(
        self, weights: Weights, in_features: int, d_model: int, factor: int = 4, channels: int | None = None
    ) -> None:
        check_choice("factor", factor, CONV_LAYERS)
        check_size("in_features", in_features)
        check_size("d_model", d_model)
        freq_out = int(subsampled_length(in_features, factor))
        if freq_out < 1:
            raise ConfigValueError("in_features", f"is too few for subsampling by {factor}, got {in_features}")
        channels = d_model if channels is None else check_size("channels", channels)
        self.factor, self.d_model = factor, d_model
        # Per convolution: the (C_in * k * k, C_out) matrix of its windows' products, the bias, kernel and stride.
        self.convs = []
        in_channels = 1
        for i, (kernel, stride) in enumerate(CONV_LAYERS[factor]):
            weight = weights.take(f"conv.{2 * i}.weight", (channels, in_channels, kernel, kernel))
            bias = weights.take(f"conv.{2 * i}.bias", (channels,))
            self.convs.append((np.ascontiguousarray(weight.reshape(channels, -1).T), bias, kernel, stride))
            in_channels = channels
        # torch flattens (channel, freq); the frames here come out (freq, channel).
        out = weights.take("out.weight", (d_model, channels * freq_out)).reshape(d_model, channels, freq_out)
        out = np.ascontiguousarray(out.transpose(0, 2, 1).reshape(d_model, -1))
        self.out = out, weights.take("out.bias", (d_model,))

    def forward(self, x: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(B, T, F)`` features, ``(B,)`` frame counts -> ``((B, T', d_model), (B,) subsampled counts)``, zeros
        past each count."""
        batch, total, _ = x.shape
        new_lengths = subsampled_length(np.asarray(lengths, dtype=np.int64), self.factor)
        y = np.zeros((batch, subsampled_length(total, self.factor), self.d_model), np.float32)
        span, step = receptive_field(self.factor)
        for b, length in enumerate(new_lengths.tolist()):
            for start in range(0, length, INFERENCE_BLOCK_FRAMES):
                end = min(start + INFERENCE_BLOCK_FRAMES, length)
                y[b, start:end] = self._frames(x[b, start * step : (end - 1) * step + span])
        return y, new_lengths

    def _frames(self, x: np.ndarray) -> np.ndarray:
        """``(T, F)`` -> ``(T', d_model)``: the convolutions (channels last) and the projection."""
        y = x[:, :, None]
        for weight, bias, kernel, stride in self.convs:
            windows = sliding_window_view(y, (kernel, kernel), axis=(0, 1))[::stride, ::stride]  # (T', F', C, k, k)
            frames, bins = windows.shape[:2]
            y = windows.reshape(frames * bins, -1) @ weight
            y += bias
            np.maximum(y, 0.0, out=y)
            y = y.reshape(frames, bins, -1)
        return linear(y.reshape(y.shape[0], -1), *self.out)


class AcousticModel:
    """Global CMVN, the subsampling, the SRU++ encoder and the CTC head of an :class:`srupp_asr.model.ASRModel`
    (the attention decoder is :mod:`srupp_asr.runtime.decoder`'s)."""

    def __init__(
        self,
        cmvn: tuple[np.ndarray, np.ndarray],
        subsampling: Conv2dSubsampling,
        encoder: SRUppEncoder,
        ctc: tuple[np.ndarray, np.ndarray] | None,
    ) -> None:
        self.cmvn, self.subsampling, self.encoder, self.ctc = cmvn, subsampling, encoder, ctc

    @classmethod
    def from_config(cls, config: Mapping[str, Any], weights: Weights) -> AcousticModel:
        """The acoustic model of the ASRModel arguments ``config`` (a config.yaml's ``model:``), taking its weights
        (``cmvn.*``, ``subsampling.*``, ``encoder.*``, ``ctc.*``) from ``weights``. NotImplementedError, one line,
        for a config this runtime does not run (another encoder, an option it does not know, a value torch would
        refuse): torch then runs it, or says what is wrong with it."""
        unknown = sorted(set(config) - set(MODEL_DEFAULTS))
        if unknown:
            raise NotImplementedError(f"the numpy runtime does not know the model option {unknown[0]}")
        conf = {**MODEL_DEFAULTS, **config}
        if conf["encoder"] != "srupp":
            raise NotImplementedError(f"the numpy runtime runs the srupp encoder only, not {conf['encoder']!r}")
        try:
            vocab_size, n_mels, d_model = (check_size(k, conf[k]) for k in ("vocab_size", "n_mels", "d_model"))
            check_number("ctc_weight", conf["ctc_weight"], at_least=0.0, at_most=1.0)
            cmvn = weights.take("cmvn.mean", (n_mels,)), weights.take("cmvn.istd", (n_mels,))
            with config_options(names={"factor": "subsampling", "channels": "subsampling_channels"}):
                subsampling = Conv2dSubsampling(
                    weights.sub("subsampling"), n_mels, d_model, conf["subsampling"], conf["subsampling_channels"]
                )
            with config_options("encoder_conf"):
                options = {"d_model": d_model, **(conf["encoder_conf"] or {})}
                encoder = SRUppEncoder.from_config(weights.sub("encoder"), d_model, options)
        except ConfigValueError as err:
            raise NotImplementedError(f"the numpy runtime cannot run this model: {err}") from None
        ctc = None
        if conf["ctc_weight"] > 0:
            ctc = weights.take("ctc.weight", (vocab_size, encoder.output_size)), weights.take("ctc.bias", (vocab_size,))
        return cls(cmvn, subsampling, encoder, ctc)

    @property
    def output_size(self) -> int:
        """The width of the encoder output (what the CTC head and the decoder's cross-attention take)."""
        return self.encoder.output_size

    @property
    def n_mels(self) -> int:
        """The filterbank's mel bins the model takes (its CMVN's size)."""
        return self.cmvn[0].shape[0]

    @property
    def has_ctc(self) -> bool:
        return self.ctc is not None

    @property
    def frame_shift(self) -> float:
        """Seconds per encoder frame: the features' 10 ms times the subsampling factor (0.04 s at x4)."""
        return FEATURE_SHIFT * self.subsampling.factor

    def encode(self, feats: np.ndarray, frame_lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(B, T, n_mels)`` log-mel features (before CMVN) and ``(B,)`` frame counts -> ``((B, T', d) encoder
        output, (B,) int64 frame counts)``, T' >= 1 (:meth:`srupp_asr.model.ASRModel.encode` in inference)."""
        feats = np.asarray(feats, dtype=np.float32)
        frame_lengths = np.asarray(frame_lengths, dtype=np.int64)
        x = apply_cmvn(feats, frame_lengths, *self.cmvn)
        # A batch too short for one output frame is padded up to one that every length excludes, as ASRModel does.
        span, _ = receptive_field(self.subsampling.factor)
        if x.shape[1] < span:
            x = np.pad(x, ((0, 0), (0, span - x.shape[1]), (0, 0)))
        x, lengths = self.subsampling.forward(x, frame_lengths)
        enc, _ = self.encoder.forward(x, lengths)
        return enc, lengths

    def ctc_log_probs(self, enc: np.ndarray) -> np.ndarray:
        """``(B, T', d)`` encoder output -> ``(B, T', V)`` float32 CTC log-probabilities."""
        if self.ctc is None:
            raise RuntimeError("this model has no CTC head (ctc_weight=0)")
        logits = linear(enc.reshape(-1, enc.shape[-1]), *self.ctc)
        return log_softmax(logits).reshape(*enc.shape[:-1], -1)
