"""benchmarks/transcribe_load.py: many files through one transcribe process, its table, and a missing model."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "transcribe_load.py"


def _load_benchmark():
    if str(SCRIPT.parent) not in sys.path:
        sys.path.insert(0, str(SCRIPT.parent))  # the script imports its sibling transcribe_memory
    spec = importlib.util.spec_from_file_location("transcribe_load", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


tl = _load_benchmark()


@pytest.mark.process  # five transcribe child processes, sampled for memory
def test_five_files_make_one_row_with_memory_samples(overfit_model_dir, capsys):
    model, _ = overfit_model_dir
    result = tl.main(["--files", "5", "--model", str(model), "--decoding", "ctc_greedy"])
    out = capsys.readouterr().out
    assert result["code"] == 0 and result["failures"] == 0 and result["files"] == 5
    assert 0 < result["seconds"] < 5 * 6  # short utterances
    # MiB: Python, numpy and the model at least (float32 on the CPU decodes without torch: about 50 MiB in all here,
    # sampled every 0.1 s)
    assert result["wall"] > 0 and result["peak"] > 20
    assert result["rss_early"] is not None and result["rss_end"] is not None
    rows = [line for line in out.splitlines() if line.startswith("| 5 |")]
    assert len(rows) == 1 and rows[0].count("|") == 11
    assert "command: srupp-asr transcribe" in out


def test_the_files_vary_in_level_and_padding(tmp_path):
    import numpy as np

    spoken = [(np.full(1600, 0.5, np.float32), "a b"), (np.full(3200, 0.5, np.float32), "c")]
    texts, seconds = tl.make_files(tmp_path, 4, spoken)
    assert texts == {"utt00000": "a b", "utt00001": "c", "utt00002": "a b", "utt00003": "c"}
    sizes = {p.stat().st_size for p in tmp_path.iterdir()}
    assert len(sizes) == 4 and seconds > (2 * 1600 + 2 * 3200) / 16000


def test_a_missing_model_says_how_to_get_one(tmp_path):
    with pytest.raises(SystemExit, match="pass --model DIR"):
        tl.main(["--files", "1", "--model", str(tmp_path / "none")])
