"""A full disk while ``srupp-asr transcribe`` writes its outputs: the previous files stay intact, no temporary
file is left, and the failure is one line naming the file. Also: the temporary names of atomic writes.

The disk is filled for the child process only, with ``RLIMIT_FSIZE``: past the limit ``write()`` fails (EFBIG)
exactly where a full disk (ENOSPC) would make it fail.
"""

from __future__ import annotations

import resource
import signal
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from srupp_asr.fileio import atomic_output, atomic_write_text, temp_prefix


def _limit_file_size() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (60, 60))


def test_a_full_disk_while_writing_outputs_leaves_the_previous_ones_intact(model_dir, tmp_path):
    audio = [tmp_path / "a.wav", tmp_path / "b.wav"]
    for path in audio:
        sf.write(path, 0.01 * np.random.default_rng(0).standard_normal(16000).astype(np.float32), 16000)
    out = tmp_path / "out"
    out.mkdir()
    previous = {name: f"previous {name}\n" for name in ("a.json", "b.json")}
    for name, text in previous.items():
        (out / name).write_text(text)
    cmd = [sys.executable, "-m", "srupp_asr.cli", "transcribe", "--model", str(model_dir), "-f", "json", "-o", str(out)]
    proc = subprocess.run(
        [*cmd, *map(str, audio)], capture_output=True, text=True, timeout=300, preexec_fn=_limit_file_size
    )
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert proc.returncode != 0
    assert len(errors) == 2, proc.stderr
    for name, line in zip(previous, errors, strict=True):
        assert str(out / name) in line and "File too large" in line and "Traceback" not in proc.stderr
    assert {p.name: p.read_text() for p in out.iterdir()} == previous  # untouched, and no temporary file left


@pytest.mark.parametrize("length", [237, 238, 246, 255])
def test_atomic_writes_take_any_name_the_file_system_allows(tmp_path, length):
    # The temporary name is short and hidden, not the output's name plus 18 bytes (which failed from 238 bytes).
    path = tmp_path / ("x" * (length - 4) + ".txt")
    atomic_write_text(path, "hello\n")
    assert path.read_text() == "hello\n"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


@pytest.mark.parametrize(
    ("name", "suffix"),
    [("talk.flac", ".tmp.flac"), ("cuts.jsonl.gz", ".tmp.jsonl.gz"), ("a." + "b" * 250, ".tmp")],
)
def test_atomic_temporary_names_are_hidden_short_and_keep_the_format_suffix(tmp_path, name, suffix):
    with atomic_output(tmp_path / name) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(temp_prefix()) and tmp.name.endswith(suffix)
        assert temp_prefix().startswith(".") and len(temp_prefix()) <= 1 + 6 + 1 + 7 + 1  # ".host-pid-"
        assert len(tmp.name) == len(temp_prefix()) + 8 + len(suffix)  # + mkstemp's 8 random characters + the suffix
        tmp.write_bytes(b"data")
    assert [p.name for p in tmp_path.iterdir()] == [name]
