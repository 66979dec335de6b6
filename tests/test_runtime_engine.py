"""srupp_asr.runtime.engine: the numpy runtime decodes as the torch network does (the same texts, scores and word
times up to float32 rounding), a model directory is read with the same checks, and the loader picks the engine."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from srupp_asr.audio import load_audio
from srupp_asr.decoding import DecodingOptions
from srupp_asr.decoding.settings import DEFAULT_OPTIONS
from srupp_asr.errors import UserError
from srupp_asr.loading import LoadedModel
from srupp_asr.model import ASRModel
from srupp_asr.runtime import engine
from srupp_asr.runtime.engine import NumpyASR
from srupp_asr.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def engines() -> tuple[LoadedModel, LoadedModel]:
    """The built-in model on the numpy runtime and in torch."""
    return LoadedModel.load(None, "cpu", engine="numpy"), LoadedModel.load(None, "cpu", engine="torch")


@pytest.fixture(scope="module")
def speech(synthesize_speech) -> list[np.ndarray]:
    texts = ["the quick brown fox jumps over the lazy dog", "seven", "please call stella and ask her to bring"]
    return [load_audio(synthesize_speech(text, f"engine_{i}.wav")) for i, text in enumerate(texts)]


@pytest.mark.parametrize(
    "options",
    [
        DEFAULT_OPTIONS,
        DecodingOptions("ctc_greedy"),
        DecodingOptions("ctc_prefix_beam", beam=4),
        DecodingOptions(nbest=1, beam=3),
    ],
    ids=["joint_lm", "ctc_greedy", "ctc_prefix_beam_lm", "joint_beam3"],
)
def test_the_numpy_runtime_decodes_as_torch(engines, speech, options):
    numpy_model, torch_model = engines
    results = []
    for loaded in engines:
        fused, lm, _ = loaded.fuse(options, None, None, options.mode == "ctc_greedy")
        net = loaded.net_for(fused)
        if isinstance(net, NumpyASR):
            results.append(net.decode_waveforms(speech, loaded.tokenizer, fused, lm))
        else:
            from srupp_asr.decoding import decode

            audio = torch.nn.utils.rnn.pad_sequence([torch.from_numpy(w) for w in speech], batch_first=True)
            lens = torch.tensor([w.size for w in speech])
            results.append(decode(net, loaded.tokenizer, audio, lens, fused, lm))
    assert isinstance(numpy_model.net, NumpyASR) and isinstance(torch_model.net, ASRModel)
    for ours, theirs in zip(*results, strict=True):
        assert ours.tokens == theirs.tokens and ours.text == theirs.text
        assert ours.score == pytest.approx(theirs.score, abs=2e-3)
        assert [w.word for w in ours.words] == [w.word for w in theirs.words]
        assert [w.start for w in ours.words] == pytest.approx([w.start for w in theirs.words])
        assert [w.confidence for w in ours.words] == pytest.approx([w.confidence for w in theirs.words], abs=1e-3)


def test_the_filterbank_in_blocks_of_frames_is_the_filterbank_at_once(engines, speech, monkeypatch):
    net = engines[0].net
    whole = net.features(speech)
    monkeypatch.setattr(engine, "FBANK_BLOCK_FRAMES", 7)  # blocks that end anywhere in a word
    blocks = net.features(speech)
    np.testing.assert_array_equal(blocks[1], whole[1])
    # Equal up to float32 rounding: a block's FFT and mel product run on fewer rows, which some CPUs sum in
    # another order (one ulp apart on AMD EPYC); a frame cut at a block's edge would be off by far more.
    np.testing.assert_allclose(blocks[0], whole[0], rtol=1e-6, atol=1e-5)


def test_auto_is_numpy_on_the_cpu_in_float32_and_torch_otherwise(engines):
    assert isinstance(LoadedModel.load(None, "cpu").net, NumpyASR)
    assert isinstance(LoadedModel.load(None, "cpu", "int8").net, ASRModel)
    with pytest.raises(UserError, match=r"^--engine numpy: float32 on the CPU only, not int8 on cpu"):
        LoadedModel.load(None, "cpu", "int8", engine="numpy")
    with pytest.raises(UserError, match=r"^--engine gpu: unknown engine"):
        LoadedModel.load(None, "cpu", engine="gpu")


def test_a_mode_the_runtime_does_not_run_goes_to_the_torch_network_with_a_torch_lm(engines):
    numpy_model, _ = engines
    options, lm, _ = numpy_model.fuse(DecodingOptions("rescoring", beam=4), None, None, False)
    assert isinstance(numpy_model.net_for(options), ASRModel)
    assert isinstance(lm, torch.nn.Module)
    options, lm, _ = numpy_model.fuse(DEFAULT_OPTIONS, None, None, False)
    assert numpy_model.net_for(options) is numpy_model.net and not isinstance(lm, torch.nn.Module)


def _copy_with(model_dir, tmp_path, change):
    """A copy of the model directory ``model_dir`` whose weights went through ``change(dict) -> dict``."""
    from safetensors.torch import save_file

    from srupp_asr.model_dir import read_weights

    out = tmp_path / "copy"
    out.mkdir(parents=True)
    for f in model_dir.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name != "model.safetensors.index.json":
            (out / f.name).write_bytes(f.read_bytes())
    save_file(change(read_weights(model_dir)), out / "model.safetensors")
    return out


def test_damaged_or_mismatched_weights_are_one_line_errors_naming_the_file(model_dir, tmp_path):
    def nan(w):
        w["ctc.bias"] = w["ctc.bias"].clone()
        w["ctc.bias"][3] = float("nan")
        return w

    bad = _copy_with(model_dir, tmp_path / "nan", nan)
    with pytest.raises(UserError, match=r"model.safetensors: weight ctc.bias holds 1 NaN or infinite value \("):
        NumpyASR.load(bad)
    missing = _copy_with(model_dir, tmp_path / "missing", lambda w: {k: v for k, v in w.items() if k != "ctc.bias"})
    with pytest.raises(UserError, match=r"model.safetensors: weight ctc.bias is missing$"):
        NumpyASR.load(missing)
    extra = _copy_with(model_dir, tmp_path / "extra", lambda w: {**w, "stray.weight": torch.zeros(2)})
    with pytest.raises(UserError, match=r"model.safetensors: weights the config has no place for: stray.weight$"):
        NumpyASR.load(extra)
    ints = _copy_with(model_dir, tmp_path / "int", lambda w: {**w, "ctc.bias": w["ctc.bias"].to(torch.int16)})
    with pytest.raises(UserError, match=r"weight ctc.bias is stored as int16, the network needs floating-point"):
        NumpyASR.load(ints)


def test_bfloat16_weights_go_to_torch_under_auto_and_are_refused_by_engine_numpy(model_dir, tmp_path):
    bf16 = _copy_with(model_dir, tmp_path, lambda w: {k: v.to(torch.bfloat16) for k, v in w.items()})
    assert isinstance(LoadedModel.load(bf16, "cpu").net, ASRModel)
    with pytest.raises(UserError, match=r"^--engine numpy: .*model.safetensors: bfloat16 weights"):
        LoadedModel.load(bf16, "cpu", engine="numpy")


def test_a_config_the_runtime_cannot_run_goes_to_torch(model_dir):
    config = model_dir / "config.yaml"
    text = config.read_text()
    config.write_text(text.replace("encoder: srupp", "encoder: conformer"))
    with pytest.raises(UserError, match=r"^--engine numpy: .*config.yaml: the conformer encoder runs with torch only"):
        LoadedModel.load(model_dir, "cpu", engine="numpy")


def test_the_tokenizer_is_checked_against_the_config(model_dir):
    config = model_dir / "config.yaml"
    pieces = Tokenizer(model_dir / "tokenizer.model").vocab_size
    config.write_text(config.read_text().replace(f"vocab_size: {pieces}", f"vocab_size: {pieces + 1}"))
    said = f"tokenizer has {pieces} pieces, config.yaml says vocab_size {pieces + 1}"
    with pytest.raises(UserError, match=rf"tokenizer.model: {said}$"):
        NumpyASR.load(model_dir)


def test_model_without_a_decoder_says_what_joint_needs(engines, speech):
    numpy_model, _ = engines
    no_decoder = dataclasses.replace(DecodingOptions("joint"), lm_weight=0.0)
    net = numpy_model.net
    saved, net.decoder = net.decoder, None
    try:
        assert "needs an attention decoder; the model has none" in net.unmet_needs(no_decoder, None)
    finally:
        net.decoder = saved
    assert net.unmet_needs(no_decoder, None) is None
