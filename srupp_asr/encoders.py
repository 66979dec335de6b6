"""Encoders behind one interface: the SRU++ encoder and two baselines (Conformer, BLSTM).

Every encoder maps ``x`` of shape ``(B, T, input_size)`` and ``lengths`` of shape ``(B,)`` to
``(out, lengths)`` with ``out`` of shape ``(B, T, output_size)`` and zeros on padded frames, and
carries an ``output_size`` attribute. :func:`build_encoder` makes one by name from config keywords.

Positional information in the Conformer baseline: torchaudio's Conformer has none, so
:class:`ConformerEncoder` adds a sinusoidal *absolute* encoding to its (scaled) input, as ESPnet's
Transformer does; ESPnet's Conformer uses relative positional attention instead, which this
baseline does not reproduce.
"""

from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F
import torchaudio
from torch import nn

from srupp_asr.checks import (
    ConfigValueError,
    check_choice,
    check_divides,
    check_even_size,
    check_keywords,
    check_probability,
    check_size,
)
from srupp_asr.sru import SRUppEncoder

ENCODER_NAMES = ("srupp", "conformer", "blstm")


def sequence_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """``(B, max_len)`` bool mask, True on the first ``lengths[b]`` positions of row ``b``."""
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


def sinusoidal_positions(
    length: int, dim: int, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``(length, dim)`` sinusoidal position table (sines in even, cosines in odd columns)."""
    pos = torch.arange(length, device=device, dtype=torch.float32)[:, None]
    inv_freq = torch.exp(torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim, device=device, dtype=torch.float32)
    table[:, 0::2] = torch.sin(pos * inv_freq)
    table[:, 1::2] = torch.cos(pos * inv_freq[: dim // 2])
    return table.to(dtype)


def _full_lengths(x: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    if lengths is None:
        return torch.full((x.shape[0],), x.shape[1], dtype=torch.long, device=x.device)
    return lengths.to(x.device, non_blocking=lengths.device.type == "cpu")  # host lengths: a copy that does not block


class ConformerEncoder(nn.Module):
    """torchaudio's Conformer layers with an input projection, sinusoidal positions and strict padding.

    The layers' parameters are torchaudio's; their forward is driven here because torchaudio's
    convolution module lets padded frames leak into real ones (through the depthwise convolution
    and the BatchNorm statistics). Here padded frames are zeroed before the depthwise convolution
    and BatchNorm sees real frames only, so an utterance's output does not depend on its batch.
    """

    def __init__(
        self,
        input_size: int,
        d_model: int = 256,
        num_layers: int = 12,
        num_heads: int = 4,
        ffn_dim: int = 1024,
        depthwise_conv_kernel_size: int = 31,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        check_size("d_model", d_model)
        check_size("num_layers", num_layers)
        check_divides("num_heads", num_heads, "d_model", d_model)
        check_size("ffn_dim", ffn_dim)
        if check_size("depthwise_conv_kernel_size", depthwise_conv_kernel_size) % 2 == 0:
            raise ConfigValueError("depthwise_conv_kernel_size", f"must be odd, got {depthwise_conv_kernel_size}")
        check_probability("dropout", dropout)
        self.input_size, self.output_size = input_size, d_model
        self.input_proj = nn.Linear(input_size, d_model) if input_size != d_model else nn.Identity()
        self.input_dropout = nn.Dropout(dropout)
        self.conformer = torchaudio.models.Conformer(
            input_dim=d_model,
            num_heads=num_heads,
            ffn_dim=ffn_dim,
            num_layers=num_layers,
            depthwise_conv_kernel_size=depthwise_conv_kernel_size,
            dropout=dropout,
        )

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``x``: ``(B, T, input_size)``; returns ``(out (B, T, d_model), lengths)``, zeros on padded frames."""
        T = x.shape[1]
        lengths = _full_lengths(x, lengths)
        valid = sequence_mask(lengths, T)  # (B, T)
        # ESPnet's scaling: the embedding is scaled up so the unit-size positions do not swamp it.
        h = self.input_proj(x) * math.sqrt(self.output_size)
        h = self.input_dropout(h + sinusoidal_positions(T, self.output_size, x.device, h.dtype))
        # An utterance with no frames would attend to nothing (NaN); let it attend everywhere, its
        # outputs are zeroed below.
        key_padding = ~(valid | ~valid.any(1, keepdim=True))
        h = h.transpose(0, 1)  # torchaudio's layers are time-major
        for layer in self.conformer.conformer_layers:
            h = _conformer_layer(layer, h, key_padding, valid.t())
        return torch.where(valid[..., None], h.transpose(0, 1), 0.0), lengths


def _conformer_layer(layer: nn.Module, x: torch.Tensor, key_padding: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """torchaudio ``ConformerLayer.forward`` (convolution after attention) with padding-aware convolution."""
    x = x + 0.5 * layer.ffn1(x)
    a = layer.self_attn_layer_norm(x)
    a, _ = layer.self_attn(a, a, a, key_padding_mask=key_padding, need_weights=False)
    x = x + layer.self_attn_dropout(a)
    x = x + _conv_module(layer.conv_module, x, valid)
    x = x + 0.5 * layer.ffn2(x)
    return layer.final_layer_norm(x)


def _conv_module(conv: nn.Module, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """torchaudio's ``_ConvolutionModule`` over ``(T, B, D)`` with padded frames kept out of the result."""
    pointwise_in, glu, depthwise, norm, act, pointwise_out, dropout = conv.sequential
    h = glu(pointwise_in(conv.layer_norm(x).permute(1, 2, 0)))  # (B, C, T)
    # The pointwise bias makes padded frames non-zero; zero them so the depthwise kernel sees the
    # same zeros at a sequence's end as it would without padding.
    valid_bt = valid.t()  # (B, T)
    h = depthwise(h * valid_bt[:, None, :])
    if isinstance(norm, nn.BatchNorm1d):
        # Statistics over real frames only: BatchNorm1d takes (N, C), so normalise the gathered frames.
        frames = h.transpose(1, 2)  # (B, T, C)
        normed = torch.zeros_like(frames)
        real = frames[valid_bt]
        if norm.training and real.shape[0] < 2:
            # One real frame has no batch variance (BatchNorm1d refuses it in training): normalise a batch that
            # short with the running statistics, and leave them as they are.
            normed[valid_bt] = F.batch_norm(
                real, norm.running_mean, norm.running_var, norm.weight, norm.bias, eps=norm.eps
            )
        else:
            normed[valid_bt] = norm(real)
        h = normed.transpose(1, 2)
    else:
        h = norm(h)
    h = dropout(pointwise_out(act(h)))
    return h.permute(2, 0, 1)


class BLSTMEncoder(nn.Module):
    """Bidirectional LSTM over packed sequences; ``d_model // 2`` hidden units per direction."""

    def __init__(self, input_size: int, d_model: int = 512, num_layers: int = 4, dropout: float = 0.1) -> None:
        super().__init__()
        check_even_size("d_model", d_model, "a bidirectional LSTM has half of it per direction")
        check_size("num_layers", num_layers)
        check_probability("dropout", dropout)
        self.input_size, self.output_size = input_size, d_model
        self.input_proj = nn.Linear(input_size, d_model) if input_size != d_model else nn.Identity()
        # nn.LSTM applies dropout between layers only (and warns when there is no "between").
        self.lstm = nn.LSTM(
            d_model,
            d_model // 2,
            num_layers=num_layers,
            dropout=dropout if num_layers > 1 else 0.0,
            batch_first=True,
            bidirectional=True,
        )
        self.output_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``x``: ``(B, T, input_size)``; returns ``(out (B, T, d_model), lengths)``, zeros on padded frames."""
        T = x.shape[1]
        # Packing wants the lengths on the host: host lengths (a training batch's) spare a blocking copy.
        host = lengths if lengths is not None and lengths.device.type == "cpu" else None
        lengths = _full_lengths(x, lengths)
        # Packing rejects empty sequences: run those over one frame and zero the result.
        packed = nn.utils.rnn.pack_padded_sequence(
            self.input_proj(x),
            (lengths if host is None else host).clamp(min=1).cpu(),
            batch_first=True,
            enforce_sorted=False,
        )
        out, _ = self.lstm(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=T)
        out = torch.where(sequence_mask(lengths, T)[..., None], out, 0.0)
        return self.output_dropout(out), lengths


_BUILDERS = {"srupp": SRUppEncoder, "conformer": ConformerEncoder, "blstm": BLSTMEncoder}


def encoder_options(name: str) -> list[str]:
    """The keyword arguments :func:`build_encoder` accepts for encoder ``name``."""
    check_choice("encoder", name, ENCODER_NAMES)
    return [p for p in inspect.signature(_BUILDERS[name]).parameters if p != "input_size"]


def build_encoder(name: str, input_size: int, **kwargs) -> nn.Module:
    """Make encoder ``name`` ("srupp", "conformer" or "blstm") over ``input_size`` features; an unknown name, an
    option the encoder does not take or a value out of range is a ConfigValueError naming the option."""
    check_choice("encoder", name, ENCODER_NAMES)
    check_keywords(_BUILDERS[name], kwargs, internal=("input_size",))
    return _BUILDERS[name](input_size, **kwargs)


def encoder_num_params(module: nn.Module) -> int:
    """Number of parameters (elements) in ``module``, shared ones counted once."""
    return sum(p.numel() for p in module.parameters())
