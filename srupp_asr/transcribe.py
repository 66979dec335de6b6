"""``srupp-asr transcribe``: audio files in, text out (txt, json, srt, vtt, tsv), recordings of any length.

:func:`transcribe` is the whole job as a Python function; the command line is a thin layer over it::

    from srupp_asr.transcribe import transcribe
    for t in transcribe(["talk.flac", "calls/"], model="exp/synth_en/model", decoding="ctc_prefix_beam"):
        print(t.path, t.text, [(w.text, w.start, w.end) for s in t.segments for w in s.words])

How a file is decoded depends on its length and the memory budget ``max_chunk_seconds`` (the most audio decoded
at once):

- files that fit are decoded whole, several at a time (``batch_size``, longest first, the batch's padded length
  within the budget);
- a longer recording is read from disk a chunk at a time (so memory stays bounded for any length), decoded chunk
  by chunk and joined at word boundaries (:mod:`srupp_asr.longform`): overlapping chunks, or with ``vad=True``
  cuts in silences found by an energy detector.

A file that cannot be read (missing, empty, not audio, truncated) is reported through ``on_error`` with a
one-line reason and the others are still transcribed. Module-level imports stay light (no torch), so
``srupp-asr transcribe --help`` starts fast and ``srupp_asr`` can export :func:`transcribe`. The inputs are found
by :mod:`srupp_asr.inputs`; the decoding settings and their arguments are :mod:`srupp_asr.decoding.cli`'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from srupp_asr.decoding.cli import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_DECODING,
    add_decoding_arguments,
    check_lm_flags,
    choose_lm,
    decoding_options,
)
from srupp_asr.errors import UserError, first_line
from srupp_asr.inputs import default_model_candidates, find_inputs
from srupp_asr.writers import (
    FORMATS,
    MAX_SEGMENT_WORDS,
    SEGMENT_PAUSE,
    WRITERS,
    OutputDirLock,
    Segment,
    Transcript,
    output_names,
    parse_formats,
    printable,
    printable_line,
    printable_transcript,
    segment_words,
    to_json,
    transcript_text,
    write_transcript,
)

if TYPE_CHECKING:
    import torch

    from srupp_asr.api import Model
    from srupp_asr.audio import AudioReader
    from srupp_asr.decoding import DecodingOptions, Hypothesis
    from srupp_asr.lm import SRUppLM
    from srupp_asr.longform import Chunk
    from srupp_asr.model import ASRModel
    from srupp_asr.tokenizer import Tokenizer

log = logging.getLogger(__name__)

MAX_CHUNK_SECONDS = 600.0  # the most audio decoded at once (a whole file, a chunk or a padded batch)
# The range of --max-chunk-seconds: shorter chunks hold too little speech to recognise (0.5 s gives garbage, under
# 25 ms not one feature frame: nothing); 10^9 s is beyond any memory (and inf cannot be counted in samples).
CHUNK_SECONDS_RANGE = (1.0, 1e9)
CHUNK_OVERLAP = 10.0  # seconds shared by neighbouring chunks (at most a quarter of a chunk by default)
# The attention modes (joint, rescoring) decode a recording longer than this in pieces cut at pauses (the energy
# VAD), several pieces at a time: the attention decoder was trained on sentences and drifts on minutes of audio,
# and pieces keep the memory flat at any length. Where no pause comes within a piece, overlapping pieces.
ATTENTION_PIECE_SECONDS = 10.0
ATTENTION_MODES = ("joint", "rescoring")
VAD_BLOCK_SECONDS = 30.0  # the VAD reads the recording in blocks of this length
# Whisper's --language values that mean English (the only language of srupp-asr's models and text normalisation)
ENGLISH = ("en", "english")
# The bar counts seconds of audio; its rate is audio seconds per wall second (the inverse real-time factor).
PROGRESS = "{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} s of audio [{elapsed}<{remaining}, {rate_fmt}]"


# ------------------------------------------------------------------------------------------ the work


class UnusableModel(UserError):
    """The model cannot decode as asked (a mode that needs a head the model lacks): no file can be transcribed."""


@dataclass
class _Job:
    """One input file: where it is, its output name, length (once probed) and a warning about its audio (once
    decoded)."""

    index: int
    path: str
    name: str
    num_samples: int = 0
    warning: str | None = None
    samples: Any = None  # a SamplesReader when the audio was given as samples, not a file


def _open(job: _Job) -> Any:
    """A reader of ``job``'s audio at 16 kHz: its samples in memory, or its file (:class:`AudioReader`)."""
    from srupp_asr.audio import AudioReader

    return job.samples if job.samples is not None else AudioReader(job.path)


class _Transcriber:
    """Decodes jobs with one loaded model; holds the options every file shares."""

    def __init__(
        self,
        model: ASRModel,
        tokenizer: Tokenizer,
        options: DecodingOptions,
        lm: SRUppLM | None,
        model_dir: str,
        max_chunk_seconds: float,
        chunk_overlap: float,
        vad: bool,
        max_segment_words: int,
        segment_pause: float,
        batch_size: int = 1,
    ) -> None:
        from srupp_asr.audio import SAMPLE_RATE

        self.model, self.tokenizer, self.options, self.model_dir = model, tokenizer, options, model_dir
        self.lm = lm
        self.lm_name: str | None = None  # the fused LM's directory, stated in every transcript's decoding settings
        self.rate = SAMPLE_RATE
        self.max_samples = int(max_chunk_seconds * SAMPLE_RATE)
        self.overlap_samples = int(chunk_overlap * SAMPLE_RATE)
        self.vad = vad
        self.batch_size = batch_size
        # The longest file decoded whole, and the chunks of longer ones (pieces cut at pauses in the attention modes)
        self.piece_samples = self.max_samples
        if options.mode in ATTENTION_MODES and self.max_samples > ATTENTION_PIECE_SECONDS * SAMPLE_RATE:
            self.piece_samples = int(ATTENTION_PIECE_SECONDS * SAMPLE_RATE)
            self.overlap_samples = min(self.overlap_samples, self.piece_samples // 4)
            self.vad = True
        self.max_segment_words, self.segment_pause = max_segment_words, segment_pause
        self.device = next(model.parameters()).device

    def decode(self, wavs: Sequence[torch.Tensor]) -> list[Hypothesis]:
        """Hypotheses of a batch of 16 kHz waveforms."""
        import torch
        from torch.nn.utils.rnn import pad_sequence

        from srupp_asr.decoding import decode

        audio = pad_sequence(list(wavs), batch_first=True).to(self.device)
        lens = torch.tensor([w.numel() for w in wavs], device=self.device)
        try:
            with torch.inference_mode():
                return decode(self.model, self.tokenizer, audio, lens, self.options, self.lm)
        except ValueError as err:  # the model lacks the CTC head or decoder the mode needs
            raise UnusableModel(f"{self.model_dir}: {err}") from None

    def transcript(
        self, job: _Job, words: list[Any], text: str, chunks: list[tuple[float, float]], seconds: float
    ) -> Transcript:
        """The transcript of ``job`` from its words (absolute times) or, without words, its text."""
        duration = job.num_samples / self.rate
        if words:
            segments = segment_words(words, self.max_segment_words, self.segment_pause)
        else:
            segments = [Segment(0.0, duration, text)] if text else []
        return Transcript(
            path=job.path,
            duration=duration,
            text=transcript_text(segments),
            segments=segments,
            model=self.model_dir,
            decoding={**dataclasses.asdict(self.options), **({"lm": self.lm_name} if self.lm_name else {})},
            chunks=chunks,
            processing_seconds=seconds,
        )

    def batches(self, jobs: Sequence[_Job], batch_size: int) -> list[list[_Job]]:
        """Whole-file jobs grouped longest first: at most ``batch_size`` per batch, padded length within budget."""
        batches: list[list[_Job]] = []
        for job in sorted(jobs, key=lambda j: (-j.num_samples, j.index)):
            # Longest first, so the batch's first job sets its padded length.
            if (
                batches
                and len(batches[-1]) < batch_size
                and (len(batches[-1]) + 1) * batches[-1][0].num_samples <= (self.max_samples)
            ):
                batches[-1].append(job)
            else:
                batches.append([job])
        return batches

    def load(self, job: _Job) -> torch.Tensor:
        """The whole waveform of ``job``'s file (as :func:`srupp_asr.audio.load_audio`), noting its level warning."""
        with _open(job) as reader:
            wav = reader.read(0, reader.num_samples)
            job.warning = reader.level_warning()
        return wav

    def run_batch(self, batch: Sequence[_Job]) -> list[Transcript]:
        """Transcripts of whole files decoded together (UserError when one cannot be read: the caller retries
        them one by one)."""
        begin = time.perf_counter()
        wavs = [self.load(job) for job in batch]
        for job, wav in zip(batch, wavs, strict=True):
            job.num_samples = wav.numel()  # MP3 and some Ogg headers only estimate the length
        hyps = self.decode(wavs)
        words = [self.timed_words(h, wav) for h, wav in zip(hyps, wavs, strict=True)]
        spent = time.perf_counter() - begin
        total = sum(job.num_samples for job in batch) or 1
        return [
            self.transcript(job, w, h.text, [(0.0, job.num_samples / self.rate)], spent * job.num_samples / total)
            for job, h, w in zip(batch, hyps, words, strict=True)
        ]

    def timed_words(self, hyp: Hypothesis, wav: torch.Tensor) -> list[Any]:
        """The words of ``hyp`` decoded from ``wav``, those the model put in its leading silence moved to where the
        sound starts (:func:`srupp_asr.longform.place_after_leading_silence`)."""
        from srupp_asr import longform

        onset = longform.leading_silence(wav.cpu().numpy(), self.rate) if hyp.words else 0.0
        return longform.place_after_leading_silence(hyp.words, onset)

    def plan(self, reader: AudioReader) -> tuple[list[Chunk], list[tuple[int, int]]]:
        """The chunks of a recording longer than the budget, and the silences the VAD found (none without it)."""
        from srupp_asr import longform

        silences = None
        if self.vad:
            frame = round(longform.VAD_FRAME_SECONDS * self.rate)
            block = round(VAD_BLOCK_SECONDS / longform.VAD_FRAME_SECONDS) * frame
            blocks = (wav.numpy() for _, wav in reader.blocks(block))
            min_frames = round(longform.MIN_SILENCE / longform.VAD_FRAME_SECONDS)
            silences = longform.silences_from_blocks(blocks, frame, min_frames)
        chunks = longform.plan_chunks(reader.num_samples, self.piece_samples, self.overlap_samples, silences)
        return chunks, silences or []

    def run_long(self, job: _Job, progress: Callable[[float], None]) -> Transcript:
        """Transcript of a recording decoded chunk by chunk, read from disk one chunk at a time; up to
        ``batch_size`` chunks (their padded length within the budget) are decoded together."""
        from srupp_asr import longform

        begin = time.perf_counter()
        with _open(job) as reader:  # a file, or samples given in memory (srupp_asr.api)
            chunks, silences = self.plan(reader)
            spans = [c.seconds(self.rate) for c in chunks]
            words: list[list[Any]] = []
            texts: list[str] = []
            pending: list[tuple[int, Chunk, torch.Tensor]] = []
            end = 0

            def flush() -> None:
                hyps = self.decode([wav for _, _, wav in pending])
                for (i, _, wav), hyp in zip(pending, hyps, strict=True):
                    words[i] = longform.shift_words(self.timed_words(hyp, wav), spans[i][0])
                    texts[i] = hyp.text
                progress(sum(chunk.end - chunk.start for _, chunk, _ in pending) / self.rate)
                pending.clear()

            for i, chunk in enumerate(chunks):
                wav = reader.read(chunk.start, chunk.end)
                if wav.numel() == 0:  # an MP3 or Ogg header overstated the length: the audio has ended
                    break
                end = max(end, chunk.start + wav.numel())
                words.append([])
                texts.append("")
                if any(a <= chunk.start and chunk.end <= b for a, b in silences):
                    # A piece the VAD found silent holds no words: decoded, a model can only make some up.
                    progress((chunk.end - chunk.start) / self.rate)
                    continue
                longest = max([wav.numel()] + [w.numel() for _, _, w in pending])
                if pending and (len(pending) >= self.batch_size or (len(pending) + 1) * longest > self.max_samples):
                    flush()
                pending.append((i, chunk, wav))
            if pending:
                flush()
            job.warning = reader.level_warning()
        if end < job.num_samples:  # only what was decoded counts
            job.num_samples = end
            spans = [(a, min(b, end / self.rate)) for a, b in spans[: len(words)]]
        merged = longform.merge_chunk_words(spans, words)
        text = " ".join(t for t in texts if t)
        return self.transcript(job, merged, text, spans, time.perf_counter() - begin)


def transcribe(
    inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | Any,
    model: str | os.PathLike[str] | Model | None = None,
    *,
    sample_rate: int | None = None,
    output_dir: str | os.PathLike[str] | None = None,
    output_format: str | Sequence[str] = "txt",
    device: str = "auto",
    batch_size: int = DEFAULT_BATCH_SIZE,
    decoding: str = DEFAULT_DECODING,
    beam: int | None = None,
    ctc_weight: float | None = None,
    length_penalty: float | None = None,
    lm: str | os.PathLike[str] | None = None,
    lm_weight: float | None = None,
    no_lm: bool = False,
    threads: int | None = None,
    max_chunk_seconds: float = MAX_CHUNK_SECONDS,
    chunk_overlap: float | None = None,
    vad: bool = False,
    max_segment_words: int = MAX_SEGMENT_WORDS,
    segment_pause: float = SEGMENT_PAUSE,
    progress: bool = False,
    on_error: Callable[[str], None] | None = None,
    on_transcript: Callable[[Transcript], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> list[Transcript]:
    """Transcribe audio files (or directories, or ``@LIST`` files) with a model directory (default: the built-in
    model); returns the transcripts of the files that could be read, in input order.

    ``inputs`` may instead be samples in memory: a numpy array or torch tensor ((samples,) or (channels, samples))
    or a list of them, at ``sample_rate`` Hz; their transcripts' ``path`` is ``samples-1``, ``samples-2``, ...
    ``model`` may be a model loaded once by :func:`srupp_asr.load_model` (then ``device`` and ``threads`` are
    its own).

    ``output_dir`` set: each transcript is also written there as ``<stem>.<format>`` for each of ``output_format``
    (``"txt,srt"``, ``"all"``, or a list), atomically. ``decoding``, ``beam``, ``ctc_weight`` and
    ``length_penalty`` are :class:`srupp_asr.decoding.DecodingOptions` (None: its default). Shallow fusion: the
    model directory's own LM (``MODEL_DIR/lm``) with its recorded weight by default; ``lm`` another LM directory
    (``srupp-asr train-lm``); ``lm_weight`` overrides the weight (0: no LM); ``no_lm`` decodes without one (see
    :func:`choose_lm`). The fused LM's directory is in each transcript's ``decoding["lm"]``. ``on_error(message)``
    gets a one-line ``"PATH: reason"`` per file that cannot be transcribed; without it the first such file raises
    :class:`UserError`. ``on_transcript`` is called with each transcript in input order as soon as it is ready.
    ``on_warning(message)`` gets a one-line ``"PATH: reason"`` per file transcribed despite a problem (samples far
    beyond full scale, clipped); without it the warning is logged.
    """
    import torch
    from tqdm import tqdm

    from srupp_asr.api import Model, samples_readers

    formats = parse_formats(output_format)
    if chunk_overlap is None:
        chunk_overlap = min(CHUNK_OVERLAP, max_chunk_seconds / 4)
    _check_settings(batch_size, threads, max_chunk_seconds, chunk_overlap, max_segment_words, segment_pause)
    check_lm_flags(lm, lm_weight, no_lm)
    decoding_options(decoding, beam, ctc_weight, length_penalty)  # checked before anything is read
    given = samples_readers(inputs, sample_rate)  # None: inputs are paths
    if given is None and isinstance(inputs, str | os.PathLike):
        inputs = [inputs]

    def report(message: str) -> None:
        if on_error is None:
            raise UserError(message)
        on_error(message)

    readers = given[0] if given is not None else []
    files, problems = ([r.path for r in readers], given[1]) if given is not None else find_inputs(inputs)
    for message in problems:
        report(message)
    if not files:
        return []
    if threads:
        torch.set_num_threads(threads)
    folder_lock = OutputDirLock(output_dir)  # one transcribe per output folder (released as this returns)
    loaded = model if isinstance(model, Model) else Model.load(model, device)
    choice = choose_lm(loaded.model_dir, decoding, lm, lm_weight, no_lm)
    options = decoding_options(decoding, beam, ctc_weight, length_penalty, choice.path, choice.weight)
    fusion_lm = loaded.fusion_lm(choice.path) if choice.path is not None else None
    log.info("%s", choice.describe())
    worker = _Transcriber(
        loaded.net,
        loaded.tokenizer,
        options,
        fusion_lm,
        loaded.model_dir,
        max_chunk_seconds,
        chunk_overlap,
        vad,
        max_segment_words,
        segment_pause,
        batch_size,
    )
    worker.lm_name = str(choice.path) if choice.path is not None else None

    jobs = [_Job(i, path, name) for i, (path, name) in enumerate(zip(files, output_names(files), strict=True))]
    for job, reader in zip(jobs, readers, strict=False):
        job.samples = reader
    in_order = _InOrder(on_transcript)

    def finish(job: _Job, transcript: Transcript | None) -> None:
        if transcript is not None and job.warning is not None:
            if on_warning is None:
                log.warning("%s", job.warning)
            else:
                on_warning(job.warning)
        if transcript is not None and output_dir is not None:
            try:
                write_transcript(transcript, output_dir, job.name, formats)
            except UserError as err:  # a full disk or a read-only folder: this file failed, the others go on
                report(str(err))
                transcript = None
        in_order.add(job.index, transcript)

    readable: list[_Job] = []
    for job in jobs:
        try:
            with _open(job) as reader:
                job.num_samples = reader.num_samples
            readable.append(job)
        except UserError as err:
            report(str(err))
            finish(job, None)

    total = sum(job.num_samples for job in readable) / worker.rate
    short = [job for job in readable if job.num_samples <= worker.piece_samples]
    long = [job for job in readable if job.num_samples > worker.piece_samples]
    bar = tqdm(total=total, desc="transcribing", unit="s", disable=not progress, file=sys.stderr, bar_format=PROGRESS)
    with bar:
        for batch in worker.batches(short, batch_size):
            try:
                transcripts = worker.run_batch(batch)
            except UnusableModel:
                raise
            except Exception:  # a file could not be decoded after all: find it and keep the others
                transcripts = [_or_report(job, lambda job=job: worker.run_batch([job])[0], report) for job in batch]
            for job, transcript in zip(batch, transcripts, strict=True):
                finish(job, transcript)
            bar.update(sum(job.num_samples for job in batch) / worker.rate)
        for job in long:
            finish(job, _or_report(job, lambda job=job: worker.run_long(job, bar.update), report))
    folder_lock.release()
    return in_order.done


def _or_report(job: _Job, work: Callable[[], Transcript], report: Callable[[str], None]) -> Transcript | None:
    """``work()``, or None after reporting what went wrong with ``job``'s file: its UserError, or, for an
    unexpected error (a bug), one line naming the file and the error, so that one file never stops a batch."""
    try:
        return work()
    except UnusableModel:
        raise
    except UserError as err:
        report(str(err))
    except Exception as err:  # any failure on one file is that file's: the batch goes on
        log.debug("transcribing %s failed", job.path, exc_info=True)
        detail = first_line(err)
        report(f"{printable(job.path)}: internal error ({type(err).__name__}: {detail}); please report it")
    return None


class _InOrder:
    """Collects transcripts arriving in any order and hands them over in input order."""

    def __init__(self, callback: Callable[[Transcript], None] | None) -> None:
        self.callback = callback
        self.pending: dict[int, Transcript | None] = {}
        self.next = 0
        self.done: list[Transcript] = []

    def add(self, index: int, transcript: Transcript | None) -> None:
        """Record the result of input ``index`` (None: it failed) and hand over all that are now in order."""
        self.pending[index] = transcript
        while self.next in self.pending:
            ready = self.pending.pop(self.next)
            self.next += 1
            if ready is not None:
                self.done.append(ready)
                if self.callback is not None:
                    self.callback(ready)


def _check_settings(
    batch_size: int,
    threads: int | None,
    max_chunk_seconds: float,
    chunk_overlap: float,
    max_segment_words: int,
    segment_pause: float,
) -> None:
    if batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {batch_size}")
    if threads is not None and threads < 1:
        raise UserError(f"--threads must be at least 1, got {threads}")
    low, high = CHUNK_SECONDS_RANGE
    if not low <= max_chunk_seconds <= high:  # nan and inf too
        raise UserError(
            f"--max-chunk-seconds must be a number of seconds in [{low:g}, {high:g}], got {max_chunk_seconds}"
        )
    if not 0 <= chunk_overlap <= max_chunk_seconds / 2:
        raise UserError(f"--chunk-overlap must be in [0, max-chunk-seconds / 2], got {chunk_overlap}")
    if max_segment_words < 1:
        raise UserError(f"--max-segment-words must be at least 1, got {max_segment_words}")
    if not (segment_pause >= 0 and math.isfinite(segment_pause)):
        raise UserError(f"--segment-pause must be a finite number of seconds >= 0, got {segment_pause}")


# ------------------------------------------------------------------------------------------ command line


def _stdout_printer(fmt: str, several: bool) -> Callable[[Transcript], None]:
    """What prints each transcript when no --output-dir is given."""
    if not several:
        return lambda t: print(WRITERS[fmt](printable_transcript(t)), end="", flush=True)
    if fmt == "txt":
        return lambda t: print(f"{printable_line(t.path)}\t{printable_line(t.text)}", flush=True)
    return lambda t: print(to_json(printable_transcript(t), indent=None), end="", flush=True)  # JSON lines


def transcribe_command(args: argparse.Namespace) -> int:
    """``srupp-asr transcribe``: exit status 0 when every input was transcribed, 1 when some failed (the closing
    line counts them); usage and model errors raise UserError (2)."""
    if args.language is not None and args.language.strip().lower() not in ENGLISH:
        raise UserError(f"--language {args.language}: srupp-asr recognises English only (--language en)")
    inputs = list(args.inputs) + [f"@{path}" for path in args.list or []]
    if not inputs:
        raise UserError("no audio given (files, directories, @LIST or --list LIST)")
    formats = parse_formats(args.output_format)
    on_transcript = None
    if args.output_dir is None:
        if len(formats) > 1:
            raise UserError("several output formats need --output-dir")
        several = len(find_inputs(inputs)[0]) > 1
        if several and formats[0] not in ("txt", "json"):
            raise UserError(f"{formats[0]} for several files needs --output-dir (stdout takes txt or json)")
        on_transcript = _stdout_printer(formats[0], several)
    failed = 0

    def on_error(message: str) -> None:
        nonlocal failed
        failed += 1
        print(f"srupp-asr transcribe: error: {printable_line(message)}", file=sys.stderr, flush=True)

    def on_warning(message: str) -> None:
        print(f"srupp-asr transcribe: warning: {printable_line(message)}", file=sys.stderr, flush=True)

    begin = time.perf_counter()
    transcripts = transcribe(
        inputs,
        args.model,
        output_dir=args.output_dir,
        output_format=formats,
        device=args.device,
        batch_size=args.batch_size,
        decoding=args.decoding,
        beam=args.beam,
        ctc_weight=args.ctc_weight,
        length_penalty=args.length_penalty,
        lm=args.lm,
        lm_weight=args.lm_weight,
        no_lm=args.no_lm,
        threads=args.threads,
        max_chunk_seconds=args.max_chunk_seconds,
        chunk_overlap=args.chunk_overlap,
        vad=args.vad,
        max_segment_words=args.max_segment_words,
        segment_pause=args.segment_pause,
        progress=not args.quiet and sys.stderr.isatty(),
        on_error=on_error,
        on_transcript=on_transcript,
        on_warning=on_warning,
    )
    wall = time.perf_counter() - begin
    warn_if_all_empty(transcripts, on_warning)
    if not args.quiet:
        audio, decoding = sum(t.duration for t in transcripts), sum(t.processing_seconds for t in transcripts)
        line = summary_line(len(transcripts), failed, audio, wall, decoding)
        fused = transcripts[0].decoding if transcripts else {}
        if fused.get("lm"):
            line += f"; language model {fused['lm']} (weight {fused['lm_weight']:g}; --no-lm: without)"
        print(line, file=sys.stderr)
    return 1 if failed else 0


# Below this much audio, silence in every input is plausible and says nothing about the model.
EMPTY_WARNING_SECONDS = 5.0


def warn_if_all_empty(transcripts: list[Transcript], on_warning: Callable[[str], None]) -> None:
    """Warn when the model heard words in none of the inputs (at least EMPTY_WARNING_SECONDS of audio): the mark of
    an undertrained model, or of audio unlike what it was trained on, which would otherwise pass with exit 0."""
    audio = sum(t.duration for t in transcripts)
    if transcripts and audio >= EMPTY_WARNING_SECONDS and not any(t.text.strip() for t in transcripts):
        on_warning(
            f"the model emitted no words for any of the {len(transcripts)} file(s) ({audio:.1f} s of audio): it may "
            "be undertrained, or the audio unlike its training data (try `srupp-asr evaluate` on held-out cuts)"
        )


def summary_line(
    files: int, failed: int, audio_seconds: float, wall_seconds: float, decode_seconds: float | None = None
) -> str:
    """``transcribed 3 files (1 failed): 1:02:03.4 of audio in 45.2 s, real-time factor 0.0121``; with
    ``decode_seconds`` (reading and decoding the audio) the real-time factor is the decoding's, and the rest of the
    wall time (loading the model, finding and probing the files) is given apart:
    ``... in 45.2 s: decoding 41.3 s, real-time factor 0.0111; model load and setup 3.9 s``."""
    rtf = f"{wall_seconds / audio_seconds:.4f}" if audio_seconds > 0 else "-"
    if decode_seconds is not None:
        rtf = f"{decode_seconds / audio_seconds:.4f}" if audio_seconds > 0 else "-"
        setup = max(wall_seconds - decode_seconds, 0.0)
        rtf += f"; model load and setup {setup:.1f} s"
    failures = f" ({failed} failed)" if failed else ""
    minutes, secs = divmod(audio_seconds, 60)
    hours, minutes = divmod(int(minutes), 60)
    length = f"{hours}:{minutes:02d}:{secs:04.1f}" if hours else f"{minutes}:{secs:04.1f}"
    return (
        f"transcribed {files} file{'s' if files != 1 else ''}{failures}: {length} of audio "
        f"in {wall_seconds:.1f} s"
        + (f": decoding {decode_seconds:.1f} s," if decode_seconds is not None else ",")
        + f" real-time factor {rtf}"
    )


def _builtin_model_text() -> str:
    """Where the built-in model is, for --help (no torch: --help stays fast)."""
    found = next((p for p in default_model_candidates() if (p / "config.yaml").is_file()), None)
    return str(found) if found is not None else "none installed here: make demo builds one"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the ``transcribe`` sub-command."""
    p = subparsers.add_parser(
        "transcribe",
        help="transcribe audio files (txt, json, srt, vtt, tsv; long recordings)",
        description="Transcribe English speech in audio files. Without --model: the built-in model "
        f"({_builtin_model_text()}), trained on synthetic English speech only: poor on real voices; train on "
        "your own data for real use (docs/training.md). Exit status: 0 all inputs transcribed; 1 some inputs "
        "failed (one error line each, counted in the closing line); 2 a usage or model error. Whisper's spellings "
        "--output_format, --output_dir, --beam_size, --word_timestamps and --language en are accepted.",
    )
    p.add_argument("inputs", nargs="*", metavar="AUDIO", help="audio files, directories (recursive) or @LIST files")
    p.add_argument("--list", action="append", metavar="LIST", help="a text file of inputs, one per line")
    p.add_argument("--model", metavar="DIR", help="model directory (default: the built-in model, see docs/cli.md)")
    p.add_argument(
        "-f",
        "--output-format",
        "--output_format",
        default="txt",
        metavar="FMT",
        help=f"comma-separated formats ({', '.join(FORMATS)}) or all (default txt)",
    )
    p.add_argument(
        "-o",
        "--output-dir",
        "--output_dir",
        metavar="DIR",
        help="write <stem>.<format> files here (default: print to stdout: the text of one file, "
        "PATH<TAB>text lines or JSON lines for several)",
    )
    add_decoding_arguments(p, batch_help="short files decoded together")
    p.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's choice)")
    p.add_argument(
        "--max-chunk-seconds",
        type=float,
        default=MAX_CHUNK_SECONDS,
        help="memory budget: the most audio decoded at once; longer files are chunked "
        f"(default {MAX_CHUNK_SECONDS:g}, at least {CHUNK_SECONDS_RANGE[0]:g})",
    )
    p.add_argument(
        "--chunk-overlap",
        type=float,
        help=f"seconds shared by neighbouring chunks (default {CHUNK_OVERLAP:g}, at most a quarter of a chunk)",
    )
    p.add_argument("--vad", action="store_true", help="cut long recordings in silences (energy VAD)")
    p.add_argument(
        "--max-segment-words",
        type=int,
        default=MAX_SEGMENT_WORDS,
        help=f"most words in a segment / subtitle (default {MAX_SEGMENT_WORDS})",
    )
    p.add_argument(
        "--segment-pause",
        type=float,
        default=SEGMENT_PAUSE,
        help=f"a pause this long (seconds) ends a segment (default {SEGMENT_PAUSE:g})",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no summary line")
    p.add_argument("--language", metavar="LANG", help="en (English) is the only language: any other is refused")
    p.add_argument(
        "--word_timestamps",
        nargs="?",
        const="True",
        choices=("True", "False"),
        help="accepted as whisper takes it; words always carry times here (json, tsv)",
    )
    p.set_defaults(func=transcribe_command)
    return p
