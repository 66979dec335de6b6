"""``srupp-asr evaluate``: decoding a cut manifest with a model directory and scoring it."""

from __future__ import annotations

import json
import re

import pytest

from srupp_asr.cli import main
from srupp_asr.scoring.score import score


def test_bad_decoding_options_and_manifest_are_one_line_errors(tmp_path, capsys):
    base = ["evaluate", "--model", str(tmp_path), "--out-dir", str(tmp_path / "out")]
    assert main([*base, "--cuts", str(tmp_path / "none.jsonl.gz"), "--beam", "0"]) == 2
    assert capsys.readouterr().err.strip() == (
        "srupp-asr evaluate: error: decoding options: beam must be an integer >= 1, got 0"
    )
    assert main([*base, "--cuts", str(tmp_path / "none.jsonl.gz")]) == 2
    assert "cut manifest not found" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def eval_cuts(overfit_model_dir, tmp_path_factory):
    """A manifest of the overfit utterances, two speakers, one reference changed so that it has errors."""
    from lhotse import CutSet, MonoCut, Recording, SupervisionSegment

    model_dir, utterances = overfit_model_dir
    cuts = []
    for i, (wav, text) in enumerate(utterances[:8]):
        rec = Recording.from_file(wav, recording_id=f"r{i}")
        ref = text if i != 3 else "something else entirely " + text
        sup = SupervisionSegment(f"s{i}", f"r{i}", 0.0, rec.duration, text=ref, speaker=f"spk{i % 2}")
        cuts.append(MonoCut(f"utt{i}", 0.0, rec.duration, 0, recording=rec, supervisions=[sup]))
    path = tmp_path_factory.mktemp("eval") / "test_cuts.jsonl.gz"
    CutSet.from_cuts(cuts).to_file(path)
    return model_dir, path


def test_evaluate_decodes_scores_and_reports_speed(eval_cuts, tmp_path, capsys):
    model_dir, cuts = eval_cuts
    out = tmp_path / "report"
    argv = ["evaluate", "--model", str(model_dir), "--cuts", str(cuts), "--out-dir", str(out)]
    assert main([*argv, "--decoding", "ctc_greedy", "--device", "cpu", "--batch-size", "3"]) == 0
    stdout = capsys.readouterr().out.splitlines()
    assert stdout[0].startswith("test_cuts: WER ") and re.match(r"decoded 0\.\d+ h of audio in .* s, RTF ", stdout[1])

    hyps = [json.loads(line) for line in (out / "hyp.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [h["id"] for h in hyps] == [f"utt{i}" for i in range(8)] and hyps[0]["speaker"] == "spk0"
    # The model was trained to WER 0 on these sentences: only the changed reference has errors (3 deletions).
    result = score(out / "ref.trn", out / "hyp.trn")
    assert [u.utt_id for u in result.utterances if u.words.counts.errors] == ["spk1-utt3"]
    assert result.total().errors == 3 and set(result.by_speaker()) == {"spk0", "spk1"}

    md = (out / "results.md").read_text(encoding="utf-8")
    assert "- decoding: `mode=ctc_greedy`" in md and re.search(r"- real-time factor: `0\.\d+`", md)
    assert re.search(r"- audio: `0\.\d{3} h \(\d+\.\d s, 8 utterances\)`", md)
    assert "|test_cuts|8|" in md
    assert "real-time factor" in (out / "report.html").read_text(encoding="utf-8")
