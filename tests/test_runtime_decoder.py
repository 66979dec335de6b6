"""The numpy attention decoder and its scorers (srupp_asr.runtime.decoder, srupp_asr.runtime.scorers) against the
torch ones: the same scores step by step while the rows are reordered, duplicated and dropped as a beam search does."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_limits

from srupp_asr.checks import ConfigValueError
from srupp_asr.decoder import TransformerDecoder as TorchDecoder
from srupp_asr.decoding import scorers as torch_scorers
from srupp_asr.encoders import sinusoidal_positions as torch_positions
from srupp_asr.lm import SRUppLM as TorchLM
from srupp_asr.loading import LoadedModel
from srupp_asr.runtime import scorers
from srupp_asr.runtime.decoder import TransformerDecoder, sinusoidal_positions
from srupp_asr.runtime.lm import SRUppLM
from srupp_asr.runtime.ops import Weights, WeightsError
from srupp_asr.tokenizer import Tokenizer

SOS_EOS_ID = Tokenizer.sos_eos_id
TOLERANCE = 1e-4


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """Small products: one thread (torch's and the BLAS's) is the fastest, and is not stalled by other work's."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(limits=1, user_api="blas"):
        yield
    torch.set_num_threads(threads)


def _weights(module: torch.nn.Module) -> Weights:
    return Weights({k: v.detach().float().numpy() for k, v in module.state_dict().items()})


def _numpy_decoder(decoder: TorchDecoder, conf: dict) -> TransformerDecoder:
    return TransformerDecoder.from_config(conf, decoder.vocab_size, decoder.memory_dim, _weights(decoder))


def _assert_same_scores(expected: torch.Tensor, got: np.ndarray) -> float:
    """Equal -inf and NaN positions, finite entries within TOLERANCE; returns their largest difference."""
    expected = expected.numpy()
    assert got.dtype == np.float32 and got.shape == expected.shape
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(expected))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    finite = np.isfinite(expected)
    diff = float(np.abs(got[finite] - expected[finite]).max(initial=0.0))
    assert diff <= TOLERANCE
    return diff


def _search_like(
    torch_scorer: object, numpy_scorer: object, utterances: list[int], vocab: int, steps: int, drop_at: int = -1
) -> float:
    """Score ``steps`` steps with both scorers, each followed by a select that keeps rows of the same utterance in a
    random order, some twice (and at step ``drop_at`` a select without tokens that drops the last utterance);
    candidates given at every other step. Returns the largest difference of the scores."""
    gen = torch.Generator().manual_seed(0)
    utt = torch.tensor(utterances)
    t_state, n_state = torch_scorer.init_state(utt), numpy_scorer.init_state(utt.numpy())
    ys = torch.full((len(utterances), 1), SOS_EOS_ID)
    worst = 0.0
    with torch.inference_mode():
        for step in range(steps):
            candidates = torch.randint(3, vocab, (len(utt), 4), generator=gen) if step % 2 else None
            expected, t_pending = torch_scorer.score(t_state, ys, candidates)
            n_candidates = None if candidates is None else candidates.numpy()
            got, n_pending = numpy_scorer.score(n_state, ys.numpy(), n_candidates)
            worst = max(worst, _assert_same_scores(expected, got))
            same = utt[:, None] == utt[None, :]  # any row of the same utterance
            rows = torch.multinomial(same.float(), 1, generator=gen)[:, 0]
            tokens = torch.randint(3, vocab, (len(utt),), generator=gen)
            t_state = torch_scorer.select(t_state, rows, tokens, t_pending)
            n_state = numpy_scorer.select(n_state, rows.numpy(), tokens.numpy(), n_pending)
            ys, utt = torch.cat([ys[rows], tokens[:, None]], 1), utt[rows]
            if step == drop_at:
                rows = torch.nonzero(utt != utt.max())[:, 0]
                t_state = torch_scorer.select(t_state, rows, None, None)
                n_state = numpy_scorer.select(n_state, rows.numpy(), None, None)
                ys, utt = ys[rows], utt[rows]
    return worst


@pytest.fixture(scope="module")
def builtin() -> tuple[TorchDecoder, TransformerDecoder, torch.Tensor, torch.Tensor]:
    """The built-in model's decoder (torch and numpy) and its encoder's output for two random waveforms."""
    net = LoadedModel.load(None, "cpu", engine="torch").net
    conf = dict(net.config["decoder_conf"])
    gen = torch.Generator().manual_seed(0)
    audio = 0.1 * torch.randn(2, 24000, generator=gen)
    with torch.inference_mode():
        memory, memory_lens = net.encode(audio, torch.tensor([24000, 15000]))
    return net.decoder, _numpy_decoder(net.decoder, conf), memory, memory_lens


def test_builtin_decoder_scores_equal_torch(builtin: tuple) -> None:
    """15 steps of 10 rows per utterance over a real encoder output, the first utterance's memory longer."""
    torch_decoder, decoder, memory, memory_lens = builtin
    expected = torch_scorers.DecoderScorer(torch_decoder, memory, memory_lens)
    scorer = scorers.DecoderScorer(decoder, memory.numpy(), memory_lens.numpy())
    worst = _search_like(expected, scorer, [0] * 10 + [1] * 10, decoder.vocab_size, 15)
    print(f"built-in decoder: max |diff| {worst:.2e}")


def test_small_decoder_scores_equal_torch() -> None:
    """A small random decoder: equal runs of rows, then unequal ones (one group per row), an utterance dropped
    midway, and a memory with no frames (attended to everywhere)."""
    torch.manual_seed(0)
    conf = {"d_model": 32, "num_layers": 2, "num_heads": 4, "ffn_dim": 48, "dropout": 0.0}
    torch_decoder = TorchDecoder(30, **conf, memory_dim=24).eval()
    decoder = _numpy_decoder(torch_decoder, conf)
    memory, memory_lens = torch.randn(3, 11, 24), torch.tensor([11, 6, 0])
    for utterances, drop_at in (([0, 0, 0, 1, 1, 1, 2, 2, 2], 4), ([0, 1, 1, 2, 2, 2], 3)):
        expected = torch_scorers.DecoderScorer(torch_decoder, memory, memory_lens)
        scorer = scorers.DecoderScorer(decoder, memory.numpy(), memory_lens.numpy())
        _search_like(expected, scorer, utterances, 30, 9, drop_at)


def test_lm_scores_equal_torch() -> None:
    """A small random SRU++ LM, attention in every layer (a key-value cache reordered too), an utterance dropped."""
    torch.manual_seed(0)
    torch_lm = TorchLM(30, d_model=32, num_layers=2, attn_dim=16, num_heads=2, attn_every=1).eval()
    lm = SRUppLM.from_config(torch_lm.config, _weights(torch_lm))
    expected, scorer = torch_scorers.LMScorer(torch_lm), scorers.LMScorer(lm)
    _search_like(expected, scorer, [0, 0, 0, 1, 1, 1, 2, 2, 2], 30, 9, drop_at=4)


def test_positions_equal_torch() -> None:
    for dim in (32, 144, 256):
        table = sinusoidal_positions(512, dim)
        np.testing.assert_allclose(table, torch_positions(512, dim).numpy(), rtol=0, atol=2e-5)
        np.testing.assert_array_equal(sinusoidal_positions(40, dim, 30), table[30:40])


def test_config_and_weights_are_checked() -> None:
    torch_decoder = TorchDecoder(10, d_model=8, num_layers=1, num_heads=2, ffn_dim=16, memory_dim=6)
    with pytest.raises(ConfigValueError, match="attn_dim"):
        TransformerDecoder.from_config({"d_model": 8, "attn_dim": 8}, 10, 6, _weights(torch_decoder))
    with pytest.raises(WeightsError, match=r"ffn\.0\.weight has shape 16x8"):
        TransformerDecoder.from_config({"d_model": 8, "num_layers": 1, "ffn_dim": 32}, 10, 6, _weights(torch_decoder))
    with pytest.raises(WeightsError, match=r"layers\.1\."):
        TransformerDecoder.from_config(
            {"d_model": 8, "num_layers": 1, "ffn_dim": 16}, 10, 6, _weights(TorchDecoder(10, 8, 2, 2, 16, memory_dim=6))
        )


def test_runtime_scorers_do_not_import_torch() -> None:
    code = "import sys, srupp_asr.runtime.scorers; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
