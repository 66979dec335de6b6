"""srupp-asr summarize (srupp_asr.scoring.summary): the results table of an experiment folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from srupp_asr.cli import main
from srupp_asr.errors import UserError
from srupp_asr.scoring.analysis import score_transcripts
from srupp_asr.scoring.formats import UtteranceText
from srupp_asr.scoring.report import ReportInfo, results_json
from srupp_asr.scoring.summary import HEADER, summarize, table
from tests.helpers import one_line_error

REFS = [UtteranceText("u1", "the cat sat on the mat"), UtteranceText("u2", "a dog ran")]


def _report(exp: Path, system: str, name: str, hyps: list[str], details: dict[str, str] | None = None) -> Path:
    """EXP/decode_<system>/<name>/results.json as srupp-asr evaluate / score write it."""
    result = score_transcripts(REFS, [UtteranceText(r.utt_id, h) for r, h in zip(REFS, hyps, strict=True)])
    folder = exp / f"decode_{system}" / name
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(results_json(result, ReportInfo(name, details=details or {})))
    return folder


@pytest.fixture
def exp(tmp_path: Path) -> Path:
    exp = tmp_path / "exp"
    _report(exp, "joint", "test", ["the cat sat on a mat", "a dog ran"], {"real-time factor": "0.0123"})
    _report(exp, "joint", "dev", ["the cat sat on the mat", "dog ran ran"])
    ps = _report(exp, "ctc_greedy", "test", ["the cat sat on the mat", "a dog ran"])
    (ps / "decode_info.json").write_text(json.dumps({"rtf": 0.5}))
    return exp


def test_table_has_a_row_per_system_and_set_in_the_given_order(exp):
    lines = table(exp, ["test", "dev"]).splitlines()
    assert "".join(f"{line}\n" for line in lines[:2]) == HEADER
    # systems sorted by name, sets in the order given; ctc_greedy has no dev report, so no row
    assert lines[2:] == [
        "| ctc_greedy | test | 2 | 9 | 0.0 | 0 | 0 | 0 | 0.0 | 0.0 | 0.5 |",
        "| joint | test | 2 | 9 | 11.1 | 1 | 0 | 0 | 12.5 | 50.0 | 0.0123 |",
        "| joint | dev | 2 | 9 | 22.2 | 0 | 1 | 1 | 16.7 | 50.0 | - |",
    ]


def test_cli_prints_the_table_and_writes_it_under_a_heading(exp, capsys):
    out = exp / "RESULTS.md"
    assert main(["summarize", str(exp), "--sets", "test", "--out", str(out), "--title", "tiny results"]) == 0
    printed = capsys.readouterr().out
    assert printed == table(exp, ["test"]) and printed.count("\n") == 4
    assert out.read_text() == f"# tiny results\n\n{printed}"
    assert not [p for p in exp.iterdir() if p.name.startswith(".RESULTS.md")]  # no temporary file left


def test_cli_quiet_prints_nothing_and_the_default_heading_names_the_folder(exp, capsys):
    assert main(["summarize", str(exp), "--sets", "dev", "--out", str(exp / "R.md"), "--quiet"]) == 0
    assert capsys.readouterr().out == ""
    assert (exp / "R.md").read_text().startswith(f"# Results ({exp})\n\n| system |")


def _error(capsys, *args: str) -> str:
    assert main(["summarize", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("srupp-asr summarize: error: ")
    return err


def test_no_report_is_a_one_line_error(exp, capsys):
    err = _error(capsys, str(exp), "--sets", "eval", "other", "--out", str(exp / "RESULTS.md"))
    assert f"no results.json under {exp}/decode_*/{{eval,other}}" in err
    assert not (exp / "RESULTS.md").exists()
    assert "experiment folder not found" in _error(capsys, str(exp / "missing"), "--sets", "test")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "results file is not valid JSON"),
        ("[1, 2]", "results file does not hold a JSON object"),
        ('{"WER": {"sentences": 2}, "CER": {}}', "results file has no 'tokens'"),
        ('{"WER": 3, "CER": 4}', "results file is malformed"),
    ],
)
def test_a_corrupt_report_is_an_error_naming_it(exp, capsys, content, message):
    path = exp / "decode_joint" / "dev" / "results.json"
    path.write_text(content)
    err = _error(capsys, str(exp), "--sets", "test", "dev", "--out", str(exp / "RESULTS.md"))
    assert f"{path}: {message}" in err
    assert not (exp / "RESULTS.md").exists()


def test_a_corrupt_decode_info_is_an_error_naming_it(exp):
    info = exp / "decode_ctc_greedy" / "test" / "decode_info.json"
    info.write_text("rtf: 0.5")
    with pytest.raises(UserError, match=f"^{info}: decoding info file is not valid JSON"):
        summarize(exp, ["test"])


# ----------------------------------------------------------------------------------------------------
# summarize --sets


@pytest.fixture
def sets_exp(tmp_path: Path) -> Path:
    sets_exp = tmp_path / "exp"
    _report(sets_exp, "joint", "test", ["the cat sat on a mat", "a dog ran"])
    _report(sets_exp, "ctc_greedy", "test", ["the cat sat on the mat", "a dog ran"])
    _report(sets_exp, "ctc_greedy", "dev", ["the cat sat on the mat", "a dog ran"])
    return sets_exp


def test_summarize_names_the_sets_without_results_and_exits_1(sets_exp, capsys):
    # was: the set quietly left out of the table, exit 0
    out = sets_exp / "RESULTS.md"
    assert main(["summarize", str(sets_exp), "--sets", "dev", "eval", "test", "other", "--out", str(out)]) == 1
    captured = capsys.readouterr()
    assert captured.err == (
        f"srupp-asr summarize: error: no results.json under {sets_exp}/decode_*/ for 2 of 4 test sets"
        " (left out of the table): eval other\n"
    )
    rows = [line for line in captured.out.splitlines() if line.startswith("| ") and "system" not in line]
    assert [row.split(" | ")[:2] for row in rows] == [
        ["| ctc_greedy", "dev"],
        ["| ctc_greedy", "test"],
        ["| joint", "test"],
    ]
    assert out.read_text().endswith(captured.out)  # the table of the others is still written


def test_summarize_a_set_another_system_lacks_is_no_error(sets_exp, capsys):
    # joint has no dev report, ctc_greedy has one: a row fewer, not a missing set
    assert main(["summarize", str(sets_exp), "--sets", "test", "dev", "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_summarize_a_set_named_twice_is_one_line(sets_exp, capsys):
    assert main(["summarize", str(sets_exp), "--sets", "test", "dev", "test"]) == 2
    assert one_line_error(capsys, "summarize") == "--sets: test given twice"
