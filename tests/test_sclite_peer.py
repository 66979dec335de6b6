"""``srupp-asr sclite`` beside the installed ``sctk sclite`` on random CTM pairs: CTM against CTM, with and without
``-T`` time-mediated alignment, ``-D`` and ``-F``: every ``.pra`` must be the same and every ``.sys`` row hold the
same numbers (sclite widens its box for a rate of 1000% or more, which this does not).

Random references hold alternations (``{ w / @ }`` among them), optional words ``(uh)`` and fragments ``e-``; times
are on a 0.05 s grid so that equal costs (sclite's ties) are common. Channels have at least two words: sclite
leaves out a second channel of one word at the end of a file (see docs/evaluation.md).
"""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest

from srupp_asr.scoring import sclite

PAIRS = 200
_WORDS = ["a", "b", "c", "d", "(uh)", "e-"]
_OPTIONS = [["-T"], ["-T", "-D"], ["-T", "-F"], []]


def _channel_lines(rng: random.Random, channel: str, words: int, alternations: bool) -> list[str]:
    t = round(rng.uniform(0, 1), 2)
    out = []
    for _ in range(words):
        if alternations and rng.random() < 0.15:
            out += [f"f {channel} * * <ALT_BEGIN>", f"f {channel} {t:.2f} 0.20 {rng.choice(_WORDS)}"]
            out.append(f"f {channel} * * <ALT>")
            if rng.random() < 0.5:  # else an empty alternative: { w / @ }
                out.append(f"f {channel} {t:.2f} 0.20 {rng.choice(_WORDS)}")
            out.append(f"f {channel} * * <ALT_END>")
        else:
            out.append(f"f {channel} {t:.2f} {rng.choice([0.1, 0.2, 0.25, 0.3]):.2f} {rng.choice(_WORDS)}")
        t = round(t + rng.choice([0.05, 0.1, 0.2, 0.3, 0.5]), 2)
    return out


def _ctm(rng: random.Random, channels: list[str], alternations: bool) -> str:
    lines = [line for ch in channels for line in _channel_lines(rng, ch, rng.randint(2, 20), alternations)]
    return "\n".join(lines) + "\n"


def _numbers(table: str) -> list[list[str]]:
    """The cells of a .sys table's rows of numbers, without the box's spacing."""
    rows = (line for line in table.splitlines() if "|" in line and any(c.isdigit() for c in line))
    return [row.replace("|", " ").split() for row in rows]


@pytest.mark.slow
@pytest.mark.reference
@pytest.mark.skipif(shutil.which("sctk") is None, reason="Debian's sctk (sctk sclite) is not installed")
def test_random_ctm_pairs_align_as_installed_sclite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # short file names: the reports' titles are the hypothesis file's name
    differ = []
    for seed in range(PAIRS):
        rng = random.Random(seed)
        channels = ["A", "B"][: rng.choice([1, 2])]
        Path("r.ctm").write_text(_ctm(rng, channels, alternations=True))
        Path("h.ctm").write_text(_ctm(rng, channels, alternations=False))
        for options in _OPTIONS:
            args = ["-r", "r.ctm", "ctm", "-h", "h.ctm", "ctm", "-o", "sum", "pralign", "-O", ".", "-f", "0", *options]
            subprocess.run(["sctk", "sclite", *args, "-n", "peer"], check=True, capture_output=True)
            sclite.main([*args, "-n", "ours"])
            same_pra = Path("ours.pra").read_text() == Path("peer.pra").read_text()
            if not same_pra or _numbers(Path("ours.sys").read_text()) != _numbers(Path("peer.sys").read_text()):
                differ.append((seed, " ".join(options)))
    assert differ == []
