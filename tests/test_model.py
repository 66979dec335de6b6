"""ASRModel: the network from raw audio to joint CTC/attention loss, and greedy CTC decoding."""

from __future__ import annotations

import inspect
import itertools
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import nn

from srupp_asr.checks import ConfigValueError
from srupp_asr.decoder import IGNORE_ID, TransformerDecoder
from srupp_asr.encoders import build_encoder
from srupp_asr.lightning_module import ASRLightningModule
from srupp_asr.model import BLANK_ID, SOS_EOS_ID, ASRModel, ctc_frames_needed
from srupp_asr.sru import SRUppEncoder, SRUppLayer
from tests.helpers import FusedAdamMixin, cpu_trainer
from tests.reference import reference_recurrence

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


# ----------------------------------------------------------------------------------------------------
# moved from tests/test_model_audit.py
# The model's math against independent references written here from the definitions.
#
# References: CTC as a float64 sum over every frame-level path (brute-force enumeration); the label-smoothed
# attention loss as a float64 KL divergence to the smoothed target distribution built in full; the attention
# decoder against ``torch.nn.TransformerDecoderLayer`` (pre-LayerNorm) with its weights copied in; the Conformer
# baseline against ``torchaudio.models.Conformer`` run on each utterance alone; the SRU++ layer against a float64
# re-implementation of docs/design.md's equations (attention, layer norm, projection) over the step-by-step recurrence
# of ``tests/reference.py``. None of them calls the code under test.

REF_VOCAB = 7  # blank 0, <unk> 1, <sos/eos> 2 (the tokenizer's special ids), real tokens 3..6
BLANK, SOS_EOS = BLANK_ID, SOS_EOS_ID
REF_ENCODER_CONFS = {
    "srupp": {"num_layers": 2, "attn_dim": 8, "num_heads": 2, "attn_every": 1},
    "conformer": {"num_layers": 1, "num_heads": 2, "ffn_dim": 16, "depthwise_conv_kernel_size": 3},
    "blstm": {"num_layers": 1},
}
REF_DECODER_CONF = {"d_model": 8, "num_layers": 2, "num_heads": 2, "ffn_dim": 16, "dropout": 0.0}


def _model(encoder: str = "srupp", **kwargs) -> ASRModel:
    torch.manual_seed(0)
    conf = {"encoder_conf": {**REF_ENCODER_CONFS[encoder], "dropout": 0.0}, "decoder_conf": REF_DECODER_CONF}
    return ASRModel(REF_VOCAB, n_mels=20, d_model=8, encoder=encoder, specaugment=None, **{**conf, **kwargs})


def _padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    tokens = torch.tensor([r + [IGNORE_ID] * (width - len(r)) for r in rows])
    return tokens, torch.tensor([len(r) for r in rows])


# ---------------------------------------------------------------- CTC


def _ctc_brute_force(log_probs: list[list[float]], target: list[int]) -> float:
    """-log of the summed probability of every frame-level path that collapses to ``target`` (inf when none)."""
    total = -math.inf
    for path in itertools.product(range(len(log_probs[0])), repeat=len(log_probs)):
        collapsed = [s for i, s in enumerate(path) if s != BLANK and (i == 0 or s != path[i - 1])]
        if collapsed == target:
            score = sum(lp[s] for lp, s in zip(log_probs, path, strict=True))
            total = score if total == -math.inf else max(total, score) + math.log1p(math.exp(-abs(total - score)))
    return -total


def _with_ctc_log_probs(model: ASRModel, monkeypatch: pytest.MonkeyPatch, log_probs: torch.Tensor) -> torch.Tensor:
    """Make the CTC head return ``log_probs`` ``(B, T, V)``; returns a matching stand-in encoder output that
    carries a gradient, so the test can see what reaches the head."""
    enc = torch.zeros(*log_probs.shape[:2], model.encoder.output_size, requires_grad=True)
    monkeypatch.setattr(model, "ctc_log_probs", lambda e: log_probs + 0.0 * e.sum())
    return enc


@pytest.mark.reference
def test_ctc_loss_equals_the_brute_force_sum_over_paths_divided_by_the_batch(monkeypatch):
    # Repeated tokens need a blank between them: [3, 3] fits 3 frames exactly; [4, 4, 4] needs 5 and gets 5;
    # [3, 4, 3] in 4 frames; an empty transcript is all blanks.
    model = _model(ctc_weight=1.0)
    cases = [([3, 3], 3), ([4, 4, 4], 5), ([3, 4, 3], 4), ([5, 6], 5), ([], 3)]
    gen = torch.Generator().manual_seed(0)
    T = max(t for _, t in cases)
    log_probs = torch.randn(len(cases), T, REF_VOCAB, generator=gen, dtype=torch.float64).log_softmax(-1)
    expected = sum(_ctc_brute_force(log_probs[b, :t].tolist(), y) for b, (y, t) in enumerate(cases)) / len(cases)
    tokens, token_lens = _padded([y for y, _ in cases])
    enc = _with_ctc_log_probs(model, monkeypatch, log_probs.float())
    out = model.losses(enc, torch.tensor([t for _, t in cases]), tokens, token_lens)
    assert out["loss_ctc"].item() == pytest.approx(expected, rel=1e-6)
    assert out["loss"].item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.reference
def test_an_utterance_ctc_cannot_emit_adds_nothing_and_leaves_the_rest_of_the_batch_finite(monkeypatch):
    # [3, 3] needs 3 frames; with 2 its loss is infinite. It is dropped (ESPnet's zero_infinity) but still counts
    # in the batch size: the loss is the feasible utterance's over 2, and its gradient is exactly zero.
    model = _model(ctc_weight=1.0)
    log_probs = torch.randn(2, 4, REF_VOCAB, generator=torch.Generator().manual_seed(1)).log_softmax(-1)
    log_probs.requires_grad_(True)
    tokens, token_lens = _padded([[3, 3], [4, 5]])
    enc = _with_ctc_log_probs(model, monkeypatch, log_probs)
    out = model.losses(enc, torch.tensor([2, 4]), tokens, token_lens)
    feasible = _ctc_brute_force(log_probs[1].tolist(), [4, 5])
    assert math.isinf(_ctc_brute_force(log_probs[0, :2].tolist(), [3, 3]))
    assert out["loss"].item() == pytest.approx(feasible / 2, rel=1e-5)
    out["loss"].backward()
    assert torch.isfinite(log_probs.grad).all()
    assert log_probs.grad[0].abs().max() == 0 and log_probs.grad[1].abs().max() > 0


@pytest.mark.reference
@pytest.mark.parametrize("encoder", sorted(REF_ENCODER_CONFS))
@pytest.mark.parametrize("ctc_weight", [0.3, 0.0])
def test_a_batch_with_no_encoder_frames_gives_a_finite_loss_and_a_gradient_for_every_parameter(encoder, ctc_weight):
    # 600 and 400 samples are 2 and 1 filterbank frames: subsampling by 4 leaves no frame at all, so every
    # non-empty transcript is out of CTC's reach (dropped, as above), an empty one costs nothing, and the decoder
    # sees an empty memory.
    # Was: F.ctc_loss raised "log_probs tensor must not be empty" (srupp), torchaudio's attention "cannot reshape
    # tensor of 0 elements" (conformer), pack_padded_sequence "Cannot pack empty tensors" (blstm): a traceback that
    # ended the training run (or the validation) at the first batch of too-short cuts; and with no CTC branch
    # (ctc_weight 0, SRU++) the subsampling parameters got no gradient at all (DDP waits for every parameter).
    model = _model(encoder, ctc_weight=ctc_weight).train()
    audio = 0.1 * torch.randn(2, 600, generator=torch.Generator().manual_seed(2))
    tokens, token_lens = _padded([[3, 4], []])
    enc, enc_lens = model.encode(audio, torch.tensor([600, 400]))
    assert enc_lens.tolist() == [0, 0] and torch.all(enc == 0)
    out = model(audio, torch.tensor([600, 400]), tokens, token_lens)
    assert out["loss_ctc"] is None if ctc_weight == 0 else out["loss_ctc"].item() == 0.0
    assert math.isfinite(out["loss_att"].item()) and out["loss_att"].item() > 0
    out["loss"].backward()
    assert [n for n, p in model.named_parameters() if p.grad is None] == []
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.reference
@pytest.mark.parametrize("encoder", sorted(REF_ENCODER_CONFS))
def test_audio_too_short_for_one_encoder_frame_decodes_to_nothing(encoder):
    # Was: the Conformer and BLSTM encoders raised on the empty time axis ("cannot reshape tensor of 0 elements",
    # "Cannot pack empty tensors"), so such a model could not transcribe a 1-sample file (the SRU++ model could).
    model = _model(encoder).eval()
    assert model.ctc_greedy(torch.zeros(2, 400), torch.tensor([1, 400])) == [[], []]


# ---------------------------------------------------------------- attention loss


def _smoothed_kl(logits: torch.Tensor, target: list[int], smoothing: float) -> float:
    """Float64 sum over positions of KL(q || softmax(logits)), q = 1 - smoothing on the target, the rest spread
    evenly over the other tokens (ESPnet's LabelSmoothingLoss), written from the definition."""
    logp = logits.double().log_softmax(-1)
    total = 0.0
    for u, y in enumerate(target):
        q = torch.full((logits.shape[-1],), smoothing / (logits.shape[-1] - 1), dtype=torch.float64)
        q[y] = 1.0 - smoothing
        total += float((q * (q.log() - logp[u])).sum())
    return total


@pytest.mark.reference
def test_attention_loss_is_the_smoothed_kl_of_sos_y_to_y_eos_summed_per_utterance_over_the_batch():
    model = _model(ctc_weight=0.0, lsm_weight=0.2).eval()
    transcripts = [[3, 4, 5, 6], [6], []]
    frames = [7, 3, 5]
    memory = torch.randn(3, 7, 8, generator=torch.Generator().manual_seed(3))
    tokens, token_lens = _padded(transcripts)
    with torch.no_grad():
        out = model.losses(memory, torch.tensor(frames), tokens, token_lens)
        loss, hits, scored = 0.0, 0, 0
        for y, t, m in zip(transcripts, frames, memory, strict=True):
            # Each utterance alone, unpadded: decoder input <sos> y, target y <eos>.
            ys_in, ys_out = torch.tensor([[SOS_EOS, *y]]), [*y, SOS_EOS]
            logits = model.decoder(m[None, :t], torch.tensor([t]), ys_in, torch.tensor([len(ys_in[0])]))[0]
            loss += _smoothed_kl(logits, ys_out, 0.2)
            hits += sum(int(a == b) for a, b in zip(logits.argmax(-1).tolist(), ys_out, strict=True))
            scored += len(ys_out)
    assert float(out["loss_att"]) == pytest.approx(loss / 3, rel=1e-5)
    assert float(out["acc"]) == pytest.approx(hits / scored, abs=1e-7)  # padding excluded, <eos> included


# ---------------------------------------------------------------- decoder


def _torch_decoder_reference(decoder: TransformerDecoder) -> tuple[nn.ModuleList, nn.LayerNorm]:
    """``torch.nn.TransformerDecoderLayer`` s (pre-LayerNorm, ReLU) holding ``decoder``'s weights."""
    d, heads = decoder.d_model, decoder.layers[0].self_attn.num_heads
    ffn = decoder.layers[0].ffn[0].out_features
    layers = nn.ModuleList()
    for ours in decoder.layers:
        ref = nn.TransformerDecoderLayer(d, heads, ffn, dropout=0.0, batch_first=True, norm_first=True)
        with torch.no_grad():
            for theirs, mine in ((ref.self_attn, ours.self_attn), (ref.multihead_attn, ours.cross_attn)):
                theirs.in_proj_weight.copy_(torch.cat([mine.wq.weight, mine.wk.weight, mine.wv.weight]))
                theirs.in_proj_bias.copy_(torch.cat([mine.wq.bias, mine.wk.bias, mine.wv.bias]))
                theirs.out_proj.load_state_dict(mine.wo.state_dict())
            ref.linear1.load_state_dict(ours.ffn[0].state_dict())
            ref.linear2.load_state_dict(ours.ffn[3].state_dict())
            for theirs, mine in ((ref.norm1, ours.norm_self), (ref.norm2, ours.norm_cross), (ref.norm3, ours.norm_ffn)):
                theirs.load_state_dict(mine.state_dict())
        layers.append(ref.eval())
    return layers, decoder.final_norm


@pytest.mark.reference
def test_decoder_equals_torch_transformer_decoder_layers_on_each_utterance_of_a_padded_batch():
    torch.manual_seed(0)
    decoder = TransformerDecoder(REF_VOCAB, d_model=8, num_layers=2, num_heads=2, ffn_dim=16, dropout=0.0).eval()
    layers, final_norm = _torch_decoder_reference(decoder)
    gen = torch.Generator().manual_seed(4)
    memory = torch.randn(2, 9, 8, generator=gen)
    frames, ys = [9, 4], [[SOS_EOS, 3, 4, 5, 6], [SOS_EOS, 6, 3]]
    batch = torch.full((2, 5), SOS_EOS)
    batch[0], batch[1, :3] = torch.tensor(ys[0]), torch.tensor(ys[1])
    memory[1, 4:] = 7.0  # padded memory frames that would show if they were read
    with torch.no_grad():
        logits = decoder(memory, torch.tensor(frames), batch, torch.tensor([5, 3]))
        for b in range(2):
            U = len(ys[b])
            # Sinusoidal positions from the definition: sin in even, cos in odd columns, 10000^(-2i/d).
            pos = torch.arange(U, dtype=torch.float64)[:, None] / 10000 ** (torch.arange(0, 8, 2) / 8)
            table = torch.stack([pos.sin(), pos.cos()], -1).flatten(1).float()
            x = decoder.embed.weight[ys[b]] * math.sqrt(8) + table
            future = torch.triu(torch.ones(U, U, dtype=torch.bool), 1)  # True: may not attend
            for layer in layers:
                x = layer(x[None], memory[b : b + 1, : frames[b]], tgt_mask=future)[0]
            expected = decoder.output(final_norm(x))
            torch.testing.assert_close(logits[b, :U], expected, rtol=0, atol=1e-5)


@pytest.mark.reference
def test_changing_a_later_token_of_a_batched_utterance_changes_none_of_its_earlier_logits():
    torch.manual_seed(0)
    decoder = TransformerDecoder(REF_VOCAB, d_model=8, num_layers=2, num_heads=2, ffn_dim=16, dropout=0.0).eval()
    memory, lens = torch.randn(2, 6, 8), torch.tensor([6, 4])
    ys = torch.tensor([[SOS_EOS, 3, 4, 5, 6], [SOS_EOS, 5, 5, 3, 4]])
    with torch.no_grad():
        base = decoder(memory, lens, ys, torch.tensor([5, 5]))
        for u in range(1, 5):
            changed = ys.clone()
            changed[:, u] = (changed[:, u] - 2) % (REF_VOCAB - 3) + 3  # another real token
            other = decoder(memory, lens, changed, torch.tensor([5, 5]))
            torch.testing.assert_close(other[:, :u], base[:, :u], rtol=0, atol=0)
            assert (other[:, u:] - base[:, u:]).abs().amax() > 1e-4


# ---------------------------------------------------------------- encoders


@pytest.mark.reference
def test_conformer_encoder_equals_torchaudio_conformer_on_each_utterance_alone():
    encoder = build_encoder("conformer", 12, d_model=8, num_layers=2, num_heads=2, ffn_dim=16, dropout=0.0)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():  # running statistics far from (0, 1), so BatchNorm matters
        for layer in encoder.conformer.conformer_layers:
            norm = layer.conv_module.sequential[3]
            norm.running_mean.copy_(torch.randn(8, generator=gen))
            norm.running_var.copy_(torch.rand(8, generator=gen) + 0.5)
    encoder.eval()
    lengths = [11, 6, 1]
    x = torch.full((3, 11, 12), 5.0)
    for b, n in enumerate(lengths):
        x[b, :n] = torch.randn(n, 12, generator=gen)
    with torch.no_grad():
        out, _ = encoder(x, torch.tensor(lengths))
        for b, n in enumerate(lengths):
            pos = torch.arange(n, dtype=torch.float64)[:, None] / 10000 ** (torch.arange(0, 8, 2) / 8)
            table = torch.stack([pos.sin(), pos.cos()], -1).flatten(1).float()
            h = F.linear(x[b, :n], encoder.input_proj.weight, encoder.input_proj.bias) * math.sqrt(8) + table
            expected, _ = encoder.conformer(h[None], torch.tensor([n]))  # torchaudio's own forward, no padding
            torch.testing.assert_close(out[b, :n], expected[0], rtol=0, atol=1e-5)
            assert torch.all(out[b, n:] == 0)


def _sru_layer_reference(layer: SRUppLayer, x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """Float64 SRU++ layer from docs/design.md: Q = Wq x; K = Wk Q; V = Wv Q; per head softmax(Q K^T / sqrt(d_head)) V
    over real keys; U = Wo layernorm(Q + alpha A); then the recurrence with x as the highway input."""
    p = {k: v.double() for k, v in layer.state_dict().items()}
    x = x.double()
    L, B, D = x.shape
    heads, dh = layer.num_heads, layer.attn_dim // layer.num_heads
    q = x @ p["wq.weight"].T
    z = q.clone()
    if layer.attention:
        k, v = q @ p["wk.weight"].T, q @ p["wv.weight"].T
        for b, n in enumerate(lengths):
            for h in range(heads):
                cols = slice(h * dh, (h + 1) * dh)
                scores = q[:, b, cols] @ k[:n, b, cols].T / math.sqrt(dh)  # (L, n): real keys only
                z[:, b, cols] += p["alpha"] * (scores.softmax(-1) @ v[:n, b, cols])
    normed = (z - z.mean(-1, keepdim=True)) / (z.var(-1, unbiased=False, keepdim=True) + layer.norm.eps).sqrt()
    u = (normed * p["norm.weight"] + p["norm.bias"]) @ p["wo.weight"].T
    mask = torch.arange(L)[:, None] < torch.tensor(lengths)[None, :]
    h, _ = reference_recurrence(u.view(L, B, D, 3), x, p["weight_c"], p["bias"], None, mask, layer.bidirectional)
    return h


@pytest.mark.reference
@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("attention", [True, False])
def test_srupp_layer_equals_a_float64_reference_of_the_design_equations(bidirectional, attention):
    torch.manual_seed(0)
    layer = SRUppLayer(12, 8, num_heads=2, attention=attention, bidirectional=bidirectional).eval()
    if attention:
        with torch.no_grad():
            layer.alpha.fill_(0.7)
    lengths = [9, 5, 1]
    x = torch.randn(9, 3, 12, generator=torch.Generator().manual_seed(6))
    mask = torch.arange(9)[:, None] < torch.tensor(lengths)[None, :]
    x = x * mask[..., None]
    with torch.no_grad():
        h, _ = layer(x, mask)
    expected = _sru_layer_reference(layer, x, lengths)
    torch.testing.assert_close(h.double(), expected, rtol=0, atol=2e-5)


@pytest.mark.reference
def test_conformer_padding_aware_convolution_module_passes_gradcheck():
    from srupp_asr.encoders import _conv_module

    torch.manual_seed(0)
    encoder = build_encoder("conformer", 4, d_model=4, num_layers=1, num_heads=1, ffn_dim=8, dropout=0.0).double()
    conv = encoder.conformer.conformer_layers[0].conv_module.train()  # BatchNorm over the real frames only
    valid = (torch.arange(5)[:, None] < torch.tensor([5, 3])[None, :]).contiguous()  # (T, B)
    x = torch.randn(5, 2, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: _conv_module(conv, t, valid), (x,))


@pytest.mark.reference
@pytest.mark.parametrize("lengths", [[1], [1, 0]])
def test_conformer_trains_on_a_batch_with_a_single_real_frame(lengths):
    # Was: BatchNorm1d, fed the real frames only, raised "Expected more than 1 value per channel when training"
    # whenever a training batch held one real encoder frame in all (one cut of ~85-125 ms at x4, alone or beside
    # cuts too short for any frame): a traceback that ended the run. Such a batch is now normalised with the
    # running statistics, which it leaves unchanged.
    encoder = build_encoder("conformer", 12, d_model=8, num_layers=1, num_heads=2, ffn_dim=16, dropout=0.0).train()
    norm = encoder.conformer.conformer_layers[0].conv_module.sequential[3]
    with torch.no_grad():
        norm.running_mean.fill_(0.3)
        norm.running_var.fill_(2.0)
    x = torch.randn(len(lengths), 1, 12, generator=torch.Generator().manual_seed(7), requires_grad=True)
    out, _ = encoder(x, torch.tensor(lengths))
    out.square().sum().backward()
    assert torch.isfinite(out).all() and out[0, 0].abs().sum() > 0 and torch.all(out[1:] == 0)
    assert torch.isfinite(x.grad).all() and x.grad[0].abs().sum() > 0
    assert torch.all(norm.running_mean == 0.3) and torch.all(norm.running_var == 2.0)
    with torch.no_grad():  # the same normalisation as in evaluation
        torch.testing.assert_close(out[:1], encoder.eval()(x[:1], torch.tensor([1]))[0], rtol=0, atol=1e-6)


# ---------------------------------------------------------------- parameter counts


@pytest.mark.reference
@pytest.mark.parametrize(
    ("config", "vocab", "millions"),
    [
        ("librispeech_srupp.yaml", 5000, 115.2),  # docs/recipes.md and the config's comment
        ("librispeech_conformer.yaml", 5000, 113.0),
        ("synth_en_gpu.yaml", 256, 15.8),  # the built-in default model
        ("synth_en_cpu.yaml", 256, 2.3),
    ],
)
def test_documented_parameter_counts_are_the_built_models(config, vocab, millions):
    conf = yaml.safe_load((Path(__file__).resolve().parent.parent / "conf" / config).read_text())["model"]
    names = inspect.signature(ASRModel).parameters
    with torch.device("meta"):
        model = ASRModel(vocab_size=vocab, **{k: v for k, v in conf.items() if k in names})
    assert round(sum(p.numel() for p in model.parameters()) / 1e6, 1) == millions


@pytest.mark.reference
def test_readme_srupp_parameter_example_is_the_built_encoder():
    with torch.device("meta"):
        encoder = SRUppEncoder(256, d_model=512, num_layers=10, attn_dim=128, attn_every=5)
    assert sum(p.numel() for p in encoder.parameters()) == SRUppEncoder.num_params(256, 512, 10, 128, 5) == 2_841_602


# ---------------------------------------------------------------- host syncs of a training step (issue 28)


def test_encoder_lengths_on_the_host_are_the_counts_encode_gives():
    model = tiny_model().eval()
    lens = torch.tensor([0, 399, 400, 1000, 1359, 1360, 1361, 16000, 16001])
    _, enc_lens = model.encode(torch.zeros(len(lens), int(lens.max())), lens)
    assert torch.equal(model.encoder_lengths(lens), enc_lens)


def test_srupp_key_mask_made_once_per_batch_equals_each_layer_making_its_own():
    torch.manual_seed(0)
    encoder = SRUppEncoder(8, d_model=16, num_layers=3, attn_dim=8, num_heads=2, attn_every=1).eval()
    x, lens = torch.randn(3, 7, 8), torch.tensor([7, 4, 0])
    out, _ = encoder(x, lens)
    mask = torch.arange(7)[:, None] < lens[None, :]
    h = encoder.input_proj(x).transpose(0, 1) * mask[..., None]
    for layer in encoder.layers:
        h, _ = layer(h, mask)  # each layer builds the key mask itself
    assert torch.equal(out, h.transpose(0, 1))


class _SyncCountingModule(ASRLightningModule):
    """Counts, with tests/host_syncs.py, what training_step and backward would make the host wait for on a GPU."""

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        moved = super().transfer_batch_to_device(batch, device, dataloader_idx)
        # On a CPU the "device" tokens are the host's tensor itself: a copy keeps the two apart, as on a GPU.
        return {**moved, "tokens": moved["tokens"].clone()}

    def training_step(self, batch, batch_idx):
        from tests.host_syncs import HostSyncCounter

        host = [batch[k] for k in ("audio_lens", "token_lens", "host_tokens")]
        self.counter = HostSyncCounter(host)
        with self.counter:
            return super().training_step(batch, batch_idx)

    def backward(self, loss, *args, **kwargs):
        with self.counter:
            super().backward(loss, *args, **kwargs)
        self.counts.append((dict(self.counter.syncs), sum(self.counter.inherent.values())))


class _FusedSyncCountingModule(FusedAdamMixin, _SyncCountingModule):
    """With fused Adam, as on CUDA: the non-finite guard then runs on the device (found_inf)."""


@pytest.mark.parametrize("fused", [False, True], ids=["adam", "fused adam"])
@pytest.mark.parametrize("ctc_weight", [0.3, 1.0])
def test_a_training_step_reads_the_device_once_or_never(char_tokenizer, ctc_weight, fused):
    # Was 4 reads in training_step alone on a GPU (the non-finite guard's flags made on the host and read back one
    # by one, the loss's finiteness, the count of utterances CTC cannot emit), 3 blocking copies of logged numbers to
    # the device, 1 in the SRU++ encoder (is the batch padded?) and 2 in CTC (its lengths, read back to the host).
    # What remains with an optimizer that cannot skip on the device: the non-finite guard's one fused read (the skip
    # decision is the host's, before backward, and every rank's must agree). With fused Adam (CUDA's): none, the
    # flag is its found_inf. Apart: PyTorch's CUDA CTC, which copies host lengths to the device inside, forward and
    # backward (counted apart).
    torch.manual_seed(0)
    module = (_FusedSyncCountingModule if fused else _SyncCountingModule)(
        str(char_tokenizer.path),
        d_model=16,
        encoder_conf=ENCODER_CONFS["srupp"],
        decoder_conf=DECODER_CONF,
        ctc_weight=ctc_weight,
        warmup_steps=10,
    )
    module.counts = []
    audio, lens, tokens, token_lens = random_batch()
    batch = {"audio": audio, "audio_lens": lens, "tokens": tokens, "token_lens": token_lens}
    trainer = cpu_trainer(2)
    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader([batch, batch], batch_size=None))
    assert len(module.counts) == 2
    for syncs, ctc in module.counts:
        if fused:
            assert syncs == {}
        else:
            assert len(syncs) == 1 and next(iter(syncs)).startswith("srupp_asr/lightning_module.py"), syncs
            assert sum(syncs.values()) == 1
        assert ctc == 2  # F.ctc_loss forward and backward
    assert {"train/loss", "train/lr", "train/nonfinite_skipped"} <= set(trainer.callback_metrics)


def _inductor_available() -> bool:
    import shutil

    try:
        import torch._inductor  # noqa: F401
    except ImportError:
        return False
    return shutil.which("c++") is not None or shutil.which("g++") is not None


@pytest.mark.parametrize(
    "backend",
    [
        "aot_eager",  # dynamo's graphs and breaks, through AOTAutograd, without code generation: seconds
        pytest.param(
            "inductor",  # about a minute of compiling on 2 CPU cores
            marks=[
                pytest.mark.slow,
                pytest.mark.skipif(not _inductor_available(), reason="inductor or a C++ compiler is missing"),
            ],
        ),
    ],
)
def test_compiled_model_gives_eager_losses_and_gradients(backend):
    # The SRU++ recurrence (a custom autograd Function with its own kernels) runs eagerly between the compiled graphs;
    # CTC and the encoder's padding check break the graph too. Inductor draws dropout masks from its own generator,
    # so it is compared without dropout; aot_eager with it (the same draws as eager).
    train = backend == "aot_eager"
    batch = random_batch()

    def step(model: nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        torch.manual_seed(5)
        out = model(*batch)
        out["loss"].backward()
        return out["loss"].detach(), {n.replace("_orig_mod.", ""): p.grad for n, p in model.named_parameters()}

    loss, grads = step(tiny_model(specaugment=None).train(train))
    torch._dynamo.reset()
    compiled_loss, compiled_grads = step(torch.compile(tiny_model(specaugment=None).train(train), backend=backend))
    tolerance = {"rtol": 1e-6, "atol": 1e-6} if train else {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(compiled_loss, loss, **tolerance)
    assert compiled_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, **tolerance, msg=name)


def test_ctc_frames_needed_counts_a_blank_between_equal_neighbours_and_nothing_for_empty_transcripts():
    tokens, token_lens = _padded([[3, 3, 4], [5], []])
    assert ctc_frames_needed(tokens, token_lens).tolist() == [4, 1, 0]
    assert ctc_frames_needed(tokens[:, :0], torch.zeros(3, dtype=torch.int64)).tolist() == [0, 0, 0]


@pytest.mark.parametrize("mixed", [False, True], ids=["all silent", "silent and spoken"])
def test_a_batch_of_silences_with_empty_transcripts_trains(char_tokenizer, mixed):
    # Was: a batch whose transcripts were all empty (U = 0), as a corpus with silence cuts draws now and then,
    # stopped training in ctc_frames_needed (torch.arange(1, 0)).
    torch.manual_seed(0)
    module = ASRLightningModule(
        str(char_tokenizer.path), d_model=16, encoder_conf=ENCODER_CONFS["srupp"], decoder_conf=DECODER_CONF
    )
    audio, lens, tokens, token_lens = random_batch()
    if mixed:
        tokens, token_lens = tokens[:, :2].clone(), torch.tensor([2, 0])
        tokens[1] = -1
    else:
        tokens, token_lens = tokens[:, :0], torch.zeros(2, dtype=torch.int64)
    batch = {"audio": audio, "audio_lens": lens, "tokens": tokens, "token_lens": token_lens}
    before = [p.detach().clone() for p in module.parameters()]
    trainer = cpu_trainer(1)
    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader([batch], batch_size=None))
    assert math.isfinite(trainer.callback_metrics["train/loss"])
    assert trainer.callback_metrics["train/nonfinite_skipped"] == 0
    assert any(not torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))
