# ruff: noqa: F811  (imported fixtures are parameter names of the tests)
"""Bad inputs to the corpus, synthesis, summary and averaging commands: each is one line naming the file or
option, and none is taken for a result (a missing transcript is not a WER, a set without results is not left
out quietly, a checkpoint is not averaged twice, an input manifest is not overwritten).

``corpus score-talks``, ``corpus speed-perturb``, ``synth-corpus --text``, ``summarize --sets`` and ``average``.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from srupp_asr.cli import main
from srupp_asr.errors import UserError
from srupp_asr.export import average_checkpoints
from tests.test_export import seeded_model, tokenizer, write_checkpoint  # noqa: F401 (fixture)
from tests.test_summary import _report


def _one_line_error(capsys, command: str) -> str:
    """The command's single stderr line (``srupp-asr COMMAND: error: ...``), without the prefix."""
    err = capsys.readouterr().err
    prefix = f"srupp-asr {command}: error: "
    assert err.count("\n") == 1 and err.startswith(prefix), err
    return err[len(prefix) :].rstrip("\n")


# ---- corpus score-talks and speed-perturb --------------------------------------------------------------------

TALKS = {"talk_a": "the cat sat on the mat", "talk_b": "a dog ran in the park", "talk_c": "birds sing at dawn"}


def _talk(folder: Path, name: str, text: str) -> dict:
    """A whole-talk cut (2 s of ``folder/audio.wav``) as corpora.tedlium_talks writes it."""
    return {
        "id": name,
        "start": 0.0,
        "duration": 2.0,
        "channel": 0,
        "supervisions": [{"id": f"{name}-0", "recording_id": name, "start": 0.0, "duration": 2.0, "text": text}],
        "recording": {
            "id": name,
            "sources": [{"type": "file", "channels": [0], "source": str(folder / "audio.wav")}],
            "sampling_rate": 16000,
            "num_samples": 32000,
            "duration": 2.0,
            "channel_ids": [0],
        },
        "custom": {"unscored": []},
        "type": "MonoCut",
    }


@pytest.fixture
def talks(tmp_path: Path) -> Path:
    """``tmp_path/talks_cuts.jsonl.gz``: the three talks of TALKS."""
    sf.write(tmp_path / "audio.wav", np.zeros(32000, dtype=np.float32), 16000)
    path = tmp_path / "talks_cuts.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(_talk(tmp_path, name, text)) + "\n" for name, text in TALKS.items())
    return path


def _transcript(text: str) -> str:
    """``srupp-asr transcribe -f json`` of a talk that says ``text`` in its first two seconds."""
    words = [{"word": w, "start": 0.2 * k, "end": 0.2 * k + 0.1} for k, w in enumerate(text.split())]
    return json.dumps({"segments": [{"start": 0.0, "end": 2.0, "text": text, "words": words}]})


def _score_talks(talks: Path, transcripts: Path, out: Path) -> int:
    return main(["corpus", "score-talks", str(talks), str(transcripts), "--out-dir", str(out)])


def test_score_talks_without_the_transcripts_folder_is_an_error_naming_it(talks, tmp_path, capsys):
    # was: every talk scored as all deletions, WER 100 %, exit 0
    missing = tmp_path / "no_such_folder"
    assert _score_talks(talks, missing, tmp_path / "out") == 2
    assert _one_line_error(capsys, "corpus") == f"{missing}: transcripts folder not found"
    assert not (tmp_path / "out").exists()

    (tmp_path / "a_file").write_text("")
    assert _score_talks(talks, tmp_path / "a_file", tmp_path / "out") == 2
    assert _one_line_error(capsys, "corpus").startswith(f"{tmp_path / 'a_file'}: not a folder")


def test_score_talks_with_no_transcript_of_any_talk_is_an_error(talks, tmp_path, capsys):
    folder = tmp_path / "transcripts"
    folder.mkdir()
    (folder / "another_talk.json").write_text(_transcript("hello"))
    assert _score_talks(talks, folder, tmp_path / "out") == 2
    line = _one_line_error(capsys, "corpus")
    assert line.startswith(f"{folder}: no transcript of any of the 3 talks of {talks}")
    assert f"{folder / 'talk_a.json'}" in line
    assert not (tmp_path / "out").exists()


def test_score_talks_names_the_talks_without_a_transcript_and_exits_1(talks, tmp_path, capsys):
    folder = tmp_path / "transcripts"
    folder.mkdir()
    (folder / "talk_a.json").write_text(_transcript(TALKS["talk_a"]))
    out = tmp_path / "out"
    assert _score_talks(talks, folder, out) == 1
    captured = capsys.readouterr()
    errors = captured.err.splitlines()
    assert errors[0] == (
        f"srupp-asr corpus: error: {folder}: no transcript for 2 of 3 talks, scored as all deletions:"
        " talk_b.json talk_c.json"
    )
    assert not any(line.startswith("warning:") for line in errors)  # said once
    assert "WER 62.5%" in captured.out  # 10 of 16 words deleted: the missing talks count, as sclite counts them
    results = json.loads((out / "results.json").read_text())
    assert results["WER"]["deletions"] == 10
    assert results["details"]["missing transcripts"] == "2 of 3 talks (scored as all deletions)"


def test_score_talks_with_every_transcript_exits_0(talks, tmp_path, capsys):
    folder = tmp_path / "transcripts"
    folder.mkdir()
    for name, text in TALKS.items():
        (folder / f"{name}.json").write_text(_transcript(text))
    assert _score_talks(talks, folder, tmp_path / "out") == 0
    captured = capsys.readouterr()
    assert "WER 0.0%" in captured.out and "error" not in captured.err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", r"not a transcribe JSON transcript \(Expecting property name"),
        ("[1, 2]", r"not a transcribe JSON transcript \(expected segments"),
        ('{"segments": [{"words": [{"word": "a"}]}]}', r"not a transcribe JSON transcript \(expected segments"),
    ],
)
def test_score_talks_with_a_broken_transcript_is_one_line_naming_it(talks, tmp_path, capsys, content, message):
    folder = tmp_path / "transcripts"
    folder.mkdir()
    (folder / "talk_a.json").write_text(content)
    assert _score_talks(talks, folder, tmp_path / "out") == 2
    line = _one_line_error(capsys, "corpus")
    assert line.startswith(f"{folder / 'talk_a.json'}: ")
    assert re.search(message, line)


@pytest.mark.parametrize("spelling", ["same path", "other spelling", "symbolic link", "hard link"])
def test_speed_perturb_refuses_to_write_over_its_input(talks, tmp_path, capsys, spelling):
    # was: the input manifest replaced by its perturbed copy (a rerun would perturb it again)
    before = talks.read_bytes()
    out = {
        "same path": talks,
        "other spelling": tmp_path / "." / "sub" / ".." / talks.name,
        "symbolic link": tmp_path / "link_cuts.jsonl.gz",
        "hard link": tmp_path / "hard_cuts.jsonl.gz",
    }[spelling]
    (tmp_path / "sub").mkdir()
    if spelling == "symbolic link":
        out.symlink_to(talks)
    elif spelling == "hard link":
        os.link(talks, out)
    assert main(["corpus", "speed-perturb", str(talks), str(out)]) == 2
    line = _one_line_error(capsys, "corpus")
    assert line == f"{out}: is the input manifest {talks}; write the perturbed cuts to another file"
    assert talks.read_bytes() == before


@pytest.mark.parametrize(
    ("factors", "message"),
    [
        (["1.0", "1.0"], "speed 1.0 given twice (its copies would share their cut ids)"),
        (["0.9", "1.1", "0.90"], "speed 0.9 given twice"),
        (["inf"], "speeds must be finite and positive, got inf"),
        (["nan"], "speeds must be finite and positive, got nan"),
        (["0"], "speeds must be finite and positive, got 0.0"),
        (["1.0", "-1"], "speeds must be finite and positive, got -1.0"),
    ],
)
def test_speed_perturb_refuses_bad_factors_in_one_line(talks, tmp_path, capsys, factors, message):
    # was: duplicate cut ids (1.0 1.0), a manifest of infinite speed (inf) or a traceback (nan), all but 0 and -1
    out = tmp_path / "sp_cuts.jsonl.gz"
    assert main(["corpus", "speed-perturb", str(talks), str(out), "--factors", *factors]) == 2
    assert _one_line_error(capsys, "corpus").startswith(f"--factors: {message}")
    assert not out.exists()


def test_speed_perturb_still_writes_every_speed(talks, tmp_path, capsys):
    out = tmp_path / "sp_cuts.jsonl.gz"
    assert main(["corpus", "speed-perturb", str(talks), str(out), "--factors", "0.9", "1.0"]) == 0
    with gzip.open(out, "rt") as f:
        ids = [json.loads(line)["id"] for line in f]
    assert ids == ["talk_a_sp0.9", "talk_a", "talk_b_sp0.9", "talk_b", "talk_c_sp0.9", "talk_c"]


# ---- synth-corpus --text ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("", "no usable sentence (it holds no text)"),
        ("\n  \n\t\n", "no usable sentence (it holds no text)"),
        (
            "hi there\nok\nder Hund bellt laut im Garten\n",
            "no usable sentence (of its 3 lines: 2 too short, 1 not English; a sentence has 4 to 30 English words)",
        ),
    ],
    ids=["empty", "blank lines", "all filtered out"],
)
def test_synth_corpus_text_without_a_usable_sentence_is_one_line_and_makes_no_folder(tmp_path, capsys, content, why):
    # was: "sentences: no usable sentence (install fortunes-min, ...)", not naming the file, and OUT_DIR left behind
    text = tmp_path / "sentences.txt"
    text.write_text(content)
    out = tmp_path / "corpus"
    assert main(["synth-corpus", str(out), "--text", str(text), "--size", "tiny"]) == 2
    assert _one_line_error(capsys, "synth-corpus") == f"{text}: {why}"
    assert not out.exists()


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda p: None, "sentence file not found"),
        (lambda p: p.mkdir(), "is a directory, not a sentence file"),
        (lambda p: p.write_bytes(b"caf\xe9 au lait is what we drink\n"), "sentence file is not UTF-8 text"),
    ],
    ids=["missing", "a folder", "not utf-8"],
)
def test_synth_corpus_text_that_cannot_be_read_is_one_line_naming_it(tmp_path, capsys, make, why):
    text = tmp_path / "sentences.txt"
    make(text)
    out = tmp_path / "corpus"
    assert main(["synth-corpus", str(out), "--text", str(text)]) == 2
    assert _one_line_error(capsys, "synth-corpus").startswith(f"{text}: {why}")
    assert not out.exists()


@pytest.mark.skipif(
    shutil.which("espeak-ng") is None or shutil.which("sox") is None, reason="needs espeak-ng and sox (its voices)"
)
def test_synth_corpus_text_with_too_few_sentences_names_the_file_and_makes_no_folder(tmp_path, capsys):
    text = tmp_path / "sentences.txt"
    text.write_text("The cat sat on the mat all day long.\nWe walked to the old mill by the river.\n")
    out = tmp_path / "corpus"
    voices = ["--voices", "espeak_en-us", "espeak_en-us_f4"]
    assert main(["synth-corpus", str(out), "--text", str(text), "--size", "tiny", *voices]) == 2
    line = _one_line_error(capsys, "synth-corpus")
    assert line.startswith(f"{text}: only 2 left, too few for the test and training sets of this size")
    assert not out.exists()


# ---- summarize --sets ------------------------------------------------------------------------------------------


@pytest.fixture
def exp(tmp_path: Path) -> Path:
    exp = tmp_path / "exp"
    _report(exp, "joint", "test", ["the cat sat on a mat", "a dog ran"])
    _report(exp, "ctc_greedy", "test", ["the cat sat on the mat", "a dog ran"])
    _report(exp, "ctc_greedy", "dev", ["the cat sat on the mat", "a dog ran"])
    return exp


def test_summarize_names_the_sets_without_results_and_exits_1(exp, capsys):
    # was: the set quietly left out of the table, exit 0
    out = exp / "RESULTS.md"
    assert main(["summarize", str(exp), "--sets", "dev", "eval", "test", "other", "--out", str(out)]) == 1
    captured = capsys.readouterr()
    assert captured.err == (
        f"srupp-asr summarize: error: no results.json under {exp}/decode_*/ for 2 of 4 test sets"
        " (left out of the table): eval other\n"
    )
    rows = [line for line in captured.out.splitlines() if line.startswith("| ") and "system" not in line]
    assert [row.split(" | ")[:2] for row in rows] == [
        ["| ctc_greedy", "dev"],
        ["| ctc_greedy", "test"],
        ["| joint", "test"],
    ]
    assert out.read_text().endswith(captured.out)  # the table of the others is still written


def test_summarize_a_set_another_system_lacks_is_no_error(exp, capsys):
    # joint has no dev report, ctc_greedy has one: a row fewer, not a missing set
    assert main(["summarize", str(exp), "--sets", "test", "dev", "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_summarize_a_set_named_twice_is_one_line(exp, capsys):
    assert main(["summarize", str(exp), "--sets", "test", "dev", "test"]) == 2
    assert _one_line_error(capsys, "summarize") == "--sets: test given twice"


# ---- average ---------------------------------------------------------------------------------------------------


@pytest.fixture
def ckpts(tmp_path: Path, tokenizer) -> list[Path]:
    folder = tmp_path / "ckpts"
    folder.mkdir()
    models = [seeded_model(seed, tokenizer.vocab_size) for seed in range(2)]
    return [write_checkpoint(folder / f"{i}.ckpt", m, i, {f"{i}.ckpt": 1.0}) for i, m in enumerate(models)]


def _average(tokenizer, out: Path, *paths: str | Path) -> int:
    return main(["average", "--ckpts", *map(str, paths), "--tokenizer", str(tokenizer.path), "--out", str(out)])


@pytest.mark.parametrize("spelling", ["same path", "other spelling", "symbolic link"])
def test_average_refuses_a_checkpoint_given_twice(ckpts, tokenizer, tmp_path, capsys, spelling):
    # was: averaged as if it were two checkpoints (its weights counted double)
    first = ckpts[0]
    second = {
        "same path": first,
        "other spelling": first.parent / "." / first.name,
        "symbolic link": tmp_path / "link.ckpt",
    }[spelling]
    if spelling == "symbolic link":
        second.symlink_to(first)
    out = tmp_path / "model"
    assert _average(tokenizer, out, first, ckpts[1], second) == 2
    line = _one_line_error(capsys, "average")
    if spelling == "symbolic link":
        assert line == f"{second}: the same file as {first}; each checkpoint is averaged once"
    else:
        assert line == f"{first}: given twice; each checkpoint is averaged once"
    assert not out.exists()
    with pytest.raises(UserError, match="each checkpoint is averaged once"):
        average_checkpoints([first, second])


def test_average_names_an_empty_or_truncated_checkpoint(ckpts, tokenizer, tmp_path, capsys):
    # was (empty): "not a readable PyTorch checkpoint (mmap can only be used with files saved with ...)"
    empty = tmp_path / "empty.ckpt"
    empty.write_bytes(b"")
    out = tmp_path / "model"
    assert _average(tokenizer, out, ckpts[0], empty) == 2
    assert _one_line_error(capsys, "average") == f"{empty}: empty file (0 bytes), not a checkpoint"

    truncated = tmp_path / "truncated.ckpt"
    data = ckpts[1].read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    assert _average(tokenizer, out, ckpts[0], truncated) == 2
    assert _one_line_error(capsys, "average") == (
        f"{truncated}: not a readable PyTorch checkpoint (not a zip archive: truncated or corrupt?)"
    )
    assert not out.exists()

    # the same in a run's checkpoint folder (--exp-dir)
    run = tmp_path / "run" / "checkpoints"
    run.mkdir(parents=True)
    shutil.copy(ckpts[0], run / "a.ckpt")
    (run / "b.ckpt").write_bytes(b"")
    assert main(["average", "--exp-dir", str(run.parent), "--out", str(out)]) == 2
    assert _one_line_error(capsys, "average") == f"{run / 'b.ckpt'}: empty file (0 bytes), not a checkpoint"


def test_average_of_distinct_checkpoints_still_works(ckpts, tokenizer, tmp_path, capsys):
    out = tmp_path / "model"
    assert _average(tokenizer, out, *ckpts) == 0
    assert capsys.readouterr().out.startswith("averaged 2 checkpoints")
