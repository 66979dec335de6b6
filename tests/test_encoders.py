"""The encoder registry and the three encoders behind one interface."""

from __future__ import annotations

import math

import pytest
import torch

from srupp_asr.checks import ConfigValueError
from srupp_asr.encoders import (
    ENCODER_NAMES,
    build_encoder,
    encoder_num_params,
    encoder_options,
    sequence_mask,
    sinusoidal_positions,
)

INPUT = 20
SMALL = {
    "srupp": {"d_model": 32, "num_layers": 3, "attn_dim": 16, "num_heads": 2, "attn_every": 2},
    "conformer": {"d_model": 32, "num_layers": 2, "num_heads": 4, "ffn_dim": 64, "depthwise_conv_kernel_size": 7},
    "blstm": {"d_model": 32, "num_layers": 2},
}


def _small(name: str, input_size: int = INPUT) -> torch.nn.Module:
    torch.manual_seed(0)
    encoder = build_encoder(name, input_size, **SMALL[name])
    if name == "srupp":  # alpha starts at 0; make the attention branch count
        with torch.no_grad():
            for layer in encoder.layers:
                if layer.attention:
                    layer.alpha.fill_(1.0)
    return encoder


@pytest.mark.parametrize("name", ENCODER_NAMES)
def test_output_has_output_size_columns_and_zeros_on_padding(name):
    encoder = _small(name).eval()
    out, lengths = encoder(torch.randn(3, 17, INPUT), torch.tensor([17, 9, 4]))
    assert encoder.output_size == 32
    assert out.shape == (3, 17, 32)
    assert lengths.tolist() == [17, 9, 4]
    assert torch.all(out[1, 9:] == 0) and torch.all(out[2, 4:] == 0)
    assert out[1, :9].abs().sum(-1).min() > 0


@pytest.mark.parametrize("name", ENCODER_NAMES)
def test_input_of_model_width_needs_no_projection(name):
    encoder = _small(name, input_size=32)
    assert isinstance(encoder.input_proj, torch.nn.Identity)
    out, _ = encoder(torch.randn(2, 5, 32), torch.tensor([5, 3]))
    assert out.shape == (2, 5, 32)


@pytest.mark.parametrize("name", ENCODER_NAMES)
def test_output_does_not_depend_on_padding(name):
    encoder = _small(name).eval()
    torch.manual_seed(1)
    short, long = torch.randn(1, 11, INPUT), torch.randn(1, 25, INPUT)
    alone, _ = encoder(short, torch.tensor([11]))
    batch = torch.full((2, 25, INPUT), 3.0)  # non-zero padding must not leak either
    batch[0, :11], batch[1] = short[0], long[0]
    out, _ = encoder(batch, torch.tensor([11, 25]))
    assert (out[0, :11] - alone[0]).abs().max().item() <= 1e-5
    assert torch.all(out[0, 11:] == 0)


def test_conformer_batchnorm_statistics_ignore_padded_frames():
    torch.manual_seed(0)
    encoder = build_encoder("conformer", INPUT, **SMALL["conformer"], dropout=0.0).train()
    torch.manual_seed(2)
    x = torch.randn(2, 10, INPUT)
    out_tight, _ = encoder(x, torch.tensor([10, 10]))
    padded = torch.cat([x, torch.randn(2, 6, INPUT)], 1)
    out_padded, _ = encoder(padded, torch.tensor([10, 10]))
    assert (out_padded[:, :10] - out_tight).abs().max().item() <= 1e-5


@pytest.mark.parametrize("name", ENCODER_NAMES)
def test_gradients_reach_every_parameter(name):
    encoder = _small(name).train()
    out, _ = encoder(torch.randn(2, 12, INPUT), torch.tensor([12, 7]))
    out.square().sum().backward()
    missing = [n for n, p in encoder.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert not missing


@pytest.mark.parametrize("name", ["conformer", "blstm"])
def test_empty_sequence_gives_zeros_not_nan(name):
    encoder = _small(name).eval()
    out, _ = encoder(torch.randn(2, 6, INPUT), torch.tensor([6, 0]))
    assert torch.isfinite(out).all() and torch.all(out[1] == 0)


def test_missing_lengths_mean_full_length():
    encoder = _small("blstm").eval()
    x = torch.randn(2, 7, INPUT)
    out, lengths = encoder(x)
    assert lengths.tolist() == [7, 7]
    torch.testing.assert_close(out, encoder(x, torch.tensor([7, 7]))[0])


def test_blstm_splits_model_width_between_directions():
    encoder = build_encoder("blstm", 80, d_model=64, num_layers=3)
    assert encoder.lstm.hidden_size == 32 and encoder.lstm.bidirectional and encoder.lstm.num_layers == 3
    per_direction_layer1 = 4 * 32 * (64 + 32 + 2)
    per_direction_upper = 4 * 32 * (64 + 32 + 2)
    assert encoder_num_params(encoder) == (80 * 64 + 64) + 2 * (per_direction_layer1 + 2 * per_direction_upper)


def test_srupp_parameter_count_matches_its_formula():
    from srupp_asr.sru import SRUppEncoder

    encoder = build_encoder("srupp", 80, d_model=64, num_layers=4, attn_dim=16, attn_every=2)
    assert encoder_num_params(encoder) == SRUppEncoder.num_params(80, 64, 4, 16, 2)


def test_unknown_encoder_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match="srupp, conformer, blstm"):
        build_encoder("transformer", 80)


def test_unknown_option_lists_the_valid_ones():
    with pytest.raises(
        ConfigValueError, match=r"^attn_dim is not an option \(valid options: d_model, num_layers, dropout"
    ):
        build_encoder("blstm", 80, attn_dim=64)
    assert encoder_options("conformer") == [
        "d_model",
        "num_layers",
        "num_heads",
        "ffn_dim",
        "depthwise_conv_kernel_size",
        "dropout",
    ]
    assert set(encoder_options("srupp")) == {
        "d_model",
        "num_layers",
        "attn_dim",
        "num_heads",
        "attn_every",
        "dropout",
        "attn_dropout",
        "highway_bias",
        "bidirectional",
        "causal",  # unidirectional layers attending to the past only (the SRU++ LM's; streaming encoders)
    }


def test_sinusoidal_positions_alternate_sine_and_cosine():
    table = sinusoidal_positions(5, 6)
    assert table.shape == (5, 6)
    torch.testing.assert_close(table[:, 0], torch.sin(torch.arange(5.0)))
    torch.testing.assert_close(table[:, 1], torch.cos(torch.arange(5.0)))
    torch.testing.assert_close(table[3, 4], torch.tensor(math.sin(3 / 10000 ** (4 / 6))))
    torch.testing.assert_close(table[3, 5], torch.tensor(math.cos(3 / 10000 ** (4 / 6))))


def test_sequence_mask_marks_the_first_length_positions():
    assert sequence_mask(torch.tensor([2, 0, 3]), 3).tolist() == [
        [True, True, False],
        [False, False, False],
        [True, True, True],
    ]


def test_conformer_layers_match_torchaudio_when_nothing_is_padded():
    from srupp_asr.encoders import _conformer_layer

    encoder = _small("conformer").eval()
    x = torch.randn(9, 2, 32)
    no_padding = torch.zeros(2, 9, dtype=torch.bool)
    for layer in encoder.conformer.conformer_layers:
        torch.testing.assert_close(_conformer_layer(layer, x, no_padding, ~no_padding.t()), layer(x, no_padding))


@pytest.mark.parametrize(
    ("name", "option", "value", "problem"),
    [
        ("srupp", "num_heads", 0, "must be at least 1, got 0"),  # was a ZeroDivisionError
        ("srupp", "num_heads", 3, r"must divide attn_dim \(16\), got 3"),
        ("srupp", "num_layers", 0, "must be at least 1, got 0"),  # was an encoder without layers
        ("srupp", "num_layers", -2, "must be at least 1, got -2"),
        ("srupp", "num_layers", "two", "must be an integer, got 'two'"),
        ("srupp", "d_model", 31, r"must be even \(a bidirectional layer"),
        ("srupp", "d_model", 1e30, "must be an integer, got 1e\\+30"),
        ("srupp", "d_model", 10**30, "must be at most 1048576"),
        ("srupp", "attn_every", -1, "must be non-negative, got -1"),
        ("srupp", "dropout", 1.5, r"must be a finite number >= 0 and < 1, got 1.5"),
        ("srupp", "attn_dropout", float("nan"), "must be a finite number >= 0 and < 1, got nan"),
        ("srupp", "highway_bias", float("inf"), "must be a finite number, got inf"),
        ("srupp", "causal", True, "needs bidirectional: false"),
        ("conformer", "num_heads", 0, "must be at least 1, got 0"),
        ("conformer", "num_heads", 5, r"must divide d_model \(32\), got 5"),
        ("conformer", "num_layers", 0, "must be at least 1, got 0"),
        ("conformer", "depthwise_conv_kernel_size", 8, "must be odd, got 8"),
        ("conformer", "ffn_dim", 0, "must be at least 1, got 0"),
        ("blstm", "d_model", 33, r"must be even \(a bidirectional LSTM"),
        ("blstm", "num_layers", 0, "must be at least 1, got 0"),
        ("blstm", "dropout", -0.1, "must be a finite number >= 0 and < 1, got -0.1"),
    ],
)
def test_bad_option_values_are_config_errors_naming_the_option(name, option, value, problem):
    with pytest.raises(ConfigValueError, match=rf"^{option} {problem}") as err:
        build_encoder(name, INPUT, **{**SMALL[name], option: value})
    assert err.value.option == option


def test_unknown_encoder_is_a_config_error_naming_the_option():
    with pytest.raises(ConfigValueError, match=r"^encoder must be one of \[srupp, conformer, blstm\], got 'lstm'$"):
        build_encoder("lstm", INPUT)
