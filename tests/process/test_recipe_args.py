"""The command lines of recipes/*/run.sh (parsed by recipes/common/stages.sh): a wrong option is one line on stderr
and exit 2 before anything runs, and paths (relative ones, ones with spaces) reach every stage whole and absolute.

No stage does real work here: a stub ``srupp-asr``, first on PATH, records its arguments and does nothing. Runs
that should be refused still pick stages that only call it (never synth_en's stage 0, which installs packages).
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAST_STAGE = {"librispeech": 9, "tedlium3": 10, "aishell1": 9, "synth_en": 7}
RECIPES = list(LAST_STAGE)
CORPORA = ["librispeech", "tedlium3", "aishell1"]
# stage 1 only calls srupp-asr (corpus prepare, synth-corpus); synth_en never runs pocketsphinx (a real decoder)
QUIET = ["--stage", "1", "--stop-stage", "1"]
SAFE = {"synth_en": ["--pocketsphinx", "false"]}
STUB = """#!/usr/bin/env bash
{ printf '%s\\037' "$@"; printf '\\n'; } >>"$STUB_LOG"
"""
# ran as a command by the old synth_en for `--lm ture`
TYPO = """#!/usr/bin/env bash
touch "$STUB_LOG.ture-ran"
"""


@pytest.fixture
def stub(tmp_path: Path) -> Path:
    """A folder holding the stub srupp-asr (and a `ture` command); returns the file its calls are logged to."""
    bin_dir = tmp_path / "stub bin"
    bin_dir.mkdir()
    for name, text in (("srupp-asr", STUB), ("ture", TYPO)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir / "calls.log"


def _run(recipe: str, stub: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{stub.parent}{os.pathsep}{os.environ['PATH']}", "STUB_LOG": str(stub)}
    script = ROOT / "recipes" / recipe / "run.sh"
    return subprocess.run(
        ["bash", str(script), *args], capture_output=True, text=True, timeout=60, env=env, cwd=cwd or stub.parent
    )


def _calls(stub: Path) -> list[list[str]]:
    """The stub's calls, each its argument list (the subcommand first)."""
    if not stub.exists():
        return []
    return [line.split("\x1f")[:-1] for line in stub.read_text().splitlines()]


def _call(stub: Path, *command: str) -> list[str]:
    """The arguments after ``command`` of the one call of the stub that starts with it."""
    found = [c[len(command) :] for c in _calls(stub) if c[: len(command)] == list(command)]
    assert len(found) == 1, (command, _calls(stub))
    return found[0]


def _after(args: list[str], option: str) -> str:
    return args[args.index(option) + 1]


def _refused(out: subprocess.CompletedProcess, stub: Path) -> str:
    """The one line a refused run printed (exit 2, nothing on stdout, no stage ran)."""
    assert out.returncode == 2, (out.returncode, out.stdout[-2000:], out.stderr[-2000:])
    assert out.stdout == "" and _calls(stub) == []
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    return lines[0]


def _usage_options(recipe: str) -> dict[str, str]:
    """The options of the usage lines of the recipe's header, each with its metavar ("" for a flag)."""
    header = []
    for line in (ROOT / "recipes" / recipe / "run.sh").read_text().splitlines()[1:]:
        if not line.startswith("#"):
            break
        header.append(line)
    usage = "\n".join(header).split("Stages")[0]
    return {m[1]: m[2] or "" for m in re.finditer(r"\[(--[a-z-]+)(?: ([^\]]+))?\]", usage)}


def _tmp_paths(tmp_path: Path) -> list[str]:
    return ["--data", str(tmp_path / "data"), "--exp", str(tmp_path / "exp")]


# ---- stage selections --------------------------------------------------------------------------------------------

BAD_STAGES = [
    (["--stage", "abc"], "--stage", "abc"),
    (["--stop-stage", "xyz"], "--stop-stage", "xyz"),
    (["--stage", "99"], "--stage", "99"),
    (["--stage", "1", "--stop-stage", "99"], "--stop-stage", "99"),
    (["--stage", "-1", "--stop-stage", "-1"], "--stage", "-1"),
    (["--stage", "2.5"], "--stage", "2.5"),
]


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize(("args", "option", "value"), BAD_STAGES, ids=[" ".join(c[0]) for c in BAD_STAGES])
def test_a_stage_that_is_not_one_of_the_recipe_is_one_line_exit_2(tmp_path, stub, recipe, args, option, value):
    line = _refused(_run(recipe, stub, *SAFE.get(recipe, []), *_tmp_paths(tmp_path), *args), stub)
    last = LAST_STAGE[recipe]
    assert line == f"run.sh: {option} takes a stage number from 0 to {last} (see --help), got '{value}'"


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_stage_after_the_stop_stage_is_one_line_exit_2(tmp_path, stub, recipe):
    out = _run(recipe, stub, *_tmp_paths(tmp_path), "--stage", "5", "--stop-stage", "2")
    assert _refused(out, stub) == "run.sh: --stage 5 is after --stop-stage 2: no stage would run"
    out = _run(recipe, stub, *SAFE.get(recipe, []), *_tmp_paths(tmp_path), "--stage", "02", "--stop-stage", "2")
    assert out.returncode == 0, out.stderr  # one stage, and a leading zero is still a number
    assert [c[0] for c in _calls(stub)] in (["cmvn"], ["corpus"])


# ---- missing values, unknown options ----------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_value_option_without_its_value_is_one_line_exit_2(tmp_path, stub, recipe):
    options = {opt: meta for opt, meta in _usage_options(recipe).items() if meta}
    assert "--stage" in options and "--exp" in options and len(options) > 15
    for option, meta in options.items():
        out = _run(recipe, stub, *SAFE.get(recipe, []), *_tmp_paths(tmp_path), *QUIET, option)
        assert _refused(out, stub) == f"run.sh: option {option} needs a value", option
        if meta != '"..."':  # --train-args "--trainer.max_epochs 1": a value may start with -- there only
            out = _run(recipe, stub, *SAFE.get(recipe, []), *_tmp_paths(tmp_path), option, *QUIET)
            assert _refused(out, stub) == f"run.sh: option {option} needs a value", option
            out = _run(recipe, stub, *SAFE.get(recipe, []), *_tmp_paths(tmp_path), *QUIET, option, "")
            assert _refused(out, stub) == f"run.sh: option {option} needs a value", option


@pytest.mark.parametrize("recipe", RECIPES)
def test_unknown_options_and_stray_words_are_one_line_exit_2(tmp_path, stub, recipe):
    for word in ("--bogus", "--stage=1"):
        line = _refused(_run(recipe, stub, *_tmp_paths(tmp_path), *QUIET, word), stub)
        assert line == f"run.sh: unknown option {word} (see --help)"
    for word in ("stray", "-x"):
        line = _refused(_run(recipe, stub, *_tmp_paths(tmp_path), *QUIET, word), stub)
        assert line == f"run.sh: unexpected argument '{word}' (see --help)"


# ---- values of the wrong kind -----------------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", RECIPES)
def test_boolean_options_take_exactly_true_or_false(tmp_path, stub, recipe):
    booleans = [opt for opt, meta in _usage_options(recipe).items() if meta == "true|false"]
    assert booleans == (["--speed-perturb", "--use-lm"] if recipe in CORPORA else ["--pocketsphinx", "--lm"])
    for option in booleans:
        for bad in ("ture", "True", "yes", "1"):
            out = _run(recipe, stub, *SAFE.get(recipe, []), *_tmp_paths(tmp_path), *QUIET, option, bad)
            assert _refused(out, stub) == f"run.sh: {option} takes true or false, got '{bad}'"
    for good in ("true", "false"):
        out = _run(recipe, stub, *_tmp_paths(tmp_path), *QUIET, *[a for o in booleans for a in (o, good)])
        assert out.returncode == 0, out.stderr


def test_synth_en_lm_typo_is_refused_not_run_as_a_command(tmp_path, stub):
    out = _run("synth_en", stub, *_tmp_paths(tmp_path), "--stage", "3", "--stop-stage", "3", "--lm", "ture")
    assert _refused(out, stub) == "run.sh: --lm takes true or false, got 'ture'"
    assert not Path(f"{stub}.ture-ran").exists()  # the old script ran `ture` (a command on PATH here)


# option -> values it refuses, per the kind of number it takes
NUMBERS = {
    "--nj": ["0", "-2", "two", "1.5"],
    "--vocab-size": ["0", "abc"],
    "--num-avg": ["0", "-1"],
    "--beam": ["0", "-1", "ten"],
    "--num-nodes": ["0", "x"],
    "--cmvn-max-cuts": ["-1", "1e3"],
    "--seed": ["-1", "x"],
    "--hours": ["0", "-1", "0.0", "ten", "1e3"],
    "--longform-max-seconds": ["0", "-5", "abc"],
    "--ctc-weight": ["1.5", "-0.1", "x"],
    "--lm-weight": ["-0.3", "x", "."],
}
KIND = {"--cmvn-max-cuts": "a whole number >= 0", "--seed": "a whole number >= 0", "--hours": "a number > 0"}
KIND |= {"--longform-max-seconds": "a number > 0", "--ctc-weight": "a number from 0 to 1"}
KIND |= {"--lm-weight": "a number >= 0"}
GOOD = {"--cmvn-max-cuts": "0", "--seed": "0", "--hours": "0.5", "--longform-max-seconds": "600", "--beam": "20"}
GOOD |= {"--ctc-weight": "0.3", "--lm-weight": "0.6", "--nj": "2", "--num-avg": "1", "--num-nodes": "1"}


@pytest.mark.parametrize("recipe", RECIPES)
def test_number_options_refuse_what_is_not_a_number_of_their_range(tmp_path, stub, recipe):
    numbers = [opt for opt, meta in _usage_options(recipe).items() if meta in ("N", "S", "H", "W")]
    numbers = [opt for opt in numbers if opt not in ("--stage", "--stop-stage", "--devices")]
    assert set(numbers) <= set(NUMBERS) and "--beam" in numbers
    for option in numbers:
        for bad in NUMBERS[option]:
            out = _run(recipe, stub, *SAFE.get(recipe, []), *_tmp_paths(tmp_path), *QUIET, option, bad)
            kind = KIND.get(option, "a whole number >= 1")
            assert _refused(out, stub) == f"run.sh: {option} takes {kind}, got '{bad}'"
    good = [a for opt in numbers if opt in GOOD for a in (opt, GOOD[opt])]
    out = _run(recipe, stub, *SAFE.get(recipe, []), *_tmp_paths(tmp_path), *QUIET, *good)
    assert out.returncode == 0, out.stderr


CHOICES = {
    "--subset": ("100|960", "50"),
    "--encoder": ("srupp|conformer", "sru"),
    "--token-type": ("unigram|bpe|char", "word"),
    "--size": ("tiny|small|large", "huge"),
    "--device": ("cpu|cuda|auto", "gpu"),
}


@pytest.mark.parametrize("recipe", RECIPES)
def test_choice_options_refuse_other_words(tmp_path, stub, recipe):
    choices = {opt: meta for opt, meta in _usage_options(recipe).items() if "|" in meta and meta != "true|false"}
    assert set(choices) <= set(CHOICES) and "--device" in choices
    for option, meta in choices.items():
        words = meta.split("|")
        bad = CHOICES[option][1]
        out = _run(recipe, stub, *SAFE.get(recipe, []), *_tmp_paths(tmp_path), *QUIET, option, bad)
        expected = f"run.sh: {option} takes {', '.join(words[:-1])} or {words[-1]}, got '{bad}'"
        assert _refused(out, stub) == expected


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_misspelt_decoding_mode_stops_the_recipe_before_any_stage(tmp_path, stub, recipe):
    modes = "ctc_greedy ctc_prefix_beam joint rescoring"
    options = ["--decodings", "--longform-decodings"] if recipe == "tedlium3" else ["--decodings"]
    for option in options:
        out = _run(recipe, stub, *SAFE.get(recipe, []), *_tmp_paths(tmp_path), *QUIET, option, "ctc_greedy jiont")
        assert _refused(out, stub) == f"run.sh: {option}: unknown decoding mode 'jiont' (modes: {modes})"
    if recipe == "synth_en":  # MODE+lm: LM fusion, of the beam modes only
        out = _run(recipe, stub, *_tmp_paths(tmp_path), *QUIET, "--decodings", "ctc_greedy+lm")
        beam_modes = "ctc_prefix_beam, joint, rescoring"
        expected = f"run.sh: --decodings: 'ctc_greedy+lm': only the beam modes fuse an LM ({beam_modes})"
        assert _refused(out, stub) == expected
    out = _run(recipe, stub, *SAFE.get(recipe, []), *_tmp_paths(tmp_path), *QUIET, "--decodings", modes)
    assert out.returncode == 0, out.stderr


def test_the_recipes_know_the_decoding_modes_of_srupp_asr():
    tree = ast.parse((ROOT / "srupp_asr" / "decoding" / "options.py").read_text())
    modes = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "MODES"
    )
    stages = (ROOT / "recipes" / "common" / "stages.sh").read_text()
    assert re.search(r'^decoding_modes="([^"]*)"$', stages, re.M)[1].split() == list(modes)


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_missing_config_file_is_one_line_exit_2(tmp_path, stub, recipe):
    options = ["--config", "--decode-config"] if recipe in CORPORA else ["--config"]
    for option in options:
        out = _run(recipe, stub, *SAFE.get(recipe, []), *_tmp_paths(tmp_path), *QUIET, option, "nope.yaml")
        line = _refused(out, stub)
        assert line.startswith(f"run.sh: {option}: no such file 'nope.yaml'") and str(ROOT) in line


# ---- paths --------------------------------------------------------------------------------------------------------


def _all_stages(recipe: str) -> list[str]:
    # every stage but synth_en's 0 (apt-get); synth_en without pocketsphinx, the corpus recipes with the LM
    if recipe == "synth_en":
        return ["--stage", "1", "--pocketsphinx", "false", "--decodings", "ctc_greedy joint joint+lm"]
    return ["--use-lm", "true", "--decodings", "ctc_greedy joint"]


@pytest.mark.parametrize("recipe", RECIPES)
def test_paths_with_spaces_reach_every_stage_whole(tmp_path, stub, recipe):
    base = tmp_path / "my dir"
    data, exp, corpus = base / "my data", base / "my exp", base / "my corpus"
    args = ["--data", str(data), "--exp", str(exp), *_all_stages(recipe)]
    lm_text = base / "my lm.txt"
    if recipe in CORPORA:
        base.mkdir()
        lm_text.write_text("hello\n")
        args += ["--corpus-dir", str(corpus), "--lm-text", str(lm_text)]
    out = _run(recipe, stub, *args)
    assert out.returncode == 0, out.stderr[-3000:]
    calls = _calls(stub)
    assert len(calls) >= 8
    for call in calls:
        for arg in call:
            path = arg.removeprefix('["')  # --data.audio_roots '["DIR"]'
            if path.startswith(str(tmp_path)):  # whole: no path cut at a space
                assert path.startswith(f"{base}/my "), (arg, call)
    # the LM, fused in the beam modes: --lm the whole LM folder
    evaluate = [c for c in calls if c[0] == "evaluate" and "--lm" in c]
    assert evaluate and all(_after(c, "--lm") == f"{exp}/lm" for c in evaluate)
    assert _after(_call(stub, "cmvn"), "--out") == f"{data}/cmvn.json"
    assert _after(_call(stub, "train", "fit"), "--trainer.default_root_dir") == str(exp)
    if recipe in CORPORA:
        assert _after(_call(stub, "train-lm"), "--train-text") == str(lm_text)


@pytest.mark.parametrize("recipe", RECIPES)
def test_relative_paths_are_taken_from_the_directory_the_script_is_run_in(tmp_path, stub, recipe):
    (tmp_path / "my.yaml").write_text("{}\n")
    for name in ("a.txt", "b.txt"):
        (tmp_path / name).write_text("hello\n")
    args = ["--data", "mydata", "--exp", "./myexp", "--config", "my.yaml", *_all_stages(recipe)]
    if recipe in CORPORA:
        args += [
            "--corpus-dir",
            "mycorpus",
            "--lm-text",
            "a.txt",
            "--lm-text",
            "b.txt",
            "--decode-config",
            "conf/decode_tedlium3.yaml",
        ]
    out = _run(recipe, stub, *args, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert _after(_call(stub, "cmvn"), "--out") == f"{tmp_path}/mydata/cmvn.json"
    train = _call(stub, "train", "fit")
    assert _after(train, "--config") == f"{tmp_path}/my.yaml"
    assert _after(train, "--trainer.default_root_dir") == f"{tmp_path}/myexp"
    assert _after(_call(stub, "average"), "--out") == f"{tmp_path}/myexp/model"
    evaluate = [c for c in _calls(stub) if c[0] == "evaluate"]
    assert evaluate and all(_after(c, "--model") == f"{tmp_path}/myexp/model" for c in evaluate)
    if recipe in CORPORA:
        prepare = _call(stub, "corpus", "prepare")
        assert prepare[1:3] == [f"{tmp_path}/mycorpus", f"{tmp_path}/mydata/manifests"]
        lm = _call(stub, "train-lm")
        i = lm.index("--train-text")
        assert lm[i + 1 : i + 3] == [f"{tmp_path}/a.txt", f"{tmp_path}/b.txt"]
        # a config not in the caller's folder: the repository's conf/ (decode_tedlium3.yaml: beam 40)
        assert all(_after(c, "--beam") == "40" for c in evaluate)
    stub.unlink()
    # a download folder, and --config conf/NAME.yaml from elsewhere: the repository's
    args = ["--stage", "0", "--stop-stage", "1"] if recipe in CORPORA else ["--stage", "4", "--stop-stage", "4"]
    args += ["--data", "d2", "--exp", "e2", "--config", "conf/tiny_cpu.yaml"]
    if recipe in CORPORA:
        args += ["--download-dir", "dl"]
    out = _run(recipe, stub, *args, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    if recipe in CORPORA:
        download = _call(stub, "corpus", "download")
        assert download[1] == f"{tmp_path}/dl"
        assert _call(stub, "corpus", "prepare")[1].startswith(f"{tmp_path}/dl/")
    else:
        assert _after(_call(stub, "train", "fit"), "--config") == f"{ROOT}/conf/tiny_cpu.yaml"


@pytest.mark.parametrize("recipe", RECIPES)
def test_help_says_where_relative_paths_are_taken_from(stub, recipe):
    out = _run(recipe, stub, "--help")
    assert out.returncode == 0 and out.stderr == ""
    text = " ".join(out.stdout.split())
    assert "is taken from the directory the script is run in" in text
    assert "A true|false option takes exactly true or false" in text


def test_synth_en_without_the_lm_does_not_decode_with_it(tmp_path, stub):
    args = ["--stage", "6", "--stop-stage", "6", "--lm", "false", "--pocketsphinx", "false", "--real-dev", "none"]
    out = _run("synth_en", stub, *_tmp_paths(tmp_path), *args)
    assert out.returncode == 0, out.stderr[-3000:]  # the old default decodings fused the LM it had not trained
    evaluate = [c for c in _calls(stub) if c[0] == "evaluate"]
    assert len(evaluate) == 4 and not any("--lm" in c for c in evaluate)


EVALUATE_STUB = """#!/usr/bin/env bash
{ printf '%s\\037' "$@"; printf '\\n'; } >>"$STUB_LOG"
if [ "$1" = evaluate ]; then  # writes results.json, as evaluate does also when it exits 1 (cuts left out)
  while [ $# -gt 0 ]; do if [ "$1" = --out-dir ]; then out=$2; fi; shift; done
  mkdir -p "$out" && echo '{}' >"$out/results.json"
  exit "$(cat "$STUB_LOG.rc")"
fi
"""


def test_a_test_set_whose_scoring_failed_is_scored_again_by_a_rerun(stub, tmp_path):
    """`evaluate` exits 1 (cuts whose audio did not load) after writing results.json: the recipe stops, and the
    rerun must score that set again instead of taking the results.json as done."""
    (stub.parent / "srupp-asr").write_text(EVALUATE_STUB)
    args = ["--stage", "8", "--stop-stage", "8", "--exp", str(tmp_path / "exp"), "--data", str(tmp_path / "data")]
    evaluated = []
    for rc in (1, 0, 0):
        Path(f"{stub}.rc").write_text(str(rc))
        out = _run("librispeech", stub, *args)
        assert out.returncode == rc, out.stderr[-2000:]
        evaluated.append(sum(c[0] == "evaluate" for c in _calls(stub)))
        stub.unlink(missing_ok=True)
    assert evaluated == [1, 8, 0]  # stopped at the first set; all 8 (the failed one again); none: all scored


# ---- --lm-text: one text file per occurrence ---------------------------------------------------------------------

LM_ONLY = ["--stage", "7", "--stop-stage", "7", "--use-lm", "true"]


def _train_text(stub: Path) -> list[str]:
    """The files train-lm got with --train-text (the words up to the next option)."""
    lm = _call(stub, "train-lm")
    i = lm.index("--train-text") + 1
    return lm[i : next(j for j in range(i, len(lm)) if lm[j].startswith("--"))]


@pytest.mark.parametrize("recipe", CORPORA)
def test_an_lm_text_path_with_spaces_reaches_train_lm_as_one_argument(tmp_path, stub, recipe):
    text = tmp_path / "my lm corpus" / "lm  norm text.txt"  # two blanks in a row: not split, not squeezed
    text.parent.mkdir()
    text.write_text("hello world\n")
    out = _run(recipe, stub, *_tmp_paths(tmp_path), *LM_ONLY, "--lm-text", str(text))
    assert out.returncode == 0, out.stderr[-3000:]
    assert _train_text(stub) == [str(text)]
    assert "--train-cuts" not in _call(stub, "train-lm")  # the given text instead of the transcripts


@pytest.mark.parametrize("recipe", CORPORA)
def test_lm_text_repeated_gives_train_lm_each_file_in_order(tmp_path, stub, recipe):
    texts = [tmp_path / "b corpus.txt", tmp_path / "a.txt", tmp_path / "c d" / "e f.txt"]
    texts[2].parent.mkdir()
    for text in texts:
        text.write_text("hello\n")
    args = [a for text in texts for a in ("--lm-text", str(text))]
    out = _run(recipe, stub, *_tmp_paths(tmp_path), *LM_ONLY, *args, "--lm-args", "--max-epochs 1")
    assert out.returncode == 0, out.stderr[-3000:]
    assert _train_text(stub) == [str(t) for t in texts]
    lm = _call(stub, "train-lm")
    assert lm[-2:] == ["--max-epochs", "1"] and _after(lm, "--valid-cuts").endswith("/manifests/dev_cuts.jsonl.gz")
    # without --lm-text: the training transcripts
    stub.unlink()
    out = _run(recipe, stub, *_tmp_paths(tmp_path), *LM_ONLY)
    assert out.returncode == 0, out.stderr[-3000:]
    lm = _call(stub, "train-lm")
    assert "--train-text" not in lm and _after(lm, "--train-cuts").endswith("/manifests/train_cuts.jsonl.gz")


@pytest.mark.parametrize("recipe", CORPORA)
def test_relative_lm_text_paths_are_taken_from_the_callers_directory(tmp_path, stub, recipe):
    caller = tmp_path / "caller dir"
    (caller / "lm texts").mkdir(parents=True)
    for name in ("lm texts/part 1.txt", "part2.txt"):
        (caller / name).write_text("hello\n")
    (tmp_path / "up.txt").write_text("hello\n")
    args = ["--lm-text", "lm texts/part 1.txt", "--lm-text", "./part2.txt", "--lm-text", "../up.txt"]
    out = _run(recipe, stub, *_tmp_paths(tmp_path), *LM_ONLY, *args, cwd=caller)
    assert out.returncode == 0, out.stderr[-3000:]
    files = _train_text(stub)
    assert files == [f"{caller}/lm texts/part 1.txt", f"{caller}/part2.txt", f"{caller}/../up.txt"]
    assert all(Path(f).is_file() for f in files)  # the stage runs in the repository root: absolute paths


@pytest.mark.parametrize("recipe", CORPORA)
def test_a_missing_lm_text_file_is_one_line_exit_2_naming_it(tmp_path, stub, recipe):
    caller = tmp_path / "caller dir"
    caller.mkdir()
    (caller / "a.txt").write_text("hello\n")
    (caller / "b.txt").write_text("hello\n")
    taken = f"(a relative path is taken from {caller})"
    # the second of two: nothing runs, not even the stages before 7
    args = ["--use-lm", "true", "--lm-text", "a.txt", "--lm-text", "nope.txt"]
    out = _run(recipe, stub, *_tmp_paths(tmp_path), *args, cwd=caller)
    assert _refused(out, stub) == f"run.sh: --lm-text: no such file 'nope.txt' {taken}"
    # the old word list: now one path (no file is named so), refused with what to do instead
    out = _run(recipe, stub, *_tmp_paths(tmp_path), *LM_ONLY, "--lm-text", "a.txt b.txt", cwd=caller)
    hint = "for several files give --lm-text once per file"
    assert _refused(out, stub) == f"run.sh: --lm-text: no such file 'a.txt b.txt' {taken[:-1]}; {hint})"
    out = _run(recipe, stub, *_tmp_paths(tmp_path), *LM_ONLY, "--lm-text", str(tmp_path), cwd=caller)
    assert _refused(out, stub) == f"run.sh: --lm-text: '{tmp_path}' is a directory, not a text file"
    if os.geteuid() != 0:  # root reads any file
        (caller / "b.txt").chmod(0)
        out = _run(recipe, stub, *_tmp_paths(tmp_path), *LM_ONLY, "--lm-text", "b.txt", cwd=caller)
        assert _refused(out, stub) == "run.sh: --lm-text: cannot read 'b.txt' (permission denied)"


# ---- the LM stage: a finished training is skipped, a stopped one resumed ----------------------------------------

LM_STAGE = {r: LM_ONLY for r in CORPORA} | {"synth_en": ["--stage", "3", "--stop-stage", "3", "--lm", "true"]}


@pytest.mark.parametrize("recipe", RECIPES)
def test_the_lm_stage_resumes_a_stopped_training_and_skips_a_finished_one(tmp_path, stub, recipe):
    # Was: an LM folder of any kind was skipped, so an LM training stopped after its first validation (which writes
    # the LM folder) stayed half-trained through every rerun; synth_en looked at the folder's weights file alike.
    data, lm = tmp_path / "data", tmp_path / "exp" / "lm"
    data.mkdir()
    (data / "tokenizer.model").write_text("")  # synth_en's stage 3 makes the tokenizer first: here it is made

    def run() -> list[str] | None:
        stub.unlink(missing_ok=True)
        out = _run(recipe, stub, *_tmp_paths(tmp_path), *LM_STAGE[recipe])
        assert out.returncode == 0, out.stderr[-3000:]
        calls = [c[1:] for c in _calls(stub) if c[0] == "train-lm"]
        assert len(calls) <= 1, calls
        return calls[0] if calls else None

    first = run()  # nothing there: a fresh training
    assert first is not None and "--resume" not in first and _after(first, "--out-dir") == str(lm)
    lm.mkdir(parents=True)
    (lm / "model.safetensors").write_text("")
    Path(f"{lm}.train.pt").write_text("")  # stopped after a validation: its state and an LM folder, not done
    again = run()
    assert again == [*first, "--resume"]
    Path(f"{lm}.train.done").write_text("{}")  # train-lm finished it
    assert run() is None
    Path(f"{lm}.train.done").unlink()
    Path(f"{lm}.train.pt").unlink()  # an LM folder trained elsewhere, no state of ours: kept as it is
    assert run() is None


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="needs shellcheck")
def test_the_recipes_are_shellcheck_clean():
    scripts = [str(ROOT / "recipes" / r / "run.sh") for r in RECIPES] + [str(ROOT / "recipes/common/stages.sh")]
    out = subprocess.run(["shellcheck", "-x", *scripts], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:]


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ([], []),
        (["epoch=0-step=10.ckpt", "last.ckpt"], ["--ckpt_path", "last"]),
        (["epoch=0-step=10.ckpt", "epoch=0-step=20.ckpt"], ["--ckpt_path", "{exp}/checkpoints/epoch=0-step=20.ckpt"]),
    ],
)
def test_stage_train_resumes_from_last_else_from_the_newest_checkpoint(tmp_path: Path, files, expected) -> None:
    """A stop between a step's top-k save and its last.ckpt leaves checkpoints but no last.ckpt: the recipe goes on
    from the newest of them (a fresh fit into that folder would be refused)."""
    exp = tmp_path / "exp"
    (exp / "checkpoints").mkdir(parents=True)
    for age, name in enumerate(reversed(files)):  # the last listed is the newest
        path = exp / "checkpoints" / name
        path.write_bytes(b"")
        os.utime(path, (1_000_000 - age, 1_000_000 - age))
    script = (
        f'source "{ROOT}/recipes/common/stages.sh"; recipe=test; srupp() {{ printf "%s\\n" "$@"; }}; '
        f'stage_train 4 conf.yaml train.jsonl.gz valid.jsonl.gz tok.model cmvn.json "{exp}"'
    )
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.splitlines()
    args = [line for line in out if not re.match(r"\d{4}-\d\d-\d\d ", line)]
    assert args[-len(expected) :] == [e.format(exp=exp) for e in expected] if expected else "--ckpt_path" not in args
