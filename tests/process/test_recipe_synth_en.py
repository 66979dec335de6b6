"""recipes/synth_en/run.sh, stages 0-7, on the tiny corpus: nothing to a model directory and its scored results."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from srupp_asr.model_dir import load_model_dir

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "recipes" / "synth_en" / "run.sh"

pytestmark = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("espeak-ng", "flite", "sox")), reason="needs espeak-ng, flite and sox"
)


def _run(*args: str) -> str:
    # The recipe calls `srupp-asr`: the one installed beside this interpreter (the venv need not be activated).
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    out = subprocess.run(["bash", str(RUN), *args], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout + out.stderr


def test_stages_0_to_7_build_a_corpus_train_export_and_score_and_rerun_skips_done_work(tmp_path):
    data, exp = tmp_path / "data", tmp_path / "exp"
    common = ["--size", "tiny", "--nj", "2", "--data", str(data), "--exp", str(exp), "--vocab-size", "64"]
    decode = [
        "--decodings",
        "ctc_greedy ctc_prefix_beam",
        "--beam",
        "4",
        "--pocketsphinx",
        "false",
        "--real-dev",
        "none",
    ]
    log = _run(*common, *decode, "--train-args", "--trainer.max_epochs 1")
    manifests = data / "corpus" / "manifests"
    for split in ("train", "dev", "test_seen", "test_unseen"):
        assert (manifests / f"{split}_cuts.jsonl.gz").stat().st_size > 0
    assert (data / "cmvn.json").is_file() and (data / "tokenizer.model").is_file()
    assert (exp / "checkpoints" / "last.ckpt").is_file()
    model, tokenizer = load_model_dir(exp / "model")
    assert tokenizer.vocab_size == model.vocab_size <= 64
    assert "(synth_en stage 5) wrote the model directory" in log
    # stages 6-7: each test set scored with each decoding mode, and one summary table of them all
    for mode in ("ctc_greedy", "ctc_prefix_beam"):
        for name in ("test_seen", "test_unseen"):
            results = json.loads((exp / f"decode_{mode}" / name / "results.json").read_text())
            assert results["name"] == name and results["WER"]["sentences"] == 12  # the tiny corpus's test sets
            assert (exp / f"decode_{mode}" / name / "report.html").is_file()
    summary = (exp / "RESULTS.md").read_text()
    assert summary.count("| ctc_greedy | test_") == 2 and summary.count("| ctc_prefix_beam | test_") == 2

    again = _run(*common, "--stage", "1", "--stop-stage", "3")
    assert "reused 90" in again or "made 0" in again
    assert "cmvn.json exists, skipping" in again and "tokenizer.model exists, skipping" in again
    assert f"{exp / 'lm'} exists (its training finished), skipping" in again
    again = _run(*common, *decode, "--stage", "6", "--stop-stage", "6")
    assert again.count("results.json exists, skipping") == 4


def test_the_pocketsphinx_comparison_decodes_and_scores_the_test_sets(tmp_path, tiny_synth_corpus):
    """Stages 6-7 with --pocketsphinx true (what `make demo` runs; the CI run above leaves it out): the real
    recogniser's transcripts are scored and its rows join the summary table."""
    pytest.importorskip("pocketsphinx", reason="pocketsphinx (the dev extra) is not installed")
    data, exp = tmp_path / "data", tmp_path / "exp"
    common = ["--size", "tiny", "--nj", "2", "--data", str(data), "--exp", str(exp), "--lm", "false"]
    common += ["--real-dev", "none"]  # the real dev sets: tests/test_real_speech.py
    # Stage 1's corpus, built once a run (the test above builds its own); stage 1 finds it complete.
    shutil.copytree(tiny_synth_corpus[0], data / "corpus")
    log = _run(*common, "--stage", "1", "--stop-stage", "1")
    assert "reused 90" in log or "made 0" in log
    shutil.copytree(ROOT / "srupp_asr" / "default_model", exp / "model")  # stage 6 decodes with a model too
    log = _run(*common, "--stage", "6", "--stop-stage", "7", "--decodings", "ctc_greedy", "--pocketsphinx", "true")
    for name in ("test_seen", "test_unseen"):
        out = exp / "decode_pocketsphinx" / name
        hyps = (out / "pocketsphinx.hyp.trn").read_text().splitlines()
        assert len(hyps) == 12 and sum(len(line.split()) > 1 for line in hyps) >= 6  # words, then the (id)
        info = json.loads((out / "decode_info.json").read_text())
        assert info["utterances"] == 12 and info["audio_seconds"] > 0
        results = json.loads((out / "results.json").read_text())
        assert results["WER"]["sentences"] == 12 and results["WER"]["errors"] < results["WER"]["tokens"]
    assert "wrote" in log and "pocketsphinx.hyp.trn" in log
    assert (exp / "RESULTS.md").read_text().count("| pocketsphinx | test_") == 2


def test_unknown_option_is_refused():
    out = subprocess.run(["bash", str(RUN), "--bogus"], capture_output=True, text=True)
    assert out.returncode == 2 and "unknown option --bogus" in out.stderr


BUILTIN = ROOT / "srupp_asr" / "default_model"


def test_walkthrough_stages_2_and_3_take_the_built_in_models_cmvn_and_tokenizer(tmp_path):
    """--size walkthrough fine-tunes the built-in model: its tokenizer (the same ids, the same pieces) and the CMVN
    statistics its weights hold, which come back as the same float32 buffers; no LM is trained."""
    import torch

    from srupp_asr.frontend import GlobalCMVN, load_cmvn
    from srupp_asr.model_dir import read_weights

    data = tmp_path / "data"
    log = _run("--size", "walkthrough", "--stage", "2", "--stop-stage", "3", "--data", str(data))
    assert (data / "tokenizer.model").read_bytes() == (BUILTIN / "tokenizer.model").read_bytes()
    weights = read_weights(BUILTIN)
    cmvn = GlobalCMVN(num_features=weights["cmvn.mean"].numel())
    cmvn.set_stats(*load_cmvn(data / "cmvn.json"))
    assert torch.equal(cmvn.mean, weights["cmvn.mean"].float()) and torch.equal(cmvn.istd, weights["cmvn.istd"].float())
    assert "the built-in model's CMVN statistics" in log and "--lm false: no language model" in log
    again = _run("--size", "walkthrough", "--stage", "2", "--stop-stage", "3", "--data", str(data))
    assert "cmvn.json exists, skipping" in again and "tokenizer.model exists, skipping" in again


def test_walkthrough_help_and_a_wrong_size():
    out = subprocess.run(["bash", str(RUN), "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--size walkthrough" in out.stdout and "conf/walkthrough_cpu.yaml" in out.stdout
    out = subprocess.run(["bash", str(RUN), "--size", "walk"], capture_output=True, text=True)
    assert out.returncode == 2 and "--size takes walkthrough, tiny, small or large, got 'walk'" in out.stderr


@pytest.mark.slow
def test_walkthrough_runs_end_to_end_in_10_minutes_and_recognises_its_seen_voices(tmp_path):
    """The whole walkthrough from nothing (corpus, CMVN, tokenizer, fine-tuning, averaging, scoring): under 10
    minutes on 2 cores when the machine is not shared, and under 60% WER on the seen voices."""
    import time

    data, exp = tmp_path / "data", tmp_path / "exp"
    start = time.monotonic()
    log = _run("--size", "walkthrough", "--nj", "2", "--data", str(data), "--exp", str(exp))
    minutes = (time.monotonic() - start) / 60
    assert "fine-tuning the built-in model" in log and "--lm false: no language model" in log
    assert not (exp / "lm").exists()
    results = json.loads((exp / "decode_joint" / "test_seen" / "results.json").read_text())
    wer = results["WER"]
    assert wer["sentences"] == 12 and wer["errors"] / wer["tokens"] < 0.60, wer
    assert (exp / "model" / "config.yaml").is_file() and (exp / "RESULTS.md").read_text().count("| joint | test_") == 2
    # 6 minutes measured on a shared 2-core machine (docs/recipes.md); 15 leaves room for a busier one
    assert minutes < 15, f"{minutes:.1f} minutes"
