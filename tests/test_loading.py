"""srupp_asr/loading.py: the loading policy of transcribe, evaluate and the API, one rule at a time (the commands
that use it are tested end to end in test_transcribe.py and test_scoring_evaluate.py): the device, the model a
name means, which LM is fused with what weight, and each fusion LM loaded once."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from srupp_asr.decoding import DecodingOptions
from srupp_asr.decoding.settings import DEFAULT_LM_WEIGHT
from srupp_asr.errors import UserError
from srupp_asr.inputs import DEFAULT_MODEL_ENV
from srupp_asr.lm import SRUppLM, save_lm
from srupp_asr.loading import (
    LoadedModel,
    choose_lm,
    compute_device,
    fused_options,
    model_dir_named,
    resolve_device,
)
from srupp_asr.model_files import LM_SUBDIR


def _lm_dir(tokenizer, out: Path, fusion_weight: float | None = None) -> Path:
    lm = SRUppLM(vocab_size=tokenizer.vocab_size, d_model=16, num_layers=1, attn_dim=8, num_heads=2)
    return save_lm(lm, tokenizer.path, out, fusion_weight=fusion_weight)


@pytest.fixture()
def with_lm(model_dir, char_tokenizer) -> Path:
    """The tiny model directory with its own LM in lm/, recording weight 0.2."""
    _lm_dir(char_tokenizer, model_dir / LM_SUBDIR, fusion_weight=0.2)
    return model_dir


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_the_device_auto_is_the_cpu_here_and_cuda_or_a_typo_is_a_user_error():
    assert resolve_device("auto") == resolve_device("cpu") == "cpu"
    with pytest.raises(UserError, match=r"^--device cuda: no CUDA device is available here \(use --device cpu\)$"):
        resolve_device("cuda")
    with pytest.raises(UserError, match=r"^--device gpu: unknown device \(choose cpu, cuda or auto\)$"):
        resolve_device("gpu")
    assert compute_device("int8", "auto") == compute_device("int8", "cpu") == "cpu"  # int8 is the CPU's
    with pytest.raises(UserError, match="--compute-type"):
        compute_device("int4", "cpu")


def test_a_model_name_is_the_built_in_model_a_directory_or_a_one_line_refusal(tmp_path, monkeypatch, model_dir):
    monkeypatch.setenv(DEFAULT_MODEL_ENV, str(model_dir))
    assert model_dir_named(None) == model_dir_named("default") == model_dir_named("builtin") == model_dir
    assert model_dir_named(str(model_dir)) == model_dir
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"^tiny\.en: model directory not found \(srupp-asr has no whisper-sized"):
        model_dir_named("tiny.en")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(UserError, match=r"^weights\.bin: is a file, not a model directory$"):
        model_dir_named("weights.bin")
    with pytest.raises(UserError, match=r"^nowhere: model directory not found$"):
        model_dir_named("nowhere")


def test_the_model_directory_s_own_lm_is_fused_with_its_recorded_weight_unless_told_otherwise(with_lm):
    own = with_lm / LM_SUBDIR
    choice = choose_lm(with_lm, "joint")
    assert (choice.path, choice.weight) == (own, 0.2) and "the model directory's" in choice.describe()
    assert choose_lm(with_lm, "joint", lm_weight=0.5).weight == 0.5
    assert choose_lm(with_lm, "joint", no_lm=True).path is None
    assert choose_lm(with_lm, "joint", lm_weight=0.0).path is None  # weight 0: none
    assert choose_lm(with_lm, "ctc_greedy").path is None  # greedy takes none and is no error
    greedy = choose_lm(with_lm, "ctc_greedy", lm_weight=0.3)  # asked for: chosen, then refused by the mode
    with pytest.raises(UserError, match="lm_weight needs a beam mode"):
        fused_options(DecodingOptions(mode="ctc_greedy"), greedy)


def test_another_lm_is_fused_with_its_own_weight_or_the_default_and_a_weight_needs_an_lm(
    model_dir, char_tokenizer, tmp_path
):
    recorded = _lm_dir(char_tokenizer, tmp_path / "recorded", fusion_weight=0.7)
    bare = _lm_dir(char_tokenizer, tmp_path / "bare")  # train-lm's output records no weight
    assert choose_lm(model_dir, "joint", lm=recorded).weight == 0.7
    assert choose_lm(model_dir, "joint", lm=bare).weight == DEFAULT_LM_WEIGHT
    assert choose_lm(model_dir, "joint").path is None  # the tiny model has no lm/ of its own
    with pytest.raises(UserError, match="--lm-weight needs --lm"):
        choose_lm(model_dir, "joint", lm_weight=0.4)
    options = fused_options(DecodingOptions(mode="joint"), choose_lm(model_dir, "joint", lm=bare))
    assert options.lm_weight == DEFAULT_LM_WEIGHT
    assert fused_options(DecodingOptions(mode="joint", lm_weight=0.9), choose_lm(model_dir, "joint")).lm_weight == 0


def test_a_loaded_model_loads_each_fusion_lm_once_and_checks_its_tokenizer(with_lm, tmp_path):
    from srupp_asr.tokenizer import Tokenizer

    loaded = LoadedModel.load(with_lm, device="cpu")
    options, lm, choice = loaded.fuse(DecodingOptions(mode="joint"), None, None, False)
    assert options.lm_weight == 0.2 and choice.path == with_lm / LM_SUBDIR
    assert loaded.fusion_lm(with_lm / ".." / with_lm.name / LM_SUBDIR) is lm  # the same directory: not again
    other = Tokenizer.train(["another tokenizer, other pieces"] * 20, tmp_path / "other.model", 30, "char")
    foreign = _lm_dir(other, tmp_path / "foreign")
    with pytest.raises(UserError, match=str(foreign)):
        loaded.fusion_lm(foreign)
