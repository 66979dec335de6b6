"""The ``srupp-asr corpus`` commands (srupp_asr.corpora): ``score-talks`` and ``speed-perturb`` on bad inputs, each one
line naming the file or option, none taken for a result."""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from srupp_asr.cli import main
from tests.helpers import one_line_error

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
    assert one_line_error(capsys, "corpus") == f"{missing}: transcripts folder not found"
    assert not (tmp_path / "out").exists()

    (tmp_path / "a_file").write_text("")
    assert _score_talks(talks, tmp_path / "a_file", tmp_path / "out") == 2
    assert one_line_error(capsys, "corpus").startswith(f"{tmp_path / 'a_file'}: not a folder")


def test_score_talks_with_no_transcript_of_any_talk_is_an_error(talks, tmp_path, capsys):
    folder = tmp_path / "transcripts"
    folder.mkdir()
    (folder / "another_talk.json").write_text(_transcript("hello"))
    assert _score_talks(talks, folder, tmp_path / "out") == 2
    line = one_line_error(capsys, "corpus")
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
    line = one_line_error(capsys, "corpus")
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
    line = one_line_error(capsys, "corpus")
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
    assert one_line_error(capsys, "corpus").startswith(f"--factors: {message}")
    assert not out.exists()


def test_speed_perturb_still_writes_every_speed(talks, tmp_path, capsys):
    out = tmp_path / "sp_cuts.jsonl.gz"
    assert main(["corpus", "speed-perturb", str(talks), str(out), "--factors", "0.9", "1.0"]) == 0
    with gzip.open(out, "rt") as f:
        ids = [json.loads(line)["id"] for line in f]
    assert ids == ["talk_a_sp0.9", "talk_a", "talk_b_sp0.9", "talk_b", "talk_c_sp0.9", "talk_c"]
