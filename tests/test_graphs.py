"""srupp_asr.graphs: the padded training losses (CPU: without graphs) and their CUDA graphs (GPU tests)."""

from __future__ import annotations

import logging
import re
import types

import pytest
import torch

from srupp_asr.checks import ConfigValueError
from srupp_asr.errors import UserError
from srupp_asr.graphs import GraphedLosses, ShapeBuckets
from srupp_asr.lightning_module import ASRLightningModule
from srupp_asr.model import ASRModel
from tests.helpers import cpu_trainer
from tests.host_syncs import HostSyncCounter

VOCAB = 12
QUIET = {"dropout": 0.0, "attn_dropout": 0.0}  # no random draws: padded and unpadded runs see the same numbers
ENCODER = {"num_layers": 3, "attn_dim": 16, "num_heads": 2, "attn_every": 2, **QUIET}
DECODER = {"d_model": 16, "num_layers": 1, "num_heads": 2, "ffn_dim": 32, "dropout": 0.0}
# Edges that pad every axis of batch(): 3 rows -> 4, 0.95 s -> 1.0 s, 5 tokens -> 8.
BUCKETS = ShapeBuckets(seconds=0.5, tokens=4, rows=4)


def _encoder_conf(encoder: str) -> dict:
    return ENCODER if encoder == "srupp" else {"num_layers": 1, "num_heads": 2, "ffn_dim": 32}


def model(ctc_weight: float = 0.3, encoder: str = "srupp", **kwargs) -> ASRModel:
    torch.manual_seed(0)
    conf = _encoder_conf(encoder)
    return ASRModel(
        VOCAB,
        d_model=16,
        encoder=encoder,
        encoder_conf=conf,
        decoder_conf=DECODER,
        ctc_weight=ctc_weight,
        specaugment=None,
        **kwargs,
    ).train()


def batch(seconds=(0.95, 0.6, 0.3), seed: int = 1) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    lens = torch.tensor([int(s * 16000) for s in seconds])
    audio = 0.1 * torch.randn(len(seconds), int(lens.max()), generator=gen)
    audio = audio * (torch.arange(audio.size(1)) < lens[:, None])
    token_lens = torch.tensor([5, 3, 1, 4, 2, 5][: len(seconds)])
    tokens = torch.randint(3, VOCAB, (len(seconds), int(token_lens.max())), generator=gen)
    tokens = tokens.masked_fill(torch.arange(tokens.size(1)) >= token_lens[:, None], -1)
    return audio, lens, tokens, token_lens


def losses_and_grads(net: ASRModel, losses, args) -> tuple[dict, dict]:
    net.zero_grad(set_to_none=True)
    out = losses(*args)
    out["loss"].backward()
    grads = {name: p.grad.clone() for name, p in net.named_parameters() if p.grad is not None}
    return {k: v.detach() for k, v in out.items() if v is not None}, grads


def test_shape_buckets_round_each_axis_up_to_its_edge():
    buckets = ShapeBuckets(seconds=0.5, tokens=16, rows=8)
    assert buckets.shape(3, 15200, 5) == (8, 16000, 16)
    assert buckets.shape(8, 16000, 16) == (8, 16000, 16)  # already on the edges
    assert buckets.shape(9, 16001, 17) == (16, 24000, 32)
    assert buckets.shape(1, 0, 0) == (8, 8000, 0)  # an empty transcript axis stays empty
    for bad in ({"seconds": 0.0}, {"tokens": 0}, {"rows": 1.5}):
        with pytest.raises(ConfigValueError):
            ShapeBuckets(**bad)


@pytest.mark.parametrize("ctc_weight", [0.0, 0.3, 1.0])
def test_the_padded_losses_and_gradients_are_the_models(ctc_weight):
    # Padding rows, samples and tokens must change no number beyond rounding: the graphs train on padded batches.
    net = model(ctc_weight)
    args = batch()
    expected, expected_grads = losses_and_grads(net, net, args)
    padded = GraphedLosses(net, BUCKETS)
    got, grads = losses_and_grads(net, padded, args)
    assert padded.recorded == 0  # on the CPU the same computation runs without graphs
    assert set(got) == set(expected)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)
    assert set(grads) == set(expected_grads) and len(grads) == len(list(net.parameters()))
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_a_batch_already_on_the_edges_is_not_padded():
    net = model()
    args = batch(seconds=(1.0, 0.5, 0.5, 0.75))
    expected, _ = losses_and_grads(net, net, args)
    got, _ = losses_and_grads(net, GraphedLosses(net, BUCKETS), args)
    torch.testing.assert_close(got["loss"], expected["loss"], rtol=1e-6, atol=1e-7)


def test_the_graphed_part_reads_nothing_back_to_the_host():
    # Recording a CUDA graph fails on a host sync. With the lengths on the host, as a training batch keeps them, the
    # one thing left that reads the device is PyTorch's CUDA CTC, which runs outside the graph (counted apart).
    net = model()
    audio, lens, tokens, token_lens = batch()
    host_tokens = tokens
    tokens = tokens.clone()  # the "device" tokens, apart from the host's as on a GPU
    counter = HostSyncCounter([lens, token_lens, host_tokens])
    with counter:
        out = GraphedLosses(net, BUCKETS)(audio, lens, tokens, token_lens)
        out["loss"].backward()
    assert dict(counter.syncs) == {}
    assert sum(counter.inherent.values()) == 2  # F.ctc_loss forward and backward


def test_only_the_srupp_encoder_can_be_graphed():
    with pytest.raises(UserError, match="srupp encoder, not ConformerEncoder"):
        GraphedLosses(model(encoder="conformer"))


def _module(tokenizer, cuda_graphs, encoder: str = "srupp") -> ASRLightningModule:
    torch.manual_seed(0)
    conf = _encoder_conf(encoder)
    return ASRLightningModule(
        str(tokenizer.path),
        d_model=16,
        encoder=encoder,
        encoder_conf=conf,
        decoder_conf=DECODER,
        specaugment=None,
        warmup_steps=10,
        cuda_graphs=cuda_graphs,
    )


def test_training_with_the_cuda_graphs_option_takes_the_same_steps(char_tokenizer, caplog):
    # model.cuda_graphs routes training_step through GraphedLosses (on a CPU: the padded computation, no graphs).
    audio, lens, _, _ = batch()
    tokens = [torch.tensor(char_tokenizer.encode(t)) for t in ("hello world", "the cat", "fun")]
    token_lens = torch.tensor([len(t) for t in tokens])
    tokens = torch.nn.utils.rnn.pad_sequence(tokens, batch_first=True, padding_value=-1)
    data = [{"audio": audio, "audio_lens": lens, "tokens": tokens, "token_lens": token_lens}] * 2
    steps = []
    for graphs in (None, {"seconds": 0.5, "tokens": 4, "rows": 4, "max_graphs": 2}):
        module = _module(char_tokenizer, graphs)
        assert (module._graphed is None) == (graphs is None)
        before = torch.cat([p.detach().flatten() for p in module.parameters()])
        with caplog.at_level(logging.WARNING, logger="srupp_asr"):
            cpu_trainer(2).fit(module, train_dataloaders=torch.utils.data.DataLoader(data, batch_size=None))
        steps.append(torch.cat([p.detach().flatten() for p in module.parameters()]) - before)
        warned = "model.cuda_graphs: no CUDA device; the padded step runs without graphs" in caplog.text
        assert warned == (graphs is not None)
    # The same updates up to float32 rounding. The padded step sums over longer rows, in another order, and Adam
    # divides by the gradients' own scale, so where a weight's two gradients nearly cancel a rounding moves its step
    # by a few % (3e-6 of 3e-4 at worst, 1e-4 of the steps' norm); padding that reached the losses would move them all.
    assert steps[0].abs().max() > 1e-4
    torch.testing.assert_close(steps[1], steps[0], rtol=0, atol=0.05 * float(steps[0].abs().max()))
    assert float((steps[1] - steps[0]).norm()) < 1e-3 * float(steps[0].norm())


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"seconds": 0}, ConfigValueError, "model.cuda_graphs.seconds must be"),
        ({"max_graphs": 0}, ConfigValueError, "model.cuda_graphs.max_graphs must be"),
        ({"buckets": 2}, UserError, "model.cuda_graphs must be a mapping of max_graphs, rows, seconds, tokens"),
        (True, UserError, "model.cuda_graphs must be a mapping"),
    ],
)
def test_bad_cuda_graphs_options_name_the_option(char_tokenizer, options, error, message):
    with pytest.raises(error, match=re.escape(message)):
        _module(char_tokenizer, options)


def test_the_cuda_graphs_option_needs_the_srupp_encoder(char_tokenizer):
    with pytest.raises(
        UserError, match=re.escape("model.cuda_graphs: CUDA graphs of the training step need the srupp")
    ):
        _module(char_tokenizer, {}, encoder="conformer")


def test_the_cuda_graphs_option_refuses_ddp_before_the_first_step(char_tokenizer):
    module = _module(char_tokenizer, {})
    module._trainer = types.SimpleNamespace(world_size=2)  # what on_fit_start reads of a DDP trainer
    with pytest.raises(UserError, match=re.escape("model.cuda_graphs: training on one device only (not under DDP)")):
        module.on_fit_start()


# ------------------------------------------------------------------ on a GPU: recorded, replayed


def _cuda_available() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        import cupy  # noqa: F401  (the SRU++ recurrence's kernel)
    except ImportError:
        return False
    return True


needs_gpu = pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA GPU and CuPy")


def _on_gpu(args):
    audio, lens, tokens, token_lens = args
    return audio.cuda(), lens, tokens.cuda(), token_lens  # the lengths stay on the host, as in training


@pytest.mark.gpu
@needs_gpu
def test_graphs_replay_the_eager_losses_and_gradients_across_shapes():
    net = model().cuda()
    graphed = GraphedLosses(net, BUCKETS)
    # Two batches of one padded shape (the second replays the first one's graph), one of another, the first again.
    batches = [batch(seed=1), batch(seconds=(0.9, 0.8, 0.2), seed=2), batch(seconds=(1.4, 0.3), seed=3)]
    for args in [*batches, batches[0]]:
        args = _on_gpu(args)
        expected, expected_grads = losses_and_grads(net, net, args)
        got, grads = losses_and_grads(net, graphed, args)
        for name in expected:
            torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=1e-5, msg=name)
        for name, grad in expected_grads.items():
            torch.testing.assert_close(grads[name], grad, rtol=1e-3, atol=1e-5, msg=name)
    assert graphed.recorded == 2


@pytest.mark.gpu
@needs_gpu
def test_graphs_beyond_max_graphs_are_dropped_and_recorded_again():
    net = model().cuda()
    graphed = GraphedLosses(net, BUCKETS, max_graphs=1)
    for args in [batch(seed=1), batch(seconds=(1.4, 0.3), seed=3), batch(seed=1)]:
        losses_and_grads(net, graphed, _on_gpu(args))
    assert graphed.recorded == 3


@pytest.mark.gpu
@needs_gpu
def test_graphs_train_under_bf16_autocast_with_dropout():
    # As Lightning's bf16-mixed runs the step: autocast (its weight-cast cache on) around the call; dropout and
    # SpecAugment draw new numbers at each replay.
    torch.manual_seed(0)
    net = (
        ASRModel(VOCAB, d_model=16, encoder_conf={**ENCODER, "dropout": 0.1}, decoder_conf={**DECODER, "dropout": 0.1})
        .cuda()
        .train()
    )
    graphed = GraphedLosses(net, BUCKETS)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    losses = []
    for _ in range(4):
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = graphed(*_on_gpu(batch()))
        out["loss"].backward()
        optimizer.step()
        losses.append(float(out["loss"]))
    assert graphed.recorded == 1
    assert all(torch.isfinite(torch.tensor(losses))) and len(set(losses)) == 4


@pytest.mark.gpu
@needs_gpu
def test_lightning_trains_with_the_cuda_graphs_option_on_a_gpu(char_tokenizer):
    # The whole loop: bf16-mixed (Lightning's autocast, its cache on), fused Adam's device-side skip, logging.
    audio, lens, _, _ = batch()
    tokens = [torch.tensor(char_tokenizer.encode(t)) for t in ("hello world", "the cat", "fun")]
    token_lens = torch.tensor([len(t) for t in tokens])
    tokens = torch.nn.utils.rnn.pad_sequence(tokens, batch_first=True, padding_value=-1)
    data = [{"audio": audio, "audio_lens": lens, "tokens": tokens, "token_lens": token_lens}] * 3
    module = _module(char_tokenizer, {"seconds": 0.5, "tokens": 4, "rows": 4})
    trainer = cpu_trainer(3, accelerator="gpu", precision="bf16-mixed")
    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(data, batch_size=None))
    assert module._graphed.recorded == 1
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
