"""ASRModel: the network from raw audio to joint CTC/attention loss, and greedy CTC decoding."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
import yaml

from srupp_asr.checks import ConfigValueError
from srupp_asr.lightning_module import ASRLightningModule
from srupp_asr.model import ASRModel

VOCAB = 12
ENCODER_CONFS = {
    "srupp": {"num_layers": 2, "attn_dim": 16, "num_heads": 2, "attn_every": 1},
    "conformer": {"num_layers": 1, "num_heads": 2, "ffn_dim": 32, "depthwise_conv_kernel_size": 5},
    "blstm": {"num_layers": 2},
}
DECODER_CONF = {"d_model": 16, "num_layers": 1, "num_heads": 2, "ffn_dim": 32}


def tiny_model(encoder: str = "srupp", **kwargs) -> ASRModel:
    torch.manual_seed(0)
    options = {"d_model": 16, "encoder_conf": ENCODER_CONFS[encoder], "decoder_conf": DECODER_CONF, **kwargs}
    return ASRModel(VOCAB, encoder=encoder, **options)


def random_batch(seconds: tuple[float, ...] = (0.9, 0.6)) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(1)
    lens = torch.tensor([int(s * 16000) for s in seconds])
    audio = 0.1 * torch.randn(len(seconds), int(lens.max()), generator=gen)
    audio = audio * (torch.arange(audio.size(1)) < lens[:, None])
    tokens = torch.tensor([[3, 4, 5, 6], [7, 8, -1, -1]])[: len(seconds)]
    token_lens = (tokens >= 0).sum(1)
    return audio, lens, tokens, token_lens


@pytest.mark.parametrize("encoder", sorted(ENCODER_CONFS))
def test_forward_backward_reaches_every_parameter(encoder):
    model = tiny_model(encoder).train()
    out = model(*random_batch())
    assert set(out) == {"loss", "loss_ctc", "loss_att", "acc"}
    assert out["loss"].dim() == 0 and torch.isfinite(out["loss"])
    assert out["loss_ctc"] > 0 and out["loss_att"] > 0
    assert 0.0 <= float(out["acc"]) <= 1.0
    out["loss"].backward()
    # DDP needs every parameter in the graph: a parameter without a gradient would hang the all-reduce.
    assert [n for n, p in model.named_parameters() if p.grad is None] == []
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    assert sum(float(p.grad.abs().sum()) for p in model.parameters()) > 0


def test_loss_is_the_weighted_sum_and_weights_0_and_1_drop_a_branch():
    joint = tiny_model(ctc_weight=0.3).eval()
    batch = random_batch()
    with torch.no_grad():
        out = joint(*batch)
        assert float(out["loss"]) == pytest.approx(0.3 * float(out["loss_ctc"]) + 0.7 * float(out["loss_att"]))

        ctc_only = tiny_model(ctc_weight=1.0).eval()
        assert ctc_only.decoder is None
        missing, unexpected = ctc_only.load_state_dict(joint.state_dict(), strict=False)
        assert missing == [] and unexpected and all(k.startswith("decoder.") for k in unexpected)
        out_ctc = ctc_only(*batch)
        assert out_ctc["loss_att"] is None and out_ctc["acc"] is None
        assert float(out_ctc["loss"]) == pytest.approx(float(out["loss_ctc"]), rel=1e-5)

        att_only = tiny_model(ctc_weight=0.0).eval()
        assert att_only.ctc is None
        att_only.load_state_dict(joint.state_dict(), strict=False)
        out_att = att_only(*batch)
        assert out_att["loss_ctc"] is None
        assert float(out_att["loss"]) == pytest.approx(float(out["loss_att"]), rel=1e-5)
        assert float(out_att["acc"]) == float(out["acc"])


def test_losses_are_per_utterance_averages_over_the_batch():
    model = tiny_model().eval()
    audio, lens, tokens, token_lens = random_batch((0.8,))
    with torch.no_grad():
        one = model(audio, lens, tokens[:, :4], token_lens)
        two = model(audio.repeat(2, 1), lens.repeat(2), tokens[:, :4].repeat(2, 1), token_lens.repeat(2))
    for key in ("loss", "loss_ctc", "loss_att"):
        assert float(two[key]) == pytest.approx(float(one[key]), rel=1e-5), key


@pytest.mark.parametrize("encoder", sorted(ENCODER_CONFS))
def test_encode_of_an_utterance_does_not_depend_on_its_batch(encoder):
    model = tiny_model(encoder).eval()
    audio, lens, _, _ = random_batch((1.0, 0.55))
    with torch.no_grad():
        alone, alone_lens = model.encode(audio[1:, : lens[1]], lens[1:])
        batched, batched_lens = model.encode(audio, lens)
    n = int(alone_lens[0])
    assert n > 0 and int(batched_lens[1]) == n and alone.shape[1] == n
    torch.testing.assert_close(batched[1, :n], alone[0], atol=1e-4, rtol=0)
    assert batched[1, n:].abs().max() == 0  # padded frames come out as zeros


def test_ctc_greedy_collapses_repeats_and_drops_blanks(monkeypatch):
    model = tiny_model().eval()
    paths = torch.tensor([[0, 3, 3, 0, 3, 4, 4, 0, 5], [6, 6, 0, 0, 7, 9, 9, 9, 9]])
    log_probs = torch.full((2, 9, VOCAB), -10.0).scatter(2, paths[..., None], 0.0)
    monkeypatch.setattr(model, "ctc_log_probs", lambda enc: log_probs)
    # Frames past each length (7 for the second utterance) are padding and never decoded.
    hyps = model.ctc_greedy_encoded(torch.zeros(2, 9, 4), torch.tensor([9, 7]))
    assert hyps == [[3, 3, 4, 5], [6, 7, 9]]


def test_ctc_greedy_decodes_raw_audio():
    model = tiny_model().eval()
    audio, lens, _, _ = random_batch()
    hyps = model.ctc_greedy(audio, lens)
    assert len(hyps) == 2
    assert all(0 < i < VOCAB for hyp in hyps for i in hyp)


def test_cmvn_stats_are_buffers_in_the_state_dict():
    model = tiny_model()
    mean, std = torch.linspace(-1, 1, 80), torch.full((80,), 2.0)
    model.set_cmvn(mean, std)
    state = model.state_dict()
    torch.testing.assert_close(state["cmvn.mean"], mean)
    torch.testing.assert_close(state["cmvn.istd"], torch.full((80,), 0.5))
    assert not any(k.startswith("fbank.") for k in state)  # derived constants are rebuilt, not stored


def test_config_rebuilds_the_same_network():
    model = tiny_model("conformer", ctc_weight=0.5, specaugment=None)
    rebuilt = ASRModel(**model.config)
    assert rebuilt.config == model.config
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {k: v.shape for k, v in model.state_dict().items()}
    assert rebuilt.specaugment is None and rebuilt.num_params() == model.num_params()


def test_specaugment_runs_in_training_only():
    model = tiny_model(specaugment={"time_warp": 0, "freq_masks": 2, "freq_width": 10})
    audio, lens, _, _ = random_batch()
    with torch.no_grad():
        model.eval()
        first, _ = model.encode(audio, lens)
        again, _ = model.encode(audio, lens)
        model.train()
        torch.manual_seed(3)
        augmented, _ = model.encode(audio, lens)
    torch.testing.assert_close(first, again)
    assert not torch.allclose(first, augmented)


def test_bad_ctc_weight_is_rejected():
    with pytest.raises(ConfigValueError, match=r"^ctc_weight must be a finite number >= 0 and <= 1, got 1.5$"):
        tiny_model(ctc_weight=1.5)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"encoder_conf": {**ENCODER_CONFS["srupp"], "num_heads": 0}}, "encoder_conf.num_heads must be at least 1"),
        ({"encoder_conf": {**ENCODER_CONFS["srupp"], "num_layers": 0}}, "encoder_conf.num_layers must be at least 1"),
        ({"encoder_conf": {**ENCODER_CONFS["srupp"], "bogus": 1}}, r"encoder_conf.bogus is not an option \(valid"),
        ({"decoder_conf": {**DECODER_CONF, "num_heads": 0}}, "decoder_conf.num_heads must be at least 1, got 0"),
        ({"decoder_conf": {**DECODER_CONF, "num_heads": 3}}, r"decoder_conf.num_heads must divide d_model \(16\)"),
        ({"decoder_conf": {**DECODER_CONF, "memory_dim": 8}}, "decoder_conf.memory_dim is not an option"),
        ({"decoder_conf": {**DECODER_CONF, "dropout": 1.0}}, "decoder_conf.dropout must be a finite number >= 0"),
        ({"specaugment": {"freq_width": -1}}, "specaugment.freq_width must be non-negative, got -1"),
        ({"specaugment": {"bogus": 1}}, "specaugment.bogus is not an option"),
        ({"n_mels": 0}, "n_mels must be at least 1, got 0"),
        ({"n_mels": 6}, r"n_mels must be at least 7 for subsampling by 4 \(too few\), got 6"),
        ({"subsampling": 5}, r"subsampling must be one of \[4, 6, 8\], got 5"),
        ({"subsampling_channels": 0}, "subsampling_channels must be at least 1, got 0"),
        ({"d_model": "wide"}, "d_model must be an integer, got 'wide'"),
        ({"dither": -5.0}, "dither must be a finite number >= 0, got -5.0"),
        ({"lsm_weight": 1.0}, "lsm_weight must be a finite number >= 0 and < 1, got 1.0"),
    ],
)
def test_bad_values_are_config_errors_named_as_the_config_names_them(options, message):
    with pytest.raises(ConfigValueError, match=f"^{message}"):
        tiny_model(**options)


def test_an_unknown_encoder_is_named_as_the_encoder_option():
    with pytest.raises(ConfigValueError, match=r"^encoder must be one of \[srupp, conformer, blstm\], got 'lstm'$"):
        ASRModel(VOCAB, encoder="lstm", encoder_conf={"num_layers": 1})


def test_lightning_module_mirrors_the_model_arguments():
    model_params = inspect.signature(ASRModel).parameters
    module_params = inspect.signature(ASRLightningModule).parameters
    for name, param in model_params.items():
        if name == "vocab_size":
            continue
        assert name in module_params, name
        assert module_params[name].default == param.default, name


SHIPPED_CONFIGS = sorted(Path(__file__).resolve().parent.parent.glob("conf/*.yaml"))


@pytest.mark.parametrize("config", SHIPPED_CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_passes_the_value_checks(config):
    model = yaml.safe_load(config.read_text()).get("model")
    if not isinstance(model, dict):
        pytest.skip("not a training config")
    names = inspect.signature(ASRModel).parameters
    with torch.device("meta"):  # the checks run; nothing is allocated
        ASRModel(vocab_size=500, **{k: v for k, v in model.items() if k in names})
