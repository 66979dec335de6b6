"""Cut manifests: reading (checked first), the commands that read them without Lightning."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from srupp_asr.errors import UserError
from srupp_asr.manifest import MAX_LINE_BYTES, check_cuts_manifest, load_cuts
from tests.helpers import write_manifest

# The data-preparation commands: they read and write manifests, and none of them trains.
PREPARATION_COMMANDS = ("prepare", "synth-corpus", "tokenizer", "cmvn", "corpus")


def test_load_cuts_names_missing_empty_and_unreadable_manifests(tmp_path):
    with pytest.raises(UserError, match=r"nope\.jsonl\.gz: cut manifest not found"):
        load_cuts(tmp_path / "nope.jsonl.gz")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(UserError, match=r"empty\.jsonl: cut manifest is empty"):
        load_cuts(tmp_path / "empty.jsonl", lazy=True)
    (tmp_path / "junk.jsonl.gz").write_bytes(b"this is not gzip")
    with pytest.raises(UserError, match=r"junk\.jsonl\.gz: cannot read the manifest \(Not a gzipped file"):
        load_cuts(tmp_path / "junk.jsonl.gz", lazy=True)


def test_the_data_preparation_commands_do_not_import_lightning():
    # A fresh interpreter: this test process has Lightning loaded already.
    code = f"""
import importlib, sys
from srupp_asr.cli import COMMANDS
import srupp_asr.manifest
for name in {PREPARATION_COMMANDS!r}:
    importlib.import_module(COMMANDS[name][0])
loaded = sorted(m for m in ("lightning", "pytorch_lightning") if m in sys.modules)
print(" ".join(loaded) or "none")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == ["none"], out.stdout + out.stderr


# ----------------------------------------------------------------------------------------------------
# moved from tests/test_frontend_audit.py
# Audit of the frontend, the Noam schedule and the manifest check against references written from their
# definitions: SpecAugment (Park et al. 2019, per utterance as ESPnet's time warp), the Noam formula, lhotse's own
# validation of supervisions.

# Manifest check ------------------------------------------------------------------------------------------


@pytest.fixture
def audio(tmp_path: Path) -> Path:
    path = tmp_path / "a.wav"
    sf.write(path, np.zeros(16000, dtype=np.float32), 16000)
    return path


def _cut(audio: Path, name: str, start: float = 0.0, duration: float = 1.0, sup: dict | None = None) -> dict:
    """A MonoCut dict of the 1 s ``audio`` with one supervision (``sup`` merged into it)."""
    supervision = {"id": name, "recording_id": "a", "start": 0.0, "duration": duration, "text": "hello", **(sup or {})}
    return {
        "id": name,
        "start": start,
        "duration": duration,
        "channel": 0,
        "supervisions": [supervision],
        "recording": {
            "id": "a",
            "sources": [{"type": "file", "channels": [0], "source": str(audio)}],
            "sampling_rate": 16000,
            "num_samples": 16000,
            "duration": 1.0,
            "channel_ids": [0],
        },
        "type": "MonoCut",
    }


def _manifest(path: Path, cuts: list[dict]) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(c) + "\n" for c in cuts)
    return path


@pytest.mark.reference
@pytest.mark.parametrize("duration", [-1.0, 0.0])
def test_a_supervision_without_a_positive_duration_is_refused(audio, tmp_path, duration):
    # Was: the check passed (returned 2) although lhotse's validate_supervision asserts duration > 0.
    path = _manifest(tmp_path / "cuts.jsonl.gz", [_cut(audio, "a"), _cut(audio, "b", sup={"duration": duration})])
    with pytest.raises(UserError) as err:
        check_cuts_manifest(path)
    assert str(err.value) == f"{path}:2: cut b: supervision b: 'duration' must be a positive number, not {duration}"


@pytest.mark.reference
@pytest.mark.parametrize(
    ("sup", "span"), [({"start": 0.7, "duration": 0.2}, "0.700 s to 0.900 s"), ({"start": -0.5}, "-0.500 s to 0.000 s")]
)
def test_a_supervision_outside_its_cut_is_refused(audio, tmp_path, sup, span):
    # Was: the check passed (returned 2), and training read the text "hello" as the transcript of the 0.5 s of
    # audio of cut b, which does not hold it (data.cut_text joins every supervision's text whatever its times).
    bad = _cut(audio, "b", start=0.5, duration=0.5, sup=sup)
    path = _manifest(tmp_path / "cuts.jsonl.gz", [_cut(audio, "a"), bad])
    with pytest.raises(UserError) as err:
        check_cuts_manifest(path)
    assert str(err.value) == f"{path}:2: cut b: supervision b spans {span}, outside its cut (0 to 0.500 s)"


@pytest.mark.reference
def test_a_supervision_partly_inside_its_cut_still_passes(audio, tmp_path):
    # lhotse's truncate keeps such supervisions by default (keep_excessive_supervisions=True).
    partly = _cut(audio, "b", duration=0.5, sup={"start": 0.3, "duration": 0.7})
    assert check_cuts_manifest(_manifest(tmp_path / "cuts.jsonl.gz", [partly])) == 1


# ----------------------------------------------------------------------------------------------------
# moved from tests/test_reliability_inputs.py: manifests from anywhere, every problem one line naming the file and
# the line


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "corpus"
    folder.mkdir()
    sf.write(folder / "a.wav", np.zeros(16000, dtype=np.float32), 16000)
    return folder


def cut(corpus_dir: Path, name: str = "a", **changes) -> dict:
    """A valid MonoCut dict of ``corpus_dir/a.wav`` (1 s), with ``changes`` merged in."""
    data = {
        "id": name,
        "start": 0.0,
        "duration": 1.0,
        "channel": 0,
        "supervisions": [{"id": name, "recording_id": "a", "start": 0.0, "duration": 1.0, "text": "hello"}],
        "recording": {
            "id": "a",
            "sources": [{"type": "file", "channels": [0], "source": str(corpus_dir / "a.wav")}],
            "sampling_rate": 16000,
            "num_samples": 16000,
            "duration": 1.0,
            "channel_ids": [0],
        },
        "type": "MonoCut",
    }
    data.update(changes)
    return data


def with_source(corpus_dir: Path, name: str, **source) -> dict:
    data = cut(corpus_dir, name)
    data["recording"]["sources"] = [{"channels": [0], **source}]
    return data


BAD_LINES = {
    "not json": (lambda d: "{'id': 'b'", r":2: not valid JSON"),
    "not an object": (lambda d: [1, 2], r":2: a cut must be a JSON object, not list"),
    "missing field": (lambda d: {k: v for k, v in cut(d, "b").items() if k != "duration"}, r"missing field 'duration'"),
    "unknown key": (lambda d: cut(d, "b", speaker_age=3), r"cut b: unknown key 'speaker_age'"),
    "unknown source key": (
        lambda d: with_source(d, "b", type="file", source=str(d / "a.wav"), bogus=1),
        r"cut b: unknown key 'bogus'",
    ),
    "wrong type duration": (lambda d: cut(d, "b", duration="1.0"), r"'duration' must be a positive number, not '1.0'"),
    "nan duration": (lambda d: cut(d, "b", duration=float("nan")), r"'duration' must be a positive number"),
    "wrong type text": (
        lambda d: cut(d, "b", supervisions=[{"id": "b", "recording_id": "a", "start": 0, "duration": 1, "text": 5}]),
        r"supervision b: 'text' must be a string, not int",
    ),
    "wrong type rate": (
        lambda d: cut(d, "b", recording={**cut(d)["recording"], "sampling_rate": "16k"}),
        r"'sampling_rate' must be a positive integer, not '16k'",
    ),
    "past the end": (lambda d: cut(d, "b", start=0.5), r"ends at 1\.500 s, past the end of its recording \(1\.000 s\)"),
    "duplicate id": (lambda d: cut(d, "a"), r":2: cut a: duplicate cut id \(first on line 1\)"),
    "shell command": (
        lambda d: with_source(d, "b", type="command", source="touch /tmp/pwned; cat a.wav"),
        r"cut b: recording a: audio source runs a shell command \('touch /tmp/pwned.*data\.allow_command_sources",
    ),
    "url": (lambda d: with_source(d, "b", type="url", source="http://x/a.wav"), r"is a URL"),
    "outside the corpus": (
        lambda d: with_source(d, "b", type="file", source="/etc/passwd"),
        r"audio file /etc/passwd is outside the corpus directories",
    ),
    "dot-dot escape": (
        lambda d: with_source(d, "b", type="file", source=str(d / ".." / "elsewhere.wav")),
        r"outside the corpus directories",
    ),
}


@pytest.mark.parametrize("name", list(BAD_LINES))
def test_a_bad_manifest_line_is_one_error_naming_file_and_line(corpus_dir, tmp_path, name):
    make, message = BAD_LINES[name]
    path = write_manifest(tmp_path / "cuts.jsonl.gz", [cut(corpus_dir), make(corpus_dir), cut(corpus_dir, "c")])
    with pytest.raises(UserError) as err:
        check_cuts_manifest(path, audio_roots=[corpus_dir])
    assert str(err.value).startswith(f"{path}:2: ") and "\n" not in str(err.value)
    assert err.match(message)


def test_a_good_manifest_passes_and_further_problems_are_counted(corpus_dir, tmp_path):
    good = write_manifest(tmp_path / "good.jsonl.gz", [cut(corpus_dir, n) for n in "abc"])
    assert check_cuts_manifest(good, audio_roots=[corpus_dir]) == 3
    assert check_cuts_manifest(good) == 3  # no roots: audio may be anywhere
    bad = write_manifest(tmp_path / "bad.jsonl.gz", [cut(corpus_dir), "nope", "[]", cut(corpus_dir, "d", duration=0)])
    with pytest.raises(UserError, match=r":2: not valid JSON .* \(and 2 more problems in this manifest\)$"):
        check_cuts_manifest(bad)


def test_command_sources_pass_only_when_allowed(corpus_dir, tmp_path):
    piped = with_source(corpus_dir, "p", type="command", source="cat a.wav")
    path = write_manifest(tmp_path / "cuts.jsonl.gz", [piped])
    assert check_cuts_manifest(path, allow_command_sources=True) == 1


def test_a_symlink_out_of_the_corpus_is_outside_it(corpus_dir, tmp_path):
    outside = tmp_path / "secret.wav"
    sf.write(outside, np.zeros(160, dtype=np.float32), 16000)
    (corpus_dir / "link.wav").symlink_to(outside)
    path = write_manifest(
        tmp_path / "cuts.jsonl.gz", [with_source(corpus_dir, "s", type="file", source=str(corpus_dir / "link.wav"))]
    )
    with pytest.raises(UserError, match=r"link\.wav is outside the corpus directories"):
        check_cuts_manifest(path, audio_roots=[corpus_dir])


def test_unreadable_manifests_are_one_line_errors(corpus_dir, tmp_path):
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(gzip.compress(json.dumps(cut(corpus_dir)).encode())[:-12])
    with pytest.raises(UserError, match=rf"^{broken}: cannot read the manifest"):
        check_cuts_manifest(broken)
    empty = write_manifest(tmp_path / "empty.jsonl.gz", [])
    with pytest.raises(UserError, match=rf"^{empty}: cut manifest is empty$"):
        check_cuts_manifest(empty)
    huge = tmp_path / "huge.jsonl"
    huge.write_bytes(b"[" + b"1," * (MAX_LINE_BYTES // 2) + b"1]\n")
    with pytest.raises(UserError, match=rf"^{huge}:1: line longer than 16 MiB"):
        check_cuts_manifest(huge)
    with pytest.raises(UserError, match=r"nothere\.jsonl\.gz: cut manifest not found$"):
        check_cuts_manifest(tmp_path / "nothere.jsonl.gz")


def flipped_gzip(corpus_dir: Path, path: Path) -> Path:
    """A ``.jsonl.gz`` of 200 cuts with one bit flipped inside the deflate stream (zlib, not the CRC, notices)."""
    good = gzip.compress("".join(json.dumps(cut(corpus_dir, f"c{i}")) + "\n" for i in range(200)).encode(), mtime=0)
    flips = ((at, bit) for at in range(10, len(good) - 8) for bit in range(8))  # past the 10-byte header
    for at, bit in flips:  # the first flip that breaks the deflate stream
        data = bytearray(good)
        data[at] ^= 1 << bit
        try:
            gzip.decompress(bytes(data))
        except zlib.error:  # what every reader met, as a traceback
            path.write_bytes(bytes(data))
            return path
        except (gzip.BadGzipFile, EOFError):
            continue
    raise AssertionError("no single bit flip broke the deflate stream")


def test_a_bit_flipped_gzip_manifest_is_one_line_for_every_command(corpus_dir, tmp_path):
    from srupp_asr.manifest import load_cuts
    from srupp_asr.tokenizer import texts_from_sources

    flipped = flipped_gzip(corpus_dir, tmp_path / "flipped.jsonl.gz")
    with pytest.raises(UserError, match=rf"^{flipped}: cannot read the manifest \(Error -3 while decompressing"):
        check_cuts_manifest(flipped)  # training's check
    with pytest.raises(UserError, match=rf"^{flipped}: cannot read the manifest"):
        load_cuts(flipped)  # evaluate, cmvn
    with pytest.raises(UserError, match=rf"^{flipped}: cannot read the manifest"):
        list(texts_from_sources([str(flipped)], []))  # tokenizer


def test_named_pipes_are_refused_unopened_as_manifests_text_files_and_training_audio(corpus_dir, tmp_path):
    """Opening a named pipe waits for a writer (for ever if none comes): each reader refuses one unopened."""
    from lhotse import MonoCut

    from srupp_asr.manifest import load_cut_audio, load_cuts
    from srupp_asr.tokenizer import texts_from_sources

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    message = rf"^{pipe}: cut manifest is not a regular file \(a pipe; save it to a file\)$"
    with pytest.raises(UserError, match=message):
        check_cuts_manifest(pipe)  # training
    with pytest.raises(UserError, match=message):
        load_cuts(pipe)  # evaluate, cmvn, tokenizer --cuts
    with pytest.raises(UserError, match=rf"^{pipe}: text file is not a regular file \(a pipe"):
        list(texts_from_sources([], [str(pipe)]))  # tokenizer --text
    with pytest.raises(UserError, match=r"^/dev/zero: text file is not a regular file \(a device"):
        list(texts_from_sources([], ["/dev/zero"]))
    data = cut(corpus_dir)
    data["recording"]["sources"][0]["source"] = str(pipe)
    piped = MonoCut.from_dict(data)
    # The training data set, evaluate and cmvn load every cut's audio here (a UserError leaves the cut out).
    with pytest.raises(UserError, match=rf"^{pipe}: cut a: not a readable audio file \(not a regular file: a pipe\)$"):
        load_cut_audio(piped)


@pytest.mark.parametrize(("seconds", "rate"), [(1.0, 16000), (2.0, 8000)])
def test_audio_changed_after_its_manifest_was_written_is_named_as_such(tmp_path, seconds, rate):
    """lhotse calls it "internal Lhotse's error or a faulty transform implementation"."""
    from lhotse import Recording

    from srupp_asr.manifest import load_cut_audio

    path = tmp_path / "a.wav"
    sf.write(path, np.zeros(32000, np.float32), 16000)
    cut = Recording.from_file(path).to_cut()
    sf.write(path, np.zeros(int(seconds * rate), np.float32), rate)
    with pytest.raises(UserError) as caught:
        load_cut_audio(cut)
    assert str(caught.value) == (
        f"{path}: cut a: its audio changed after the manifest was written: the file holds {int(seconds * rate)}"
        f" samples at {rate} Hz, the manifest says 32000 at 16000 Hz (prepare the manifest again)"
    )
