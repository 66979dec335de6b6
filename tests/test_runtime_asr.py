"""The numpy acoustic model (srupp_asr.runtime.asr) against ASRModel.encode / ctc_log_probs in torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import srupp_asr
from srupp_asr.audio import load_audio
from srupp_asr.fileio import read_yaml_mapping
from srupp_asr.model import ASRModel
from srupp_asr.model_dir import load_model_dir
from srupp_asr.runtime.asr import AcousticModel
from srupp_asr.runtime.ops import Weights
from tests.helpers import TINY, chirp

MODEL_DIR = Path(srupp_asr.__file__).parent / "default_model"


class ReadArrays(dict):
    """Arrays by name that record which were read."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        super().__init__(arrays)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> np.ndarray:
        self.read.add(key)
        return super().__getitem__(key)


def numpy_model(net: ASRModel, config: dict | None = None) -> tuple[AcousticModel, set[str]]:
    """The numpy model of ``net`` (of ``config``, by default its own) and the names of the weights it left."""
    arrays = ReadArrays({k: v.detach().float().numpy() for k, v in net.state_dict().items()})
    model = AcousticModel.from_config(net.config if config is None else config, Weights(arrays))
    return model, set(arrays) - arrays.read


def batch(waves: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([len(w) for w in waves])
    audio = torch.zeros(len(waves), int(lengths.max()))
    for i, w in enumerate(waves):
        audio[i, : len(w)] = torch.as_tensor(w)
    return audio, lengths


def compare(net: ASRModel, model: AcousticModel, waves: list[np.ndarray]) -> tuple[float, float]:
    """Max abs differences of the encoder output and the CTC log-probs on the valid frames of a padded batch of
    ``waves``, after checking the lengths, shapes and padding."""
    audio, lengths = batch(waves)
    with torch.inference_mode():
        want, want_lengths = net.encode(audio, lengths)
        want_log_probs = net.ctc_log_probs(want) if net.ctc is not None else None
        feats, frames = net.fbank(audio, lengths)
    got, got_lengths = model.encode(feats.numpy(), frames.numpy())
    assert got.dtype == np.float32 and got_lengths.dtype == np.int64
    assert got.shape == want.shape and got_lengths.tolist() == want_lengths.tolist()
    valid = np.arange(got.shape[1]) < got_lengths[:, None]
    assert not got[~valid].any()  # zeros past each length, as torch
    enc_diff = float(np.abs(got - want.numpy())[valid].max(initial=0.0))
    if want_log_probs is None:
        return enc_diff, 0.0
    log_probs = model.ctc_log_probs(got)
    assert log_probs.dtype == np.float32 and log_probs.shape == want_log_probs.shape
    return enc_diff, float(np.abs(log_probs - want_log_probs.numpy())[valid].max(initial=0.0))


@pytest.fixture(scope="module")
def builtin() -> tuple[ASRModel, AcousticModel, set[str]]:
    net, _ = load_model_dir(MODEL_DIR)
    config = read_yaml_mapping(MODEL_DIR / "config.yaml", "model config")["model"]
    return net, *numpy_model(net, config)


def test_builtin_model_matches_torch_on_noise_tones_and_silence(builtin):
    net, model, left = builtin
    assert left == {k for k in net.state_dict() if k.startswith("decoder.")}
    assert model.frame_shift == pytest.approx(net.frame_shift) == pytest.approx(0.04)
    noise = 0.1 * np.random.default_rng(0).standard_normal(16000 * 2).astype(np.float32)
    # Noise, a tone, near silence, and audio too short for one encoder frame.
    waves = [noise, chirp(1.5), np.full(4000, 1e-4, np.float32), noise[:600]]
    enc_diff, log_prob_diff = compare(net, model, waves)
    assert enc_diff < 2e-3 and log_prob_diff < 2e-3


def test_builtin_model_matches_torch_on_speech(builtin, synthesize_speech):
    net, model, _ = builtin
    speech = load_audio(synthesize_speech())
    enc_diff, log_prob_diff = compare(net, model, [speech, speech[8000:40000], speech[: len(speech) // 3]])
    assert enc_diff < 2e-3 and log_prob_diff < 2e-3


@pytest.mark.parametrize(
    "overrides",
    [
        {},  # TINY: x4, bidirectional
        {"subsampling": 6, "subsampling_channels": 8, "ctc_weight": 1.0},
        {"subsampling": 8, "n_mels": 40, "encoder_conf": {"d_model": 16, "num_layers": 2, "bidirectional": False}},
    ],
)
def test_small_models_match_torch_across_subsampling_blocks(overrides):
    torch.manual_seed(0)
    net = ASRModel(12, **{**TINY, **overrides}).eval()
    n_mels = net.config["n_mels"]
    net.set_cmvn(torch.linspace(5.0, 10.0, n_mels), torch.linspace(1.0, 3.0, n_mels))
    model, left = numpy_model(net)
    assert all(k.startswith("decoder.") for k in left) and (net.decoder is None) == (not left)
    assert model.frame_shift == pytest.approx(net.frame_shift)
    rng = np.random.default_rng(1)
    # 11 s: more than one block of the subsampling at x4 (256 output frames)
    waves = [0.1 * rng.standard_normal(n).astype(np.float32) for n in (176000, 30000, 1200)]
    enc_diff, log_prob_diff = compare(net, model, waves)
    assert enc_diff < 1e-4 and log_prob_diff < 1e-4
    # A batch too short for one encoder frame: padded up to one that its length excludes.
    compare(net, model, [waves[2][:500]])


def test_model_without_ctc_head():
    net = ASRModel(12, **{**TINY, "ctc_weight": 0.0}).eval()
    model, _ = numpy_model(net)
    with pytest.raises(RuntimeError, match="no CTC head"):
        model.ctc_log_probs(np.zeros((1, 2, 32), np.float32))


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"encoder": "conformer"}, "runs the srupp encoder only, not 'conformer'"),
        ({"frontend": "mfcc"}, "does not know the model option frontend"),
        ({"subsampling": 5}, "cannot run this model: subsampling must be one of [4, 6, 8], got 5"),
        ({"encoder_conf": {"num_heads": 3}}, "cannot run this model: encoder_conf.num_heads must divide attn_dim"),
        ({"encoder_conf": {"heads": 3}}, "cannot run this model: encoder_conf.heads is not an option"),
    ],
)
def test_configs_it_cannot_run_are_not_implemented(builtin, change, reason):
    net = builtin[0]
    config = {**read_yaml_mapping(MODEL_DIR / "config.yaml", "model config")["model"], **change}
    with pytest.raises(NotImplementedError) as err:
        AcousticModel.from_config(config, Weights({k: v.numpy() for k, v in net.state_dict().items()}))
    assert reason in str(err.value) and "\n" not in str(err.value)


def test_runtime_modules_do_not_import_torch():
    modules = "srupp_asr.runtime.sru, srupp_asr.runtime.asr, srupp_asr.runtime.lm"
    code = f"import sys, {modules}; print(sorted(m for m in sys.modules if 'torch' in m))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
