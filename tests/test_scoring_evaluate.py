"""``srupp-asr evaluate``: decoding a cut manifest with a model directory and scoring it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal

import pytest

from srupp_asr.cli import main
from srupp_asr.scoring.score import score


def test_bad_decoding_options_and_manifest_are_one_line_errors(tmp_path, capsys):
    base = ["evaluate", "--model", str(tmp_path), "--out-dir", str(tmp_path / "out")]
    assert main([*base, "--cuts", str(tmp_path / "none.jsonl.gz"), "--beam", "0"]) == 2
    assert capsys.readouterr().err.strip() == (
        "srupp-asr evaluate: error: decoding options: beam must be an integer in [1, 128] (memory grows with it), got 0"
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


def test_evaluate_in_python_takes_decoding_options_or_keywords(eval_cuts, tmp_path):
    """``evaluate(options=DecodingOptions(...))`` decodes as the same settings given as keywords, as ``transcribe``
    does; an unknown keyword is a TypeError naming it."""
    from srupp_asr.decoding import DecodingOptions
    from srupp_asr.scoring.evaluate import evaluate

    model_dir, cuts = eval_cuts
    common = {"device": "cpu", "batch_size": 3, "errors": []}
    by_options, speed = evaluate(model_dir, cuts, tmp_path / "a", options=DecodingOptions("ctc_greedy"), **common)
    by_keywords, _ = evaluate(model_dir, cuts, tmp_path / "b", decoding="ctc_greedy", **common)
    assert (tmp_path / "a" / "hyp.jsonl").read_text() == (tmp_path / "b" / "hyp.jsonl").read_text()
    assert by_options.total().errors == by_keywords.total().errors == 3 and speed.utterances == 8
    assert "- decoding: `mode=ctc_greedy`" in (tmp_path / "a" / "results.md").read_text(encoding="utf-8")
    with pytest.raises(TypeError, match=r"^evaluate\(\) got an unexpected keyword argument 'best_of'$"):
        evaluate(model_dir, cuts, tmp_path / "c", best_of=4, **common)
    assert not (tmp_path / "c").exists()


def _edited(cuts_path, out_path, edit):
    """A copy of a cut manifest with ``edit(list of cut dicts)`` applied."""
    import gzip

    with gzip.open(cuts_path, "rt", encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    edit(lines)
    with gzip.open(out_path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(c) + "\n" for c in lines)
    return out_path


def test_evaluate_leaves_out_cuts_whose_audio_does_not_load_and_exits_1(eval_cuts, tmp_path, capsys):
    model_dir, cuts = eval_cuts

    def lose_audio(lines):
        lines[2]["recording"]["sources"][0]["source"] = str(tmp_path / "gone.wav")
        lines[5]["recording"]["sources"][0]["source"] = str(tmp_path / "text.wav")
        (tmp_path / "text.wav").write_text("not audio")

    broken = _edited(cuts, tmp_path / "broken.jsonl.gz", lose_audio)
    out = tmp_path / "report"
    argv = ["evaluate", "--model", str(model_dir), "--cuts", str(broken), "--out-dir", str(out), "--device", "cpu"]
    assert main([*argv, "--decoding", "ctc_greedy"]) == 1
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if " error: " in line]  # stderr also names the report
    assert errors[0] == f"srupp-asr evaluate: error: {tmp_path / 'gone.wav'}: cut utt2: audio file not found"
    assert re.fullmatch(
        rf"srupp-asr evaluate: error: {tmp_path / 'text.wav'}: cut utt5: cannot load its audio \(.+\)", errors[1]
    )
    assert len(errors) == 2 and "2 cut(s) left out" in captured.out
    hyps = [json.loads(line)["id"] for line in (out / "hyp.jsonl").read_text(encoding="utf-8").splitlines()]
    refs = [json.loads(line)["id"] for line in (out / "ref.jsonl").read_text(encoding="utf-8").splitlines()]
    assert hyps == refs == [f"utt{i}" for i in (0, 1, 3, 4, 6, 7)]  # the others are decoded and scored
    assert score(out / "ref.trn", out / "hyp.trn").total().errors == 3  # no deletions for the lost cuts
    assert "2 cut(s) whose audio did not load" in (out / "results.md").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "case,message",
    [
        ("command", r":2: cut utt1: recording r1: audio source runs a shell command"),
        ("duplicate", r":3: cut utt0: duplicate cut id \(first on line 1\)"),
        ("not json", r":2: not valid JSON"),
    ],
)
def test_evaluate_and_cmvn_refuse_hostile_or_broken_manifests(eval_cuts, tmp_path, capsys, case, message):
    model_dir, cuts = eval_cuts
    flag = tmp_path / "ran"

    def edit(lines):
        if case == "command":
            lines[1]["recording"]["sources"][0] = {"type": "command", "channels": [0], "source": f"touch {flag}"}
        elif case == "duplicate":
            lines[2]["id"] = "utt0"

    bad = _edited(cuts, tmp_path / "bad.jsonl.gz", edit)
    if case == "not json":
        import gzip

        with gzip.open(bad, "rt") as f:
            text = f.read().splitlines()
        text[1] = "{not json"
        with gzip.open(bad, "wt") as f:
            f.write("\n".join(text) + "\n")
    argv = [
        "evaluate",
        "--model",
        str(model_dir),
        "--cuts",
        str(bad),
        "--out-dir",
        str(tmp_path / "o"),
        "--device",
        "cpu",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(re.escape(str(bad)) + message, err), err
    assert main(["cmvn", str(bad), "--out", str(tmp_path / "cmvn.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(re.escape(str(bad)) + message, err), err
    assert not flag.exists() and not (tmp_path / "cmvn.json").exists() and not (tmp_path / "o").exists()


def test_command_sources_run_only_when_allowed(eval_cuts, tmp_path, capsys):
    model_dir, cuts = eval_cuts
    wav = None

    def edit(lines):
        nonlocal wav
        wav = lines[1]["recording"]["sources"][0]["source"]
        lines[1]["recording"]["sources"][0] = {"type": "command", "channels": [0], "source": f"cat {wav}"}

    piped = _edited(cuts, tmp_path / "piped.jsonl.gz", edit)
    assert main(["cmvn", str(piped), "--out", str(tmp_path / "cmvn.json"), "--allow-command-sources"]) == 0
    out = tmp_path / "report"
    argv = ["evaluate", "--model", str(model_dir), "--cuts", str(piped), "--out-dir", str(out), "--device", "cpu"]
    assert main([*argv, "--decoding", "ctc_greedy", "--allow-command-sources"]) == 0
    assert "utt1" in (out / "hyp.jsonl").read_text(encoding="utf-8")


def test_cmvn_leaves_out_cuts_whose_audio_does_not_load_and_exits_1(eval_cuts, tmp_path, capsys):
    _, cuts = eval_cuts

    def lose(lines):
        lines[0]["recording"]["sources"][0]["source"] = str(tmp_path / "gone.wav")

    broken = _edited(cuts, tmp_path / "broken.jsonl.gz", lose)
    assert main(["cmvn", str(broken), "--out", str(tmp_path / "cmvn.json")]) == 1
    captured = capsys.readouterr()
    assert captured.err.strip() == f"srupp-asr cmvn: error: {tmp_path / 'gone.wav'}: cut utt0: audio file not found"
    assert (tmp_path / "cmvn.json").exists() and "1 cut(s) left out" in captured.out


@contextlib.contextmanager
def deadline(seconds: int):
    """Raise TimeoutError in the block after ``seconds`` (a blocked ``open()`` of a named pipe included)."""

    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("command", ["evaluate", "cmvn"])
def test_a_cut_whose_audio_is_a_named_pipe_is_left_out_with_one_line_not_waited_on(
    eval_cuts, tmp_path, capsys, command
):
    """Opening a named pipe waits for a writer: evaluate hung for ever on such a cut (transcribe refused it)."""
    model_dir, cuts = eval_cuts
    os.mkfifo(tmp_path / "pipe.wav")

    def pipe(lines):
        lines[1]["recording"]["sources"][0]["source"] = str(tmp_path / "pipe.wav")

    broken = _edited(cuts, tmp_path / "piped.jsonl.gz", pipe)
    if command == "evaluate":
        argv = ["evaluate", "--model", str(model_dir), "--cuts", str(broken), "--out-dir", str(tmp_path / "report")]
        argv += ["--device", "cpu", "--decoding", "ctc_greedy"]
    else:
        argv = ["cmvn", str(broken), "--out", str(tmp_path / "cmvn.json")]
    with deadline(120):
        assert main(argv) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if " error: " in line]
    assert errors == [
        f"srupp-asr {command}: error: {tmp_path / 'pipe.wav'}: cut utt1: not a readable audio file"
        " (not a regular file: a pipe)"
    ]


@pytest.mark.parametrize("command", ["evaluate", "cmvn"])
def test_a_manifest_that_is_a_named_pipe_is_one_line_not_waited_on(eval_cuts, tmp_path, capsys, command):
    model_dir, _ = eval_cuts
    os.mkfifo(tmp_path / "cuts.jsonl.gz")
    if command == "evaluate":
        argv = ["evaluate", "--model", str(model_dir), "--cuts", str(tmp_path / "cuts.jsonl.gz")]
        argv += ["--out-dir", str(tmp_path / "report"), "--device", "cpu"]
    else:
        argv = ["cmvn", str(tmp_path / "cuts.jsonl.gz"), "--out", str(tmp_path / "cmvn.json")]
    with deadline(60):
        assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        f"srupp-asr {command}: error: {tmp_path / 'cuts.jsonl.gz'}: cut manifest is not a regular file (a pipe;"
        " save it to a file)"
    )
