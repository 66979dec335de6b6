"""Hostile audio input (issue 9): one ``srupp-asr transcribe`` batch, run as a real process, mixing good files in
every format, rate, width and channel count with every kind of broken input.

Each good file must give the right transcript (the overfit model's greedy CTC output is exact on its utterances, so
a file holding the same speech must give exactly the same text); each broken one exactly one error line naming it;
the batch goes on, the exit status is 1 (the closing line counts the failures) and nothing prints a traceback. The
process runs with a strict UTF-8 stdout (``PYTHONIOENCODING=utf-8:strict``, as under an ``en_US.UTF-8`` locale),
so a non-UTF-8 file name that reached stdout unescaped would crash it.

Also here: MP3 headers that overstate the length, unreadable files, symbolic-link loops, and memory while
transcribing a 10-hour file (under ``-m slow``). The reading of audio itself (the sample-rate guard, libmpg123's
stderr chatter, truncated Ogg and MP3 files, streaming a 1-hour file) is checked in ``tests/test_audio.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from srupp_asr.audio import (
    MIN_FILE_RATE,
    SAMPLE_RATE,
    AudioReader,
    load_audio,
)
from srupp_asr.cli import main
from srupp_asr.inputs import find_inputs
from srupp_asr.scoring.align import align, char_tokens
from srupp_asr.transcribe import printable, transcribe
from tests.helpers import lossy_formats

ERROR_PREFIX = "srupp-asr transcribe: error: "
SUMMARY = re.compile(r"^transcribed (\d+) files? \((\d+) failed\): ")
# Lossy codecs at their best quality keep the waveform within ~30 dB SNR of the source, but the overfit model
# (20 clean utterances, no augmentation) flips a letter or two on that much codec noise (measured: CER 2-7 %
# over the 20 utterances, some exact, none above 25 %): the signal is checked tightly, the text loosely.
LOSSY_MIN_SNR_DB = 25.0
LOSSY_MAX_CER = 0.3


def _resampled(wav: np.ndarray, rate: int) -> np.ndarray:
    import torchaudio.functional as AF

    return AF.resample(torch.from_numpy(wav), SAMPLE_RATE, rate).numpy()


def _cer(ref: str, hyp: str) -> float:
    counts = align(char_tokens(ref), char_tokens(hyp)).counts
    return counts.errors / max(counts.tokens, 1)


def _snr_db(reference: np.ndarray, decoded: np.ndarray) -> float:
    n = min(len(reference), len(decoded))
    noise = float(((reference[:n] - decoded[:n]) ** 2).sum()) + 1e-12
    return 10 * np.log10(float((reference[:n] ** 2).sum()) / noise)


def _overstate_mp3_length(path: Path, frames: int = 0x7FFFFF00) -> None:
    """Rewrite the Xing/Info tag's frame count, so the header promises ~10^12 samples (a damaged tag)."""
    data = bytearray(path.read_bytes())
    at = max(data.find(b"Xing"), data.find(b"Info"))
    if at < 0 or not data[at + 7] & 1:
        pytest.skip("this MP3 encoder wrote no Xing/Info frame count")
    data[at + 8 : at + 12] = frames.to_bytes(4, "big")
    path.write_bytes(bytes(data))


def _bytes_name(folder: Path, name: bytes) -> str:
    """The str Python uses for ``folder/name`` when ``name`` is not UTF-8 (lone surrogates, as os.listdir gives)."""
    return os.fsdecode(os.fsencode(folder) + b"/" + name)


@pytest.fixture(scope="module")
def model(overfit_model_dir) -> Path:
    return overfit_model_dir[0]


@pytest.fixture(scope="module")
def utts(overfit_model_dir) -> list[tuple[Path, str]]:
    return overfit_model_dir[1]


# ------------------------------------------------------------------------------------------ the batch


class Batch:
    """The files of the hostile batch, what each should give, and what the process printed."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.exact: dict[str, str] = {}  # path -> the transcript it must give
        self.lossy: dict[str, tuple[str, np.ndarray]] = {}  # path -> (text, source samples at 16 kHz)
        self.same_as: dict[str, str] = {}  # path -> another path whose transcript it must equal
        self.bad: dict[str, str] = {}  # path -> a fragment of its error line
        self.inputs: list[str] = []
        self.code = -1
        self.out = self.err = ""
        self.texts: dict[str, str] = {}  # printable path -> transcript, from stdout
        self.errors: dict[str, list[str]] = {}  # printable path -> its error lines


def _good_files(batch: Batch, utts) -> None:
    good = batch.folder / "good"
    good.mkdir()

    def speech(i: int) -> tuple[np.ndarray, str]:
        wav, text = utts[i]
        return load_audio(wav).numpy(), text

    w, text = speech(0)
    sf.write(good / "ch8_pcm16.wav", np.stack([w] * 8, axis=1), SAMPLE_RATE, subtype="PCM_16")
    batch.exact[str(good / "ch8_pcm16.wav")] = text
    for rate in (48000, 192000):
        w, text = speech(1 if rate == 48000 else 2)
        sf.write(good / f"rate_{rate}.wav", _resampled(w, rate), rate, subtype="PCM_16")
        batch.exact[str(good / f"rate_{rate}.wav")] = text
    # 8 kHz keeps only the band below 4 kHz and the overfit model, trained on wideband speech, does not recognise
    # narrowband speech: the 8 kHz file must give what the same band-limited signal gives as a 16 kHz file.
    w, _ = speech(3)
    sf.write(good / "rate_8000.wav", _resampled(w, 8000), 8000, subtype="PCM_16")
    sf.write(good / "rate_8000_as_16k.wav", load_audio(good / "rate_8000.wav").numpy(), SAMPLE_RATE, subtype="FLOAT")
    batch.same_as[str(good / "rate_8000.wav")] = str(good / "rate_8000_as_16k.wav")
    for name, subtype, i in [("pcm24", "PCM_24", 4), ("float32", "FLOAT", 5), ("float64", "DOUBLE", 6)]:
        w, text = speech(i)
        sf.write(good / f"{name}.wav", w, SAMPLE_RATE, subtype=subtype)
        batch.exact[str(good / f"{name}.wav")] = text
    # A rate sharing few factors with 16 kHz: resampled from 22050 Hz (45 ppm off) instead of building a 6 GB kernel.
    w, text = speech(7)
    sf.write(good / "rate_22051.wav", _resampled(w, 22050), 22051, subtype="FLOAT")
    batch.exact[str(good / "rate_22051.wav")] = text
    sf.write(good / "one_sample.wav", np.array([0.1], np.float32), SAMPLE_RATE)
    batch.exact[str(good / "one_sample.wav")] = ""  # nothing to hear: an empty transcript, not an error
    w, text = speech(8)
    raw = _bytes_name(good, b"caf\xe9_latin1.wav")  # a Latin-1 name: not UTF-8
    sf.write(os.fsencode(raw), w, SAMPLE_RATE)
    batch.exact[raw] = text

    formats = sf.available_formats()
    lossy = [("MP3", "mp3", None, 44100, 9), ("OGG", "ogg", "VORBIS", 48000, 10), ("OGG", "opus", "OPUS", 48000, 11)]
    for fmt, ext, subtype, rate, i in lossy:
        if fmt not in formats or (subtype and subtype not in sf.available_subtypes(fmt)):
            continue  # reported by test_lossy_formats_are_available
        w, text = speech(i)
        path = good / f"best_quality.{ext}"
        mode = "CONSTANT" if fmt == "MP3" else None
        sf.write(path, _resampled(w, rate), rate, format=fmt, subtype=subtype, compression_level=0.0, bitrate_mode=mode)
        batch.lossy[str(path)] = (text, w)
    if "MP3" in formats:
        # A damaged Xing tag promising 10^12 samples: decoded for what the file holds (the long-file path).
        w, text = speech(12)
        path = good / "overstated_length.mp3"
        sf.write(path, _resampled(w, 44100), 44100, format="MP3", compression_level=0.0)
        _overstate_mp3_length(path)
        batch.lossy[str(path)] = (text, w)

    # A directory that links back to itself: searched once, each file listed once.
    loop = good / "loop"
    loop.mkdir()
    w, text = speech(13)
    sf.write(loop / "inside.wav", w, SAMPLE_RATE)
    batch.exact[str(loop / "inside.wav")] = text
    os.symlink("..", loop / "up")  # loop/up -> good (which holds loop again)
    os.symlink(".", loop / "again.d")  # loop/again.d -> loop
    batch.inputs += [str(good), str(loop / "again.d")]  # the loop again, through its link: nothing added


def _bad_files(batch: Batch, utts) -> None:
    bad = batch.folder / "bad"
    bad.mkdir()
    rng = np.random.default_rng(9)
    w = load_audio(utts[14][0]).numpy()
    sf.write(bad / "valid.wav", w, SAMPLE_RATE)
    data = (bad / "valid.wav").read_bytes()
    (bad / "valid.wav").unlink()

    def add(name: str, content: bytes | None, reason: str) -> None:
        path = bad / name
        if content is not None:
            path.write_bytes(content)
        batch.bad[str(path)] = reason

    add("empty.wav", b"", "not a readable audio file (the file is empty)")
    os.mkfifo(bad / "pipe.wav")  # opening it would wait for a writer for ever
    add("pipe.wav", None, "not a readable audio file (not a regular file: a pipe; save the audio to a file)")
    (bad / "zero.wav").symlink_to("/dev/zero")  # endless: reading it would never end
    add("zero.wav", None, "not a readable audio file (not a regular file: a device; save the audio to a file)")
    sf.write(bad / "zero_samples.wav", np.zeros(0, np.float32), SAMPLE_RATE)
    add("zero_samples.wav", None, "holds no audio samples")
    add(
        "header_only.wav",
        data[:44],
        f"truncated: its header declares {len(data) - 44} bytes of audio, the file holds 0",
    )
    add("cut_in_header.wav", data[:30], "not a readable audio file")
    add("cut_in_data.wav", data[: len(data) // 2], "truncated")
    for ext in ("wav", "flac", "mp3", "ogg"):
        add(f"random_bytes.{ext}", rng.integers(0, 256, 5000, dtype=np.uint8).tobytes(), "not a readable audio file")
    for name, value in [("nan", np.nan), ("inf", np.inf), ("minus_inf", -np.inf)]:
        samples = w.copy()
        samples[len(samples) // 2] = value
        sf.write(bad / f"{name}.wav", samples, SAMPLE_RATE, subtype="FLOAT")
        add(f"{name}.wav", None, "it holds NaN or infinite samples")
    sf.write(bad / "rate_100hz.wav", w[:1000], 100)
    add("rate_100hz.wav", None, f"its sample rate, 100 Hz, is below {MIN_FILE_RATE} Hz")
    os.symlink("nowhere.wav", bad / "dangling.wav")
    add("dangling.wav", None, "no such file")
    os.symlink("self_loop.wav", bad / "self_loop.wav")
    add("self_loop.wav", None, "Too many levels of symbolic links")
    raw = _bytes_name(bad, b"random_\xff.wav")
    with open(os.fsencode(raw), "wb") as f:
        f.write(rng.integers(0, 256, 3000, dtype=np.uint8).tobytes())
    batch.bad[raw] = "not a readable audio file"
    if os.geteuid() != 0:  # root reads anything: test_unreadable_file_is_one_error_line says so
        sf.write(bad / "unreadable.wav", w, SAMPLE_RATE)
        (bad / "unreadable.wav").chmod(0)
        add("unreadable.wav", None, "Permission denied")
    batch.inputs.append(str(bad))


def _run_cli(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}
    command = [sys.executable, "-m", "srupp_asr.cli", "transcribe", *args]
    return subprocess.run(command, capture_output=True, env=env, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def batch(model, utts, tmp_path_factory) -> Batch:
    result = Batch(tmp_path_factory.mktemp("hostile"))
    _good_files(result, utts)
    _bad_files(result, utts)
    done = _run_cli(["--model", str(model), "--decoding", "ctc_greedy", "--threads", "2", *result.inputs])
    result.code = done.returncode
    result.out = done.stdout.decode("utf-8")  # strict: what was printed is valid UTF-8
    result.err = done.stderr.decode("utf-8")
    for line in result.out.splitlines():
        path, _, text = line.partition("\t")
        assert path not in result.texts, f"listed twice: {path}"
        result.texts[path] = text
    for line in result.err.splitlines()[:-1]:
        assert line.startswith(ERROR_PREFIX), f"not an error line: {line!r}\n{result.err}"
        named = [p for p in map(printable, result.bad) if line.startswith(f"{ERROR_PREFIX}{p}: ")]
        assert len(named) == 1, f"names no bad file: {line!r}"
        result.errors.setdefault(named[0], []).append(line)
    return result


def test_the_batch_goes_on_and_the_exit_code_counts_the_failures(batch):
    assert "Traceback" not in batch.err
    assert batch.code == 1, batch.err  # some inputs failed (the closing line counts them)
    # Every line of stderr is an error naming a bad file, or the summary: no library chatter.
    assert len(batch.err.splitlines()) == len(batch.bad) + 1, batch.err
    good = len(batch.exact) + len(batch.lossy) + 2 * len(batch.same_as)  # same_as: the 8 kHz file and its twin
    match = SUMMARY.match(batch.err.splitlines()[-1])
    assert match and (int(match[1]), int(match[2])) == (good, len(batch.bad)), batch.err.splitlines()[-1]
    assert len(batch.texts) == good


def _good_names(kind: str) -> list[str]:
    return {
        "exact": [
            "ch8_pcm16.wav",
            "rate_48000.wav",
            "rate_192000.wav",
            "pcm24.wav",
            "float32.wav",
            "float64.wav",
            "rate_22051.wav",
            "one_sample.wav",
            "caf\\xe9_latin1.wav",
            "loop/inside.wav",
        ],
        "lossy": ["best_quality.mp3", "best_quality.ogg", "best_quality.opus", "overstated_length.mp3"],
    }[kind]


def _find(paths, name: str) -> str:
    found = [p for p in paths if printable(p).endswith(f"/{name}")]
    if not found:
        pytest.skip(f"{name} was not made here (its format is missing)")
    return found[0]


@pytest.mark.parametrize("name", _good_names("exact"))
def test_a_good_file_gives_the_exact_transcript(batch, name):
    path = _find(batch.exact, name)
    assert batch.texts[printable(path)] == batch.exact[path]


def test_8_khz_gives_the_transcript_of_the_same_signal_at_16_khz(batch):
    ((path, twin),) = batch.same_as.items()
    assert batch.texts[path] == batch.texts[twin]


@pytest.mark.parametrize("name", _good_names("lossy"))
def test_a_lossy_file_decodes_to_the_same_speech(batch, name):
    path = _find(batch.lossy, name)
    text, source = batch.lossy[path]
    decoded = load_audio(path).numpy()
    assert abs(len(decoded) - len(source)) <= 0.05 * SAMPLE_RATE  # its real length, whatever its header says
    assert _snr_db(source, decoded) >= LOSSY_MIN_SNR_DB
    assert _cer(text, batch.texts[path]) <= LOSSY_MAX_CER, (text, batch.texts[path])


@pytest.mark.parametrize(
    "name",
    [
        "empty.wav",
        "zero_samples.wav",
        "header_only.wav",
        "cut_in_header.wav",
        "cut_in_data.wav",
        "random_bytes.wav",
        "random_bytes.flac",
        "random_bytes.mp3",
        "random_bytes.ogg",
        "nan.wav",
        "inf.wav",
        "minus_inf.wav",
        "rate_100hz.wav",
        "dangling.wav",
        "self_loop.wav",
        "random_\\xff.wav",
    ],
)
def test_a_bad_file_gets_one_error_line_naming_it(batch, name):
    path = _find(batch.bad, name)
    lines = batch.errors.get(printable(path), [])
    assert len(lines) == 1, batch.err
    assert batch.bad[path] in lines[0]
    assert printable(path) not in batch.texts


def test_lossy_formats_are_available():
    formats = sf.available_formats()
    missing = [f for f in ("MP3", "OGG") if f not in formats]
    if "OGG" in formats and "OPUS" not in sf.available_subtypes("OGG"):
        missing.append("OGG/OPUS")
    if missing:
        pytest.skip(f"this libsndfile ({sf.__libsndfile_version__}) cannot write {', '.join(missing)}")


def test_unreadable_file_is_one_error_line(batch):
    if os.geteuid() == 0:
        pytest.skip("running as root, which can read a file whatever its permissions")
    path = _find(batch.bad, "unreadable.wav")
    (line,) = batch.errors[path]
    assert line == f"{ERROR_PREFIX}{path}: not a readable audio file (Permission denied)"


def test_a_file_the_os_refuses_is_one_error_line_and_the_batch_goes_on(monkeypatch, capsys, model, utts, tmp_path):
    # The same as chmod 000 for a non-root user, wherever the tests run (as root too): the OS refuses the open.
    import builtins

    import srupp_asr.audio

    locked = tmp_path / "locked.wav"
    shutil.copy(utts[15][0], locked)

    def refusing_open(file, *args, **kwargs):
        if os.fspath(file) == str(locked):
            raise PermissionError(13, "Permission denied", str(locked))
        return builtins.open(file, *args, **kwargs)

    monkeypatch.setattr(srupp_asr.audio, "open", refusing_open, raising=False)
    code = main(["transcribe", "--model", str(model), "--decoding", "ctc_greedy", str(locked), str(utts[16][0])])
    out, err = capsys.readouterr()
    assert code == 1
    assert out == f"{utts[16][0]}\t{utts[16][1]}\n"
    assert err.splitlines()[0] == f"{ERROR_PREFIX}{locked}: not a readable audio file (Permission denied)"


def test_non_utf8_names_are_written_and_printed_escaped(model, utts, tmp_path):
    good = _bytes_name(tmp_path, b"caf\xe9.wav")
    sf.write(os.fsencode(good), load_audio(utts[17][0]).numpy(), SAMPLE_RATE)
    bad = _bytes_name(tmp_path, b"bad\xff.wav")
    with open(os.fsencode(bad), "wb") as f:
        f.write(b"not audio at all" * 10)
    out_dir = tmp_path / "out"
    done = _run_cli(["--model", str(model), "--decoding", "ctc_greedy", "-f", "all", "-o", str(out_dir), good, bad])
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


FORMATS = ("txt", "json", "srt", "vtt", "tsv")


def test_printable_escapes_only_what_is_not_utf8():
    assert printable("plain/naïve 日本.wav") == "plain/naïve 日本.wav"
    assert printable(os.fsdecode(b"caf\xe9.wav")) == "caf\\xe9.wav"
    assert printable("lone \ud800 surrogate") == "lone \\ud800 surrogate"


# ------------------------------------------------------------------------------------------ links


def test_symlink_loops_end_the_search_and_list_each_file_once(tmp_path):
    tree = tmp_path / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    for name in ("x.wav", "a/y.wav", "a/b/z.wav"):
        (tree / name).write_bytes(b"x")
    os.symlink("../..", tree / "a" / "b" / "up")  # back to tree
    os.symlink(".", tree / "a" / "here")
    os.symlink("x.wav", tree / "x_again.wav")  # a second name for x.wav
    files, problems = find_inputs([tree, tree / "a" / "b" / "up", tree / "a" / "here", tree / "x.wav"])
    assert problems == []
    assert sorted(os.path.relpath(f, tree) for f in files) == ["a/b/z.wav", "a/y.wav", "x.wav"]


# ------------------------------------------------------------------------------------------ the rate guard


# ------------------------------------------------------------------------------------------ MP3 specifics


def test_an_mp3_whose_header_overstates_its_length_is_read_for_what_it_holds(tmp_path, model, utts):
    if "MP3" not in sf.available_formats():
        pytest.skip("libsndfile without MP3")
    wav, _ = utts[18]
    sf.write(tmp_path / "a.mp3", load_audio(wav).numpy(), SAMPLE_RATE, format="MP3")
    intact = load_audio(tmp_path / "a.mp3")
    _overstate_mp3_length(tmp_path / "a.mp3")
    with AudioReader(tmp_path / "a.mp3") as reader:
        assert reader.num_samples > 10**9  # what the header claims
    assert load_audio(tmp_path / "a.mp3").numel() == pytest.approx(intact.numel(), abs=2304)
    (t,) = transcribe(tmp_path / "a.mp3", model, decoding="ctc_greedy")  # the chunked path, as the claim is long
    assert t.duration == pytest.approx(intact.numel() / SAMPLE_RATE, abs=0.15)
    assert len(t.chunks) <= 2 and t.chunks[-1][1] <= t.duration + 1e-6


def test_vad_on_a_recording_without_silence_gives_no_empty_chunk(model, tmp_path):
    # Where the VAD finds no silence near the end, the plan covers the rest with overlapping chunks and then adds an
    # empty one (5.0, 5.0): it is dropped, not decoded, and not listed in the transcript's chunks.
    noise = 0.05 * np.random.default_rng(4).standard_normal(5 * SAMPLE_RATE).astype(np.float32)
    sf.write(tmp_path / "noise.wav", noise, SAMPLE_RATE)
    (t,) = transcribe(tmp_path / "noise.wav", model, decoding="ctc_greedy", vad=True, max_chunk_seconds=2.0)
    assert len(t.chunks) >= 3 and all(end > start for start, end in t.chunks)
    assert t.chunks[-1][1] == pytest.approx(5.0) and t.duration == pytest.approx(5.0)


# ------------------------------------------------------------------------------------------ long files, memory


def _transcribe_measured(model: Path, audio: Path, folder: Path) -> tuple[float, float]:
    """Transcribe ``audio`` in a fresh process (JSON into ``folder``): its own peak RSS in MiB (VmHWM, polled: wait4's
    ru_maxrss would also count a compiler building the CPU extension) and its wall seconds."""
    command = [sys.executable, "-m", "srupp_asr.cli", "transcribe", "-q", "--model", str(model), "--threads", "2"]
    command += ["--decoding", "ctc_greedy", "-f", "json", "-o", str(folder), str(audio)]
    peak, begin = 0.0, time.perf_counter()
    with open(folder / "stderr.txt", "wb") as err:
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
        while child.poll() is None:
            with contextlib.suppress(OSError, StopIteration, ValueError):
                status = Path(f"/proc/{child.pid}/status").read_text().splitlines()
                peak = max(peak, int(next(x for x in status if x.startswith("VmHWM:")).split()[1]) / 1024)
            time.sleep(0.2)
    assert child.returncode == 0, (folder / "stderr.txt").read_text()
    return peak, time.perf_counter() - begin


@pytest.mark.slow
def test_a_ten_hour_file_is_transcribed_with_bounded_memory(model, utts, tmp_path):
    # The default settings: 600 s chunks, the most audio decoded at once. The overfit model, trained on tight
    # utterances, garbles them inside long silence (its text is exact only without padding), so what is checked is
    # where the words land: in every 5-minute period, starting within its utterance, nowhere else - no stretch of
    # the 10 hours lost, repeated or shifted by the streaming.
    if not Path("/proc/self/status").exists():
        pytest.skip("needs /proc to read a process's peak memory")
    hours, period = 10, 300.0  # an utterance in the middle of every 5 minutes, silence around it
    path = tmp_path / "ten_hours.wav"
    spans = []
    with sf.SoundFile(path, "w", SAMPLE_RATE, 1, subtype="PCM_16") as f:  # 1.15 GB, written 5 minutes at a time
        for k in range(int(hours * 3600 / period)):
            speech = load_audio(utts[k % len(utts)][0]).numpy()
            block = np.zeros(int(period * SAMPLE_RATE), np.float32)
            at = len(block) // 2
            block[at : at + len(speech)] = speech
            f.write(block)
            spans.append((k * period + at / SAMPLE_RATE, k * period + (at + len(speech)) / SAMPLE_RATE))
    assert path.stat().st_size > 1e9

    (tmp_path / "short").mkdir()
    baseline, _ = _transcribe_measured(model, utts[0][0], tmp_path / "short")  # Python, torch and the model
    peak, _ = _transcribe_measured(model, path, tmp_path)
    path.unlink()
    whole = hours * 3600 * SAMPLE_RATE * 4 / 2**20  # the recording at once as float32: 2,197 MiB
    assert peak - baseline < 1024 < whole / 2, f"peak RSS {peak:.0f} MiB, {peak - baseline:.0f} above a short run"
    data = json.loads((tmp_path / "ten_hours.json").read_text())
    assert data["duration"] == pytest.approx(hours * 3600, abs=0.01)
    words = [w for s in data["segments"] for w in s["words"]]
    found = {}
    for w in words:
        k = int(w["start"] // period)
        start, end = spans[k]
        # A word starts within its utterance; it may end late (the overfit model sometimes emits a lone letter,
        # with no word boundary, when the next utterance begins: its word then spans the silence), not later.
        following = spans[k + 1][0] if k + 1 < len(spans) else hours * 3600
        assert start - 0.3 <= w["start"] <= end + 0.3 and w["end"] <= following + 0.3, (w, spans[k])
        found[k] = found.get(k, 0) + 1
    assert sorted(found) == list(range(len(spans)))  # every utterance heard, in its place


@pytest.mark.parametrize("long", [False, True], ids=["batched", "long-form"])
def test_an_unexpected_error_on_one_file_is_one_line_and_the_batch_goes_on(monkeypatch, capsys, model, utts, long):
    # A bug that strikes one file (here: decoding raising on it) must cost that file only.
    import importlib

    victim, fine = utts[15], utts[16]
    worker = importlib.import_module("srupp_asr.transcribe")._Transcriber  # the package exports a function so named
    method = "run_long" if long else "run_batch"
    original = getattr(worker, method)

    def failing(self, jobs, *args):
        if any(job.path == str(victim[0]) for job in (jobs if isinstance(jobs, list) else [jobs])):
            raise RuntimeError("simulated bug\nwith a second line")
        return original(self, jobs, *args)

    monkeypatch.setattr(worker, method, failing)
    args = ["transcribe", "--model", str(model), "--decoding", "ctc_greedy", str(victim[0]), str(fine[0])]
    if long:  # every file goes through the chunked long-form path
        args += ["--max-chunk-seconds", "1"]
    code = main(args)
    out, err = capsys.readouterr()
    assert code == 1
    assert f"{fine[0]}\t" in out
    errors = [line for line in err.splitlines() if line.startswith(ERROR_PREFIX)]
    assert errors == [f"{ERROR_PREFIX}{victim[0]}: internal error (RuntimeError: simulated bug); please report it"]


# ------------------------------------------------------------------------------------------ truncated Ogg and MP3


# ------------------------------------------------------------------------------------------ loud float files


# ------------------------------------------------------------------------------------------ a batch of odd inputs


WARNING_PREFIX = "srupp-asr transcribe: warning: "


class OddBatch:
    """One CLI run over good files with odd names, a missing @LIST, a loud file and a truncated Ogg file."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.good: dict[str, str] = {}  # path -> its transcript
        self.inputs: list[str] = []
        self.code = -1
        self.out: list[str] = []
        self.err: list[str] = []


@pytest.fixture(scope="module")
def odd_batch(model, utts, tmp_path_factory) -> OddBatch:
    batch = OddBatch(tmp_path_factory.mktemp("odd"))
    folder = batch.folder
    for i, name in enumerate(["plain.wav", "two\nlines\tand tab.wav", "esc\x1b[2Jape.wav"]):
        shutil.copy(utts[i][0], folder / name)
        batch.good[str(folder / name)] = utts[i][1]
    (folder / "bad\nsrupp-asr transcribe: error: fake.wav").write_bytes(b"not audio" * 20)
    sf.write(folder / "loud.wav", load_audio(utts[3][0]).numpy() * 32768, SAMPLE_RATE, subtype="FLOAT")
    if ("OGG", "VORBIS", "ogg") in lossy_formats():
        sf.write(folder / "cut.ogg", load_audio(utts[4][0]).numpy(), SAMPLE_RATE, format="OGG", subtype="VORBIS")
        data = (folder / "cut.ogg").read_bytes()
        (folder / "cut.ogg").write_bytes(data[: len(data) // 2])
    names = sorted(os.listdir(folder))
    batch.inputs = [str(folder / names[0]), f"@{folder / 'missing.txt'}", *(str(folder / n) for n in names[1:])]
    done = _run_cli(["--model", str(model), "--decoding", "ctc_greedy", "--threads", "2", *batch.inputs])
    batch.code = done.returncode
    batch.out = done.stdout.decode("utf-8").splitlines()
    batch.err = done.stderr.decode("utf-8").splitlines()
    return batch


def _errors(batch: OddBatch) -> list[str]:
    return [line for line in batch.err if line.startswith(ERROR_PREFIX)]


def test_a_missing_list_is_one_error_and_the_other_inputs_are_transcribed(odd_batch):
    assert f"{ERROR_PREFIX}{odd_batch.folder / 'missing.txt'}: list file not found" in odd_batch.err
    assert len(odd_batch.out) == len(odd_batch.good) + 1  # the good files and the loud one
    cut = (odd_batch.folder / "cut.ogg").exists()
    assert len(_errors(odd_batch)) == 2 + cut  # the list, the bad file (and the cut Ogg file)
    assert odd_batch.code == 1
    assert "Traceback" not in "\n".join(odd_batch.err)


def test_control_characters_in_names_are_escaped_one_line_per_input(odd_batch):
    from srupp_asr.writers import printable_line

    for path, text in odd_batch.good.items():
        assert f"{printable_line(path)}\t{text}" in odd_batch.out
    bad = odd_batch.folder / "bad\\nsrupp-asr transcribe: error: fake.wav"
    assert f"{ERROR_PREFIX}{bad}: not a readable audio file (Format not recognised.)" in odd_batch.err
    # Every line is an error, the loud file's warning or the summary: no name broke or faked a line.
    assert all(line.startswith((ERROR_PREFIX, WARNING_PREFIX)) for line in odd_batch.err[:-1]), odd_batch.err
    assert len(odd_batch.err) == len(_errors(odd_batch)) + 2
    assert SUMMARY.match(odd_batch.err[-1])


def test_a_loud_float_file_is_transcribed_with_one_warning_naming_it(odd_batch):
    loud = odd_batch.folder / "loud.wav"
    peak = float(np.abs(sf.read(loud, dtype="float32")[0]).max())
    assert [line for line in odd_batch.err if line.startswith(WARNING_PREFIX)] == [
        f"{WARNING_PREFIX}{loud}: its samples reach {peak:.3g} times full scale (audio should lie within +-1); "
        "clipped, they may give a wrong transcript (a float file written at integer scale?)"
    ]
    assert any(line.startswith(f"{loud}\t") for line in odd_batch.out)


def test_a_truncated_ogg_file_in_a_batch_is_one_error_naming_it(odd_batch):
    cut = odd_batch.folder / "cut.ogg"
    if not cut.exists():
        pytest.skip("this libsndfile cannot write Ogg Vorbis")
    assert [line for line in _errors(odd_batch) if str(cut) in line] == [
        f"{ERROR_PREFIX}{cut}: not a readable audio file (truncated: its last Ogg page is cut short)"
    ]
