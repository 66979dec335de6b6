# ruff: noqa: F811  (imported fixtures are parameter names of the tests)
"""Manifests and configs from anywhere: every problem is one line naming the file (and the line), found before
training starts; configs cannot name classes outside lightning / torch / srupp_asr."""

from __future__ import annotations

import gzip
import json
import os
import zlib
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from srupp_asr.errors import UserError
from srupp_asr.manifest_check import MAX_LINE_BYTES, check_cuts_manifest
from srupp_asr.train import TRUSTED_CLASSES_ENV, check_trusted_classes, run_train
from tests.test_train import TINY_CONFIG, speech_corpus, tokenizer_path  # noqa: F401 (fixtures)


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


def write_manifest(path: Path, lines: list) -> Path:
    text = "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(text)
    return path


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


def test_training_stops_at_a_bad_manifest_before_the_first_step(speech_corpus, tmp_path):
    with gzip.open(speech_corpus["cuts"], "rt") as f:
        good = [json.loads(line) for line in f]
    bad = write_manifest(tmp_path / "bad.jsonl.gz", [*good[:2], {**good[2], "duration": -1}, *good[3:]])
    root = tmp_path / "exp"
    args = [
        "fit",
        "--config",
        str(TINY_CONFIG),
        f"--data.train_cuts={bad}",
        f"--data.valid_cuts={speech_corpus['cuts']}",
    ]
    args += [f"--data.tokenizer={speech_corpus['tokenizer']}", f"--trainer.default_root_dir={root}"]
    with pytest.raises(UserError, match=rf"^{bad}:3: cut utt2: 'duration' must be a positive number, not -1"):
        run_train([*args, "--trainer.max_steps=2"])
    assert not list(root.rglob("*.ckpt"))
    outside = Path(speech_corpus["cuts"]).parent / "elsewhere"
    with pytest.raises(UserError, match=r"is outside the corpus directories"):
        run_train(
            [*args[:4], f"--data.train_cuts={speech_corpus['cuts']}", *args[5:], f"--data.audio_roots=[{outside}]"]
        )


# ------------------------------------------------------------------------------------------------------ configs


def test_a_wrong_type_in_a_config_names_the_file_and_key(tmp_path, tokenizer_path):
    config = tmp_path / "lr.yaml"
    config.write_text("model:\n  lr: fast\n")
    with pytest.raises(UserError, match=rf"^{config}: .*model\.lr"):
        run_train(["fit", "--config", str(TINY_CONFIG), "--config", str(config), "--data.tokenizer", tokenizer_path])


def test_a_config_naming_an_untrusted_class_is_refused_before_import(tmp_path, tokenizer_path):
    config = tmp_path / "evil.yaml"
    marker = tmp_path / "imported"
    (tmp_path / "evil_plugin.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    config.write_text("trainer:\n  callbacks:\n  - class_path: evil_plugin.Callback\n    init_args: {}\n")
    os.sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(
            UserError, match=rf"^{config}: trainer\.callbacks\[0\]: class 'evil_plugin\.Callback' is not allowed"
        ):
            run_train(
                ["fit", "--config", str(TINY_CONFIG), "--config", str(config), "--data.tokenizer", tokenizer_path]
            )
    finally:
        os.sys.path.remove(str(tmp_path))
    assert not marker.exists()  # refused from the YAML, before jsonargparse imported anything


def test_a_class_from_the_command_line_is_checked_too(tokenizer_path, tmp_path, monkeypatch):
    args = ["fit", "--config", str(TINY_CONFIG), "--data.tokenizer", tokenizer_path, "--trainer.max_steps=0"]
    args += [f"--trainer.default_root_dir={tmp_path}", "--trainer.callbacks+=tests.test_train.UpdateRecorder"]
    monkeypatch.delenv(TRUSTED_CLASSES_ENV, raising=False)
    with pytest.raises(
        UserError,
        match=r"^config: fit\.trainer\.callbacks\[0\]: class 'tests\.test_train\.UpdateRecorder' is not allowed",
    ):
        run_train(args)


def test_trusted_modules_and_the_environment_extension(monkeypatch):
    monkeypatch.delenv(TRUSTED_CLASSES_ENV, raising=False)
    fine = {
        "trainer": {"logger": {"class_path": "lightning.pytorch.loggers.CSVLogger"}},
        "x": [{"class_path": "CSVLogger"}],
    }
    check_trusted_classes(fine, "c.yaml")
    with pytest.raises(UserError, match=r"^c\.yaml: a\.b\[1\]: class 'lightningx\.Evil' is not allowed"):
        check_trusted_classes({"a": {"b": [{}, {"class_path": "lightningx.Evil"}]}}, "c.yaml")
    monkeypatch.setenv(TRUSTED_CLASSES_ENV, "mine, other.pkg")
    check_trusted_classes({"a": {"class_path": "other.pkg.Thing"}, "b": {"class_path": "mine.X"}}, "c.yaml")


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
    from srupp_asr.data import load_cuts
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

    from srupp_asr.data import load_cut_audio, load_cuts
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
