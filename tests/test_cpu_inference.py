"""benchmarks/cpu_inference.py: the table's ratios to whisper's row and its WER by the project's scorer (the
measuring itself is a benchmark, run by hand)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def ci():
    sys.path.insert(0, str(BENCH))  # the script imports its sibling peers.py
    try:
        spec = importlib.util.spec_from_file_location("cpu_inference", BENCH / "cpu_inference.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up by name
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCH))
        sys.modules.pop("cpu_inference", None)


def test_the_table_gives_ratios_to_whisper_and_normalised_wer(ci):
    utts = [ci.Utterance("a", Path("a.wav"), 4.0, "Ten of clubs."), ci.Utterance("b", Path("b.wav"), 6.0, "yes")]
    ours = ci.Run("srupp-asr defaults", 1.0, 3.0, 6.0, 1_200_000_000, {"a": "ten of clubs", "b": "no"})
    whisper = ci.Run(ci.PEERS["whisper"], 2.0, 1.5, 12.0, 300_000_000, {"a": "10 of clubs.", "b": "Yes!"})
    rows = ci.table([ours, whisper], utts, "two files").splitlines()
    assert rows[0] == "two files: 2 files, 0.2 min of audio (x: ratio to whisper tiny.en in this run)"
    assert rows[4] == "| srupp-asr defaults | 0.100 (0.50x) | 3.0 s (2.00x) | 6.0 s (0.50x) | 1.20 GB (4.00x) | 25.0% |"
    assert rows[5].endswith("| 0.200 (1.00x) | 1.5 s (1.00x) | 12.0 s (1.00x) | 0.30 GB (1.00x) | 25.0% |")


def test_absent_real_sets_are_one_line_and_exit_0(ci, tmp_path, capsys):
    assert ci.main(["--real-dev", str(tmp_path / "none")]) == 0
    assert (
        capsys.readouterr().out
        == f"cpu_inference.py: {tmp_path / 'none'} is absent: no real sets to measure on (give files)\n"
    )


def test_wer_by_set_gives_each_sets_wer_and_the_change_from_the_first_system(ci):
    utts = [
        ci.Utterance("fsdd/a", Path("a.wav"), 1.0, "one two"),
        ci.Utterance("fsdd/b", Path("b.wav"), 1.0, "three four"),
        ci.Utterance("lj/c", Path("c.wav"), 2.0, "a b c d"),
    ]
    ours = ci.Run("srupp-asr defaults", 1.0, 1.0, 2.0, 1, {"fsdd/a": "one two", "fsdd/b": "three", "lj/c": "a b c d"})
    int8 = ci.Run("srupp-asr int8", 1.0, 1.0, 2.0, 1, {"fsdd/a": "one", "fsdd/b": "three", "lj/c": "a b x d"})
    rows = ci.wer_by_set([ours, int8], utts).splitlines()
    assert rows[2] == "| system | fsdd (2) | lj (1) |"
    assert rows[4:] == ["| srupp-asr defaults | 25.0% | 0.0% |", "| srupp-asr int8 | 50.0% (+25.0) | 25.0% (+25.0) |"]
    assert ci.wer_by_set([ours], utts[:2]) is None  # one set: the main table says it


def test_files_with_one_stem_in_several_folders_keep_their_own_ids_and_transcripts(ci, tmp_path):
    """Speech Commands has ``down/x.flac`` and ``go/x.flac``: each keeps its reference and gets its own output
    (transcribe writes ``x.txt`` and ``x-2.txt``), not the other's."""
    (tmp_path / "sc").mkdir()
    rows = ["path\tduration_s\tspeaker\ttext\tsplit", "down/x.flac\t1.0\ts\tdown\tdev", "go/x.flac\t1.0\ts\tgo\tdev"]
    (tmp_path / "sc" / "manifest.tsv").write_text("\n".join(rows) + "\n")
    utts = ci.read_sets(tmp_path, ["sc"])
    assert [(u.utt_id, u.text) for u in utts] == [("sc/down/x", "down"), ("sc/go/x", "go")]
    out = tmp_path / "out"
    out.mkdir()
    (out / "x.txt").write_text("down\n")
    (out / "x-2.txt").write_text("go\n")
    assert ci.read_hypotheses(out, utts) == {"sc/down/x": "down", "sc/go/x": "go"}
