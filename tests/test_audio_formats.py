"""What FFmpeg decodes and libsndfile does not (M4A/MP4 AAC, WebM/Matroska Opus, raw AAC, AC-3), read through
PyAV only where libsndfile cannot open the file: the samples match the source recording, the same checks give the
same one-line errors (truncated, no audio, not audio), and directories and the CLI take these files."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from srupp_asr.audio import SAMPLE_RATE, AudioReader, load_audio
from srupp_asr.cli import main
from srupp_asr.errors import UserError
from srupp_asr.inputs import find_inputs

av = pytest.importorskip("av")

# (file name, container, codec, sample rate, channels)
FORMATS = [
    ("speech.m4a", "ipod", "aac", 22050, 1),
    ("speech.mp4", "mp4", "aac", 44100, 2),
    ("speech.webm", "webm", "libopus", 48000, 1),
    ("speech.mka", "matroska", "libopus", 48000, 2),
    ("speech.aac", "adts", "aac", 16000, 1),
    ("speech.ac3", "ac3", "ac3", 48000, 2),
]


def encode(
    source: np.ndarray, rate: int, path, container: str, codec: str, out_rate: int, channels: int, bit_rate: int = 0
) -> None:
    """Encode mono float ``source`` at ``rate`` into ``path`` with PyAV (FFmpeg's encoders; ``bit_rate`` 0: the
    encoder's default)."""
    layout = "mono" if channels == 1 else "stereo"
    planes = np.repeat(source[None, :], channels, axis=0).astype(np.float32)
    with av.open(str(path), "w", format=container) as out:
        stream = out.add_stream(codec, rate=out_rate)
        stream.layout = layout
        if bit_rate:
            stream.bit_rate = bit_rate
        frame = av.AudioFrame.from_ndarray(planes, format="fltp", layout=layout)
        frame.sample_rate = rate
        resampler = av.AudioResampler(format=stream.codec_context.format.name, layout=layout, rate=out_rate)
        for piece in [*resampler.resample(frame), *resampler.resample(None), None]:
            for packet in stream.encode(piece):
                out.mux(packet)


@pytest.fixture(scope="module")
def speech(synthesize_speech) -> tuple[np.ndarray, int]:
    samples, rate = sf.read(synthesize_speech(), dtype="float32")
    return samples, rate


@pytest.fixture(scope="module")
def encoded(speech, tmp_path_factory):
    folder = tmp_path_factory.mktemp("formats")
    for name, container, codec, rate, channels in FORMATS:
        encode(*speech, folder / name, container, codec, rate, channels)
    return folder


def _best_correlation(a: np.ndarray, b: np.ndarray, max_lag: int) -> float:
    """The highest normalised correlation of ``a`` and ``b`` over lags up to ``max_lag`` samples (codecs delay)."""
    n = min(len(a), len(b)) - max_lag
    best = -1.0
    for lag in range(-max_lag, max_lag + 1):
        x = a[max(lag, 0) : max(lag, 0) + n]
        y = b[max(-lag, 0) : max(-lag, 0) + n]
        best = max(best, float(np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y) + 1e-12)))
    return best


@pytest.mark.parametrize(("name", "container", "codec", "rate", "channels"), FORMATS)
def test_decoded_samples_match_the_source(speech, encoded, name, container, codec, rate, channels):
    path = encoded / name
    with pytest.raises(sf.LibsndfileError):  # what these files are here for: libsndfile cannot read them
        sf.info(str(path))
    reference = load_audio_array(*speech)
    with AudioReader(path) as reader:
        assert (reader.file_rate, reader.channels) == (rate, channels)
        wav = reader.read(0, reader.num_samples)
        assert wav.dtype == np.float32 and wav.ndim == 1
        # a stretch read alone is that stretch of the whole (the reader's contract, as for libsndfile files)
        middle = reader.read(10_000, 20_000)
    np.testing.assert_allclose(middle, wav[10_000:20_000], atol=1e-6, rtol=0)  # as tests/test_audio.py
    assert np.array_equal(load_audio(path), wav)
    # encoders add priming and padding (raw AAC keeps its 128 ms priming): at most 0.15 s more, never less
    assert len(reference) - 0.01 * SAMPLE_RATE <= len(wav) <= len(reference) + 0.15 * SAMPLE_RATE
    assert _best_correlation(wav, reference, max_lag=int(0.15 * SAMPLE_RATE)) > 0.95


def load_audio_array(samples: np.ndarray, rate: int) -> np.ndarray:
    from srupp_asr.audio import prepare_waveform

    return prepare_waveform(samples, rate)


def test_cut_files_and_non_audio_are_one_line_errors(encoded, tmp_path):
    webm = (encoded / "speech.webm").read_bytes()
    (tmp_path / "cut.webm").write_bytes(webm[: len(webm) // 10])
    with pytest.raises(UserError, match=r"^.*cut\.webm: not a readable audio file \(truncated: its header declares"):
        AudioReader(tmp_path / "cut.webm")
    m4a = (encoded / "speech.m4a").read_bytes()
    (tmp_path / "cut.m4a").write_bytes(m4a[: len(m4a) // 3])
    with pytest.raises(UserError, match=r"cut\.m4a: not a readable audio file \(Invalid data found"):
        AudioReader(tmp_path / "cut.m4a")
    # text with an audio name, and bytes that begin like MP4 and hold nothing: one line each, never noise
    (tmp_path / "notes.m4a").write_text("not audio at all\n")
    with pytest.raises(UserError, match=r"notes\.m4a: not a readable audio file \(Format not recognised"):
        AudioReader(tmp_path / "notes.m4a")
    (tmp_path / "fake.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 8)
    with pytest.raises(UserError, match=r"fake\.mp4: not a readable audio file \("):
        AudioReader(tmp_path / "fake.mp4")
    # a video container without audio
    (tmp_path / "silent.mkv").write_bytes(_video_only(tmp_path / "v.mkv"))
    with pytest.raises(UserError, match=r"silent\.mkv: not a readable audio file \(it holds no audio stream\)"):
        AudioReader(tmp_path / "silent.mkv")


def _video_only(path) -> bytes:
    with av.open(str(path), "w", format="matroska") as out:
        stream = out.add_stream("mpeg4", rate=5)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        for _ in range(3):
            frame = av.VideoFrame.from_ndarray(np.zeros((32, 32, 3), np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return path.read_bytes()


def test_directories_find_these_files_and_transcribe_reads_them(encoded, overfit_model_dir, tmp_path, capsys):
    files, problems = find_inputs([str(encoded)])
    assert sorted(p.rsplit("/", 1)[1] for p in files) == sorted(name for name, *_ in FORMATS) and not problems
    model, utts = overfit_model_dir
    wav, text = utts[0]
    samples, rate = sf.read(wav, dtype="float32")
    folder = tmp_path / "in"
    folder.mkdir()
    encode(samples, rate, folder / "utt.m4a", "ipod", "aac", 44100, 1, bit_rate=192_000)
    encode(samples, rate, folder / "utt.webm", "webm", "libopus", 48000, 1)
    # What each file decodes to, as a WAV: the CLI must hear exactly that. (A codec's artefacts can change a word of
    # the overfit model, which knows these utterances and nothing else, so the texts are compared with the decoded
    # audio's, not with the reference.)
    argv = ["transcribe", "--model", str(model), "--decoding", "ctc_greedy", "-q"]
    heard = {}
    for name in ("utt.m4a", "utt.webm"):
        decoded = tmp_path / f"{name}.wav"
        sf.write(decoded, load_audio(folder / name), SAMPLE_RATE, subtype="FLOAT")
        assert main([*argv, str(decoded)]) == 0
        heard[name] = capsys.readouterr().out.strip()
    assert heard["utt.webm"].split()[:3] == text.split()[:3]  # the decoding is not garbage
    code = main([*argv, str(folder)])
    out = capsys.readouterr().out.splitlines()
    assert code == 0 and out == [f"{folder / name}\t{heard[name]}" for name in ("utt.m4a", "utt.webm")]
