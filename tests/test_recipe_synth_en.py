"""recipes/synth_en/run.sh, stages 0-5, on the tiny corpus: nothing to a model directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from srupp_asr.export import load_model

ROOT = Path(__file__).resolve().parent.parent
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


def test_stages_0_to_5_build_a_corpus_train_and_export_and_rerun_skips_done_work(tmp_path):
    data, exp = tmp_path / "data", tmp_path / "exp"
    common = ["--size", "tiny", "--nj", "2", "--data", str(data), "--exp", str(exp), "--vocab-size", "64"]
    log = _run(*common, "--train-args", "--trainer.max_epochs 1")
    manifests = data / "corpus" / "manifests"
    for split in ("train", "dev", "test_seen", "test_unseen"):
        assert (manifests / f"{split}_cuts.jsonl.gz").stat().st_size > 0
    assert (data / "cmvn.json").is_file() and (data / "tokenizer.model").is_file()
    assert (exp / "checkpoints" / "last.ckpt").is_file()
    model, tokenizer = load_model(exp / "model")
    assert tokenizer.vocab_size == model.vocab_size <= 64
    assert "(synth_en stage 5) wrote the model directory" in log

    again = _run(*common, "--stage", "1", "--stop-stage", "3")
    assert "reused 90" in again or "made 0" in again
    assert "cmvn.json exists, skipping" in again and "tokenizer.model exists, skipping" in again


def test_unknown_option_is_refused():
    out = subprocess.run(["bash", str(RUN), "--bogus"], capture_output=True, text=True)
    assert out.returncode == 2 and "unknown option --bogus" in out.stderr
