"""The batched decode driver ``transcribe`` and ``evaluate`` share (:mod:`srupp_asr.decoding.batch`): results in
input order whatever the batching, one recording's failure its own, chunked or whole by the limits; and the module
layering that keeps ``transcribe`` from importing the API module that calls it."""

from __future__ import annotations

import ast
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from srupp_asr.audio import SAMPLE_RATE, AudioReader, SamplesReader
from srupp_asr.decoding import DecodingOptions
from srupp_asr.decoding.batch import (
    BatchDecoder,
    Batching,
    Recording,
    UnusableModel,
    _union_seconds,
    concurrent_batches,
)
from srupp_asr.errors import UserError
from srupp_asr.loading import LoadedModel
from srupp_asr.runtime import features
from srupp_asr.runtime.features import apply_cmvn

GREEDY = DecodingOptions("ctc_greedy")


@pytest.fixture(scope="module")
def loaded(overfit_model_dir):
    return LoadedModel.load(overfit_model_dir[0], device="cpu")


def _file(path: Path) -> Recording:
    with AudioReader(path) as reader:
        return Recording(str(path), reader.num_samples, lambda: AudioReader(path))


def _unreadable(name: str, num_samples: int) -> Recording:
    def open_it():
        raise UserError(f"{name}: not a readable audio file")

    return Recording(name, num_samples, open_it)


def test_results_come_in_input_order_and_a_failure_is_that_recordings_own(loaded, overfit_model_dir):
    utts = overfit_model_dir[1]
    files = [_file(w) for w, _ in utts[:5]]
    recordings = [files[0], _unreadable("gone.wav", 99_999_999 // 1000), *files[1:]]
    decoder = BatchDecoder(loaded.net, loaded.tokenizer, GREEDY, batching=Batching(batch_size=3), name="m")
    steps: list[float] = []
    results = list(decoder.run(recordings, steps.append))
    assert [r.recording.name for r in results] == [r.name for r in recordings]
    assert str(results[1].error) == "gone.wav: not a readable audio file" and results[1].text == ""
    assert [r.text for r in results if r.error is None] == [t for _, t in utts[:5]]
    assert all(r.chunks == [(0.0, r.num_samples / SAMPLE_RATE)] for r in results if r.error is None)
    assert all(r.seconds > 0 and 0 < r.decode_seconds <= r.seconds for r in results if r.error is None)
    assert len(steps) == 2  # 6 recordings, 3 at a time: one progress step per batch
    decoded = sum(r.num_samples for r in results if r.error is None) + recordings[1].num_samples
    assert sum(steps) == pytest.approx(decoded / SAMPLE_RATE)


def test_the_limits_decide_whole_or_chunked(loaded, overfit_model_dir):
    """Without limits (``evaluate``'s) a recording is decoded whole however long; with ``transcribe``'s a recording
    longer than the budget is read and decoded in chunks, its words in absolute times."""
    wav, text = overfit_model_dir[1][0]
    audio = torch.from_numpy(sf.read(wav, dtype="float32")[0])
    twice = torch.cat([audio, torch.zeros(SAMPLE_RATE), audio])
    recording = Recording("twice", twice.numel(), lambda: SamplesReader(twice.numpy(), SAMPLE_RATE, name="twice"))
    (whole,) = BatchDecoder(loaded.net, loaded.tokenizer, GREEDY).run([recording])
    assert whole.chunks == [(0.0, twice.numel() / SAMPLE_RATE)]
    limits = Batching.chunked(GREEDY, batch_size=2, max_chunk_seconds=audio.numel() / SAMPLE_RATE + 0.5,
                              chunk_overlap=0.0, vad=True)  # fmt: skip
    (chunked,) = BatchDecoder(loaded.net, loaded.tokenizer, GREEDY, batching=limits).run([recording])
    assert len(chunked.chunks) == 3 and chunked.chunks[-1][1] == pytest.approx(twice.numel() / SAMPLE_RATE)
    # The first utterance's chunk is exact; the second holds some of the pause, which the overfit model garbles.
    assert chunked.text.startswith(f"{text} ") and chunked.text != text
    assert chunked.words[-1].start > chunked.chunks[-1][0]  # shifted to the recording's time
    # the attention modes cut pieces of ATTENTION_PIECE_SECONDS at pauses, whatever the budget
    joint = Batching.chunked(DecodingOptions("joint"), 8, 600.0, 10.0, vad=False)
    assert (joint.piece_samples, joint.overlap_samples, joint.vad) == (10 * SAMPLE_RATE, 10 * SAMPLE_RATE // 4, True)
    assert Batching.chunked(GREEDY, 8, 600.0, 10.0, vad=False).piece_samples == 600 * SAMPLE_RATE


def test_chunks_start_on_the_models_frame_grid_in_a_pause_and_see_the_whole_recordings_frames(
    loaded, overfit_model_dir
):
    """Overlapping chunks start in the quietest moment within reach (here the pause between two utterances) on the
    encoder's frame grid, so a chunk's subsampled features are those of the whole recording from its start on (a
    chunk a quarter frame off can make a model hear a word differently)."""
    wav, _ = overfit_model_dir[1][0]
    audio = torch.from_numpy(sf.read(wav, dtype="float32")[0])
    pause = 1e-4 * torch.randn(round(0.5 * SAMPLE_RATE), generator=torch.Generator().manual_seed(0))
    heard = torch.nonzero(audio.abs() > 0.01 * audio.abs().max())  # the utterance's own first and last sound
    long = torch.cat([audio, pause, audio, pause, audio])
    budget = (audio.numel() + pause.numel()) / SAMPLE_RATE + 0.3  # a chunk's second half reaches the first pause
    limits = Batching.chunked(GREEDY, batch_size=1, max_chunk_seconds=budget, chunk_overlap=0.25, vad=False)
    decoder = BatchDecoder(loaded.net, loaded.tokenizer, GREEDY, batching=limits)
    with SamplesReader(long.numpy(), SAMPLE_RATE) as reader:
        chunks, silences = decoder.plan(reader)
    grid = round(loaded.net.frame_shift * SAMPLE_RATE)
    assert silences == [] and grid == 640 and len(chunks) >= 3
    assert all(c.start % grid == 0 for c in chunks)
    assert heard.max() < chunks[1].start < audio.numel() + pause.numel() + heard.min()  # in the pause
    acoustic = loaded.net.acoustic  # float32 on the CPU: the numpy runtime's network decodes the chunks
    net = LoadedModel.load(overfit_model_dir[0], device="cpu", engine="torch").net  # and the torch one, if asked

    def subsampled_numpy(samples: torch.Tensor) -> torch.Tensor:
        feats, lens = features.fbank(samples.numpy()[None], np.array([samples.numel()]))
        return torch.from_numpy(acoustic.subsampling.forward(apply_cmvn(feats, lens, *acoustic.cmvn), lens)[0][0])

    def subsampled_torch(samples: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            feats, lens = net.fbank(samples[None], torch.tensor([samples.numel()]))
            return net.subsampling(net.cmvn(feats, lens), lens)[0][0]

    for subsampled in (subsampled_numpy, subsampled_torch):
        whole = subsampled(long)
        for chunk in chunks[1:]:
            part = subsampled(long[chunk.start : chunk.end])
            offset = chunk.start // grid
            torch.testing.assert_close(part[:-2], whole[offset : offset + len(part) - 2], rtol=1e-4, atol=1e-4)


def test_a_model_that_cannot_decode_as_asked_stops_everything(loaded, overfit_model_dir, monkeypatch):
    decoder = BatchDecoder(loaded.net, loaded.tokenizer, DecodingOptions("joint"), name="the-model")
    monkeypatch.setattr(loaded.net, "decoder", None)
    with pytest.raises(UnusableModel, match=r"^the-model: mode joint .* needs an attention decoder"):
        list(decoder.run([_file(overfit_model_dir[1][0][0])]))


@pytest.fixture
def two_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


def _decode_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("srupp-asr decode")]  # (alive ones)


def test_two_workers_decode_two_batches_at_once_with_the_same_results(loaded, overfit_model_dir, two_threads):
    """On the CPU, ``workers=2`` decodes two batches at once, each on its own thread with half the torch threads:
    the same transcripts in input order, a failure still its own, one progress step per batch, and the seconds of the
    results add up to the wall time (overlapping batches are not counted twice)."""
    utts = overfit_model_dir[1]
    recordings = [_file(utts[0][0]), _unreadable("gone.wav", 1000), *[_file(w) for w, _ in utts[1:6]]]
    alone = list(BatchDecoder(loaded.net, loaded.tokenizer, GREEDY, batching=Batching(batch_size=2)).run(recordings))
    decoder = BatchDecoder(loaded.net, loaded.tokenizer, GREEDY, batching=Batching(batch_size=2, workers=2))
    seen: set[tuple[str, int]] = set()
    decode_batch = decoder.decode_batch

    def spy(batch):
        seen.add((threading.current_thread().name, torch.get_num_threads()))
        return decode_batch(batch)

    decoder.decode_batch = spy
    steps: list[float] = []
    begin = time.perf_counter()
    results = list(decoder.run(recordings, steps.append))
    wall = time.perf_counter() - begin
    assert [r.recording.name for r in results] == [r.name for r in recordings]
    assert [r.text for r in results] == [r.text for r in alone] and results[1].error is not None
    assert [r.text for r in results if r.error is None] == [t for _, t in utts[:6]]
    assert seen and seen <= {("srupp-asr decode 0", 1), ("srupp-asr decode 1", 1)}  # (which takes what: the OS's)
    assert len(steps) == 4 and torch.get_num_threads() == 2  # the threads are given back
    assert 0 < sum(r.seconds for r in results) <= wall
    assert all(0 < r.decode_seconds <= r.seconds for r in results if r.error is None)


def test_a_failed_batch_stops_the_workers_at_its_turn(loaded, overfit_model_dir, two_threads, monkeypatch):
    """An error that stops everything (a model unusable for the options) is raised in order, after the results
    before it, without waiting for the batches being decoded; the workers take no batch after those, and a caller
    that stops reading stops them too."""
    recordings = sorted((_file(w) for w, _ in overfit_model_dir[1][:6]), key=lambda r: -r.num_samples)
    decoder = BatchDecoder(loaded.net, loaded.tokenizer, GREEDY, batching=Batching(batch_size=1, workers=2))
    decode_batch, taken = decoder.decode_batch, []
    failing = recordings[1]  # one recording a batch, longest first: batch k holds recordings[k]

    def slow(batch):
        taken.append(batch[0])
        if batch[0] is failing:
            raise UnusableModel("m: unusable")
        if batch[0] is not recordings[0]:
            time.sleep(2.0)  # still decoding when the caller stops
        return decode_batch(batch)

    monkeypatch.setattr(decoder, "decode_batch", slow)
    got = []
    with pytest.raises(UnusableModel, match=r"^m: unusable$"):
        for result in decoder.run(recordings):
            got.append(result.recording)
    assert got == recordings[:1] and torch.get_num_threads() == 2
    for thread in _decode_threads():  # (an exception does not wait for the batches being decoded)
        thread.join(timeout=60)
    assert not _decode_threads()
    assert len(taken) <= 4 and not {id(r) for r in recordings[4:]} & {id(r) for r in taken}
    failing = None
    taken.clear()
    results = decoder.run(recordings)
    assert next(results).recording is recordings[0]
    results.close()  # the caller stops reading
    for thread in _decode_threads():
        thread.join(timeout=60)
    assert not _decode_threads() and len(taken) <= 3 and torch.get_num_threads() == 2


def test_a_long_recordings_chunks_decode_two_batches_at_once_with_the_same_result(
    loaded, overfit_model_dir, two_threads
):
    """A recording longer than a piece is read a chunk at a time and, with ``workers=2``, two batches of its chunks
    decode at once: the same text, words and chunks as one batch at a time, and its decoding time is the wall time
    something was being decoded (not the sum of the overlapping batches' times)."""
    wav, _ = overfit_model_dir[1][0]
    audio = torch.from_numpy(sf.read(wav, dtype="float32")[0])
    pause = torch.zeros(SAMPLE_RATE // 2)
    long = torch.cat([audio, pause, audio, pause, audio, pause, audio])
    recording = Recording("long", long.numel(), lambda: SamplesReader(long.numpy(), SAMPLE_RATE, name="long"))
    budget = audio.numel() / SAMPLE_RATE + 0.5

    def decoded(workers: int):
        limits = Batching.chunked(GREEDY, 1, budget, 0.0, vad=True, workers=workers)
        decoder = BatchDecoder(loaded.net, loaded.tokenizer, GREEDY, batching=limits)
        names: set[str] = set()
        decode = decoder.decode

        def spy(wavs):
            names.add(threading.current_thread().name)
            return decode(wavs)

        decoder.decode = spy
        steps: list[float] = []
        (result,) = decoder.run([recording], steps.append)
        return result, names, steps

    one, one_names, one_steps = decoded(1)
    two, two_names, two_steps = decoded(2)
    assert len(one.chunks) >= 4 and one.error is None and two.error is None
    assert (two.text, two.chunks) == (one.text, one.chunks)
    # The same words at the same frames; a confidence may differ in float32's last bits, since a batch of other
    # chunks pads to another length (which changes how the matrix products' sums are split on some CPUs).
    assert [(w.text, w.start, w.end) for w in two.words] == [(w.text, w.start, w.end) for w in one.words]
    assert [w.confidence for w in two.words] == pytest.approx([w.confidence for w in one.words], rel=1e-5)
    assert one_names == {"MainThread"} and two_names and two_names <= {"srupp-asr decode 0", "srupp-asr decode 1"}
    assert sum(two_steps) == pytest.approx(sum(one_steps)) == pytest.approx(long.numel() / SAMPLE_RATE)
    assert 0 < two.decode_seconds <= two.seconds and torch.get_num_threads() == 2


# transcribe() through the API, two batches at once, then the interpreter's own exit (not the CLI's os._exit).
API_CHILD = """
import sys, torch
from srupp_asr.transcribe import transcribe
torch.set_num_threads(2)
out = transcribe(sys.argv[2:], sys.argv[1], batch_size=1, decoding="ctc_greedy", device="cpu")
print(len(out))
"""


def test_a_program_that_decoded_two_batches_at_once_exits_cleanly(overfit_model_dir):
    """The worker threads have ended when the decoding returns: one still ending as the interpreter exits aborted
    the process (``terminate called without an active exception``, exit status 134)."""
    model, utts = overfit_model_dir
    files = [str(w) for w, _ in utts[:4]]
    command = [sys.executable, "-c", API_CHILD, str(model), *files]
    # Three at once: without the join, about one child in three aborted.
    children = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for child in children:
        out, err = child.communicate(timeout=300)
        assert (child.returncode, out.strip()) == (0, "4"), err[-2000:]


# The command, each batch taking 3 s longer: SIGTERM / Ctrl-C once the first transcript is out.
# The child takes Ctrl-C as in a terminal even where the tests run as a background job, whose shell starts them with
# SIGINT ignored (Python then installs no KeyboardInterrupt handler).
SLOW_CLI = """
import signal, sys, time, torch
signal.signal(signal.SIGINT, signal.default_int_handler)
from srupp_asr.decoding import batch
decode_batch = batch.BatchDecoder.decode_batch
def slow(self, recordings):
    time.sleep(3.0)
    return decode_batch(self, recordings)
batch.BatchDecoder.decode_batch = slow
from srupp_asr.cli import console_main
sys.argv = ["srupp-asr", "transcribe", "--model", sys.argv[1], "--decoding", "ctc_greedy", "--batch-size", "1",
            "--threads", "2", "--device", "cpu", *sys.argv[2:]]
console_main()
"""


@pytest.mark.parametrize(("sig", "status", "line"), [
    (signal.SIGTERM, 143, "srupp-asr transcribe: terminated (SIGTERM)"),
    (signal.SIGINT, 130, "srupp-asr transcribe: interrupted"),
])  # fmt: skip
def test_the_command_stops_at_once_on_a_signal_while_two_batches_decode(overfit_model_dir, sig, status, line):
    """A signal stops ``transcribe`` without waiting for the batches the workers are decoding: one line, the
    signal's exit status, well within one batch's time."""
    model, utts = overfit_model_dir
    child = subprocess.Popen([sys.executable, "-c", SLOW_CLI, str(model), *[str(w) for w, _ in utts[:6]]],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert child.stdout.readline()  # the first transcript: the workers are on the next two batches
        child.send_signal(sig)
        start = time.perf_counter()
        _, err = child.communicate(timeout=60)
        took = time.perf_counter() - start
    finally:
        child.kill()
    assert child.returncode == status and err.strip().splitlines()[-1] == line, err[-2000:]
    assert took < 2.0


def test_concurrent_batches_on_a_cpu_with_threads_to_share(two_threads):
    assert concurrent_batches("cpu") == 2 and concurrent_batches("cuda") == 1
    torch.set_num_threads(1)
    assert concurrent_batches("cpu") == 1
    with pytest.raises(ValueError, match="workers must be at least 1"):
        Batching(workers=0)
    assert _union_seconds([(5.0, 6.0), (0.0, 2.0), (1.0, 3.0), (2.5, 2.75)]) == 4.0  # overlaps counted once


def _imports(module: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_transcribe_and_the_driver_do_not_import_the_api_module_that_calls_them():
    package = Path(__file__).resolve().parents[1] / "srupp_asr"
    assert "srupp_asr.transcribe" in _imports(package / "api.py")
    for module in ("transcribe.py", "decoding/batch.py", "scoring/evaluate.py"):
        assert not {"srupp_asr.api", "srupp_asr.transcribe"} & _imports(package / module), module
