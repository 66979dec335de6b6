"""Convolutional subsampling in front of the encoder: 10 ms frames -> 40 / 60 / 80 ms, then Linear(d_model).

The convolutions are unpadded ("valid"), as in ESPnet and WeNet, so an output frame inside an
utterance's new length reads only input frames inside its length: right padding cannot leak into
valid outputs, and a padded batch gives each utterance the same valid frames as running it alone.

That also lets CPU inference run the stack an utterance and a block of :data:`INFERENCE_BLOCK_FRAMES` output frames
at a time: the first convolution's output (``channels`` x half the frames x half the bins, 20 MB for 10 s at 256
channels) then never exists for a whole padded batch at once (160 MB for eight 10-s files), and no time is spent on
padding.
"""

from __future__ import annotations

import torch
from torch import nn

from srupp_asr.checks import ConfigValueError, check_choice, check_probability, check_size

# (kernel, stride) of each Conv2d, applied to time and frequency alike.
CONV_LAYERS: dict[int, tuple[tuple[int, int], ...]] = {
    4: ((3, 2), (3, 2)),
    6: ((3, 2), (5, 3)),
    8: ((3, 2), (3, 2), (3, 2)),
}
INFERENCE_BLOCK_FRAMES = 256  # output frames per block when CPU inference runs the stack in blocks (~10 s at x4)


def subsampled_length(length: int | torch.Tensor, factor: int) -> int | torch.Tensor:
    """Output length of the factor-``factor`` conv stack for input ``length`` (0 when too short)."""
    check_choice("factor", factor, CONV_LAYERS)
    for kernel, stride in CONV_LAYERS[factor]:
        length = (length - kernel) // stride + 1
    return length.clamp_min(0) if isinstance(length, torch.Tensor) else max(length, 0)


def receptive_field(factor: int) -> tuple[int, int]:
    """``(span, step)`` of the factor-``factor`` conv stack: output frame ``j`` reads input frames
    ``[j * step, j * step + span)``."""
    check_choice("factor", factor, CONV_LAYERS)
    span, step = 1, 1
    for kernel, stride in CONV_LAYERS[factor]:
        span, step = span + (kernel - 1) * step, step * stride
    return span, step


def fewest_frames(factor: int) -> int:
    """The fewest input frames from which the factor-``factor`` conv stack makes one output frame."""
    return next(n for n in range(1, 100) if subsampled_length(n, factor) > 0)


class Conv2dSubsampling(nn.Module):
    """Conv2d stack (ReLU after each) over (time, freq), flattened channels x freq, then Linear to d_model."""

    def __init__(
        self, in_features: int, d_model: int, factor: int = 4, dropout: float = 0.0, channels: int | None = None
    ) -> None:
        super().__init__()
        check_choice("factor", factor, CONV_LAYERS)
        freq_out = subsampled_length(check_size("in_features", in_features), factor)
        if freq_out < 1:
            raise ConfigValueError(
                "in_features",
                f"must be at least {fewest_frames(factor)} for subsampling by {factor} (too few), got {in_features}",
            )
        check_size("d_model", d_model)
        if channels is not None:
            check_size("channels", channels)
        check_probability("dropout", dropout)
        self.factor = factor
        self.d_model = d_model
        self.channels = channels or d_model  # ESPnet and WeNet use d_model channels
        layers: list[nn.Module] = []
        in_channels = 1
        for kernel, stride in CONV_LAYERS[factor]:
            layers += [nn.Conv2d(in_channels, self.channels, kernel, stride), nn.ReLU()]
            in_channels = self.channels
        self.conv = nn.Sequential(*layers)
        self.out = nn.Linear(self.channels * freq_out, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, F) features and (B,) frame counts -> ((B, T', d_model), (B,) subsampled counts); padding zeroed."""
        batch, total, _ = x.shape
        new_lengths = subsampled_length(lengths, self.factor)
        total_out = subsampled_length(total, self.factor)
        if total_out == 0:  # the convolutions would refuse an input shorter than their kernels
            return x.new_zeros(batch, 0, self.d_model), new_lengths
        if x.device.type == "cpu" and not (self.training or torch.is_grad_enabled()):
            return self._blockwise(x, new_lengths.tolist(), total_out), new_lengths
        y = self.dropout(self._frames(x))
        valid = torch.arange(total_out, device=y.device) < new_lengths.to(y.device)[:, None]
        return y.masked_fill(~valid[..., None], 0.0), new_lengths

    def _frames(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, F) -> (B, T', d_model): the convolutions and the projection."""
        y = self.conv(x.unsqueeze(1))  # (B, C, T', F')
        return self.out(y.transpose(1, 2).flatten(2))

    def _blockwise(self, x: torch.Tensor, lengths: list[int], total_out: int) -> torch.Tensor:
        """The same frames as :meth:`_frames` on the padded batch (padding zeroed, no dropout: inference), computed
        an utterance and :data:`INFERENCE_BLOCK_FRAMES` output frames at a time from the input frames each block
        reads."""
        span, step = receptive_field(self.factor)
        y = None
        for b, length in enumerate(lengths):
            for start in range(0, length, INFERENCE_BLOCK_FRAMES):
                end = min(start + INFERENCE_BLOCK_FRAMES, length)
                block = self._frames(x[b : b + 1, start * step : (end - 1) * step + span])[0]
                if y is None:  # the projection's dtype (bfloat16 under autocast)
                    y = block.new_zeros(x.shape[0], total_out, self.d_model)
                y[b, start:end] = block
        return x.new_zeros(x.shape[0], total_out, self.d_model) if y is None else y
