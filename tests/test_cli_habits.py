"""The habits a new user brings: whisper's option spellings, misspelt options and commands, English only, the
built-in model by default (transcribe and evaluate), plain line-aligned text in ``score``, and exit statuses
(0 all done, 1 some inputs failed, 2 usage or model error)."""

from __future__ import annotations

import argparse
import json

import pytest

from srupp_asr.cli import COMMANDS, _subparsers, build_parser, main
from srupp_asr.inputs import DEFAULT_MODEL_ENV


def _parse(command: str, *argv: str):
    return build_parser(command).parse_args([command, *argv])


def _one_error_line(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    return err.rstrip("\n")


def test_whispers_spellings_are_aliases():
    ours = _parse("transcribe", "a.wav", "--output-format", "srt", "--output-dir", "out", "--beam", "3")
    theirs = _parse(
        "transcribe", "a.wav", "--output_format", "srt", "--output_dir", "out", "--beam_size", "3",
        "--word_timestamps", "True", "--language", "en", "--task", "transcribe",
    )  # fmt: skip
    for name in ("output_format", "output_dir", "beam", "inputs"):
        assert getattr(ours, name) == getattr(theirs, name)
    assert _parse("evaluate", "--cuts", "c", "--out-dir", "o", "--beam_size", "4").beam == 4


def test_another_task_is_refused_in_one_line(capsys, tmp_path):
    line = _one_error_line(capsys, ["transcribe", str(tmp_path / "a.wav"), "--task", "translate"])
    assert line == "srupp-asr transcribe: error: --task translate: srupp-asr transcribes, it does not translate " + (
        "(--task transcribe)"
    )


@pytest.mark.parametrize("language", ["fr", "de", "zh"])
def test_another_language_is_refused_in_one_line(capsys, tmp_path, language):
    line = _one_error_line(capsys, ["transcribe", str(tmp_path / "a.wav"), "--language", language])
    assert (
        line == f"srupp-asr transcribe: error: --language {language}: srupp-asr recognises English only (--language en)"
    )


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["transcribe", "a.wav", "--outptu-dir", "x"], "srupp-asr transcribe: error: unknown option --outptu-dir "
         "(did you mean --output-dir?)"),
        (["transcribe", "a.wav", "--beam-size", "5"], "srupp-asr transcribe: error: unknown option --beam-size "
         "(did you mean --beam?)"),
        (["transcribe", "a.wav", "--output_fromat=srt"], "srupp-asr transcribe: error: unknown option "
         "--output_fromat (did you mean --output-format?)"),
        (["evaluate", "--cuts", "c", "--out-dir", "o", "--modle", "m"], "srupp-asr evaluate: error: unknown "
         "option --modle (did you mean --model?)"),
        (["transcribe", "a.wav", "--zzzzzz"], "srupp-asr transcribe: error: unknown option --zzzzzz (see "
         "srupp-asr transcribe --help)"),
        (["--bogus"], "srupp-asr: error: unknown option --bogus (see srupp-asr --help)"),
        (["transcibe", "a.wav"], "srupp-asr: error: no command 'transcibe' (did you mean transcribe?)"),
        (["talk.wav"], "srupp-asr: error: no command 'talk.wav' (to transcribe a file: srupp-asr transcribe "
         "talk.wav)"),
    ],
)  # fmt: skip
def test_misspellings_get_the_nearest_name_in_one_line(capsys, argv, line):
    assert _one_error_line(capsys, argv) == line


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["score", "--hypp", "h.txt", "--ref", "r.txt"], "srupp-asr score: error: unknown option --hypp (did you "
         "mean --hyp?)"),  # named before argparse would say that the required --hyp is missing
        (["evaluate", "--cut", "x"], "srupp-asr evaluate: error: unknown option --cut (did you mean --cuts?)"),
        (["transcribe", "a.wav", "--out", "x"], "srupp-asr transcribe: error: unknown option --out (did you mean "
         "--output-dir or --output-format?)"),
        (["prepare", "kaldi", "d", "o.jsonl.gz", "--allow-comand-sources"], "srupp-asr prepare kaldi: error: "
         "unknown option --allow-comand-sources (did you mean --allow-command-sources?)"),
        (["corpus", "prepare", "librispeech", "a", "b", "--sbuset", "100"], "srupp-asr corpus prepare: error: "
         "unknown option --sbuset (did you mean --subset?)"),
        (["--verison"], "srupp-asr: error: unknown option --verison (did you mean --version?)"),
    ],
)  # fmt: skip
def test_misspelt_options_are_named_first_even_beside_required_ones(capsys, argv, line):
    assert _one_error_line(capsys, argv) == line


def _long_options(parser) -> list[str]:
    return [s for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"]


# info: no options; sclite: NIST sclite's own single-dash command line (its unknown options are one line too:
# tests/test_sclite.py)
@pytest.mark.parametrize("command", [c for c in COMMANDS if c not in ("train", "info", "sclite")])
def test_every_commands_misspelt_option_gets_one_line_with_a_suggestion(capsys, command):
    parser = _subparsers(build_parser(command))[command]
    words = [command]
    while subs := _subparsers(parser):  # prepare kaldi, corpus download, ...: the first sub-command
        name, parser = next(iter(subs.items()))
        words.append(name)
    option = _long_options(parser)[0]
    typo = option[:-2] + option[-1] + option[-2]  # the last two letters swapped: --modle
    line = _one_error_line(capsys, [*words, typo, "x"])
    assert line.startswith(f"srupp-asr {' '.join(words)}: error: unknown option {typo} (did you mean ")
    assert option in line.split("did you mean ", 1)[1]


def test_a_negative_number_is_a_value_not_an_unknown_option(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["score", "--ref", "r", "--hyp", "h", "--worst", "-1"])
    assert stop.value.code == 2 and "--worst: must be a whole number >= 0" in capsys.readouterr().err


def test_a_misspelt_lightning_option_is_not_taken_as_an_abbreviation(capsys):
    """``train fit --trainer.max_step 3`` went to LightningCLI as an abbreviation of --trainer.max_steps (and failed
    on something else); now it is a misspelling with its suggestion."""
    line = _one_error_line(capsys, ["train", "fit", "--config", "tiny_cpu", "--trainer.max_step", "3"])
    assert line == ("srupp-asr train: error: command line: unknown option --trainer.max_step (did you mean "
                    "--trainer.max_steps?)")  # fmt: skip


def test_help_says_english_and_names_the_built_in_model(capsys):
    for argv in (["--help"], ["transcribe", "--help"]):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 0
        text = " ".join(capsys.readouterr().out.split())
        assert "English" in text and "built-in model" in text and "synthetic" in text
        assert "Exit status" in text
    assert "srupp_asr/default_model" in text or DEFAULT_MODEL_ENV in text or "none installed" in text


def test_transcribe_with_whispers_spellings_end_to_end(capsys, overfit_model_dir, tmp_path):
    model, utts = overfit_model_dir
    wav, text = utts[0]
    argv = ["transcribe", "--model", str(model), "--decoding", "ctc_prefix_beam", "--beam_size", "4"]
    argv += ["--output_format", "json", "--output_dir", str(tmp_path), "--language", "en", "--word_timestamps"]
    assert main([*argv, "True", "-q", str(wav)]) == 0
    data = json.loads((tmp_path / f"{wav.stem}.json").read_text())
    assert data["text"] == text and data["decoding"]["beam"] == 4
    assert [w["word"] for s in data["segments"] for w in s["words"]] == text.split()


def test_evaluate_defaults_to_the_built_in_model(capsys, corpus, overfit_model_dir, monkeypatch, tmp_path):
    model, _ = overfit_model_dir
    monkeypatch.setenv(DEFAULT_MODEL_ENV, str(model))
    cuts = corpus.cuts
    code = main(["evaluate", "--cuts", str(cuts), "--out-dir", str(tmp_path / "eval"), "--decoding", "ctc_greedy"])
    assert code == 0
    assert "WER 0.0% " in capsys.readouterr().out  # the overfit model's own utterances: it was that model
    assert str(model) in (tmp_path / "eval" / "results.md").read_text()
    monkeypatch.setenv(DEFAULT_MODEL_ENV, str(tmp_path / "none"))
    line = _one_error_line(capsys, ["evaluate", "--cuts", str(cuts), "--out-dir", str(tmp_path / "eval2")])
    assert "no model given (--model DIR) and no default model found" in line


def test_score_takes_plain_line_aligned_text_with_no_ids(capsys, tmp_path):
    ref, hyp = tmp_path / "ref.txt", tmp_path / "hyp.txt"
    ref.write_text("The cat sat on the mat\nA dog\n\nThe end\n")
    hyp.write_text("The cat sat on a mat\nA dog barked\n\nThe end\n")
    assert main(["score", "--ref", str(ref), "--hyp", str(hyp), "--no-ids"]) == 0
    out = capsys.readouterr().out
    # 10 reference words (a blank line is an empty utterance); "the" -> "a", "barked" inserted: 2 errors
    assert "WER 20.0% (sub 10.0 del 0.0 ins 10.0; 10 words, 4 sentences" in out, out
    # Without --no-ids the first words would be ids: "The" twice is an error that says what to do.
    line = _one_error_line(capsys, ["score", "--ref", str(ref), "--hyp", str(hyp)])
    assert line.endswith("utterance id 'The' already on line 1 (plain text with one utterance per line and no "
                         "ids? score it with --no-ids)")  # fmt: skip
    # Unique first words that pair with nothing: the same advice instead of a report of all deletions.
    ref.write_text("hello world\ngood morning\n")
    hyp.write_text("hallo world\ngod morning\n")
    line = _one_error_line(capsys, ["score", "--ref", str(ref), "--hyp", str(hyp)])
    assert line == (f"srupp-asr score: error: {hyp}: no utterance id of the hypotheses is in {ref} (plain text "
                    "with one utterance per line and no ids? score it with --no-ids)")  # fmt: skip
    assert main(["score", "--ref", str(ref), "--hyp", str(hyp), "--no-ids"]) == 0
    assert "WER 50.0% " in capsys.readouterr().out


def test_score_warns_when_every_hypothesis_is_empty(capsys, tmp_path):
    """The mark of an undertrained model (evaluate and the recipes' scoring say it too): a warning, exit 0."""
    ref, hyp = tmp_path / "ref.trn", tmp_path / "hyp.trn"
    ref.write_text("the cat sat (u1)\na dog (u2)\n")
    hyp.write_text(" (u1)\n (u2)\n")
    assert main(["score", "--ref", str(ref), "--hyp", str(hyp), "--out-dir", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "every hypothesis is empty (no words for any of the 2 utterances)" in err
    assert "every hypothesis is empty" in (tmp_path / "out" / "results.md").read_text()
    hyp.write_text("the cat (u1)\n (u2)\n")  # one word heard: no such warning
    assert main(["score", "--ref", str(ref), "--hyp", str(hyp)]) == 0
    assert "every hypothesis is empty" not in capsys.readouterr().err


def test_every_command_handler_is_named_command():
    from srupp_asr.cli import COMMANDS, _subparsers, build_parser

    handlers = {}
    for name in COMMANDS:
        if name == "sclite":  # sclite's own command line: scoring.sclite.main(argv), not an argparse handler
            continue
        parsers = [_subparsers(build_parser(name))[name]]
        while parsers:
            parser = parsers.pop()
            if "func" in parser._defaults:
                handlers[parser.prog] = parser._defaults["func"].__name__
            parsers += _subparsers(parser).values()
    assert "srupp-asr score" in handlers and "srupp-asr prepare kaldi" in handlers
    assert {prog: h for prog, h in handlers.items() if not h.endswith("_command")} == {}


def test_each_command_registers_the_help_that_srupp_asr_help_shows():
    # srupp-asr --help lists COMMANDS' lines without importing the commands; the modules register their own.
    from srupp_asr.cli import COMMANDS, build_parser

    for name, (_module, line) in COMMANDS.items():
        if name == "sclite":
            continue
        choices = next(a for a in build_parser(name)._actions if isinstance(a, argparse._SubParsersAction))
        assert next(c.help for c in choices._choices_actions if c.dest == name) == line, name
