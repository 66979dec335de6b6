"""The built-in default model shipped in ``srupp_asr/default_model`` (trained on a GPU by
``recipes/synth_en/local/device_run.sh start default-model``): its files, that it is what ``transcribe`` picks
without ``--model``, and that it recognises espeak-ng speech it was not trained on."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

import srupp_asr
from srupp_asr.inputs import DEFAULT_MODEL_ENV, default_model_dir
from srupp_asr.model_dir import load_model_dir, read_weights, weight_files
from srupp_asr.scoring.align import Counts, align_batch, word_tokens
from srupp_asr.transcribe import transcribe

SHIPPED = Path(srupp_asr.__file__).resolve().parent / "default_model"
TRANSFER_LIMIT = 16 * 2**20  # each file came back from the GPU machine, whose limit is 16 MiB a file

# Sentences not in the corpus' text sources (fortunes, WordNet, licences), spoken by espeak-ng's default
# English voice (26 words in all: one error is 4% WER).
SENTENCES = [
    "please call stella and ask her to bring these things with her from the store",
    "the weather will be warm and sunny this afternoon",
    "a good book is the best of friends",
]


def test_the_shipped_model_is_float16_shards_each_under_the_transfer_limit():
    files = sorted(p.name for p in SHIPPED.iterdir())
    assert files == [
        "config.yaml",
        "lm",
        "model-00001-of-00003.safetensors",
        "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
        "model.safetensors.index.json",
        "tokenizer.model",
    ]
    assert all((SHIPPED / name).stat().st_size < TRANSFER_LIMIT for name in files)
    assert len(weight_files(SHIPPED).shards) == 3
    weights = read_weights(SHIPPED)
    dtypes = {name: t.dtype for name, t in weights.items() if t.is_floating_point()}
    assert {dtypes.pop("cmvn.mean"), dtypes.pop("cmvn.istd")} == {torch.float32}  # the stats keep float32
    assert dtypes and set(dtypes.values()) == {torch.float16}
    model, tokenizer = load_model_dir(SHIPPED)
    assert 15.5e6 < sum(p.numel() for p in model.parameters()) < 16.1e6
    assert tokenizer.vocab_size == 256


def test_the_shipped_model_carries_a_small_float16_lm_with_its_tokenizer_and_weight():
    from safetensors.torch import load_file

    from srupp_asr.lm import check_same_tokenizer, load_lm, read_fusion_weight
    from srupp_asr.loading import choose_lm

    lm_dir = SHIPPED / "lm"
    assert sorted(p.name for p in lm_dir.iterdir()) == ["config.yaml", "model.safetensors", "tokenizer.model"]
    assert sum(p.stat().st_size for p in lm_dir.iterdir()) < 8 * 2**20  # the checkout's size budget
    assert {t.dtype for t in load_file(lm_dir / "model.safetensors").values()} == {torch.float16}
    lm, lm_tokenizer = load_lm(lm_dir)
    assert lm.num_params() < 2_000_000
    _, tokenizer = load_model_dir(SHIPPED)
    check_same_tokenizer(lm_tokenizer, tokenizer, lm_dir)
    assert read_fusion_weight(lm_dir) == 0.2
    choice = choose_lm(SHIPPED, "joint")
    assert (choice.path, choice.weight) == (lm_dir, 0.2)  # fused by default
    assert choose_lm(SHIPPED, "ctc_greedy").path is None  # greedy takes none and is no error
    assert "lm" in yaml.safe_load((SHIPPED / "config.yaml").read_text())["source"]  # its data is credited


def test_transcribe_uses_the_shipped_model_without_model(monkeypatch, tmp_path):
    monkeypatch.delenv(DEFAULT_MODEL_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_model_dir() == SHIPPED


@pytest.mark.parametrize("decoding", ["ctc_greedy", "joint"])
def test_the_shipped_model_recognises_espeak_speech(synthesize_speech, monkeypatch, tmp_path, decoding):
    monkeypatch.delenv(DEFAULT_MODEL_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    wavs = [synthesize_speech(text, f"default_model_{i}.wav") for i, text in enumerate(SENTENCES)]
    transcripts = transcribe(wavs, decoding=decoding, device="cpu", threads=2)
    assert [Path(t.path) for t in transcripts] == wavs
    alignments = align_batch(
        [(word_tokens(ref), word_tokens(t.text)) for ref, t in zip(SENTENCES, transcripts, strict=True)]
    )
    counts = sum((a.counts for a in alignments), start=Counts())
    errors, words = counts.errors, counts.tokens
    # Measured when the model was committed (2026-11-28): greedy 3, joint 2 errors in 32 words. An untrained or wrongly
    # loaded model gets nearly every word wrong.
    assert errors / words <= 0.25, [t.text for t in transcripts]
