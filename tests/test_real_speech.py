"""benchmarks/real_speech.py: the real dev sets imported by the table importer and scored by the project's
evaluate and scorer (WER after lower-casing and dropping punctuation), pocketsphinx on the same 16 kHz audio, and
a clean skip without the real data. Runs on a few real files of ../shared/data/real_en; skipped where it is absent
(a user's clone)."""

from __future__ import annotations

import csv
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from srupp_asr.data import load_cuts, save_cuts

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
ROOT = BENCH.parent
REAL_DEV = ROOT.parent / "shared" / "data" / "real_en"
needs_real = pytest.mark.skipif(
    not REAL_DEV.is_dir(), reason=f"no real speech at {REAL_DEV} (a clone without ../shared)"
)


@pytest.fixture(scope="module")
def rs():
    spec = importlib.util.spec_from_file_location("real_speech", BENCH / "real_speech.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _words(text: str) -> list[str]:
    """Lower-cased words without punctuation, written independently of srupp_asr.text."""
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower().replace("-", " ")).split()


def _edits(ref: list[str], hyp: list[str]) -> int:
    """Word-level Levenshtein distance."""
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1]


@needs_real
def test_the_real_sets_import_with_the_table_importer_and_their_durations(rs, tmp_path):
    manifests = rs.import_real_sets(REAL_DEV, tmp_path, ("pocketsphinx_testdata",))
    assert list(manifests) == ["pocketsphinx_testdata"] and list(manifests["pocketsphinx_testdata"]) == ["dev"]
    cuts = {c.id: c for c in load_cuts(manifests["pocketsphinx_testdata"]["dev"])}
    with open(REAL_DEV / "pocketsphinx_testdata" / "manifest.tsv", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    assert len(cuts) == len(rows) == 10
    for row in rows:
        cut = cuts[Path(row["path"]).stem]
        assert abs(cut.duration - float(row["duration_s"])) < 1e-3  # from the audio header, same as the source
        assert (cut.supervisions[0].text, cut.supervisions[0].speaker) == (row["text"], row["speaker"])


@needs_real
def test_real_dev_scoring_of_the_built_in_model_is_wer_after_lowercasing_and_dropping_punctuation(rs, tmp_path):
    manifests = rs.import_real_sets(REAL_DEV, tmp_path / "m", ("ljspeech32", "fsdd"))
    few = [*list(load_cuts(manifests["ljspeech32"]["dev"]))[1:3], *list(load_cuts(manifests["fsdd"]["dev"]))[:2]]
    assert {c.sampling_rate for c in few} == {22050, 8000}  # resampled to 16 kHz on the way in
    save_cuts(few, tmp_path / "few_cuts.jsonl.gz")
    from srupp_asr.transcribe import default_model_dir

    wer, rtf = rs.score_model(default_model_dir(), tmp_path / "few_cuts.jsonl.gz", tmp_path / "out")
    hyps = {h["id"]: h["text"] for h in map(json.loads, (tmp_path / "out" / "hyp.jsonl").read_text().splitlines())}
    assert set(hyps) == {c.id for c in few}
    refs = {c.id: _words(c.supervisions[0].text) for c in few}
    assert any(c.supervisions[0].text != " ".join(refs[c.id]) for c in few)  # the raw texts carry case, commas
    errors = sum(_edits(refs[i], _words(hyps[i])) for i in refs)
    assert wer == pytest.approx(100 * errors / sum(len(r) for r in refs.values()))
    assert rtf > 0


@needs_real
def test_pocketsphinx_decodes_real_audio_at_16_khz(rs, tmp_path):
    if not rs.pocketsphinx_available():
        pytest.skip("pocketsphinx is not installed")
    manifests = rs.import_real_sets(REAL_DEV, tmp_path / "m", ("pocketsphinx_testdata", "fsdd"))
    cards = [c for c in load_cuts(manifests["pocketsphinx_testdata"]["dev"]) if c.id.startswith("cards")][:2]
    digits = list(load_cuts(manifests["fsdd"]["dev"]))[:1]
    save_cuts([*cards, *digits], tmp_path / "few_cuts.jsonl.gz")
    wer, _ = rs.score_pocketsphinx(tmp_path / "few_cuts.jsonl.gz", tmp_path / "ps", jobs=1)
    hyps = (tmp_path / "ps" / "pocketsphinx.hyp.trn").read_text().splitlines()
    refs = (tmp_path / "ps" / "pocketsphinx.ref.trn").read_text().splitlines()
    assert len(hyps) == len(refs) == 3
    errors = sum(
        _edits(r.rsplit(" (", 1)[0].split(), h.rsplit(" (", 1)[0].split()) for r, h in zip(refs, hyps, strict=True)
    )
    assert wer == pytest.approx(100 * errors / sum(len(r.rsplit(" (", 1)[0].split()) for r in refs))
    assert wer < 50  # mostly its own test data, at the rate its model expects


def test_without_the_real_data_the_benchmark_says_so_and_exits_0(rs, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rs, "DEFAULT_REAL_DEV", tmp_path / "absent")
    assert rs.find_real_dev(None) is None
    monkeypatch.setattr(sys, "argv", ["real_speech.py", "--exp", str(tmp_path / "exp")])
    assert rs.main() == 0
    assert "real_speech: skipped: no real speech at" in capsys.readouterr().out
    assert not (tmp_path / "exp").exists()
    monkeypatch.setattr(sys, "argv", ["real_speech.py", "--real-dev", str(tmp_path)])
    assert rs.main() == 2
    assert "no real_en sets in it" in capsys.readouterr().err
