"""Training-time channel augmentation (srupp_asr.augment): each step against its definition, seeding, the hook."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import torch
from lhotse import CutSet, Recording, SupervisionSegment
from lhotse.utils import fastcopy

from srupp_asr import augment as A
from srupp_asr.data import ASRDataModule, ASRDataset
from srupp_asr.errors import UserError
from srupp_asr.samplers import SeededBatch
from srupp_asr.tokenizer import Tokenizer

RATE = 16000
T = np.arange(RATE) / RATE  # one second


def _peak_hz(samples: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.argmax(spectrum) * RATE / len(samples))


def _voice() -> np.ndarray:
    """A voice-like test signal: 150 Hz harmonics up to 3 kHz, amplitude-modulated at 3 Hz."""
    harmonics = sum(np.sin(2 * np.pi * k * 150 * T + k) / k for k in range(1, 21))
    return 0.2 * harmonics * (1 + 0.5 * np.sin(2 * np.pi * 3 * T))


def _db(a: np.ndarray, b: np.ndarray) -> float:
    return float(20 * np.log10(np.std(a) / np.std(b)))


def test_vtlp_warp_is_linear_below_the_knee_and_keeps_nyquist():
    for alpha in (0.85, 1.0, 1.15):
        knee = A.VTLP_KNEE * 8000 * min(alpha, 1) / alpha
        assert A.vtlp_warp(np.array([0.0, 8000.0]), alpha).tolist() == pytest.approx([0.0, 8000.0])
        assert A.vtlp_warp(np.array([knee / 2, knee]), alpha) == pytest.approx([alpha * knee / 2, alpha * knee])
        grid = np.linspace(0, 8000, 1001)
        assert np.all(np.diff(A.vtlp_warp(grid, alpha)) > 0)  # monotonic: no two frequencies land on one


@pytest.mark.parametrize(("freq", "alpha"), [(1000.0, 1.1), (1000.0, 0.9), (300.0, 1.15), (7000.0, 1.1)])
def test_vtlp_moves_a_sine_to_its_warped_frequency(freq, alpha):
    out = A.vtlp(0.5 * np.sin(2 * np.pi * freq * T), alpha)
    assert len(out) == RATE
    expected = float(A.vtlp_warp(np.array([freq]), alpha)[0])
    assert abs(_peak_hz(out) - expected) <= 2.0  # 1 Hz resolution; 7000 Hz lies above the knee
    assert expected != pytest.approx(freq, abs=20)


def test_vtlp_of_one_is_nearly_the_identity():
    x = _voice()
    inner = slice(512, -512)  # the edges, where the first and last frames are half empty
    assert np.max(np.abs(A.vtlp(x, 1.0)[inner] - x[inner])) < 1e-6


def test_eq_filters_by_its_drawn_response():
    eq = A.draw_eq(np.random.default_rng(3), 12.0)
    eq = {**eq, "low_cut_hz": 200, "high_cut_hz": 4000}  # both cuts present, whatever was drawn
    impulse = np.zeros(4096)
    impulse[2048] = 1.0
    out = A.equalize(impulse, eq)
    measured = np.abs(np.fft.rfft(out))
    wanted = A.eq_response(np.fft.rfftfreq(4096, 1 / RATE), eq)
    np.testing.assert_allclose(measured, wanted, rtol=0.02, atol=1e-4)
    # the curve itself: the control gains at their frequencies, the Butterworth corners 3 dB down
    points = np.geomspace(*A.EQ_RANGE_HZ, A.EQ_POINTS)
    flat = {"gains_db": eq["gains_db"], "low_cut_hz": None, "high_cut_hz": None}
    assert 20 * np.log10(A.eq_response(points, flat)) == pytest.approx(eq["gains_db"], abs=1e-9)
    zero = {"gains_db": [0.0] * A.EQ_POINTS, "low_cut_hz": 200, "high_cut_hz": 4000}
    assert 20 * np.log10(A.eq_response(np.array([200.0, 4000.0]), zero)) == pytest.approx([-3.0, -3.0], abs=0.02)


def _onset_s(samples: np.ndarray) -> float:
    """When the 5 ms frame energy first reaches 1/100 of the loudest frame's."""
    frames = np.mean(samples[: len(samples) // 80 * 80].reshape(-1, 80) ** 2, axis=1)
    return float(np.argmax(frames >= 0.01 * frames.max()) * 80 / RATE)


@pytest.mark.parametrize(("codec", "mode"), [("gsm", 0), ("amr-nb", 7), ("amr-nb", 0), ("vorbis", 0)])
def test_codec_round_trip_keeps_length_level_and_timing(codec, mode):
    x = _voice()
    x[: RATE * 2 // 5] = 0.0  # the voice starts at 0.4 s
    out = A.codec_round_trip(x, codec, mode)
    assert len(out) == len(x)
    assert abs(_db(out[RATE // 2 :], x[RATE // 2 :])) < 3.0
    assert abs(_onset_s(out) - 0.4) <= 0.01  # aligned: the codec's delay is removed
    assert not np.allclose(out, x, atol=1e-3)  # and it is lossy


def test_narrow_band_codecs_remove_the_upper_band():
    x = 0.3 * np.sin(2 * np.pi * 6000 * T) + 0.3 * np.sin(2 * np.pi * 500 * T)
    for codec in ("gsm", "amr-nb"):
        spectrum = np.abs(np.fft.rfft(A.codec_round_trip(x, codec, 7)))
        assert spectrum[6000] < 0.01 * spectrum[500]  # 8 kHz codecs: nothing above 4 kHz survives


def test_pitch_shift_moves_a_sine_and_keeps_length():
    out = A.shift_pitch(0.3 * np.sin(2 * np.pi * 440 * T), 1200)
    assert len(out) == RATE and abs(_peak_hz(out) - 880) <= 2.0


def test_augment_is_deterministic_from_the_seed_and_keeps_length_and_range():
    augment = A.ChannelAugment(pitch_prob=1.0, vtlp_prob=1.0, eq_prob=1.0, codec_prob=1.0)
    x = _voice()
    a = augment(x, np.random.default_rng(7))
    b = augment(x, np.random.default_rng(7))
    c = augment(x, np.random.default_rng(8))
    assert a.dtype == np.float32 and len(a) == len(x) and np.abs(a).max() <= 1.0
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c, atol=1e-3)
    assert set(augment.draw(np.random.default_rng(7))) == {"pitch", "vtlp", "eq", "codec"}


def test_draws_do_not_depend_on_the_probabilities():
    """Turning one step off leaves the other steps' draws as they were."""
    on = A.ChannelAugment(pitch_prob=1.0, vtlp_prob=1.0, eq_prob=1.0, codec_prob=1.0)
    some = A.ChannelAugment(vtlp_prob=1.0)
    assert some.draw(np.random.default_rng(5))["vtlp"] == on.draw(np.random.default_rng(5))["vtlp"]
    assert A.ChannelAugment().draw(np.random.default_rng(5)) == {}


def test_config_is_checked():
    assert A.ChannelAugment.from_config(None) is None and A.ChannelAugment.from_config({"eq_prob": 0.0}) is None
    made = A.ChannelAugment.from_config({"vtlp_prob": 0.5, "vtlp_range": [0.9, 1.1], "codecs": ["gsm"]})
    assert made == A.ChannelAugment(vtlp_prob=0.5, vtlp_range=(0.9, 1.1), codecs=("gsm",))
    with pytest.raises(UserError, match="unknown keys \\['vtlp'\\]"):
        A.ChannelAugment.from_config({"vtlp": 0.5})
    with pytest.raises(UserError, match="eq_prob must be within"):
        A.ChannelAugment(eq_prob=1.5)
    with pytest.raises(UserError, match="codecs must be some of"):
        A.ChannelAugment(codecs=("mp3",))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("augment_corpus")
    cuts = []
    for i, text in enumerate(["one two", "three four", "five"]):
        path = root / f"a{i}.wav"
        sf.write(path, (_voice()[: 8000 + 2000 * i]).astype(np.float32), RATE)
        rec = Recording.from_file(path, recording_id=f"a{i}")
        sup = SupervisionSegment(id=f"a{i}", recording_id=f"a{i}", start=0, duration=rec.duration, text=text)
        cuts.append(fastcopy(rec.to_cut(), id=f"a{i}", supervisions=[sup]))
    cuts = CutSet.from_cuts(cuts)
    cuts.to_file(root / "cuts.jsonl.gz")
    tok = Tokenizer.train(["one two", "three four", "five"], root / "tok.model", vocab_size=30, model_type="char")
    return root, cuts, tok


def test_training_batches_carry_the_augmentation_reproducibly(corpus):
    _, cuts, tok = corpus
    settings = {"vtlp_prob": 1.0, "eq_prob": 1.0, "codec_prob": 1.0}
    clean = ASRDataset(tok)[cuts]
    first = ASRDataset(tok, channel_augment=settings)[SeededBatch(cuts, 11)]
    again = ASRDataset(tok, channel_augment=A.ChannelAugment(**settings))[SeededBatch(cuts, 11)]
    other = ASRDataset(tok, channel_augment=settings)[SeededBatch(cuts, 12)]
    assert first["audio_lens"].tolist() == clean["audio_lens"].tolist()
    assert first["texts"] == clean["texts"]
    assert torch.equal(first["audio"], again["audio"])
    assert not torch.allclose(first["audio"], clean["audio"], atol=1e-3)
    assert not torch.allclose(first["audio"], other["audio"], atol=1e-3)


def test_data_module_checks_the_setting_before_training(corpus):
    root, _, tok = corpus
    manifest = str(root / "cuts.jsonl.gz")
    with pytest.raises(UserError, match="unknown keys"):
        ASRDataModule(manifest, manifest, str(tok.path), channel_augment={"vltp_prob": 1.0})
    module = ASRDataModule(manifest, manifest, str(tok.path), num_workers=0, channel_augment={"eq_prob": 1.0})
    module.setup("fit")
    batch = next(iter(module.train_dataloader()))
    assert batch["audio"].shape[0] == 3
