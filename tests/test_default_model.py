"""The built-in default model shipped in ``srupp_asr/default_model`` (trained on a GPU by
``recipes/synth_en/local/device_run.sh start default-model``): its files, that it is what ``transcribe`` picks
without ``--model``, and that it recognises espeak-ng speech it was not trained on."""

from __future__ import annotations

import re
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
ROOT = Path(__file__).resolve().parent.parent
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

    from srupp_asr.decoding.lexicon import read_word_list
    from srupp_asr.lm import load_lm
    from srupp_asr.loading import choose_lm
    from srupp_asr.model_files import check_same_tokenizer, read_fusion_weight, read_lexicon_weight

    lm_dir = SHIPPED / "lm"
    names = ["config.yaml", "model.safetensors", "tokenizer.model", "words.COPYRIGHT", "words.txt.gz"]
    assert sorted(p.name for p in lm_dir.iterdir()) == names  # the word list with its notice
    assert sum(p.stat().st_size for p in lm_dir.iterdir()) < 8 * 2**20  # the checkout's size budget
    assert {t.dtype for t in load_file(lm_dir / "model.safetensors").values()} == {torch.float16}
    lm, lm_tokenizer = load_lm(lm_dir)
    assert lm.num_params() < 2_000_000
    _, tokenizer = load_model_dir(SHIPPED)
    check_same_tokenizer(lm_tokenizer, tokenizer, lm_dir)
    assert read_fusion_weight(lm_dir) == 0.4
    assert read_lexicon_weight(lm_dir) == 10.0 and len(read_word_list(lm_dir, tokenizer).lexicon) == 338_109
    assert "Kevin Atkinson" in (lm_dir / "words.COPYRIGHT").read_text()
    choice = choose_lm(SHIPPED, "joint")
    assert (choice.path, choice.weight) == (lm_dir, 0.4)  # fused by default
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


# What the README and docs/cli.md quote of the shipped model, by the names config.yaml's source.results gives them.
QUOTED = ("LJ Speech 32 sentences", "vctk_dev", "Speech Commands dev", "FSDD dev", "test_seen", "test_unseen")


def model_fingerprint(model_dir: Path) -> str:
    """SHA-256 of what decides the shipped model's transcripts: its weights, its tokenizer and its LM (weights,
    config with the fusion and word list weights, tokenizer, word list)."""
    import hashlib

    files = [*sorted(weight_files(model_dir).shards), model_dir / "tokenizer.model"]
    files += [model_dir / "lm" / name for name in ("model.safetensors", "config.yaml", "tokenizer.model")]
    files += [path for path in [model_dir / "lm" / "words.txt.gz"] if path.exists()]  # the word list, if any
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(model_dir).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def test_the_numbers_quoted_for_the_shipped_model_were_measured_on_it():
    """A new model must come with its own numbers: config.yaml's source records the fingerprint of the model its
    results were measured on, and the README's and docs/cli.md's WERs are those results."""
    source = yaml.safe_load((SHIPPED / "config.yaml").read_text())["source"]
    assert source.get("fingerprint") == model_fingerprint(SHIPPED), (
        "srupp_asr/default_model changed since its results were measured: measure it (benchmarks/real_speech.py, "
        "srupp-asr evaluate on the synth_en test sets), then write its source.results, the README's and "
        f"docs/cli.md's numbers, and source.fingerprint: {model_fingerprint(SHIPPED)}"
    )
    results = " ".join(source["results"].split())
    wer = {name: re.search(rf"{name} ([0-9.]+)", results).group(1) for name in QUOTED}
    readme = " ".join((ROOT / "README.md").read_text().split())
    lj, vctk, words, digits = (wer[name] for name in QUOTED[:4])
    assert (
        f"gets {lj}% WER on 32 LJ Speech sentences, {vctk}% on VCTK voices it never heard, {words}% on Speech "
        f"Commands words of unseen speakers and {digits}% on FSDD digits"
    ) in readme
    lines = (ROOT / "README.md").read_text().splitlines()
    row = next(line for line in lines if line.startswith("| built-in model, 15.8 M parameters"))
    assert row.endswith(f"| {wer['test_seen']} | {wer['test_unseen']} | {lj} | {words} |"), row
    cli = (ROOT / "docs" / "cli.md").read_text()
    for label, value in (
        ("LJ Speech, 32 read sentences", lj),
        ("vctk_dev (4 VCTK voices no training split holds)", vctk),
        ("Speech Commands dev (single words, speakers not in training)", words),
        ("FSDD dev (digits; other takes of the training speakers)", digits),
        ("synth_en test_seen / test_unseen (814 sentences each)", f"{wer['test_seen']} / {wer['test_unseen']}"),
    ):
        assert f"| {label} | {value} |" in cli, label
