"""Audio loading: formats, downmix, resampling, and one-line errors for files that are not audio."""

from __future__ import annotations

import math
import os
import struct

import numpy as np
import pytest
import soundfile as sf
import torch

from srupp_asr.audio import SAMPLE_RATE, AudioReader, load_audio, prepare_waveform
from srupp_asr.errors import UserError


def _tone(freq: float, rate: int, seconds: float, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (amplitude * np.sin(2 * math.pi * freq * t)).astype(np.float32)


def _peak_hz(wav: torch.Tensor, rate: int) -> float:
    spectrum = torch.fft.rfft(wav.double()).abs()
    return float(spectrum.argmax()) * rate / wav.numel()


@pytest.fixture
def wav_bytes(tmp_path):
    """Bytes of a 1 s 16-bit 16 kHz mono WAV."""
    path = tmp_path / "ok.wav"
    sf.write(path, _tone(440, SAMPLE_RATE, 1.0), SAMPLE_RATE, subtype="PCM_16")
    return path.read_bytes()


def test_wav_at_16k_loads_sample_exact(tmp_path):
    samples = (np.arange(-800, 800, dtype=np.int16) * 20).astype(np.int16)
    sf.write(tmp_path / "a.wav", samples, SAMPLE_RATE, subtype="PCM_16")
    wav = load_audio(tmp_path / "a.wav")
    assert wav.dtype == torch.float32 and wav.dim() == 1
    assert torch.equal(wav, torch.from_numpy(samples.astype(np.float32) / 32768))


def test_stereo_is_downmixed_by_averaging(tmp_path):
    left, right = _tone(300, SAMPLE_RATE, 0.5), _tone(700, SAMPLE_RATE, 0.5, amplitude=0.25)
    sf.write(tmp_path / "st.wav", np.stack([left, right], axis=1), SAMPLE_RATE, subtype="FLOAT")
    wav = load_audio(tmp_path / "st.wav")
    torch.testing.assert_close(wav, torch.from_numpy((left + right) / 2), atol=1e-7, rtol=0)


@pytest.mark.parametrize("rate", [8000, 22050, 44100, 48000])
def test_other_rates_are_resampled_to_16k(tmp_path, rate):
    sf.write(tmp_path / "r.wav", _tone(1000, rate, 1.0), rate, subtype="FLOAT")
    wav = load_audio(tmp_path / "r.wav")
    assert wav.numel() == math.ceil(rate * 1.0 * SAMPLE_RATE / rate)
    assert _peak_hz(wav, SAMPLE_RATE) == pytest.approx(1000, abs=1)
    # Away from the edges the resampled tone keeps its amplitude.
    assert float(wav[2000:-2000].abs().max()) == pytest.approx(0.5, abs=0.01)


def test_sample_rate_argument_picks_the_output_rate(tmp_path):
    sf.write(tmp_path / "r.wav", _tone(1000, SAMPLE_RATE, 1.0), SAMPLE_RATE)
    wav = load_audio(tmp_path / "r.wav", sample_rate=8000)
    assert wav.numel() == 8000
    assert _peak_hz(wav, 8000) == pytest.approx(1000, abs=1)


@pytest.mark.parametrize(("fmt", "tolerance"), [("FLAC", 1e-4), ("OGG", 0.1), ("MP3", 0.1)])
def test_compressed_formats_decode_to_the_same_signal(tmp_path, fmt, tolerance):
    tone = _tone(440, SAMPLE_RATE, 1.0)
    path = tmp_path / f"a.{fmt.lower()}"
    sf.write(path, tone, SAMPLE_RATE, format=fmt)
    wav = load_audio(path)
    assert wav.numel() == tone.size
    # Lossy codecs keep the waveform close, not exact; compare away from codec edge effects.
    error = (wav[1000:-1000] - torch.from_numpy(tone[1000:-1000])).abs().max()
    assert float(error) < tolerance, f"{fmt}: max abs error {float(error):.4f}"


def test_float_samples_beyond_full_scale_are_clipped(tmp_path):
    sf.write(tmp_path / "loud.wav", np.array([0.5, 1.7, -3.0, 0.0], np.float32), SAMPLE_RATE, subtype="FLOAT")
    assert load_audio(tmp_path / "loud.wav").tolist() == [0.5, 1.0, -1.0, 0.0]


def test_prepare_waveform_accepts_lhotse_channel_first_arrays():
    samples = np.stack([np.full(100, 0.2, np.float32), np.full(100, 0.4, np.float32)])
    torch.testing.assert_close(prepare_waveform(samples, SAMPLE_RATE), torch.full((100,), 0.3))


def test_streamed_wav_with_placeholder_sizes_is_read(tmp_path, wav_bytes):
    # ffmpeg or sox writing to a pipe cannot seek back to fill in the sizes and leave 0xFFFFFFFF.
    data = bytearray(wav_bytes)
    data[4:8] = struct.pack("<I", 0xFFFFFFFF)
    data[40:44] = struct.pack("<I", 0xFFFFFFFF)
    (tmp_path / "pipe.wav").write_bytes(bytes(data))
    assert load_audio(tmp_path / "pipe.wav").numel() == SAMPLE_RATE


def _assert_user_error(path, *fragments):
    with pytest.raises(UserError) as info:
        load_audio(path)
    message = str(info.value)
    assert message.startswith(f"{os.fspath(path)}: "), message
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


def test_missing_file_is_a_user_error(tmp_path):
    _assert_user_error(tmp_path / "nope.wav", "no such file")


def test_directory_is_a_user_error(tmp_path):
    _assert_user_error(tmp_path, "not a readable audio file", "directory")


def test_empty_file_is_a_user_error(tmp_path):
    (tmp_path / "empty.wav").write_bytes(b"")
    _assert_user_error(tmp_path / "empty.wav", "not a readable audio file", "empty")


def test_zero_length_audio_is_a_user_error(tmp_path):
    sf.write(tmp_path / "zero.wav", np.zeros(0, np.float32), SAMPLE_RATE)
    _assert_user_error(tmp_path / "zero.wav", "no audio samples")


def test_text_file_is_a_user_error(tmp_path):
    (tmp_path / "notes.wav").write_text("these are not the samples you are looking for\n" * 20)
    _assert_user_error(tmp_path / "notes.wav", "not a readable audio file", "Format not recognised")


def test_header_only_wav_is_a_user_error(tmp_path, wav_bytes):
    (tmp_path / "head.wav").write_bytes(wav_bytes[:30])
    _assert_user_error(tmp_path / "head.wav", "not a readable audio file")


def test_truncated_wav_is_a_user_error(tmp_path, wav_bytes):
    (tmp_path / "cut.wav").write_bytes(wav_bytes[: len(wav_bytes) // 2])
    _assert_user_error(tmp_path / "cut.wav", "not a readable audio file", "truncated", "declares 32000 bytes")


def test_truncated_flac_is_a_user_error(tmp_path):
    sf.write(
        tmp_path / "a.flac",
        _tone(440, SAMPLE_RATE, 1.0) + 0.01 * np.random.default_rng(0).standard_normal(SAMPLE_RATE),
        SAMPLE_RATE,
    )
    data = (tmp_path / "a.flac").read_bytes()
    (tmp_path / "cut.flac").write_bytes(data[: len(data) // 2])
    _assert_user_error(tmp_path / "cut.flac", "not a readable audio file")


def test_nan_samples_are_a_user_error(tmp_path):
    sf.write(tmp_path / "nan.wav", np.array([0.1, np.nan, 0.2], np.float32), SAMPLE_RATE, subtype="FLOAT")
    _assert_user_error(tmp_path / "nan.wav", "NaN")


def test_espeak_speech_loads_at_16k(synthesize_speech):
    path = synthesize_speech()
    info = sf.info(path)
    wav = load_audio(path)
    assert info.samplerate == 22050
    assert wav.numel() == math.ceil(info.frames * SAMPLE_RATE / 22050)
    assert 0.05 < float(wav.abs().max()) <= 1.0


# ------------------------------------------------------------------------------------------ reading in stretches


@pytest.mark.parametrize(
    ("fmt", "rate", "channels"),
    [("WAV", 16000, 1), ("FLAC", 44100, 2), ("WAV", 22050, 1), ("WAV", 8000, 2), ("OGG", 22050, 1), ("MP3", 44100, 2)],
)
def test_stretches_equal_the_same_samples_of_the_whole_file(tmp_path, fmt, rate, channels):
    noise = 0.3 * np.random.default_rng(1).standard_normal((rate * 3, channels)).astype(np.float32)
    path = tmp_path / f"a.{fmt.lower()}"
    sf.write(path, noise, rate, format=fmt)
    whole = load_audio(path)
    with AudioReader(path) as reader:
        assert reader.num_samples == whole.numel() and reader.duration == pytest.approx(3.0)
        # Forward, backward (re-read), overlapping and up to the end: the resampler's edges never show.
        for start, end in [(12345, 30000), (100, 5000), (29000, 47000), (40000, 48000), (47990, 60000)]:
            piece = reader.read(start, end)
            torch.testing.assert_close(piece, whole[start : min(end, whole.numel())], atol=1e-6, rtol=0)
        blocks = list(reader.blocks(7777))
    assert [start for start, _ in blocks] == list(range(0, whole.numel(), 7777))
    torch.testing.assert_close(torch.cat([b for _, b in blocks]), whole, atol=1e-6, rtol=0)


def test_ogg_is_read_without_seeking_because_libsndfile_seeks_it_wrongly(tmp_path):
    # libsndfile 1.2 returns wrong samples for a while after seeking in Vorbis: the reader decodes onwards instead.
    noise = 0.3 * np.random.default_rng(2).standard_normal((48000 * 2, 2)).astype(np.float32)
    sf.write(tmp_path / "a.ogg", noise, 48000, format="OGG")
    whole = load_audio(tmp_path / "a.ogg", sample_rate=48000)
    with AudioReader(tmp_path / "a.ogg", sample_rate=48000) as reader:
        for start in (33000, 1000, 60000, 59000):
            torch.testing.assert_close(reader.read(start, start + 4000), whole[start : start + 4000], atol=1e-6, rtol=0)


def test_a_truncated_file_read_in_stretches_is_a_user_error(tmp_path):
    sf.write(tmp_path / "a.flac", 0.1 * np.random.default_rng(0).standard_normal(SAMPLE_RATE * 4), SAMPLE_RATE)
    data = (tmp_path / "a.flac").read_bytes()
    (tmp_path / "cut.flac").write_bytes(data[: len(data) // 2])
    with AudioReader(tmp_path / "cut.flac") as reader:
        assert reader.num_samples == 4 * SAMPLE_RATE  # the header still promises 4 s
        reader.read(0, SAMPLE_RATE)  # the first second is there
        with pytest.raises(UserError, match=r"cut\.flac: not a readable audio file"):
            reader.read(3 * SAMPLE_RATE, 4 * SAMPLE_RATE)


def test_opening_checks_the_same_problems_as_loading(tmp_path):
    (tmp_path / "empty.wav").write_bytes(b"")
    with pytest.raises(UserError, match="the file is empty"):
        AudioReader(tmp_path / "empty.wav")
    sf.write(tmp_path / "zero.wav", np.zeros(0, np.float32), SAMPLE_RATE)
    with pytest.raises(UserError, match="holds no audio samples"):
        AudioReader(tmp_path / "zero.wav")


@pytest.mark.parametrize("rate", [8000, 22050, 44100])
def test_resampling_is_bit_for_bit_torchaudios_function(rate):
    import torchaudio.functional as AF

    x = 0.5 * torch.randn(rate + 123, generator=torch.Generator().manual_seed(rate))
    assert torch.equal(prepare_waveform(x, rate), AF.resample(x, rate, SAMPLE_RATE).clamp(-1, 1))
