"""The SRU++ layer and encoder."""

from __future__ import annotations

import pytest
import torch

from srupp_asr.sru import SRUppEncoder, SRUppLayer, attention_layers


def test_attention_layers_are_counted_from_the_top():
    assert attention_layers(10, 5) == [5, 10]
    assert attention_layers(4, 1) == [1, 2, 3, 4]
    assert attention_layers(6, 4) == [2, 6]
    assert attention_layers(3, 0) == []


@pytest.mark.parametrize("attention", [True, False])
@pytest.mark.parametrize("bidirectional", [True, False])
def test_layer_parameter_count_matches_formula(attention, bidirectional):
    layer = SRUppLayer(64, 24, num_heads=4, attention=attention, bidirectional=bidirectional)
    assert sum(p.numel() for p in layer.parameters()) == SRUppLayer.num_params(64, 24, attention)
    assert f"params={SRUppLayer.num_params(64, 24, attention):,}" in repr(layer)


@pytest.mark.parametrize("input_size", [80, 64])
def test_encoder_parameter_count_matches_formula(input_size):
    enc = SRUppEncoder(input_size, d_model=64, num_layers=5, attn_dim=16, num_heads=2, attn_every=2)
    assert [layer.attention for layer in enc.layers] == [True, False, True, False, True]
    assert sum(p.numel() for p in enc.parameters()) == SRUppEncoder.num_params(input_size, 64, 5, 16, 2)


def _copy_without_attention(layer: SRUppLayer) -> SRUppLayer:
    plain = SRUppLayer(layer.d_model, layer.attn_dim, layer.num_heads, attention=False)
    state = {k: v for k, v in layer.state_dict().items() if not k.startswith(("wk.", "wv.", "alpha"))}
    plain.load_state_dict(state)
    return plain


def test_attention_contributes_nothing_while_alpha_is_zero():
    torch.manual_seed(0)
    layer = SRUppLayer(32, 16, num_heads=2, attention=True).eval()
    plain = _copy_without_attention(layer).eval()
    x = torch.randn(20, 3, 32)
    assert layer.alpha.item() == 0.0
    torch.testing.assert_close(layer(x)[0], plain(x)[0], rtol=0, atol=0)
    with torch.no_grad():
        layer.alpha.fill_(0.5)
    assert not torch.allclose(layer(x)[0], plain(x)[0])


def test_alpha_gets_a_gradient_at_initialisation():
    layer = SRUppLayer(16, 8, attention=True)
    layer(torch.randn(5, 2, 16))[0].square().sum().backward()
    assert layer.alpha.grad is not None and layer.alpha.grad.abs().item() > 0


@pytest.mark.parametrize("bidirectional", [True, False])
def test_encoder_output_does_not_depend_on_padding(bidirectional):
    torch.manual_seed(1)
    enc = SRUppEncoder(
        40, d_model=48, num_layers=4, attn_dim=16, num_heads=2, attn_every=2, bidirectional=bidirectional
    )
    with torch.no_grad():  # make the attention branch matter
        for layer in enc.layers:
            if layer.attention:
                layer.alpha.fill_(1.0)
    enc.eval()
    short, long = torch.randn(1, 13, 40), torch.randn(1, 30, 40)
    alone, _ = enc(short)
    batch = torch.zeros(2, 30, 40)
    batch[0, :13], batch[1] = short[0], long[0]
    out, lengths = enc(batch, torch.tensor([13, 30]))
    assert (out[0, :13] - alone[0]).abs().max().item() <= 1e-5
    assert torch.all(out[0, 13:] == 0)
    assert lengths.tolist() == [13, 30]


def test_encoder_trains_one_step_and_all_parameters_get_gradients():
    enc = SRUppEncoder(20, d_model=24, num_layers=2, attn_dim=8, attn_every=1)
    out, _ = enc(torch.randn(2, 9, 20), torch.tensor([9, 4]))
    out.square().sum().backward()
    missing = [n for n, p in enc.named_parameters() if p.grad is None]
    assert not missing


def test_zero_length_sequence_gives_zeros_not_nan():
    enc = SRUppEncoder(8, d_model=8, num_layers=2, attn_dim=8, attn_every=1)
    with torch.no_grad():
        for layer in enc.layers:
            layer.alpha.fill_(1.0)
    out, _ = enc(torch.randn(2, 5, 8), torch.tensor([5, 0]))
    assert torch.isfinite(out).all() and torch.all(out[1] == 0)
    out.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in enc.parameters() if p.grad is not None)


def test_key_padding_mask_reaches_attention_contiguous(monkeypatch):
    """The mask handed to scaled_dot_product_attention has a stride-1 last dimension: the fused (memory-efficient /
    cuDNN) kernels refuse any other and PyTorch silently falls back to the slow math attention."""
    import torch.nn.functional as F

    seen = []
    sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kwargs):
        seen.append(attn_mask)
        return sdpa(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    layer = SRUppLayer(8, 8, num_heads=2)
    x = torch.randn(5, 3, 8)
    mask = torch.arange(5)[:, None] < torch.tensor([5, 3, 1])[None, :]
    layer(x, mask)
    (key_mask,) = seen
    assert key_mask.shape == (3, 1, 1, 5) and key_mask.stride(-1) == 1
    assert torch.equal(key_mask[:, 0, 0], mask.t())
