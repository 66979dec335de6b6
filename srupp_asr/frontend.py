"""The model's frontend: Kaldi-compatible log-mel filterbank, global CMVN and SpecAugment, batched in torch.

Order in the model: ``Fbank`` (raw 16 kHz waveform -> 80-dim log-mel) -> ``GlobalCMVN`` -> ``SpecAugment``
(training only). Every module takes and keeps a padded batch plus per-utterance lengths; padded frames
come out as zeros (SpecAugment leaves them as they came).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from srupp_asr.audio import SAMPLE_RATE, prepare_waveform
from srupp_asr.checks import check_int, check_number, check_size
from srupp_asr.errors import UserError
from srupp_asr.fileio import atomic_write_text
from srupp_asr.runtime.features import (  # the framing shared with the numpy filterbank
    HOP_LENGTH,
    N_FFT,
    N_MELS,
    PREEMPHASIS,
    WAVEFORM_SCALE,
    WIN_LENGTH,
    kaldi_mel_banks,
    povey_window,
)

# The framing and mel constants live with the numpy filterbank (torch-free), which computes the same features.
LOG_FLOOR = torch.finfo(torch.float32).eps
# A mel bin that barely varies over the training data (band-limited audio) would otherwise be blown
# up to huge values by 1 / std.
STD_FLOOR = 1e-2


def num_frames(num_samples: torch.Tensor) -> torch.Tensor:
    """Frames of a 25 ms / 10 ms framing with Kaldi's snip_edges=True: 1 + (S - 400) // 160, 0 when S < 400."""
    frames = torch.div(num_samples - WIN_LENGTH, HOP_LENGTH, rounding_mode="floor") + 1
    return frames.clamp_min(0)


def _valid_frames(frame_lengths: torch.Tensor, num_frames_total: int) -> torch.Tensor:
    """(B, T) bool mask: True on the frames of each utterance, False on padding."""
    return torch.arange(num_frames_total, device=frame_lengths.device) < frame_lengths[:, None]


class Fbank(nn.Module):
    """80-dim log-mel filterbank matching Kaldi's defaults (povey window, pre-emphasis, snip_edges, no energy)."""

    def __init__(self, dither: float = 0.0, n_mels: int = N_MELS) -> None:
        super().__init__()
        check_number("dither", dither, at_least=0.0)
        check_size("n_mels", n_mels)
        self.dither = dither  # Gaussian noise in 16-bit sample units, added in training mode only
        self.n_mels = n_mels
        # Window and mel matrix per device. Plain tensors, not buffers: they stay out of the state dict, and
        # a model cast to half precision (.half(), Lightning's "16-true") leaves them exact float32.
        self._constants: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def frame_shift(self) -> float:
        """Seconds between feature frames (10 ms)."""
        return HOP_LENGTH / SAMPLE_RATE

    def extra_repr(self) -> str:
        return f"n_mels={self.n_mels}, dither={self.dither}"

    def _window_and_mel_banks(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._constants:
            # the numpy filterbank's window and filters (srupp_asr.runtime.features): one definition for both
            window, banks = torch.tensor(povey_window()), torch.tensor(kaldi_mel_banks(self.n_mels))
            self._constants[device] = (window.to(device), banks.to(device))
        return self._constants[device]

    def forward(self, wav: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, S) waveforms in [-1, 1] and their lengths in samples -> ((B, T, n_mels) log-mel, (B,) frame counts)."""
        batch, samples = wav.shape
        # Lengths on the host (a training batch's) are copied without blocking: the host never waits here.
        frame_lengths = num_frames(lengths.to(wav.device, non_blocking=lengths.device.type == "cpu"))
        if samples < WIN_LENGTH:
            return wav.new_zeros(batch, 0, self.n_mels, dtype=torch.float32), frame_lengths
        # Under mixed precision the power spectrum overflows fp16 and loses the log floor in bf16.
        with torch.autocast(device_type=wav.device.type, enabled=False):
            # With snip_edges every frame of an utterance lies inside its samples, so padding never leaks in.
            frames = (wav.float() * WAVEFORM_SCALE).unfold(1, WIN_LENGTH, HOP_LENGTH)
            if self.training and self.dither > 0:
                frames = frames + self.dither * torch.randn_like(frames)
            frames = frames - frames.mean(dim=-1, keepdim=True)
            frames = torch.cat(
                [frames[..., :1] * (1 - PREEMPHASIS), frames[..., 1:] - PREEMPHASIS * frames[..., :-1]], dim=-1
            )
            window, mel_banks = self._window_and_mel_banks(wav.device)
            spectrum = torch.fft.rfft(frames * window, n=N_FFT)
            # |X|^2 from the real and imaginary parts: abs() then square would lose precision to the sqrt.
            power = torch.view_as_real(spectrum).square().sum(dim=-1)
            feats = torch.matmul(power, mel_banks).clamp_min(LOG_FLOOR).log()
            valid = _valid_frames(frame_lengths, feats.size(1))
            return feats.masked_fill(~valid[..., None], 0.0), frame_lengths


class GlobalCMVN(nn.Module):
    """Global mean and variance normalisation with stats stored in the model's state dict."""

    def __init__(
        self, mean: torch.Tensor | None = None, std: torch.Tensor | None = None, num_features: int = N_MELS
    ) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(num_features))
        self.register_buffer("istd", torch.ones(num_features))
        if (mean is None) != (std is None):
            raise ValueError("give both mean and std, or neither")
        if mean is not None and std is not None:
            self.set_stats(mean, std)

    def set_stats(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        """Load stats from :func:`compute_cmvn_stats` or :func:`load_cmvn` (std is floored at STD_FLOOR)."""
        mean, std = torch.as_tensor(mean), torch.as_tensor(std)
        if mean.shape != self.mean.shape or std.shape != self.mean.shape:
            raise ValueError(f"expected mean and std of shape {tuple(self.mean.shape)}")
        self.mean.copy_(mean)
        self.istd.copy_(1.0 / std.to(torch.float64).clamp_min(STD_FLOOR))

    def forward(self, feats: torch.Tensor, frame_lengths: torch.Tensor) -> torch.Tensor:
        """(B, T, F) features -> normalised features, padded frames set to 0."""
        valid = _valid_frames(frame_lengths.to(feats.device), feats.size(1))
        return ((feats - self.mean) * self.istd).masked_fill(~valid[..., None], 0.0)


@torch.inference_mode()
def compute_cmvn_stats(
    cuts: Iterable[Any], max_cuts: int | None = None, errors: list[str] | None = None, n_mels: int = N_MELS
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std (float32, (n_mels,)) of the Fbank features over all frames of a lhotse CutSet.

    A cut whose audio does not load is a one-line ``UserError``; with an ``errors`` list its line is appended
    there instead and the other cuts still count."""
    from srupp_asr.manifest import load_cut_audio

    fbank = Fbank(n_mels=n_mels).eval()
    total = torch.zeros(n_mels, dtype=torch.float64)
    total_sq = torch.zeros(n_mels, dtype=torch.float64)
    count = 0
    for index, cut in enumerate(cuts):
        if max_cuts is not None and index >= max_cuts:
            break
        try:
            samples = load_cut_audio(cut)
        except UserError as err:
            if errors is None:
                raise
            errors.append(str(err))
            continue
        if samples is None:
            raise UserError(f"cut {cut.id}: has no audio to compute CMVN stats from")
        wav = torch.from_numpy(prepare_waveform(samples, cut.sampling_rate))
        feats, frames = fbank(wav[None], torch.tensor([wav.numel()]))
        # float64 sums: a thousand hours is ~4e8 frames, beyond float32's exact range.
        feats = feats[0, : int(frames[0])].double()
        total += feats.sum(dim=0)
        total_sq += feats.square().sum(dim=0)
        count += feats.size(0)
    if count == 0:
        raise UserError("CMVN stats: the cuts hold no audio frames (no cuts, or all shorter than 25 ms)")
    mean = total / count
    var = (total_sq / count - mean.square()).clamp_min(0.0)
    return mean.float(), var.sqrt().float()


def save_cmvn(path: str | os.PathLike[str], mean: torch.Tensor, std: torch.Tensor) -> None:
    """Write CMVN stats to a small JSON file, atomically (a crash leaves the old file or the new one)."""
    mean, std = torch.as_tensor(mean).flatten(), torch.as_tensor(std).flatten()
    if mean.shape != std.shape:
        raise ValueError(f"mean and std differ in shape: {tuple(mean.shape)} vs {tuple(std.shape)}")
    text = json.dumps({"mean": mean.double().tolist(), "std": std.double().tolist()}, indent=1) + "\n"
    atomic_write_text(path, text)


def load_cmvn(path: str | os.PathLike[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Read (mean, std) float32 tensors written by :func:`save_cmvn`."""
    name = os.fspath(path)
    try:
        with open(name) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise UserError(f"{name}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"{name}: not a CMVN stats file ({err})") from None
    if not isinstance(data, dict) or not {"mean", "std"} <= data.keys():
        raise UserError(f"{name}: not a CMVN stats file (expected a JSON object with 'mean' and 'std')")
    try:
        mean = torch.tensor(data["mean"], dtype=torch.float32)
        std = torch.tensor(data["std"], dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError) as err:
        raise UserError(f"{name}: not a CMVN stats file ('mean' and 'std' must be lists of numbers: {err})") from None
    if mean.dim() != 1 or mean.shape != std.shape or mean.numel() == 0:
        raise UserError(f"{name}: not a CMVN stats file ('mean' and 'std' must be equally long non-empty lists)")
    if not (torch.isfinite(mean).all() and torch.isfinite(std).all() and (std >= 0).all()):
        raise UserError(f"{name}: not a CMVN stats file (values must be finite and std non-negative)")
    return mean, std


class SpecAugment(nn.Module):
    """SpecAugment (time warp, frequency and time masks) in training mode; the identity in eval mode.

    Time masks adapt to each utterance's length (Park et al. 2020, as ESPnet and NeMo do): up to
    ``max_time_masks`` masks, ``ceil(time_masks_per_frame * T)`` of them for a short utterance, each up
    to ``time_width_ratio * T`` frames wide. Masked values become ``mask_value`` (0 = the mean after CMVN).
    """

    def __init__(
        self,
        time_warp: int = 5,
        freq_masks: int = 2,
        freq_width: int = 27,
        max_time_masks: int = 10,
        time_masks_per_frame: float = 0.04,
        time_width_ratio: float = 0.05,
        mask_value: float = 0.0,
    ) -> None:
        super().__init__()
        for name, value in (
            ("time_warp", time_warp),
            ("freq_masks", freq_masks),
            ("freq_width", freq_width),
            ("max_time_masks", max_time_masks),
        ):
            check_int(name, value, minimum=0)
        check_number("time_masks_per_frame", time_masks_per_frame, at_least=0.0)
        check_number("time_width_ratio", time_width_ratio, at_least=0.0)
        check_number("mask_value", mask_value)
        self.time_warp = time_warp
        self.freq_masks = freq_masks
        self.freq_width = freq_width
        self.max_time_masks = max_time_masks
        self.time_masks_per_frame = time_masks_per_frame
        self.time_width_ratio = time_width_ratio
        self.mask_value = mask_value

    def extra_repr(self) -> str:
        return (
            f"time_warp={self.time_warp}, freq_masks={self.freq_masks}, freq_width={self.freq_width}, "
            f"max_time_masks={self.max_time_masks}, time_masks_per_frame={self.time_masks_per_frame}, "
            f"time_width_ratio={self.time_width_ratio}"
        )

    def forward(self, feats: torch.Tensor, frame_lengths: torch.Tensor) -> torch.Tensor:
        """(B, T, F) features -> augmented features; frames past each length are left as they are."""
        if not self.training:
            return feats
        frame_lengths = frame_lengths.to(feats.device)
        valid = _valid_frames(frame_lengths, feats.size(1))
        if self.time_warp > 0:
            feats = self._warp(feats, frame_lengths, valid)
        mask = self._freq_mask(feats)[:, None, :] | self._time_mask(frame_lengths, feats.size(1))[:, :, None]
        return feats.masked_fill(mask & valid[..., None], self.mask_value)

    def _warp(self, feats: torch.Tensor, lengths: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Move a random frame c of each utterance to c + w, |w| <= time_warp, stretching both sides linearly."""
        batch, total, _ = feats.shape
        window, device = self.time_warp, feats.device
        length = lengths.to(device=device, dtype=torch.float32)
        # As the SpecAugment paper: c in [W, L - W), w uniform in [-W, W]; too short to warp when L <= 2W.
        center = window + torch.floor(torch.rand(batch, device=device) * (length - 2 * window).clamp_min(1))
        shift = torch.randint(-window, window + 1, (batch,), device=device)
        # Both ends stay where they are, so the destination must stay strictly inside the utterance.
        dest = torch.minimum((center + shift).clamp_min(1), (length - 2).clamp_min(1))
        center, dest, last = center[:, None], dest[:, None], (length - 1)[:, None]
        t = torch.arange(total, device=device, dtype=torch.float32)[None]
        # Output frame t reads source position src: piecewise linear through (0, 0), (dest, center), (L-1, L-1).
        left = t * center / dest
        right = center + (t - dest) * (last - center) / (last - dest).clamp_min(1)
        src = torch.where(t <= dest, left, right)
        warpable = (lengths.to(device) > 2 * window)[:, None] & valid
        src = torch.where(warpable, src.clamp(min=0).minimum(last), t)  # identity on padding, short utterances
        low = src.floor()
        frac = (src - low)[..., None]
        low = low.long()
        high = torch.where(warpable, torch.minimum(low + 1, last.long()), low)
        warped = feats.gather(1, low[..., None].expand_as(feats)) * (1 - frac)
        warped = warped + feats.gather(1, high[..., None].expand_as(feats)) * frac
        # Untouched frames are copied exactly rather than recomputed through the interpolation.
        return torch.where(warpable[..., None], warped, feats)

    def _freq_mask(self, feats: torch.Tensor) -> torch.Tensor:
        """(B, F) bool: ``freq_masks`` bands per utterance, each 0..freq_width bins wide."""
        batch, _, bins = feats.shape
        device = feats.device
        width = torch.randint(0, min(self.freq_width, bins) + 1, (batch, self.freq_masks), device=device)
        start = torch.floor(torch.rand(batch, self.freq_masks, device=device) * (bins - width + 1)).long()
        index = torch.arange(bins, device=device)[None, None]
        return ((index >= start[..., None]) & (index < (start + width)[..., None])).any(dim=1)

    def _time_mask(self, lengths: torch.Tensor, total: int) -> torch.Tensor:
        """(B, T) bool: per utterance of length L, min(max_time_masks, ceil(rate * L)) spans of 0..ratio*L frames."""
        device = lengths.device
        length = lengths.to(torch.float32)
        count = torch.ceil(self.time_masks_per_frame * length).clamp(max=self.max_time_masks)
        max_width = torch.floor(self.time_width_ratio * length)
        shape = (lengths.numel(), self.max_time_masks)
        width = torch.floor(torch.rand(shape, device=device) * (max_width + 1)[:, None])
        start = torch.floor(torch.rand(shape, device=device) * (length[:, None] - width + 1))
        active = torch.arange(self.max_time_masks, device=device)[None] < count[:, None]
        t = torch.arange(total, device=device)[None, None]
        inside = (t >= start[..., None]) & (t < (start + width)[..., None]) & active[..., None]
        return inside.any(dim=1)
