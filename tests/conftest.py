"""Shared fixtures: real speech synthesised with espeak-ng at test time (no downloaded audio).

``synthesize_speech(text, name="speech.wav")`` writes a 22.05 kHz 16-bit mono WAV of ``text`` spoken by
espeak-ng into a session-wide temporary folder and returns its path; the same text and name are only
synthesised once per session. Tests asking for it are skipped, with the reason, where espeak-ng is missing.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

SPEECH_TEXT = "The quick brown fox jumps over the lazy dog, then sleeps until seven."


@pytest.fixture(scope="session")
def synthesize_speech(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """A function ``(text=SPEECH_TEXT, name="speech.wav") -> Path`` that speaks ``text`` into a WAV file."""
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng); it synthesises the test speech")
    folder = tmp_path_factory.mktemp("speech")
    made: dict[tuple[str, str], Path] = {}

    def synthesize(text: str = SPEECH_TEXT, name: str = "speech.wav") -> Path:
        key = (text, name)
        if key not in made:
            path = folder / name
            subprocess.run([espeak, "-w", str(path), text], check=True, capture_output=True, timeout=60)
            made[key] = path
        return made[key]

    return synthesize
