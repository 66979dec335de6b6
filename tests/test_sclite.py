"""``srupp-asr sclite`` against NIST SCTK's own sclite test suite (``tsclite.sh``, expected outputs in ``base/``).

Each case runs with SCTK's command line on the copied inputs in ``tests/data/sctk`` and compares every row of
``.sys`` and ``.raw`` (speakers, Sum, Mean, S.D., Median, NCE) and each utterance's C/S/D/I in ``.pra`` with
sclite's; the ``.dtl`` and ``.sgml`` reports base/ holds, and some ``.pra`` files, are compared whole.
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

from srupp_asr.cli import main as cli_main
from srupp_asr.errors import UserError
from srupp_asr.scoring import sclite
from srupp_asr.scoring.align import align_nets
from srupp_asr.scoring.formats import CtmToken
from srupp_asr.scoring.sclite_ctm import chunks, recordings
from srupp_asr.scoring.wordnet import CharMode, build_net, parse_tokens

DATA = Path(__file__).parent / "data" / "sctk"

# tsclite.sh's cases with expected .sys/.raw files that Debian's sclite reproduces (less the -S ones), with
# their options (DATA=.; -O, -n and -f are added by the test).
CASES = {
    "test1": "-r ./csrnab.ref -h ./csrnab.hyp -i wsj -o all snt spk dtl prf sgml nl.sgml",
    "test1e": "-r ./csrnab.ref -h ./csrnab.hyp -i wsj -o all snt spk dtl prf sgml nl.sgml -e utf-8",
    "test3": "-r ./lvc_ref.stm stm -h ./lvc_hyp.ctm ctm -o all lur prf",
    "test3a": "-r ./lvc_refe.stm stm -h ./lvc_hyp.ctm ctm -o all lur prf",
    "test3b": "-r ./lvc_ref.stm stm -h ./lvc_hypc.ctm ctm -o sum",
    "test7": "-r ./tests.ref -h ./tests.hyp -i spu_id -o all -F -D",
    "test7_r": "-h ./tests.ref -r ./tests.hyp -i spu_id -o all -F -D",
    "test7_noD": "-r ./tests.ref -h ./tests.hyp -i spu_id -o all -F",
    "test7_5": "-r ./tests.ref -h ./tests.hyp -i spu_id -o all -c DH",
    "test7_6": "-r ./tests.ref -h ./tests.hyp -i spu_id -o all sgml nl.sgml -F -D -e utf-8",
    "test7-utf8-2bytes": "-r ./tests.ref.utf8-2bytes -h ./tests.hyp.utf8-2bytes -i spu_id -o all sgml -F -D -e utf-8",
    "test7-utf8-3bytes": "-r ./tests.ref.utf8-3bytes -h ./tests.hyp.utf8-3bytes -i spu_id -o all sgml -F -D -e utf-8",
    "test7-utf8-4bytes": "-r ./tests.ref.utf8-4bytes -h ./tests.hyp.utf8-4bytes -i spu_id -o all sgml -F -D -e utf-8",
    "test8": "-r ./csrnab1.ref -h ./csrnab1.hyp -i wsj -o all -c",
    "test9": "-e gb -r ./mand_ref.stm stm -h ./mand_hyp.ctm ctm -o all dtl prf -c",
    "test9_1": "-e gb -r ./mand_ref.stm stm -h ./mand_hyp.ctm ctm -o all -c DH",
    "test10": "-e gb -r ./mand_ref.stm stm -h ./mand_hyp.ctm ctm -o all prf -c NOASCII",
    "test10_1": "-e gb -r ./mand_ref.stm stm -h ./mand_hyp.ctm ctm -o all -c NOASCII DH",
    # Beyond the goal's 37: base/ has SCTK's newer CTM-to-CTM cutting, which srupp-asr sclite follows (Debian's
    # 2.4.10 cuts the channels elsewhere, so its .pra differs; with -T only the utterances differ, not .sys).
    "test13": "-r ./tima_ref.ctm ctm -h ./tima_hyp.ctm ctm -o all prf",
    "test13_D": "-r ./tima_ref.ctm ctm -h ./tima_hyp.ctm ctm -o all prf -D",
    "test13_a": "-r ./tima_ref.ctm ctm -h ./tima_hyp.ctm ctm -o all -T",
    "test13_aD": "-r ./tima_ref.ctm ctm -h ./tima_hyp.ctm ctm -o all -T -D",
    "test14_a": "-r ./lvc_refr.stm stm -h ./lvc_hypr.ctm ctm -o all lur -m ref hyp",
    "test14_b": "-r ./lvc_ref.stm stm -h ./lvc_hypr.ctm ctm -o all lur -m ref hyp",
    "test14_c": "-r ./lvc_refr.stm stm -h ./lvc_hyp.ctm ctm -o all lur -m ref hyp",
    "test14_d": "-r ./lvc_refr.stm stm -h ./lvc_hypr.ctm ctm -o all lur -m hyp",
    "test14_e": "-r ./lvc_refr.stm stm -h ./lvc_hypr.ctm ctm -o all lur -m ref",
    "test15_a": "-r ./test.cantonese.stm stm -h ./test.cantonese.ctm ctm -o all prf -e utf-8",
    "test15_b": "-r ./test.cantonese.stm stm -h ./test.cantonese.ctm ctm -o all prf -e utf-8 -c NOASCII DH",
    "test15_c": "-r ./test.turkish.ref trn -h ./test.turkish.hyp -o all prf -e utf-8 babel_turkish -i spu_id",
    # Beyond the goal's 37: Debian's sclite has no 'ukrainian' case folding, SCTK's newer one wrote base/.
    "test15_d": "-r ./test.ukranian.ref trn -h ./test.ukranian.hyp -o all prf -e utf-8 ukrainian -i spu_id",
    **{
        f"test16_{n}": f"-r ./stm2ctm_missing.ref.stm stm -h ./stm2ctm_missing.{hyp}.ctm ctm -o all prf"
        for n, hyp in enumerate(
            [
                "hyp-missall",
                "hyp-missfile1",
                "hyp-missfile1chanA",
                "hyp-missfile1chanb",
                "hyp-missfile2",
                "hyp-missfile2chanA",
                "hyp-missfile2chanB",
                "hyp",
            ],
            start=2,
        )
    },
    "test17": "-r ./test.vietnamese.ref.trn trn -h test.vietnamese.hyp.trn trn -i spu_id -o all prf -e utf-8 "
    "babel_vietnamese",
}

# The cases that do not match base/, and why (none now).
NOT_MATCHING: dict[str, str] = {}


def table_rows(text: str) -> list[str]:
    """The rows of a .sys/.raw table that hold numbers, cells joined by single spaces."""
    rows = []
    for line in text.splitlines():
        if line.strip().startswith("|") and re.search(r"\d", line) and "SPKR" not in line:
            rows.append(" ".join(line.replace("|", " ").split()))
    return rows


def pra_counts(text: str) -> dict[str, list[str]]:
    """{utterance id: [C, S, D, I]} of a .pra file."""
    out, utt = {}, None
    for line in text.splitlines():
        if line.startswith("id: "):
            utt = line[4:].strip()
        elif line.startswith("Scores:"):
            out[utt] = line.split(")")[-1].split()
    return out


def run_case(name: str, out: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Run one case in a copy of the data folder; the report files that differ from base/ (empty: it matches)."""
    monkeypatch.chdir(DATA)
    sclite.main([*shlex.split(CASES[name]), "-O", str(out), "-n", name, "-f", "0"])
    differ = []
    for ext in ("sys", "raw", "pra"):
        expected = DATA / "base" / f"{name}.{ext}"
        if not expected.exists():
            continue
        want = expected.read_text(encoding="latin-1")
        got = (out / f"{name}.{ext}").read_text(encoding="latin-1")
        same = pra_counts(want) == pra_counts(got) if ext == "pra" else table_rows(want) == table_rows(got)
        if not same:
            differ.append(ext)
    return differ


# The .dtl and .sgml reports base/ holds for runnable cases, and two .pra files (test13_a: the insertions and
# deletions of a CTM-to-CTM alignment in time order): compared whole (sgml without its creation date).
DETAIL_REPORTS = {
    "test1": ("dtl", "sgml", "pra"),
    "test1e": ("dtl", "sgml"),
    "test9": ("dtl",),
    "test7_6": ("sgml",),
    "test13_a": ("pra",),
}
DETAIL_DIFFER = {
    "test7_6": "sgml: word tags (word;tag1;tag2) and escaped \\; are kept in sclite's SGML, dropped here (1 utterance)"
}


def detail_reports_differing(name: str, out: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Run one case; its .dtl/.sgml reports that differ from base/ (empty: byte for byte the same)."""
    monkeypatch.chdir(DATA)
    sclite.main([*shlex.split(CASES[name]), "-O", str(out), "-n", name, "-f", "0"])
    differ = []
    for ext in DETAIL_REPORTS[name]:
        want, got = ((d / f"{name}.{ext}").read_bytes() for d in (DATA / "base", out))
        if ext == "sgml":
            got = re.sub(rb' creation_date="[^"]*"', b" ", got)
        if want != got:
            differ.append(ext)
    return differ


@pytest.mark.parametrize("name", sorted(DETAIL_REPORTS))
def test_sctk_case_detail_reports_byte_for_byte(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    differ = detail_reports_differing(name, tmp_path, monkeypatch)
    assert differ == (["sgml"] if name in DETAIL_DIFFER else [])


@pytest.mark.parametrize("name", [n for n in CASES if n not in NOT_MATCHING])
def test_sctk_case_matches_sclite(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_case(name, tmp_path, monkeypatch) == []


def test_unsupported_option_is_refused_naming_it() -> None:
    with pytest.raises(UserError, match="option -S "):
        sclite.parse_args(["-r", "ref", "-h", "hyp", "-S", "algo1", "mand.lex"])


@pytest.mark.parametrize("ref_format", ["trn", "stm"])
def test_time_mediated_alignment_needs_a_ctm_reference_as_in_sclite(ref_format: str) -> None:
    """sctk sclite: 'Time-mediated alignments require the reference file to be in CTM format'."""
    hyp_format = "trn" if ref_format == "trn" else "ctm"
    with pytest.raises(UserError, match=r"-T \(time-mediated alignment\) needs a CTM reference"):
        sclite.parse_args(["-r", "ref", ref_format, "-h", "hyp", hyp_format, "-T"])


def test_sctk_cases_matching_count(capsys: pytest.CaptureFixture[str]) -> None:
    """The record: which of SCTK's cases match and why the others do not."""
    matching = [n for n in CASES if n not in NOT_MATCHING]
    print(f"{len(matching)} of {len(CASES)} SCTK cases match base/: {' '.join(matching)}")
    for name, why in NOT_MATCHING.items():
        print(f"  {name}: {why}")
    assert len(matching) == 40


def test_nce_clips_confidences_0_and_1_as_sclite(tmp_path: Path) -> None:
    """A correct word at confidence 0 and a wrong one at 1: sctk sclite prints NCE -13.640 (clip at 1e-7)."""
    (tmp_path / "r.stm").write_text("f 1 s 0 3 <o> a b c d\n")
    (tmp_path / "h.ctm").write_text("f 1 0.1 0.1 a 1.0\nf 1 0.5 0.1 x 1.0\nf 1 1.1 0.1 c 0.0\nf 1 1.5 0.1 d 0.5\n")
    args = ["-r", str(tmp_path / "r.stm"), "stm", "-h", str(tmp_path / "h.ctm"), "ctm", "-n", "x"]
    utts = sclite.sclite(sclite.parse_args(args))
    assert [u.alignment.hyp_conf for u in utts] == [(1.0, 1.0, 0.0, 0.5)]
    text = (tmp_path / "x.sys").read_text()
    assert "| Sum/Avg|    1      4 | 75.0   25.0    0.0    0.0   25.0  100.0 |-13.640 |" in text


def test_confidence_outside_0_1_is_warned_of_as_sclite_does(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """sctk sclite scores a CTM with a confidence of 1.5 and warns; 0 and 1 are in range."""
    (tmp_path / "r.stm").write_text("f 1 s 0 3 <o> a b c\n")
    (tmp_path / "h.ctm").write_text("f 1 0.1 0.1 a 1.5\nf 1 0.5 0.1 b 1.0\nf 1 1.1 0.1 c 0.0\n")
    args = ["-r", str(tmp_path / "r.stm"), "stm", "-h", str(tmp_path / "h.ctm"), "ctm", "-n", "x"]
    assert [u.alignment.ops for u in sclite.sclite(sclite.parse_args(args))] == ["CCC"]
    assert "1 of 3 confidence scores were not in the range (0.0,1.0)" in capsys.readouterr().err


def test_alternation_chooses_the_matching_path() -> None:
    a = align_nets(build_net("a { b c / d } e"), build_net("a d e"))
    assert (a.ops, a.ref) == ("CCC", ("a", "d", "e"))


def test_null_alternative_is_left_out_without_error() -> None:
    a = align_nets(build_net("a { c / @ } d"), build_net("a d"))
    assert a.ops == "CC"


def test_optional_word_deleted_is_correct_under_D() -> None:
    a = align_nets(build_net("b (c) d", optional=True), build_net("b d", optional=True))
    assert (a.ops, a.counts.tokens) == ("CCC", 3)
    plain = align_nets(build_net("b (c) d"), build_net("b d"))
    assert plain.ops == "CDC"


def test_fragment_matches_its_word_under_F() -> None:
    assert align_nets(build_net("fi- -icks", fragments=True), build_net("find ticks", fragments=True)).ops == "CC"
    assert align_nets(build_net("fi- -icks"), build_net("find ticks")).ops == "SS"


def test_null_word_costs_add_in_single_precision_as_sclite() -> None:
    """sclite sums its costs (0.001 for a left-out ``@``) in single precision: sctk sclite aligns ``c`` with
    ``b c c { a / @ } c`` as D D C D; exact sums tie there and would keep the last ``c`` instead (D D D C)."""
    assert align_nets(build_net("b c c { a / @ } c"), build_net("c")).ops == "DDCD"


def test_time_mediated_alignment_pairs_words_by_their_times() -> None:
    """Two words said in swapped order: -T pairs them by time (two substitutions), sclite's plain costs keep the
    word they share (a deletion, a match and an insertion cost 6, two substitutions 8)."""
    ref = build_net("a b", times=[(0.0, 1.0), (5.0, 6.0)])
    hyp = build_net("b a", times=[(0.0, 1.0), (5.0, 6.0)])
    assert align_nets(ref, hyp, time_mediated=True).ops == "SS"
    assert align_nets(ref, hyp).ops in ("DCI", "ICD")


def test_ctm_channel_is_cut_every_51_words_where_the_gaps_meet() -> None:
    """Reference and hypothesis alike: a chunk ends 50 words past its first, the rest (under 50) is the last."""
    tokens = [CtmToken("f", "A", k * 0.5, 0.3, "w") for k in range(120)]
    rec = recordings(tokens, "x.ctm")[0]
    got = [(c.utt_id, len(c.ref), len(c.hyp)) for c in chunks(rec, rec, "r.ctm", "h.ctm")]
    assert got == [("f-A-0000", 51, 51), ("f-A-0001", 51, 51), ("f-A-0002", 18, 18)]


def _write_timed_pair(tmp_path: Path) -> list[str]:
    (tmp_path / "r.ctm").write_text("F A 0.0 1.0 a\nF A 5.0 1.0 b\nF A 7.0 0.5 (uh)\nF B 1.0 0.5 x\nF B 2.0 0.5 y\n")
    (tmp_path / "h.ctm").write_text(
        "F A 0.0 1.0 b\nF A 5.0 1.0 a\nF A 8.0 0.2 c\nF B 1.1 0.5 x\nF B 1.6 0.5 z\nF B 2.0 0.4 y\n"
    )
    return ["-r", str(tmp_path / "r.ctm"), "ctm", "-h", str(tmp_path / "h.ctm"), "ctm", "-T", "-D", "-o", "all"]


def test_ctm_reference_utterances_are_file_channel_number_aligned_by_time_under_T(tmp_path: Path) -> None:
    """As sctk sclite -T -D scores it: swapped words paired by time, the optional (uh) left out is correct."""
    utts = sclite.sclite(sclite.parse_args([*_write_timed_pair(tmp_path), "-n", "x"]))
    got = [(u.utt_id, u.speaker, u.file, u.channel, u.alignment.ops) for u in utts]
    assert got == [("f-a-0000", "f-a", "f", "a", "SSCI"), ("f-b-0000", "f-b", "f", "b", "CIC")]


def test_ctm_recordings_out_of_order_are_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "r.ctm").write_text("f1 A 0.0 1.0 a\nf2 A 0.0 1.0 a\n")
    (tmp_path / "h.ctm").write_text("f2 A 0.0 1.0 a\nf1 A 0.0 1.0 a\n")
    args = ["-r", str(tmp_path / "r.ctm"), "ctm", "-h", str(tmp_path / "h.ctm"), "ctm"]
    with pytest.raises(UserError, match=r"h\.ctm: recording 'f2' where .*r\.ctm has 'f1'"):
        sclite.sclite(sclite.parse_args(args))


def test_character_mode_keeps_ascii_runs_under_noascii_and_drops_hyphens_under_dh() -> None:
    net = build_net("ab-c 食左", chars=CharMode(no_ascii=True, drop_hyphens=True))
    assert [w.text for w in net.words] == ["abc", "食", "左"]


def test_slash_is_a_word_character_outside_braces() -> None:
    assert parse_tokens("a/b {c/d}") == ["a/b", "{", "c", "/", "d", "}"]


def test_utf8_case_folding_is_ascii_unless_a_localization_names_more_letters() -> None:
    """As sctk sclite folds (checked letter by letter): Ġ/ġ differ under plain -e utf-8 (SCTK test7-utf8-2bytes
    counts them as different words), Vietnamese and Turkish letters fold under their localizations."""
    plain = sclite.parse_args(["-r", "r", "-h", "h", "-e", "utf-8"])
    assert sclite.fold_case("AĠÉ", plain) == "aĠÉ"
    viet = sclite.parse_args(["-r", "r", "-h", "h", "-e", "utf-8", "babel_vietnamese"])
    assert sclite.fold_case("IỲĐĠ", viet) == "iỳđĠ"
    turkish = sclite.parse_args(["-r", "r", "-h", "h", "-e", "utf-8", "babel_turkish"])
    assert sclite.fold_case("IİŞÉ", turkish) == "ıişÉ"


def test_slash_brace_and_parentheses_outside_an_alternation_are_words() -> None:
    """SCTK test17's lines hold ``( ) - / < >`` as words; a lone ``/`` once ended the transcript there."""
    assert [w.text for w in build_net("x: ( ) - / < > } a").words] == ["x:", "(", ")", "-", "/", "<", ">", "}", "a"]
    assert len(build_net("} { a / b }").words) == 3


def test_trn_ids_pair_case_insensitively_and_comments_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "ref").write_text(";; comment\nA B (SPK-1)\n")
    (tmp_path / "hyp").write_text("a x (spk-1)\n")
    utts = sclite.sclite(sclite.parse_args(["-r", str(tmp_path / "ref"), "-h", str(tmp_path / "hyp"), "-i", "rm"]))
    assert [(u.speaker, u.alignment.ops) for u in utts] == [("spk", "CS")]
    assert "Sum/Avg|    1      2 | 50.0   50.0" in (tmp_path / "hyp.sys").read_text()


def test_cli_refuses_sgml_input_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["sclite", "-P", "-o", "dtl"]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0


@pytest.mark.skipif(shutil.which("sctk") is None, reason="Debian's sctk (sctk sclite) is not installed")
def test_same_numbers_as_installed_sclite_on_own_input(tmp_path: Path) -> None:
    import subprocess

    (tmp_path / "ref.trn").write_text("the cat { sat / sit } on (uh) mat (spk1_a)\nhello world (spk2_b)\n")
    (tmp_path / "hyp.trn").write_text("the bat sat on the mat (SPK1_A)\nhello (spk2_b)\n")
    args = ["-r", str(tmp_path / "ref.trn"), "-h", str(tmp_path / "hyp.trn"), "-i", "spu_id", "-D", "-o", "sum"]
    (tmp_path / "peer").mkdir()
    subprocess.run(["sctk", "sclite", *args, "-O", str(tmp_path / "peer"), "-n", "x"], check=True, capture_output=True)
    sclite.main([*args, "-O", str(tmp_path / "ours"), "-n", "x"])
    want = table_rows((tmp_path / "peer" / "x.sys").read_text())
    assert table_rows((tmp_path / "ours" / "x.sys").read_text()) == want


@pytest.mark.skipif(shutil.which("sctk") is None, reason="Debian's sctk (sctk sclite) is not installed")
def test_same_alignments_as_installed_sclite_on_own_ctm_input_under_T(tmp_path: Path) -> None:
    import subprocess

    args = _write_timed_pair(tmp_path)
    (tmp_path / "peer").mkdir()  # sclite does not make its -O folder
    subprocess.run(["sctk", "sclite", *args, "-O", str(tmp_path / "peer"), "-n", "x"], check=True, capture_output=True)
    sclite.main([*args, "-O", str(tmp_path / "ours"), "-n", "x"])
    assert (tmp_path / "ours" / "x.pra").read_text() == (tmp_path / "peer" / "x.pra").read_text()


def test_tedlium_stage_scores_talk_ctm_against_stm(tmp_path: Path) -> None:
    """recipes/tedlium3 stage 9 (``corpus score-talks --stm``): transcribe's JSON -> CTM, the STM folder's files
    (comments dropped, sorted) -> one reference, scored by sclite into sclite.sys/.raw/.pra."""
    import json

    from srupp_asr.scoring.talks import sclite_talks

    words = [{"word": w, "start": s, "end": s + 0.3} for w, s in (("hello", 1.0), ("word", 1.5), ("noise", 4.0))]
    (tmp_path / "talks").mkdir()
    (tmp_path / "talks" / "TalkA.json").write_text(json.dumps({"segments": [{"words": words}]}))
    (tmp_path / "stm").mkdir()
    (tmp_path / "stm" / "TalkA.stm").write_text(
        ";; a comment line\nTalkA 1 inter_segment_gap 3.5 5.0 <o,,unknown> ignore_time_segment_in_scoring\n"
        "TalkA 1 TalkA 0.5 2.5 <o,f0,male> hello world\n"
    )
    out = tmp_path / "out"
    out.mkdir()
    sys_file = sclite_talks(tmp_path / "talks", tmp_path / "stm", out)
    assert (out / "ref.stm").read_text().splitlines()[0].startswith("TalkA 1 TalkA 0.5")  # sorted, no comment
    assert (out / "hyp.ctm").read_text().split("\n")[0].split()[-1] == "hello"
    assert sys_file == out / "sclite.sys" and sys_file.is_file() and (out / "sclite.pra").is_file()
    opts = sclite.parse_args(["-r", str(out / "ref.stm"), "stm", "-h", str(out / "hyp.ctm"), "ctm"])
    utts = sclite.sclite(opts)
    assert [(u.utt_id, u.alignment.ops) for u in utts] == [("talka-000", "CS")]
