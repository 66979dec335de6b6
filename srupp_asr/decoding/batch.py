"""The batched decode driver that ``transcribe`` and ``evaluate`` share: recordings in, each one's text and timed
words out, in input order.

:class:`BatchDecoder` decodes :class:`Recording` s (a length and a way to read the audio) with one loaded model,
its :class:`~srupp_asr.decoding.DecodingOptions` and an optional fusion LM, within :class:`Batching` limits:

- a recording of at most ``piece_samples`` is decoded whole, several at a time (longest first, at most
  ``batch_size`` per batch, the batch's padded length within ``max_samples``);
- a longer one is read a chunk at a time (memory stays bounded at any length), decoded chunk by chunk, up to
  ``batch_size`` chunks together, and joined at word boundaries (:mod:`srupp_asr.longform`): overlapping chunks, or
  with ``vad`` cuts in silences found by an energy detector;
- with ``workers`` above 1 (:func:`concurrent_batches`: 2 on a CPU with 2 or more compute threads), that many batches
  (of whole recordings, or of a long recording's chunks) are decoded at once, each on its own thread with its share
  of the compute threads. The label-synchronous search is a long chain of small operations that gains nothing from a
  second thread inside it (see :func:`srupp_asr.threads.one_thread`), while one batch's search
  beside another's encoder keeps both cores busy: the 32 LJ Speech files decode 1.5x faster on 2 cores, idle or
  with one core busy, with the same transcripts (docs/benchmarks.md, "CPU inference").

A recording that cannot be read or decoded gives a :class:`Decoded` holding the error and the others go on; a model
that lacks what the options need (:class:`UnusableModel`) stops everything. The model comes loaded
(:class:`srupp_asr.loading.LoadedModel`). Light to import (no torch).
"""

from __future__ import annotations

import collections
import contextlib
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from srupp_asr.errors import UserError

if TYPE_CHECKING:
    import numpy as np

    from srupp_asr.decoding import DecodingOptions, Hypothesis, Word
    from srupp_asr.lm import SRUppLM
    from srupp_asr.longform import Chunk
    from srupp_asr.model import ASRModel
    from srupp_asr.tokenizer import Tokenizer

# The attention modes (joint, rescoring) decode a recording longer than this in pieces cut at pauses (the energy
# VAD), several pieces at a time: the attention decoder was trained on sentences and drifts on minutes of audio,
# and pieces keep the memory flat at any length. Where no pause comes within a piece, overlapping pieces.
ATTENTION_PIECE_SECONDS = 10.0
ATTENTION_MODES = ("joint", "rescoring")
VAD_BLOCK_SECONDS = 30.0  # the VAD reads the recording in blocks of this length


class UnusableModel(UserError):
    """The model cannot decode as asked (a mode that needs a head the model lacks): no recording can be decoded."""


class AudioSource(Protocol):
    """What the driver reads a recording through (:class:`srupp_asr.audio.AudioReader` and ``SamplesReader``):
    16 kHz mono samples by position, in blocks (the VAD), and a warning about their level."""

    num_samples: int

    def read(self, start: int, end: int) -> np.ndarray: ...

    def blocks(self, block_samples: int) -> Iterator[tuple[int, np.ndarray]]: ...

    def level_warning(self) -> str | None: ...

    def __enter__(self) -> AudioSource: ...

    def __exit__(self, *exc: object) -> None: ...


@dataclass
class Recording:
    """One recording to decode: its name, its length in samples as known before reading it (batching goes by it)
    and how to open its audio."""

    name: str
    num_samples: int
    open: Callable[[], AudioSource]


@dataclass
class Decoded:
    """What came of one recording: its text and words (times from its start), the spans decoded (seconds), the
    samples decoded (a header may overstate the length), a warning about its audio, its share of the wall time
    (``seconds``: reading and decoding) and of the model's (``decode_seconds``), the time reading its audio; or the
    ``error`` that stopped it."""

    recording: Recording
    text: str = ""
    words: list[Word] = field(default_factory=list)
    chunks: list[tuple[float, float]] = field(default_factory=list)
    num_samples: int = 0
    warning: str | None = None
    seconds: float = 0.0
    decode_seconds: float = 0.0
    read_seconds: float = 0.0
    error: Exception | None = None


@dataclass(frozen=True)
class Batching:
    """How much is decoded at once: at most ``batch_size`` recordings (or chunks) with a padded length within
    ``max_samples``; a recording longer than ``piece_samples`` is decoded in chunks of at most that, neighbours
    sharing ``overlap_samples`` or, with ``vad``, cut in silences; ``workers`` batches at once. The defaults: whole
    recordings, any length, one batch at a time."""

    batch_size: int = 1
    max_samples: float = math.inf
    piece_samples: float = math.inf
    overlap_samples: int = 0
    vad: bool = False
    workers: int = 1  # batches decoded at once (on the CPU), each on its own thread

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")

    @classmethod
    def chunked(
        cls,
        options: DecodingOptions,
        batch_size: int,
        max_chunk_seconds: float,
        chunk_overlap: float,
        vad: bool,
        workers: int = 1,
    ) -> Batching:
        """``transcribe``'s limits: ``max_chunk_seconds`` of audio at once; in the attention modes, recordings longer
        than :data:`ATTENTION_PIECE_SECONDS` in pieces of that length cut at pauses."""
        from srupp_asr.audio import SAMPLE_RATE

        max_samples = int(max_chunk_seconds * SAMPLE_RATE)
        piece, overlap = max_samples, int(chunk_overlap * SAMPLE_RATE)
        if options.mode in ATTENTION_MODES and max_samples > ATTENTION_PIECE_SECONDS * SAMPLE_RATE:
            piece = int(ATTENTION_PIECE_SECONDS * SAMPLE_RATE)
            overlap, vad = min(overlap, piece // 4), True
        return cls(batch_size, max_samples, piece, overlap, vad, workers)


def concurrent_batches(device: object) -> int:
    """How many batches to decode at once on ``device``: 2 on a CPU with 2 compute threads or more
    (:func:`srupp_asr.threads.cpu_threads`; each batch then gets half of them), else 1 (a GPU runs one batch at a time
    faster)."""
    from srupp_asr.threads import cpu_threads

    return 2 if str(device) == "cpu" and cpu_threads() >= 2 else 1


class BatchDecoder:
    """Decodes recordings with one loaded model, its options, an optional fusion LM and batching limits."""

    def __init__(
        self,
        model: ASRModel,
        tokenizer: Tokenizer,
        options: DecodingOptions,
        lm: SRUppLM | None = None,
        batching: Batching | None = None,
        name: str = "",
    ) -> None:
        self.model, self.tokenizer, self.options, self.lm = model, tokenizer, options, lm
        self.batching = batching or Batching()
        self.name = name  # the model's, in the error of a model that lacks what the options need
        from srupp_asr.audio import SAMPLE_RATE

        self.rate = SAMPLE_RATE
        # A numpy model (srupp_asr.runtime) decodes itself; a torch one through srupp_asr.decoding.decode.
        self.device = model.device if hasattr(model, "decode_waveforms") else next(model.parameters()).device

    def run(
        self, recordings: Sequence[Recording], progress: Callable[[float], None] | None = None
    ) -> Iterator[Decoded]:
        """Decode ``recordings``, yielding each one's :class:`Decoded` in input order as soon as it and those before
        it are done; ``progress(seconds)`` is called with the seconds of audio each step decoded."""
        progress = progress or (lambda seconds: None)
        done: dict[int, Decoded] = {}
        ready = 0
        indexed = list(enumerate(recordings))
        short = [(i, r) for i, r in indexed if r.num_samples <= self.batching.piece_samples]
        batches = self.batches(short)
        for batch, results in zip(batches, self._decode_batches([[r for _, r in b] for b in batches]), strict=True):
            for (i, _), result in zip(batch, results, strict=True):
                done[i] = result
            progress(sum(result.num_samples for result in results) / self.rate)
            while ready in done:
                yield done.pop(ready)
                ready += 1
        for i, r in indexed:
            if r.num_samples > self.batching.piece_samples:
                done[i] = self._alone(lambda r=r: self.decode_long(r, progress), r)
            while ready in done:
                yield done.pop(ready)
                ready += 1

    def _decode_batches(self, batches: list[list[Recording]]) -> Iterator[list[Decoded]]:
        """Each batch's results, in order: one batch at a time, or ``workers`` at once when there are several."""
        workers = min(self.batching.workers, len(batches))
        if workers <= 1:
            yield from map(self._decode_or_split, batches)
            return
        with _Workers(workers) as pool:
            outcomes = [pool.submit(lambda b=b: self._decode_or_split(b)) for b in batches]
            before = time.perf_counter()
            for outcome in outcomes:
                results = outcome.result()
                # Batches overlap in time: each one's share of the wall time is what passed since the one before it
                # was done, so the seconds of all results add up to the wall time, as one at a time.
                now = time.perf_counter()
                _rescale_seconds(results, now - before)
                before = now
                yield results

    def _decode_or_split(self, batch: list[Recording]) -> list[Decoded]:
        """:meth:`decode_batch`, or, when decoding the batch fails, each recording alone (a failure is its own)."""
        try:
            return self.decode_batch(batch)
        except UnusableModel:
            raise
        except Exception:  # a recording could not be decoded after all: find it and keep the others
            return [self._alone(lambda r=r: self.decode_batch([r])[0], r) for r in batch]

    @staticmethod
    def _alone(work: Callable[[], Decoded], recording: Recording) -> Decoded:
        """``work()``, or the Decoded holding the error that stopped it (a model unusable for the options stops
        everything)."""
        try:
            return work()
        except UnusableModel:
            raise
        except Exception as err:  # any failure on one recording is that recording's: the others go on
            return Decoded(recording, num_samples=recording.num_samples, error=err)

    def batches(self, indexed: Sequence[tuple[int, Recording]]) -> list[list[tuple[int, Recording]]]:
        """Whole recordings grouped longest first: at most ``batch_size`` per batch, padded length within budget."""
        batches: list[list[tuple[int, Recording]]] = []
        for i, r in sorted(indexed, key=lambda item: (-item[1].num_samples, item[0])):
            # Longest first, so the batch's first recording sets its padded length.
            last = batches[-1] if batches else None
            if (
                last
                and len(last) < self.batching.batch_size
                and (len(last) + 1) * last[0][1].num_samples <= self.batching.max_samples
            ):
                last.append((i, r))
            else:
                batches.append([(i, r)])
        return batches

    def decode(self, wavs: Sequence[np.ndarray]) -> list[Hypothesis]:
        """Hypotheses of a batch of 16 kHz waveforms."""
        if hasattr(self.model, "decode_waveforms"):
            problem = self.model.unmet_needs(self.options, self.lm)
            if problem:  # the model lacks the CTC head or decoder the mode needs
                raise UnusableModel(f"{self.name}: {problem}")
            return self.model.decode_waveforms(wavs, self.tokenizer, self.options, self.lm)
        return self._decode_with_torch(wavs)

    def _decode_with_torch(self, wavs: Sequence[np.ndarray]) -> list[Hypothesis]:
        import torch
        from torch.nn.utils.rnn import pad_sequence

        from srupp_asr.decoding import decode

        audio = pad_sequence([torch.from_numpy(w) for w in wavs], batch_first=True).to(self.device)
        lens = torch.tensor([w.size for w in wavs], device=self.device)
        try:
            with torch.inference_mode():
                hyps = decode(self.model, self.tokenizer, audio, lens, self.options, self.lm)
        except ValueError as err:  # the model lacks the CTC head or decoder the mode needs
            raise UnusableModel(f"{self.name}: {err}") from None
        if self.device.type == "cuda":  # the time measured is the decoding's
            torch.cuda.synchronize()
        return hyps

    def decode_batch(self, batch: Sequence[Recording]) -> list[Decoded]:
        """Whole recordings read and decoded together; one whose audio cannot be read holds its error. Raises when
        decoding fails (the caller then decodes them one by one)."""
        begin = time.perf_counter()
        results, wavs = [], []
        for recording in batch:
            start = time.perf_counter()
            try:
                with recording.open() as reader:
                    wav = reader.read(0, reader.num_samples)
                    warning = reader.level_warning()
            except Exception as err:  # that recording's: the others are decoded
                read = time.perf_counter() - start
                results.append(Decoded(recording, num_samples=recording.num_samples, read_seconds=read, error=err))
                continue
            # MP3 and some Ogg headers only estimate the length
            results.append(Decoded(recording, num_samples=wav.size, warning=warning))
            results[-1].read_seconds = time.perf_counter() - start
            wavs.append(wav)
        decoded = [result for result in results if result.error is None]
        if wavs:
            start = time.perf_counter()
            # Digital silence (every sample zero) holds no words: not decoded, as what a model hears in it is made up.
            sounding = [k for k, wav in enumerate(wavs) if wav.any()]
            hyps = dict(zip(sounding, self.decode([wavs[k] for k in sounding]), strict=True)) if sounding else {}
            model_seconds = time.perf_counter() - start
            total = sum(result.num_samples for result in decoded) or 1
            for k, (result, wav) in enumerate(zip(decoded, wavs, strict=True)):
                if k in hyps:
                    result.text, result.words = hyps[k].text, self.timed_words(hyps[k], wav)
                result.chunks = [(0.0, result.num_samples / self.rate)]
                result.decode_seconds = model_seconds * result.num_samples / total
            spent = time.perf_counter() - begin
            for result in decoded:
                result.seconds = spent * result.num_samples / total
        return results

    def timed_words(self, hyp: Hypothesis, wav: np.ndarray) -> list[Word]:
        """The words of ``hyp`` decoded from ``wav``, those the model put in its leading silence moved to where the
        sound starts (:func:`srupp_asr.longform.place_after_leading_silence`)."""
        from srupp_asr import longform

        onset = longform.leading_silence(wav, self.rate) if hyp.words else 0.0
        return longform.place_after_leading_silence(hyp.words, onset)

    def plan(self, reader: AudioSource) -> tuple[list[Chunk], list[tuple[int, int]]]:
        """The chunks of a recording longer than a piece, and the silences the VAD found (none without it). The
        recording is read once ahead for its loudness (10-ms energies), which places the cuts; chunks start on the
        model's frame grid (the encoder's frame shift), so each sees the frames the whole recording would."""
        from srupp_asr import longform

        frame = round(longform.VAD_FRAME_SECONDS * self.rate)
        block = round(VAD_BLOCK_SECONDS / longform.VAD_FRAME_SECONDS) * frame
        energies, total = longform.energies_from_blocks((wav for _, wav in reader.blocks(block)), frame)
        silences = None
        if self.batching.vad:
            min_frames = round(longform.MIN_SILENCE / longform.VAD_FRAME_SECONDS)
            silences = longform.silences_from_energies(energies, total, frame, min_frames)
        piece, overlap = int(self.batching.piece_samples), self.batching.overlap_samples
        loudness = longform.Loudness(energies, frame)
        grid = round(self.model.frame_shift * self.rate)
        chunks = longform.plan_chunks(reader.num_samples, piece, overlap, silences, loudness, grid)
        return chunks, silences or []

    def decode_long(self, recording: Recording, progress: Callable[[float], None]) -> Decoded:
        """A recording decoded chunk by chunk, read one chunk at a time; up to ``batch_size`` chunks (their padded
        length within the budget) are decoded together."""
        from srupp_asr import longform

        begin = time.perf_counter()
        busy: list[tuple[float, float]] = []  # when each batch of chunks was being decoded
        with contextlib.ExitStack() as stack:
            reader = stack.enter_context(recording.open())  # a file, or samples given in memory
            workers = self.batching.workers
            pool = stack.enter_context(_Workers(workers)) if workers > 1 else None
            chunks, silences = self.plan(reader)
            spans = [c.seconds(self.rate) for c in chunks]
            words: list[list[Word]] = []
            texts: list[str] = []
            pending: list[tuple[int, Chunk, np.ndarray]] = []
            running: collections.deque = collections.deque()  # (batch, outcome) decoding on the workers
            end = 0

            def decode(batch: list[tuple[int, Chunk, np.ndarray]]) -> list[Hypothesis]:
                start = time.perf_counter()
                hyps = self.decode([wav for _, _, wav in batch])
                busy.append((start, time.perf_counter()))
                return hyps

            def collect(batch: list[tuple[int, Chunk, np.ndarray]], hyps: list[Hypothesis]) -> None:
                for (i, _, wav), hyp in zip(batch, hyps, strict=True):
                    words[i] = longform.shift_words(self.timed_words(hyp, wav), spans[i][0])
                    texts[i] = hyp.text
                progress(sum(chunk.end - chunk.start for _, chunk, _ in batch) / self.rate)

            def flush() -> None:
                batch = list(pending)
                pending.clear()
                if pool is None:
                    collect(batch, decode(batch))
                    return
                # At most one batch per worker is read ahead: memory stays that of a few batches at any length.
                running.append((batch, pool.submit(lambda: decode(batch))))
                while len(running) >= pool.count:
                    done, outcome = running.popleft()
                    collect(done, outcome.result())

            for i, chunk in enumerate(chunks):
                wav = reader.read(chunk.start, chunk.end)
                if wav.size == 0:  # an MP3 or Ogg header overstated the length: the audio has ended
                    break
                end = max(end, chunk.start + wav.size)
                words.append([])
                texts.append("")
                if any(a <= chunk.start and chunk.end <= b for a, b in silences) or not wav.any():
                    # A piece the VAD found silent, or digital silence (every sample zero), holds no words: decoded,
                    # a model can only make some up.
                    progress((chunk.end - chunk.start) / self.rate)
                    continue
                longest = max([wav.size] + [w.size for _, _, w in pending])
                limits = self.batching
                if pending and (len(pending) >= limits.batch_size or (len(pending) + 1) * longest > limits.max_samples):
                    flush()
                pending.append((i, chunk, wav))
            if pending:
                flush()
            while running:
                done, outcome = running.popleft()
                collect(done, outcome.result())
            warning = reader.level_warning()
        num_samples = recording.num_samples
        if end < num_samples:  # only what was decoded counts
            num_samples = end
            spans = [(a, min(b, end / self.rate)) for a, b in spans[: len(words)]]
        return Decoded(
            recording,
            text=" ".join(t for t in texts if t),
            words=longform.merge_chunk_words(spans, words),
            chunks=spans,
            num_samples=num_samples,
            warning=warning,
            seconds=time.perf_counter() - begin,
            decode_seconds=_union_seconds(busy),
        )


class _Outcome:
    """What a job submitted to :class:`_Workers` gave: :meth:`result` waits for it, and raises what the job raised."""

    def __init__(self) -> None:
        self._box: queue.SimpleQueue = queue.SimpleQueue()

    def run(self, work: Callable[[], Any]) -> None:
        try:
            self._box.put((True, work()))
        except BaseException as err:  # raised in the caller's thread, by result()
            self._box.put((False, err))

    def result(self) -> Any:
        ok, value = self._box.get()
        if not ok:
            raise value
        return value


class _Workers:
    """``count`` threads that take submitted jobs in the order submitted, with the compute threads shared among them
    (:func:`srupp_asr.threads.set_cpu_threads` sets each one's share while the pool is open; restored when it closes).

    Once the pool is closed the threads take no more jobs. Closed when the work is done, it waits for the threads'
    end: one still ending while the interpreter exits can abort the process (``terminate called without an active
    exception``, from torch's thread-local state). Closed by an exception (an error, Ctrl-C, SIGTERM, a caller that
    stopped reading), it does not wait for the jobs being run: the threads are daemons, and the command exits at
    once (:func:`srupp_asr.cli.exit_without_teardown` ends the process without the interpreter's teardown)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []
        self._threads_before = 0

    def __enter__(self) -> _Workers:
        from srupp_asr.threads import cpu_threads, set_cpu_threads

        self._threads_before = cpu_threads()
        set_cpu_threads(max(1, self._threads_before // self.count))  # (a thread takes it at its first operation)
        self._threads = [
            threading.Thread(target=self._work, name=f"srupp-asr decode {n}", daemon=True) for n in range(self.count)
        ]
        for thread in self._threads:
            thread.start()
        return self

    def submit(self, work: Callable[[], Any]) -> _Outcome:
        outcome = _Outcome()
        self._jobs.put((work, outcome))
        return outcome

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None and not self._closed.is_set():
            work, outcome = job
            outcome.run(work)

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        from srupp_asr.threads import set_cpu_threads

        self._closed.set()
        for _ in self._threads:
            self._jobs.put(None)
        if exc_type is None:
            for thread in self._threads:
                thread.join()
        set_cpu_threads(self._threads_before)


def _union_seconds(spans: list[tuple[float, float]]) -> float:
    """The length of the union of time ``spans`` (``(start, end)``): the wall time something was being decoded."""
    total, reached = 0.0, -math.inf
    for start, end in sorted(spans):
        if end > reached:
            total += end - max(start, reached)
            reached = end
    return total


def _rescale_seconds(results: list[Decoded], wall: float) -> None:
    """Scale the ``seconds`` and ``decode_seconds`` of a batch's results so that their ``seconds`` sum to ``wall``."""
    spent = sum(result.seconds for result in results)
    if spent > 0:
        for result in results:
            result.seconds *= wall / spent
            result.decode_seconds *= wall / spent
