"""The numpy SRU++ layer, encoder and LM (srupp_asr.runtime.sru, srupp_asr.runtime.lm) against their torch
references (srupp_asr.sru, srupp_asr.lm)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import srupp_asr
from srupp_asr import sru as torch_sru
from srupp_asr.checks import ConfigValueError
from srupp_asr.fileio import read_yaml_mapping
from srupp_asr.lm import load_lm
from srupp_asr.runtime.lm import SRUppLM
from srupp_asr.runtime.ops import Weights
from srupp_asr.runtime.sru import SRUppEncoder, SRUppLayer

LM_DIR = Path(srupp_asr.__file__).parent / "default_model" / "lm"


def weights_of(module: torch.nn.Module) -> Weights:
    return Weights({k: v.detach().float().numpy() for k, v in module.state_dict().items()})


def randomised(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` in eval mode, its attention switched on (alpha 0.7) and its gate biases random, so that every
    part of a layer shows in its output."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("alpha"):
                p.fill_(0.7)
            elif name.endswith("bias") and p.dim() == 2:
                p.normal_()
    return module.eval()


LAYER_KINDS = [  # (attention, bidirectional, causal)
    (True, True, False),
    (False, True, False),
    (True, False, False),
    (True, False, True),
    (False, False, True),
]


@pytest.mark.parametrize(("attention", "bidirectional", "causal"), LAYER_KINDS)
def test_layer_matches_torch_with_and_without_padding(attention, bidirectional, causal):
    torch.manual_seed(0)
    layer = randomised(torch_sru.SRUppLayer(32, 16, 2, attention, bidirectional, causal=causal))
    weights = weights_of(layer)
    ours = SRUppLayer(weights, 32, 16, 2, attention, bidirectional, causal)
    weights.check_all_taken()
    x = torch.randn(13, 4, 32)
    lengths = torch.tensor([13, 9, 1, 0])  # a full row, padded rows, an empty one
    mask = torch.arange(13)[:, None] < lengths
    with torch.no_grad():
        want_padded, want_full = layer(x, mask)[0].numpy(), layer(x)[0].numpy()
    got_padded = ours.forward(x.numpy(), mask.numpy())
    np.testing.assert_allclose(got_padded, want_padded, rtol=0, atol=2e-6)
    assert not got_padded[~mask.numpy()].any()  # padded steps emit 0
    np.testing.assert_allclose(ours.forward(x.numpy()), want_full, rtol=0, atol=2e-6)
    assert ours.forward(x.numpy()).dtype == np.float32


@pytest.mark.parametrize("attention", [True, False])
def test_layer_steps_match_torch_steps_and_forward_through_a_row_selection(attention):
    torch.manual_seed(1)
    layer = randomised(torch_sru.SRUppLayer(24, 8, 2, attention, bidirectional=False, causal=True))
    ours = SRUppLayer(weights_of(layer), 24, 8, 2, attention, bidirectional=False, causal=True)
    x = torch.randn(6, 3, 24)
    rows = torch.tensor([2, 2, 0])  # after step 3: row 2 twice, row 0; row 1 dropped
    state = ours_state = None
    with torch.no_grad():
        for t in range(6):
            if t == 3:
                state, ours_state = state.select(rows), ours_state.select(rows.numpy())
                x[t:] = x[t:, rows]
            want, state = layer.step(x[t], state)
            got, ours_state = ours.step(x[t].numpy(), ours_state)
            np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=2e-6)
            np.testing.assert_allclose(ours_state.c, state.c.numpy(), rtol=0, atol=2e-6)
    # Without a selection, the steps give what the whole-sequence forward gives.
    x = np.random.default_rng(0).standard_normal((5, 2, 24)).astype(np.float32)
    whole, ours_state = ours.forward(x), None
    for t in range(5):
        h, ours_state = ours.step(x[t], ours_state)
        np.testing.assert_allclose(h, whole[t], rtol=0, atol=2e-6)


def test_step_needs_a_causal_layer():
    layer = torch_sru.SRUppLayer(8, 4, bidirectional=False)
    with pytest.raises(RuntimeError, match="causal"):
        SRUppLayer(weights_of(layer), 8, 4, bidirectional=False).step(np.zeros((1, 8), np.float32))


@pytest.mark.parametrize(("input_size", "bidirectional"), [(20, True), (32, False)])
def test_encoder_matches_torch(input_size, bidirectional):
    torch.manual_seed(2)
    options = {"d_model": 32, "num_layers": 3, "attn_dim": 16, "num_heads": 4, "attn_every": 2}
    encoder = randomised(torch_sru.SRUppEncoder(input_size, bidirectional=bidirectional, dropout=0.3, **options))
    weights = weights_of(encoder)
    ours = SRUppEncoder.from_config(weights, input_size, {**options, "bidirectional": bidirectional, "dropout": 0.3})
    weights.check_all_taken()
    x = torch.randn(3, 17, input_size)
    lengths = torch.tensor([17, 11, 4])
    with torch.no_grad():
        want, _ = encoder(x, lengths)
        want_full, _ = encoder(x)
    got, got_lengths = ours.forward(x.numpy(), lengths.numpy())
    np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=1e-5)
    assert got_lengths.dtype == np.int64 and got_lengths.tolist() == [17, 11, 4]
    assert not got[1, 11:].any() and not got[2, 4:].any()
    got_full, full_lengths = ours.forward(x.numpy())
    np.testing.assert_allclose(got_full, want_full.numpy(), rtol=0, atol=1e-5)
    assert full_lengths.tolist() == [17, 17, 17]


def test_float16_weights_stay_float16_in_the_encoder_and_give_what_their_float32_values_give():
    torch.manual_seed(3)
    options = {"d_model": 32, "num_layers": 2, "attn_dim": 16, "num_heads": 4, "attn_every": 1}
    encoder = randomised(torch_sru.SRUppEncoder(20, **options)).half()
    stored = {k: v.detach().numpy() for k, v in encoder.state_dict().items()}
    ours = SRUppEncoder.from_config(Weights(stored), 20, options)
    cast = SRUppEncoder.from_config(Weights({k: v.astype(np.float32) for k, v in stored.items()}), 20, options)
    assert {ours.layers[0].wq.dtype, ours.layers[0]._wo[0][0].dtype} == {np.dtype(np.float16)}  # half the memory
    x, lengths = np.random.default_rng(0).standard_normal((2, 9, 20)).astype(np.float32), np.array([9, 5])
    np.testing.assert_array_equal(ours.forward(x, lengths)[0], cast.forward(x, lengths)[0])


def test_encoder_refuses_options_it_does_not_know_or_torch_would_refuse():
    with pytest.raises(ConfigValueError, match=r"^heads is not an option"):
        SRUppEncoder.from_config(Weights({}), 8, {"heads": 2})
    with pytest.raises(ConfigValueError, match=r"^num_heads must divide attn_dim"):
        SRUppEncoder.from_config(Weights({}), 8, {"d_model": 8, "attn_dim": 6, "num_heads": 4})
    with pytest.raises(ConfigValueError, match=r"^causal needs bidirectional: false"):
        SRUppEncoder.from_config(Weights({}), 8, {"causal": True})


def test_lm_steps_match_the_builtin_torch_lm_through_selections():
    torch_lm, _ = load_lm(LM_DIR)
    config = read_yaml_mapping(LM_DIR / "config.yaml", "LM config")["lm"]
    weights = weights_of(torch_lm)
    lm = SRUppLM.from_config(config, weights)
    weights.check_all_taken()
    assert lm.vocab_size == torch_lm.vocab_size == 256
    g = torch.Generator().manual_seed(3)
    tokens = torch.full((6,), 2)  # <sos/eos> first
    states = ours = None
    worst = 0.0
    with torch.no_grad():
        for step in range(20):
            want, states = torch_lm.step(tokens, states)
            got, ours = lm.step(tokens.numpy(), ours)
            assert got.dtype == np.float32 and got.shape == (6, 256)
            worst = max(worst, float(np.abs(got - want.numpy()).max()))
            if step in (5, 12):  # reorder and duplicate rows, as a beam search keeps some hypotheses twice
                rows = torch.tensor([3, 3, 0, 5, 1, 1])
                states, ours = [s.select(rows) for s in states], lm.select(ours, rows.numpy())
            tokens = torch.randint(3, 256, (6,), generator=g)
    assert worst < 1e-4
    assert lm.select(None, np.array([0])) is None


def test_lm_config_it_cannot_run_is_not_implemented():
    with pytest.raises(NotImplementedError, match=r"^the numpy runtime cannot run this LM: layers is not an option"):
        SRUppLM.from_config({"vocab_size": 10, "layers": 2}, Weights({}))
    with pytest.raises(NotImplementedError, match="vocab_size must be at least 3"):
        SRUppLM.from_config({"vocab_size": 2}, Weights({}))
