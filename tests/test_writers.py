"""Output formats: time stamps, segmenting, each format's exact text, atomic writing and output names; names that
are not UTF-8 or hold control characters, escaped where they are printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from srupp_asr.errors import UserError
from srupp_asr.writers import (
    FORMATS,
    Segment,
    Transcript,
    format_timestamp,
    output_names,
    parse_formats,
    printable,
    segment_words,
    to_dict,
    to_json,
    to_srt,
    to_tsv,
    to_txt,
    to_vtt,
    transcript_text,
    write_transcript,
)
from tests.helpers import W, bytes_name, run_transcribe_cli

ERROR_PREFIX = "srupp-asr transcribe: error: "

WORDS = [W("hello", 0.5, 0.9), W("big", 1.0, 1.2), W("world", 1.3, 1.8, 0.51234), W("again", 3.0, 3.4)]


def _transcript(words=WORDS, max_words=3) -> Transcript:
    segments = segment_words(words, max_words=max_words, pause=0.8)
    return Transcript(
        path="talk.wav",
        duration=4.0,
        text=transcript_text(segments),
        segments=segments,
        model="exp/model",
        decoding={"mode": "ctc_greedy", "beam": 10},
        chunks=[(0.0, 4.0)],
        processing_seconds=0.5,
    )


@pytest.mark.parametrize(
    ("seconds", "marker", "expected"),
    [
        (0.0, ".", "00:00:00.000"),
        (1.2346, ",", "00:00:01,235"),  # rounded to the nearest millisecond
        (59.9996, ".", "00:01:00.000"),  # rounding carries into the minutes
        (3723.004, ",", "01:02:03,004"),
        (100 * 3600 + 1.5, ".", "100:00:01.500"),
    ],
)
def test_timestamps_have_hours_minutes_seconds_and_milliseconds(seconds, marker, expected):
    assert format_timestamp(seconds, marker) == expected


def test_negative_timestamp_is_refused():
    with pytest.raises(ValueError):
        format_timestamp(-0.1)


def test_segments_break_at_max_words_and_at_pauses():
    segments = segment_words(WORDS, max_words=2, pause=0.8)
    assert [s.text for s in segments] == ["hello big", "world", "again"]
    assert [(s.start, s.end) for s in segments] == [(0.5, 1.2), (1.3, 1.8), (3.0, 3.4)]
    # A 1.2 s pause before "again" breaks even when the word limit allows more.
    assert [s.text for s in segment_words(WORDS, max_words=10, pause=0.8)] == ["hello big world", "again"]
    assert segment_words([], max_words=3) == []


def test_txt_has_one_segment_per_line():
    assert to_txt(_transcript()) == "hello big world\nagain\n"


def test_srt_cues_are_numbered_with_comma_milliseconds():
    assert to_srt(_transcript()) == (
        "1\n00:00:00,500 --> 00:00:01,800\nhello big world\n\n2\n00:00:03,000 --> 00:00:03,400\nagain\n"
    )


def test_vtt_has_a_header_and_dot_milliseconds():
    assert to_vtt(_transcript()) == (
        "WEBVTT\n\n00:00:00.500 --> 00:00:01.800\nhello big world\n\n00:00:03.000 --> 00:00:03.400\nagain\n\n"
    )


def test_vtt_escapes_markup_characters():
    t = _transcript([W("a<b>&c", 0.0, 1.0)])
    assert "a&lt;b&gt;&amp;c" in to_vtt(t)


def test_tsv_is_whisper_style_integer_milliseconds():
    assert to_tsv(_transcript()) == "start\tend\ttext\n500\t1800\thello big world\n3000\t3400\tagain\n"


def test_json_holds_segments_words_model_options_and_durations():
    data = json.loads(to_json(_transcript()))
    assert data["audio"] == "talk.wav" and data["duration"] == 4.0 and data["text"] == "hello big world again"
    assert data["model"] == "exp/model" and data["decoding"] == {"mode": "ctc_greedy", "beam": 10}
    assert data["processing_seconds"] == 0.5 and data["real_time_factor"] == 0.125
    assert data["chunks"] == [[0.0, 4.0]]
    first, second = data["segments"]
    assert (first["id"], first["start"], first["end"], first["text"]) == (0, 0.5, 1.8, "hello big world")
    assert first["words"][2] == {"word": "world", "start": 1.3, "end": 1.8, "confidence": 0.5123}
    assert second["words"] == [{"word": "again", "start": 3.0, "end": 3.4, "confidence": 0.9}]
    assert json.loads(to_json(_transcript(), indent=None)) == data
    assert "\n" not in to_json(_transcript(), indent=None).rstrip("\n")


def test_a_transcript_without_words_keeps_its_text():
    t = Transcript("a.wav", 2.0, "some text", [Segment(0.0, 2.0, "some text")])
    assert to_txt(t) == "some text\n"
    assert to_srt(t) == "1\n00:00:00,000 --> 00:00:02,000\nsome text\n"
    assert to_dict(t)["segments"][0]["words"] == []


def test_an_empty_transcript_gives_empty_but_valid_files():
    t = Transcript("a.wav", 1.0, "", [])
    assert to_txt(t) == "" and to_srt(t) == "" and to_vtt(t) == "WEBVTT\n\n" and to_tsv(t) == "start\tend\ttext\n"
    assert json.loads(to_json(t))["segments"] == []


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("txt", ["txt"]),
        ("srt,TXT", ["txt", "srt"]),
        (" vtt , json ", ["json", "vtt"]),
        ("all", list(FORMATS)),
        (["tsv", "txt"], ["txt", "tsv"]),
    ],
)
def test_format_lists_parse_into_a_fixed_order(spec, expected):
    assert parse_formats(spec) == expected


@pytest.mark.parametrize("spec", ["doc", "txt,pdf", "", ","])
def test_unknown_formats_are_user_errors(spec):
    with pytest.raises(UserError, match="unknown output format"):
        parse_formats(spec)


def test_output_names_come_from_stems_and_collisions_get_numbers():
    paths = ["a/talk.wav", "b/talk.flac", "c/Talk.mp3", "talk-2.wav", "x/.wav", "notes.v1.ogg"]
    assert output_names(paths) == ["talk", "talk-2", "Talk-3", "talk-2-2", ".wav", "notes.v1"]


def test_write_transcript_writes_each_format_atomically(tmp_path):
    out = tmp_path / "out"
    written = write_transcript(_transcript(), out, "talk", ["txt", "srt", "json"])
    assert [p.name for p in written] == ["talk.txt", "talk.srt", "talk.json"]
    assert (out / "talk.txt").read_text() == "hello big world\nagain\n"
    assert json.loads((out / "talk.json").read_text())["text"] == "hello big world again"
    assert sorted(os.listdir(out)) == ["talk.json", "talk.srt", "talk.txt"]  # no temporary files left behind


def test_write_transcript_escapes_a_path_that_is_not_utf8(tmp_path):
    # The Python API called directly (not only the CLI) with a file name holding a non-UTF-8 byte.
    name = os.fsdecode(b"caf\xe9")
    t = Transcript(f"/data/{name}.wav", 1.0, "hello", [Segment(0.0, 1.0, "hello")])
    (path,) = write_transcript(t, tmp_path, name, ["json"])
    assert path.name == f"{name}.json"  # the output keeps the raw name on disk
    assert json.loads(path.read_text(encoding="utf-8"))["audio"] == "/data/caf\\xe9.wav"


@pytest.mark.parametrize("stem_bytes", [233, 250])  # 238 to 255 bytes with ".json": all fit the file system
def test_write_transcript_takes_any_name_the_file_system_allows(tmp_path, stem_bytes):
    (path,) = write_transcript(_transcript(), tmp_path, "x" * stem_bytes, ["json"])
    assert json.loads(path.read_text())["text"] == "hello big world again"
    assert os.listdir(tmp_path) == [path.name]


def test_a_name_longer_than_the_file_system_allows_is_one_user_error(tmp_path):
    name = "x" * 251  # 256 bytes with ".json"
    with pytest.raises(UserError) as caught:
        write_transcript(_transcript(), tmp_path, name, ["json"])
    why = "cannot write (File name too long); no file of the set was changed"
    assert str(caught.value) == f"{tmp_path / name}.json: {why}"
    assert os.listdir(tmp_path) == []


def test_a_name_too_long_for_one_format_leaves_every_format_as_it_was(tmp_path):
    name = "x" * 251  # 255 bytes with ".txt", 256 with ".json": the first formats fit, the last does not
    (tmp_path / f"{name}.txt").write_text("previous\n")
    with pytest.raises(UserError, match="File name too long"):
        write_transcript(_transcript(), tmp_path, name, ["txt", "vtt", "srt", "json"])
    assert os.listdir(tmp_path) == [f"{name}.txt"] and (tmp_path / f"{name}.txt").read_text() == "previous\n"


def test_a_full_disk_in_the_middle_of_a_set_of_formats_changes_no_file_of_the_set(tmp_path):
    # A child process whose files may not grow past 300 bytes (write() then fails with EFBIG, where a full disk fails
    # with ENOSPC): the txt, vtt and srt fit, the json does not. Before, the first three were replaced and the error
    # said "nothing was written".
    for fmt in FORMATS:
        (tmp_path / f"talk.{fmt}").write_text(f"previous {fmt}\n")
    code = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (300, 300))\n"
        "from tests.test_writers import _transcript\n"
        "from srupp_asr.errors import UserError\n"
        "from srupp_asr.writers import FORMATS, write_transcript\n"
        "try:\n"
        "    write_transcript(_transcript(), sys.argv[1], 'talk', list(FORMATS))\n"
        "except UserError as err:\n"
        "    print(err)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.stdout == f"{tmp_path / 'talk.json'}: cannot write (File too large); no file of the set was changed\n"
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {f"talk.{f}": f"previous {f}\n" for f in FORMATS}


def _empty_model(tmp_path: Path) -> Path:
    """A model directory that exists but holds nothing: found by the early checks, refused only by loading."""
    folder = tmp_path / "empty_model"
    folder.mkdir(exist_ok=True)
    return folder


def test_an_output_folder_that_cannot_be_written_is_refused_before_the_model_loads(tmp_path):
    import numpy as np
    import soundfile as sf

    from srupp_asr.transcribe import transcribe

    folder = tmp_path / "read_only"
    folder.mkdir()
    audio = tmp_path / "a.wav"
    sf.write(audio, np.zeros(1600, dtype=np.float32), 16000)  # audio that probes well: the folder is what is wrong
    # A folder mode 555 does not stop root: as root the folder is made immutable instead (chattr +i).
    folder.chmod(0o555)
    root = os.geteuid() == 0
    if root and subprocess.run(["chattr", "+i", str(folder)], capture_output=True, check=False).returncode:
        pytest.skip("as root, needs chattr +i to make a folder that cannot be written")
    try:
        with pytest.raises(UserError) as caught:
            # an empty folder as the model: loading it would fail, so the folder's refusal comes before any load
            transcribe(audio, model=str(_empty_model(tmp_path)), output_dir=folder)
    finally:
        if root:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        folder.chmod(0o755)
    assert str(caught.value).startswith(f"{folder}: cannot write to the output folder (")


def test_printable_line_escapes_control_characters_and_line_separators_only():
    from srupp_asr.writers import printable_line

    name = "a\nb\tc\x1b[31m\rd\x7f\x85e\u2028f\u2029 naïve 日本 back\\slash"
    assert printable_line(name) == "a\\nb\\tc\\x1b[31m\\rd\\x7f\\x85e\\u2028f\\u2029 naïve 日本 back\\slash"
    assert printable_line(name).splitlines() == [printable_line(name)]  # one line, whatever the name
    assert printable_line(os.fsdecode(b"caf\xe9\n.wav")) == "caf\\xe9\\n.wav"  # not UTF-8 either


def test_printable_escapes_only_what_is_not_utf8():
    assert printable("plain/naïve 日本.wav") == "plain/naïve 日本.wav"
    assert printable(os.fsdecode(b"caf\xe9.wav")) == "caf\\xe9.wav"
    assert printable("lone \ud800 surrogate") == "lone \\ud800 surrogate"


def test_non_utf8_names_are_written_and_printed_escaped(overfit_model_dir, tmp_path):
    """The whole batch crashed on a file name that is not UTF-8."""
    import soundfile as sf

    from srupp_asr.audio import SAMPLE_RATE, load_audio
    from srupp_asr.transcribe import transcribe

    model, utts = overfit_model_dir
    good = bytes_name(tmp_path, b"caf\xe9.wav")
    sf.write(os.fsencode(good), load_audio(utts[17][0]), SAMPLE_RATE)
    bad = bytes_name(tmp_path, b"bad\xff.wav")
    with open(os.fsencode(bad), "wb") as f:
        f.write(b"not audio at all" * 10)
    out_dir = tmp_path / "out"
    done = run_transcribe_cli(
        ["--model", str(model), "--decoding", "ctc_greedy", "-f", "all", "-o", str(out_dir), good, bad]
    )
    err = done.stderr.decode("utf-8")
    assert done.returncode == 1 and "Traceback" not in err
    assert (
        err.splitlines()[0]
        == f"{ERROR_PREFIX}{tmp_path}/bad\\xff.wav: not a readable audio file (Format not recognised.)"
    )
    # The output files keep the input's name, byte for byte; inside them the name is escaped.
    assert sorted(os.listdir(os.fsencode(out_dir))) == sorted(f"caf\xe9.{f}".encode("latin-1") for f in FORMATS)
    assert (out_dir / os.fsdecode(b"caf\xe9.txt")).read_text() == f"{utts[17][1]}\n"
    data = json.loads((out_dir / os.fsdecode(b"caf\xe9.json")).read_text(encoding="utf-8"))
    assert data["audio"] == f"{tmp_path}/caf\\xe9.wav" and data["text"] == utts[17][1]
    # The Python API hands back the real name, which opens the file.
    (t,) = transcribe(good, model, decoding="ctc_greedy")
    assert t.path == good and os.path.exists(t.path)


def test_a_second_transcribe_into_an_output_folder_in_use_is_refused_in_one_line(tmp_path):
    """Two ``transcribe -o DIR`` runs at once overwrote each other's same-stem outputs, both exiting 0."""
    import subprocess
    import sys

    import numpy as np
    import soundfile as sf

    from srupp_asr.transcribe import transcribe
    from srupp_asr.writers import OutputDirLock

    out = tmp_path / "out"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from srupp_asr.writers import OutputDirLock; lock = OutputDirLock(sys.argv[1]);"
            " print('locked', flush=True); time.sleep(60)",
            str(out),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    sf.write(tmp_path / "a.wav", np.zeros(1600, dtype=np.float32), 16000)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(UserError) as err:
            transcribe([tmp_path / "a.wav"], _empty_model(tmp_path), output_dir=out)  # refused before it loads
        assert str(err.value) == (
            f"{out}: another `srupp-asr transcribe` is writing to this folder; wait for it to finish or give this run"
            " its own --output-dir"
        )
        assert list(out.iterdir()) == []  # nothing written, and no lock file left in the folder
    finally:
        holder.kill()
        holder.wait()
    first, second = OutputDirLock(out), OutputDirLock(out)  # the holder is gone; one process may claim it twice
    first.release()
    with pytest.raises(UserError, match="another `srupp-asr transcribe` is writing"):  # `second` holds it still
        _claim_in_child(out)
    second.release()
    _claim_in_child(out, expect_ok=True)


def _claim_in_child(folder, expect_ok: bool = False) -> None:
    """Claim ``folder`` from another process; raise UserError (as that process did) unless it got it."""
    import subprocess
    import sys

    code = "import sys; from srupp_asr.writers import OutputDirLock; OutputDirLock(sys.argv[1])"
    proc = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True)
    if proc.returncode != 0:
        assert not expect_ok, proc.stderr
        raise UserError(proc.stderr.strip().splitlines()[-1])
    assert expect_ok


def test_an_endless_list_file_ends_at_the_bound_in_one_line_and_the_other_inputs_go_on(tmp_path):
    """``@/dev/zero`` ended in a MemoryError traceback and stopped the batch."""
    import numpy as np
    import soundfile as sf

    from srupp_asr.fileio import MAX_LIST_BYTES
    from srupp_asr.inputs import find_inputs

    sf.write(tmp_path / "a.wav", np.zeros(1600, dtype=np.float32), 16000)
    files, problems = find_inputs(["@/dev/zero", str(tmp_path / "a.wav")])
    assert files == [str(tmp_path / "a.wav")]
    assert problems == [f"/dev/zero: list file holds more than {MAX_LIST_BYTES // 2**20} MiB (the most this reads)"]
