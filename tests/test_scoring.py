"""Scoring: sclite-style alignment, transcript formats, report files and the ``score`` command."""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
from pathlib import Path

import jiwer
import numpy as np
import pytest

from srupp_asr.cli import main
from srupp_asr.errors import UserError
from srupp_asr.scoring import align as align_mod
from srupp_asr.scoring.align import COST_DEL, COST_INS, COST_SUB, Counts, align, align_batch, char_tokens
from srupp_asr.scoring.analysis import length_bucket, score_transcripts
from srupp_asr.scoring.formats import UtteranceText, read_transcripts, read_utt2spk, trn_line
from srupp_asr.scoring.plots import read_metrics_csv
from srupp_asr.scoring.report import ReportInfo, pralign_block, results_md, write_report
from srupp_asr.scoring.score import score


def ops(ref: str, hyp: str) -> str:
    """The op letters of aligning two space-separated strings."""
    return align(ref.split(), hyp.split()).ops


def sclite_cost(counts: Counts) -> int:
    return COST_SUB * counts.substitutions + COST_DEL * counts.deletions + COST_INS * counts.insertions


# ---- alignment ------------------------------------------------------------------------------------------------


def test_alignment_prefers_a_shift_to_seven_substitutions_as_sclite_does():
    # Seven substitutions cost 28; four deletions, three matches and four insertions cost 24. sclite reports
    # the latter (3 0 4 4), Levenshtein with unit costs (jiwer) the former.
    assert ops("x1 x2 x3 x4 a b c", "a b c y1 y2 y3 y4") == "DDDDCCCIIII"
    out = jiwer.process_words("x1 x2 x3 x4 a b c", "a b c y1 y2 y3 y4")
    assert (out.substitutions, out.deletions, out.insertions) == (7, 0, 0)


@pytest.mark.parametrize(
    ("ref", "hyp", "expected"),
    [  # each expected string is what sclite 2.10 -o pralign printed for the pair
        ("a b c d", "a x c d e", "CSCCI"),
        ("x y z", "x z", "CDC"),
        ("a b", "c", "DS"),
        ("a b c", "b", "DCD"),
        ("a b", "b a", "DCI"),
    ],
)
def test_tie_breaking_follows_sclite(ref, hyp, expected):
    assert ops(ref, hyp) == expected


def test_empty_reference_is_all_insertions_and_empty_hypothesis_all_deletions():
    assert ops("", "foo bar") == "II"
    assert ops("hello world", "") == "DD"
    both_empty = align([], [])
    assert both_empty.ops == ""
    assert both_empty.counts == Counts(sentences=1, sentence_errors=0)


def test_columns_pair_tokens_with_their_operation():
    assert list(align(["a", "b", "c"], ["a", "x", "c", "d"]).columns()) == [
        ("a", "a", "C"), ("b", "x", "S"), ("c", "c", "C"), (None, "d", "I"),
    ]  # fmt: skip


def test_char_tokens_split_code_points_and_drop_spaces():
    assert char_tokens("hé 你好  a") == ("h", "é", "你", "好", "a")
    assert char_tokens("क्षि") == ("क", "्", "ष", "ि")  # combining marks are characters of their own, as in sclite


def test_counts_add_up_and_rates_are_undefined_without_reference_tokens():
    a = align(["a", "b", "c", "d"], ["a", "x", "c"]).counts
    b = align([], ["z"]).counts
    total = a + b
    assert total == Counts(2, 2, 4, 2, 1, 1, 1)
    assert total.errors == 3 and total.error_rate == 75.0 and total.sentence_error_rate == 100.0
    assert b.error_rate is None and b.row() == (1, 0, None, None, None, None, None, 100.0)


def _random_pairs(rng: random.Random, count: int, vocab: list[str]) -> list[tuple[list[str], list[str]]]:
    pairs = []
    for _ in range(count):
        ref = [rng.choice(vocab) for _ in range(rng.randint(0, 15))]
        hyp = [rng.choice(vocab) for _ in range(rng.randint(0, 15))] if rng.random() < 0.5 else list(ref)
        for _ in range(rng.randint(0, 4)):  # a few edits anywhere
            pos = rng.randint(0, len(hyp))
            kind = rng.choice("sdi")
            if kind == "i" or not hyp:
                hyp.insert(pos, rng.choice(vocab))
            elif kind == "d":
                del hyp[min(pos, len(hyp) - 1)]
            else:
                hyp[min(pos, len(hyp) - 1)] = rng.choice(vocab)
        pairs.append((ref, hyp))
    return pairs


def test_batched_alignment_equals_one_pair_at_a_time(monkeypatch):
    pairs = _random_pairs(random.Random(1), 300, list("abcde"))
    pairs.append((["w"] * 120, ["w", "v"] * 70))  # long: its own batch when cells are scarce
    monkeypatch.setattr(align_mod, "_MAX_CELLS", 4000)  # many small batches, one pair alone in some
    batched = align_batch(pairs)
    assert [a.ops for a in batched] == [align(r, h).ops for r, h in pairs]
    for (ref, hyp), a in zip(pairs, batched, strict=True):
        assert a.ref == tuple(ref) and a.hyp == tuple(hyp)
        assert "".join(r for r, _, op in a.columns() if op != "I") == "".join(ref)
        assert "".join(h for _, h, op in a.columns() if op != "D") == "".join(hyp)


def test_jiwer_finds_the_same_words_and_never_fewer_errors_at_sclite_cost():
    # jiwer minimises the number of edits, sclite its weighted cost: on the same pairs our cost is never above
    # the sclite cost of jiwer's alignment, our error count never below jiwer's, and the word counts agree.
    pairs = _random_pairs(random.Random(2), 400, list("abcdefg"))
    ours = align_batch(pairs)
    differ = 0
    for (ref, hyp), a in zip(pairs, ours, strict=True):
        if not ref:
            continue  # jiwer refuses empty references
        j = jiwer.process_words(" ".join(ref), " ".join(hyp))
        theirs = Counts(1, 0, len(ref), j.hits, j.substitutions, j.deletions, j.insertions)
        assert a.counts.tokens == j.hits + j.substitutions + j.deletions
        assert sclite_cost(a.counts) <= sclite_cost(theirs)
        assert a.counts.errors >= theirs.errors
        differ += a.counts.errors != theirs.errors
    assert differ < 0.1 * len(pairs)  # they differ only where a shift beats many substitutions


def test_totals_equal_jiwer_wer_when_edits_are_isolated():
    rng = random.Random(3)
    vocab = [f"w{i}" for i in range(500)]
    refs, hyps = [], []
    for _ in range(200):
        ref = [rng.choice(vocab) for _ in range(rng.randint(5, 30))]
        hyp, edited = [], False
        for w in ref:  # edits from a large vocabulary with a correct word after each: no alignment ambiguity
            r = 1.0 if edited else rng.random()
            hyp += [] if r < 0.05 else [rng.choice(vocab)] if r < 0.1 else [w, rng.choice(vocab)] if r < 0.13 else [w]
            edited = r < 0.13
        refs.append(" ".join(ref))
        hyps.append(" ".join(hyp))
    result = score_transcripts(
        [UtteranceText(str(i), r) for i, r in enumerate(refs)], [UtteranceText(str(i), h) for i, h in enumerate(hyps)]
    )
    out = jiwer.process_words(refs, hyps)
    total = result.total("WER")
    assert (total.substitutions, total.deletions, total.insertions) == (
        out.substitutions, out.deletions, out.insertions,
    )  # fmt: skip
    assert total.error_rate == pytest.approx(100 * out.wer)


# ---- formats --------------------------------------------------------------------------------------------------


def write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_reads_kaldi_trn_and_jsonl_with_speakers(tmp_path):
    kaldi = write(tmp_path / "text", "u1 Hello  there\n\nu2\n")
    trn = write(tmp_path / "hyp.trn", "hello there (spk1-u1)\n (spk_2-u2)\n")
    jsonl = write(tmp_path / "h.jsonl", '{"id": "u1", "text": "hi", "speaker": "s"}\n{"utt_id": "u2", "text": ""}\n')
    assert read_transcripts(kaldi) == [UtteranceText("u1", "Hello there"), UtteranceText("u2", "")]
    assert read_transcripts(trn) == [
        UtteranceText("spk1-u1", "hello there", "spk1"),
        UtteranceText("spk_2-u2", "", "spk_2"),
    ]
    assert read_transcripts(jsonl) == [UtteranceText("u1", "hi", "s"), UtteranceText("u2", "")]
    # auto-detection by content when the name says nothing
    assert read_transcripts(write(tmp_path / "a", "x y (s-1)\n"))[0].speaker == "s"
    assert read_transcripts(write(tmp_path / "b", '{"id": "1", "text": "x"}\n'))[0].text == "x"
    assert read_transcripts(write(tmp_path / "c", "x (y)\n"), fmt="kaldi") == [UtteranceText("x", "(y)")]


def test_trn_lines_round_trip_with_the_speaker_prefix():
    assert trn_line(UtteranceText("u1", "a b", "spk")) == "a b (spk-u1)"
    assert trn_line(UtteranceText("spk-u1", "", "spk")) == "(spk-u1)"
    assert trn_line(UtteranceText("u1", "a", None)) == "a (u1)"


@pytest.mark.parametrize(
    ("content", "fmt", "message"),
    [
        ("", "auto", r"holds no transcripts"),
        ("\n  \n", "kaldi", r"holds no transcripts"),
        (b"u1 ok\nu2 caf\xe9\n", "kaldi", r":2: hypothesis file is not UTF-8"),
        ("a b (s-1)\nno id here\n", "trn", r":2: a trn line ends with its utterance id"),
        ("a (s 1)\n", "trn", r":1: bad utterance id"),
        ('{"id": "1", "text": "a"}\n{"id": "2", "text": \n', "jsonl", r":2: not valid JSON"),
        ('["a"]\n', "jsonl", r":1: expected a JSON object"),
        ('{"text": "a"}\n', "jsonl", r":1: needs a non-empty string field 'id'"),
        ('{"id": "1", "text": 3}\n', "jsonl", r":1: needs a string field 'text'"),
        ("u1 a\nu1 b\n", "kaldi", r":2: utterance id 'u1' already on line 1"),
    ],
)
def test_bad_transcript_files_name_file_and_line(tmp_path, content, fmt, message):
    path = write(tmp_path / "hyp.txt", content)
    with pytest.raises(UserError) as err:
        read_transcripts(path, fmt, "hypothesis file")
    assert str(err.value).startswith(str(path)) and re.search(message, str(err.value))


def test_missing_file_and_bad_utt2spk_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="not found"):
        read_transcripts(tmp_path / "nope.txt")
    with pytest.raises(UserError, match=r"utt2spk:1: expected 'UTT_ID SPEAKER'"):
        read_utt2spk(write(tmp_path / "utt2spk", "u1 s1 extra\n"))
    assert read_utt2spk(write(tmp_path / "u2s", "u1 s1\n\nu2 s2\n")) == {"u1": "s1", "u2": "s2"}


# ---- scoring and analysis ---------------------------------------------------------------------------------


def test_missing_hypotheses_are_empty_and_extra_ones_ignored():
    refs = [UtteranceText("u1", "Hello, World!"), UtteranceText("u2", "good morning")]
    hyps = [UtteranceText("u1", "hello world"), UtteranceText("u3", "stray")]
    result = score_transcripts(refs, hyps)
    assert result.missing == ["u2"] and result.extra == ["u3"]
    assert result.utterances[0].ref == "hello world"  # normalised as in training
    assert result.total() == Counts(2, 1, 4, 2, 0, 2, 0)
    raw = score_transcripts(refs, hyps, normalize=False)
    assert raw.total().correct == 0  # "Hello," != "hello"


def test_speakers_come_from_utt2spk_then_the_files():
    refs = [UtteranceText("u1", "a", None), UtteranceText("s2-u2", "b", "s2"), UtteranceText("u3", "c", None)]
    hyps = [UtteranceText("u1", "a", "from_hyp"), UtteranceText("s2-u2", "x"), UtteranceText("u3", "c")]
    result = score_transcripts(refs, hyps, utt2spk={"u3": "s3"})
    assert [u.speaker for u in result.utterances] == ["from_hyp", "s2", "s3"]
    assert {k: (c.tokens, c.errors) for k, c in result.by_speaker().items()} == {
        "from_hyp": (1, 0), "s2": (1, 1), "s3": (1, 0),
    }  # fmt: skip


def test_breakdowns_count_confusions_deletions_insertions_and_lengths():
    refs = ["the cat sat", "the cat ran away", "a dog", "", " ".join(["w"] * 45)]
    hyps = ["the bat sat", "the bat ran", "a dog barked loudly", "uh", " ".join(["w"] * 45)]
    result = score_transcripts(
        [UtteranceText(f"u{i}", r) for i, r in enumerate(refs)], [UtteranceText(f"u{i}", h) for i, h in enumerate(hyps)]
    )
    assert result.confusions() == [(("cat", "bat"), 2)]
    assert result.deleted() == [("away", 1)]
    assert result.inserted() == [("barked", 1), ("loudly", 1), ("uh", 1)]
    assert list(result.by_length()) == ["0", "1-4", "40-79"]
    assert result.by_length()["1-4"] == Counts(3, 3, 9, 6, 2, 1, 2)
    assert [u.utt_id for u in result.worst()] == ["u2", "u1", "u3", "u0"]  # most errors, then highest rate
    assert [length_bucket(n) for n in (0, 1, 4, 5, 19, 20, 80, 1000)] == [
        "0", "1-4", "1-4", "5-9", "10-19", "20-39", "80+", "80+",
    ]  # fmt: skip


# ---- report files ---------------------------------------------------------------------------------------------


def small_result():
    refs = [UtteranceText("spk1-u1", "a b c d", "spk1"), UtteranceText("spk2-u2", "你好 世界", "spk2")]
    hyps = [UtteranceText("spk1-u1", "a x c d e", "spk1"), UtteranceText("spk2-u2", "你好", "spk2")]
    return score_transcripts(refs, hyps)


def test_pralign_block_looks_like_sclites():
    result = small_result()
    assert pralign_block(result.utterances[0], result.utterances[0].words) == (
        "id: (spk1-u1)\nspeaker: spk1\nScores: (#C #S #D #I) 3 1 0 1\n"
        "REF:  a B c d * \nHYP:  a X c d E \nEval:   S     I \n"
    )
    wide = pralign_block(result.utterances[1], result.utterances[1].words)
    assert "REF:  你好 世界 \nHYP:  你好 **** \nEval:      D    \n" in wide  # wide characters take two cells


def test_results_md_has_espnet_tables():
    md = results_md(small_result(), ReportInfo("test_clean", "ref.trn", "hyp.trn"))
    assert "|dataset|Snt|Wrd|Corr|Sub|Del|Ins|Err|S.Err|" in md
    wer, cer = re.findall(r"^\|test_clean\|.*\|$", md, flags=re.MULTILINE)
    assert wer == "|test_clean|2|6|66.7|16.7|16.7|16.7|50.0|100.0|"
    assert cer == "|test_clean|2|8|62.5|12.5|25.0|12.5|50.0|100.0|"  # 4 + 4 characters, no spaces


def test_write_report_writes_every_file_atomically(tmp_path):
    csv = "epoch,step,train/loss,valid/loss,valid/wer\n0,0,5.0,,\n0,1,4.0,,\n0,1,,4.5,80\n"
    log = write(tmp_path / "metrics.csv", csv)
    paths = write_report(small_result(), tmp_path / "out", ReportInfo("t"), train_log=log)
    names = {
        "results.md", "results.json", "report.html", "alignment.wer.txt", "alignment.cer.txt", "ref.trn",
        "hyp.trn", "error_types.png", "wer_by_length.png", "training_curves.png",
    }  # fmt: skip
    assert {p.name for p in paths.values()} == names
    assert {p.name for p in (tmp_path / "out").iterdir()} == names  # no temporary files left behind
    totals = json.loads((tmp_path / "out" / "results.json").read_text(encoding="utf-8"))
    for level in ("WER", "CER"):
        c = small_result().total(level)
        assert totals[level]["errors"] == c.errors and totals[level]["tokens"] == c.tokens
        assert totals[level]["error_rate"] == pytest.approx(c.error_rate)
    for p in paths.values():
        if p.suffix == ".png":
            assert p.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert page.count('src="data:image/png;base64,') == 3
    assert "<script" not in page and "http" not in page  # self-contained
    for section in ("Summary", "By speaker", "WER by utterance length", "Worst utterances", "Confusion pairs"):
        assert f">{section}<" in page


def test_training_log_problems_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="no 'step' column"):
        read_metrics_csv(write(tmp_path / "a.csv", "epoch,loss\n0,1\n"))
    with pytest.raises(UserError, match=r"b.csv:3: a value is not a number"):
        read_metrics_csv(write(tmp_path / "b.csv", "step,train/loss\n0,1\n1,abc\n"))
    assert read_metrics_csv(write(tmp_path / "c.csv", "epoch,step,x/loss\n0,0,1\n0,5,\n0,7,2\n")) == {
        "x/loss": [(0.0, 1.0), (7.0, 2.0)]
    }


# ---- the command ----------------------------------------------------------------------------------------------


def test_score_command_prints_a_summary_and_warns_about_unpaired_ids(tmp_path, capsys):
    ref = write(tmp_path / "ref.txt", "u1 The cat sat.\nu2 a dog\nu3 missing here\n")
    hyp = write(tmp_path / "hyp.txt", "u1 the bat sat\nu2 a dog\nu9 extra\n")
    u2s = write(tmp_path / "utt2spk", "u1 s1\nu2 s1\nu3 s2\n")
    out = tmp_path / "report"
    argv = ["score", "--ref", str(ref), "--hyp", str(hyp), "--out-dir", str(out), "--utt2spk", str(u2s)]
    assert main([*argv, "--name", "dev"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [
        "dev: WER 42.9% (sub 14.3 del 28.6 ins 0.0; 7 words, 3 sentences, S.Err 66.7%)  CER 50.0% (24 chars)"
    ]
    assert f"warning: {hyp}: 1 reference(s) have no hypothesis" in captured.err and "u3" in captured.err
    assert f"warning: {hyp}: 1 hypothesis(es) have no reference; ignored: u9" in captured.err
    assert "(s2-u3)" in (out / "ref.trn").read_text(encoding="utf-8")
    assert "|dev|3|7|57.1|14.3|28.6|0.0|42.9|66.7|" in (out / "results.md").read_text(encoding="utf-8")


def test_score_command_reports_bad_input_in_one_line(tmp_path, capsys):
    ref = write(tmp_path / "ref.trn", "a b (s-1)\nbroken line\n")
    assert main(["score", "--ref", str(ref), "--hyp", str(ref)]) == 2
    err = capsys.readouterr().err.strip()
    problem = "a trn line ends with its utterance id in parentheses, got 'broken line'"
    assert err == f"srupp-asr score: error: {ref}:2: {problem}"


def test_score_function_without_out_dir_writes_nothing(tmp_path):
    ref = write(tmp_path / "r.jsonl", '{"id": "a", "text": "x y", "speaker": "s"}\n')
    result = score(ref, ref)
    assert result.total().errors == 0 and result.by_speaker() == {"s": Counts(1, 0, 2, 2, 0, 0, 0)}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl"]


# ---- the HTML in a browser ------------------------------------------------------------------------------------


def _chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def test_report_html_renders_in_headless_chromium(tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install chromium); it renders the HTML report")
    from PIL import Image

    write_report(small_result(), tmp_path, ReportInfo("render"))
    shot = tmp_path / "shot.png"
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--screenshot={shot}",
           "--window-size=1200,2000", (tmp_path / "report.html").as_uri()]  # fmt: skip
    subprocess.run(cmd, capture_output=True, timeout=120, check=False, cwd=tmp_path)
    assert shot.is_file() and shot.stat().st_size > 0
    pixels = np.asarray(Image.open(shot).convert("RGB")).reshape(-1, 3)
    assert len(np.unique(pixels, axis=0)) > 50  # not a blank page
    colors = {tuple(p) for p in pixels[::7]}
    assert (0xEE, 0xF3, 0xFB) in colors  # the CSS of the summary boxes was applied
    assert (0xD6, 0x27, 0x28) in colors  # the embedded error-type plot was decoded and drawn (substitution red)


def _score_in_child(ref: Path, hyp: Path, out: Path, file_size_limit: int | None = None):
    """``srupp-asr score`` in a child process, its files limited to ``file_size_limit`` bytes (a full disk:
    past the limit write() fails with EFBIG where a full disk fails with ENOSPC)."""
    import resource
    import signal
    import sys

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

    cmd = [sys.executable, "-m", "srupp_asr.cli", "score", "--ref", str(ref), "--hyp", str(hyp), "--out-dir", str(out)]
    preexec = limit if file_size_limit else None
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, preexec_fn=preexec)


def test_a_report_that_the_disk_cannot_hold_names_the_file_and_leaves_the_old_report_whole(tmp_path):
    """On a full disk ``score --out-dir`` said "No space left on device" without naming the file, and left half a
    report (a new results.json beside the old report.html)."""
    ref, hyp, hyp2 = tmp_path / "ref.txt", tmp_path / "hyp.txt", tmp_path / "hyp2.txt"
    words = [f"word{i}" for i in range(40)]
    ref.write_text("".join(f"u{i} {' '.join(words[i : i + 8])}\n" for i in range(30)))
    hyp.write_text("".join(f"u{i} {' '.join(words[i : i + 7])}\n" for i in range(30)))
    hyp2.write_text("".join(f"u{i} {' '.join(words[i + 1 : i + 8])} extra\n" for i in range(30)))
    out = tmp_path / "report"
    assert _score_in_child(ref, hyp, out).returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    sizes = sorted(len(data) for data in before.values())
    assert "report.html" in before and sizes[-1] == len(before["report.html"]) > sizes[-2]
    # Room for every file but the largest: the old writer replaced the others, then failed on report.html.
    proc = _score_in_child(ref, hyp2, out, file_size_limit=(sizes[-2] + sizes[-1]) // 2)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert errors == [
        f"srupp-asr score: error: {out / 'report.html'}: cannot write (File too large); no file of the set was changed"
    ], proc.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the old report whole, no temporary file


def test_a_twenty_million_word_line_is_one_line_error_in_seconds(tmp_path, capsys):
    """A 100 MB hypothesis that is one 20-million-word line ran 180 s of CPU without a result."""
    import time

    from srupp_asr.scoring.formats import MAX_TRANSCRIPT_CHARS

    ref, hyp = tmp_path / "ref.txt", tmp_path / "hyp.txt"
    ref.write_text("u1 hello world\n")
    with open(hyp, "w") as f:
        f.write("u1 ")
        f.write("word " * 20_000_000)
        f.write("\n")
    start = time.monotonic()
    assert main(["score", "--ref", str(ref), "--hyp", str(hyp)]) == 2
    assert time.monotonic() - start < 60  # reading 100 MB; no alignment
    assert capsys.readouterr().err.strip() == (
        f"srupp-asr score: error: {hyp}:1: a line of 100,000,003 characters, more than the {MAX_TRANSCRIPT_CHARS:,}"
        " one line of a hypothesis file may hold (split it)"
    )


def test_a_pair_too_long_to_align_is_one_line_naming_the_utterance_before_any_work(tmp_path, capsys):
    from srupp_asr.scoring.align import MAX_PAIR_CELLS, TooLongToAlign

    ref, hyp = tmp_path / "ref.txt", tmp_path / "hyp.txt"
    ref.write_text("short one\nlong " + "a " * 20_000 + "\n")
    hyp.write_text("short one\nlong " + "b " * 20_000 + "\n")
    assert main(["score", "--ref", str(ref), "--hyp", str(hyp)]) == 2
    assert capsys.readouterr().err.strip() == (
        "srupp-asr score: error: utterance long: aligning 20,000 reference tokens with 20,000 hypothesis tokens needs"
        f" 400,040,001 cells, more than the {MAX_PAIR_CELLS:,} one utterance may use (about 16,000 tokens each);"
        " split it into shorter utterances"
    )
    with pytest.raises(TooLongToAlign):  # characters too: 100,000 by 100,000 characters in one word each
        align_batch([(tuple("x" * 20_000), tuple("y" * 20_000))])


def test_a_set_over_the_words_one_scoring_holds_is_refused_naming_the_limit(tmp_path, capsys, monkeypatch):
    """1M utterances took about 6 GB; the totals of a set larger than MAX_SCORED_WORDS would be worse."""
    from srupp_asr.scoring import analysis

    monkeypatch.setattr(analysis, "MAX_SCORED_WORDS", 100)  # 10 million in use: the same check, smaller
    ref, hyp = tmp_path / "ref.txt", tmp_path / "hyp.txt"
    ref.write_text("".join(f"u{i} one two three four five\n" for i in range(10)))
    hyp.write_text("".join(f"u{i} one two three four five six\n" for i in range(10)))
    assert main(["score", "--ref", str(ref), "--hyp", str(hyp)]) == 2
    assert capsys.readouterr().err.strip() == (
        "srupp-asr score: error: 10 utterances hold 110 words (references and hypotheses), more than the 100 one"
        " scoring holds in memory (about 2.5 GB); score the set in parts"
    )
    monkeypatch.setattr(analysis, "MAX_SCORED_WORDS", 110)
    assert main(["score", "--ref", str(ref), "--hyp", str(hyp)]) == 0
