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

The decoding itself is :class:`srupp_asr.decoding.batch.BatchDecoder`'s, which ``evaluate`` shares; this module
finds and probes the inputs, makes the transcripts and writes them. A file that cannot be read (missing, empty, not
audio, truncated) is reported through ``on_error`` with a one-line reason and the others are still transcribed.
Module-level imports stay light (no torch), so ``srupp-asr transcribe --help`` starts fast and ``srupp_asr`` can
export :func:`transcribe`. The inputs are found by :mod:`srupp_asr.inputs`; the decoding settings and their
arguments are :mod:`srupp_asr.decoding.settings`'s; the model, its LM and its device are :mod:`srupp_asr.loading`'s.
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

from srupp_asr.allocator import keep_freed_memory
from srupp_asr.compute_types import DEFAULT_COMPUTE_TYPE, add_compute_type_argument
from srupp_asr.decoding.batch import BatchDecoder, Batching, Recording, concurrent_batches
from srupp_asr.decoding.settings import (
    DEFAULT_OPTIONS,
    add_decoding_arguments,
    batch_size_for,
    check_batch_size,
    requested_options,
)
from srupp_asr.errors import DECODING_MEMORY_REMEDY, UserError, first_line, is_out_of_memory, out_of_memory_line
from srupp_asr.inputs import FoundInputs, default_model_candidates, find_inputs
from srupp_asr.loading import LoadedModel, add_engine_argument, compute_device, model_dir_named
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
    from srupp_asr.audio import SamplesReader
    from srupp_asr.decoding import DecodingOptions
    from srupp_asr.decoding.batch import AudioSource, Decoded

log = logging.getLogger(__name__)

MAX_CHUNK_SECONDS = 600.0  # the most audio decoded at once (a whole file, a chunk or a padded batch)
# The range of --max-chunk-seconds: shorter chunks hold too little speech to recognise (0.5 s gives garbage, under
# 25 ms not one feature frame: nothing); 10^9 s is beyond any memory (and inf cannot be counted in samples).
CHUNK_SECONDS_RANGE = (1.0, 1e9)
CHUNK_OVERLAP = 10.0  # seconds shared by neighbouring chunks (at most a quarter of a chunk by default)
# Whisper's --language values that mean English (the only language of srupp-asr's models and text normalisation)
ENGLISH = ("en", "english")
# The bar counts seconds of audio; its rate is audio seconds per wall second (the inverse real-time factor).
PROGRESS = "{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} s of audio [{elapsed}<{remaining}, {rate_fmt}]"


# ------------------------------------------------------------------------------------------ the work


@dataclass
class _Job:
    """One input file: where it is, its output name, its samples when given in memory, and its length (once
    probed)."""

    path: str
    name: str
    samples: SamplesReader | None = None
    num_samples: int = 0

    def open(self) -> AudioSource:
        """A reader of the audio at 16 kHz: its samples in memory, or its file (:class:`AudioReader`)."""
        from srupp_asr.audio import AudioReader

        return self.samples if self.samples is not None else AudioReader(self.path)


def transcribe(
    inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | Any,
    model: str | os.PathLike[str] | LoadedModel | None = None,
    *,
    options: DecodingOptions = DEFAULT_OPTIONS,
    sample_rate: int | None = None,
    output_dir: str | os.PathLike[str] | None = None,
    output_format: str | Sequence[str] = "txt",
    device: str = "auto",
    compute_type: str = DEFAULT_COMPUTE_TYPE,
    engine: str = "auto",
    batch_size: int | None = None,
    lm: str | os.PathLike[str] | None = None,
    no_lm: bool = False,
    threads: int | None = None,
    max_chunk_seconds: float = MAX_CHUNK_SECONDS,
    chunk_overlap: float | None = None,
    vad: bool = False,
    max_segment_words: int = MAX_SEGMENT_WORDS,
    segment_pause: float = SEGMENT_PAUSE,
    language: str | None = None,
    task: str | None = None,
    progress: bool = False,
    on_error: Callable[[str], None] | None = None,
    on_transcript: Callable[[Transcript], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
    **decode_options: Any,
) -> list[Transcript]:
    """Transcribe audio files (or directories, or ``@LIST`` files, or what :func:`~srupp_asr.inputs.find_inputs`
    found in them) with a model directory (default: the built-in model); returns the transcripts of the files that
    could be read, in input order.

    ``inputs`` may instead be samples in memory: a numpy array or torch tensor ((samples,) or (channels, samples))
    or a list of them, at ``sample_rate`` Hz; their transcripts' ``path`` is ``samples-1``, ``samples-2``, ...
    ``model`` may be a model loaded once by :func:`srupp_asr.load_model` (then ``device``, ``compute_type``,
    ``engine`` and ``threads`` are its own). ``engine``: ``auto`` (float32 on the CPU in numpy, without torch:
    :mod:`srupp_asr.runtime`), ``numpy`` or ``torch`` (:meth:`~srupp_asr.loading.LoadedModel.load`).
    ``compute_type``: ``float32``, ``int8`` (the Linear layers quantised, CPU only) or ``bfloat16`` (the encoder in
    bfloat16 autocast, where the device does it natively; :mod:`srupp_asr.compute_types`). ``batch_size``: recordings
    (or pieces of long ones) decoded together; None: 8 on a CPU, 32 on a GPU
    (:func:`~srupp_asr.decoding.settings.batch_size_for`).

    ``output_dir`` set: each transcript is also written there as ``<stem>.<format>`` for each of ``output_format``
    (``"txt,srt"``, ``"all"``, or a list), atomically. ``options`` is the
    :class:`~srupp_asr.decoding.DecodingOptions` (default ``joint``, the fused LM's own weight); as in whisper,
    ``**decode_options`` set its fields instead (``beam=5``; ``decoding`` is ``mode``; None leaves a field as it
    is; whisper's ``beam_size`` is ``beam``), over ``options`` when both are given; whisper's ``language`` and
    ``task`` are taken when they ask for English, transcribed (:func:`check_language_and_task`). Shallow fusion:
    the model directory's own LM (``MODEL_DIR/lm``) with its recorded weight by default; ``lm`` another LM directory
    (``srupp-asr train-lm``); ``lm_weight`` overrides the weight (0: no LM); ``no_lm`` decodes without one (see
    :func:`~srupp_asr.loading.choose_lm`). The fused LM's directory is in each transcript's ``decoding["lm"]``.
    ``on_error(message)`` gets a one-line ``"PATH: reason"`` per file that cannot be transcribed, in input order;
    without it the first such file raises :class:`UserError`. ``on_transcript`` is called with each transcript in
    input order as soon as it is ready. ``on_warning(message)`` gets a one-line ``"PATH: reason"`` per file
    transcribed despite a problem (samples far beyond full scale, clipped); without it the warning is logged.
    """
    from tqdm import tqdm

    from srupp_asr.audio import SAMPLE_RATE
    from srupp_asr.threads import set_cpu_threads

    check_language_and_task(language, task)
    formats = parse_formats(output_format)
    if chunk_overlap is None:
        chunk_overlap = min(CHUNK_OVERLAP, max_chunk_seconds / 4)
    _check_settings(batch_size, threads, max_chunk_seconds, chunk_overlap, max_segment_words, segment_pause)
    # checked before anything is read; the LM weight applies once the LM is chosen
    options, lm_weight = requested_options("transcribe", options, decode_options, lm, no_lm)
    if not isinstance(model, LoadedModel):  # what loading would refuse, before any input is read
        compute_device(compute_type, device)
        model_dir_named(model)
    given = samples_readers(inputs, sample_rate)  # None: inputs are paths (or FoundInputs)
    if given is None and isinstance(inputs, str | os.PathLike):
        inputs = [inputs]

    def report(message: str) -> None:
        if on_error is None:
            raise UserError(message)
        on_error(message)

    readers = given[0] if given is not None else []
    if given is not None:
        files, problems = [r.path for r in readers], given[1]
    else:
        files, problems = inputs if isinstance(inputs, FoundInputs) else find_inputs(inputs)
    for message in problems:
        report(message)
    if not files:
        return []
    jobs = [_Job(path, name) for path, name in zip(files, output_names(files), strict=True)]
    for job, reader in zip(jobs, readers, strict=False):
        job.samples = reader
    readable = _probe(jobs, report)  # before the model loads: a file that is not audio is named at once
    if not readable:
        return []
    if threads:
        set_cpu_threads(threads)
    folder_lock = OutputDirLock(output_dir)  # one transcribe per output folder (released as this returns)
    loaded = model if isinstance(model, LoadedModel) else LoadedModel.load(model, device, compute_type, engine)
    options, fusion_lm, choice = loaded.fuse(options, lm, lm_weight, no_lm)
    log.info("%s", choice.describe())
    workers = concurrent_batches(loaded.device)
    batch_size = batch_size_for(batch_size, loaded.device)
    batching = Batching.chunked(options, batch_size, max_chunk_seconds, chunk_overlap, vad, workers)
    net = loaded.net_for(options)
    decoder = BatchDecoder(net, loaded.tokenizer, options, fusion_lm, batching, loaded.model_dir)
    settings = {**dataclasses.asdict(options), **({"lm": str(choice.path)} if choice.path is not None else {})}

    done: list[Transcript] = []

    def finish(job: _Job, result: Decoded) -> None:
        if result.error is not None:
            _report_failure(job.path, result.error, report)
            return
        transcript = _transcript(job.path, result, loaded.model_dir, dict(settings), max_segment_words, segment_pause)
        if result.warning is not None:
            if on_warning is None:
                log.warning("%s", result.warning)
            else:
                on_warning(result.warning)
        if output_dir is not None:
            try:
                write_transcript(transcript, output_dir, job.name, formats)
            except UserError as err:  # a full disk or a read-only folder: this file failed, the others go on
                report(str(err))
                return
        done.append(transcript)
        if on_transcript is not None:
            on_transcript(transcript)

    total = sum(job.num_samples for job in readable) / SAMPLE_RATE
    recordings = [Recording(job.path, job.num_samples, job.open) for job in readable]
    bar = tqdm(total=total, desc="transcribing", unit="s", disable=not progress, file=sys.stderr, bar_format=PROGRESS)
    with bar:
        for job, result in zip(readable, decoder.run(recordings, bar.update), strict=True):
            finish(job, result)
    folder_lock.release()
    return done


def check_language_and_task(language: str | None, task: str | None) -> None:
    """whisper's ``--language`` and ``--task`` as srupp-asr takes them: English, transcribed; a one-line UserError
    for anything else (a whisper user's options work unchanged when they ask for what srupp-asr does)."""
    if language is not None and language.strip().lower() not in ENGLISH:
        raise UserError(f"--language {language}: srupp-asr recognises English only (--language en)")
    if task is not None and task.strip().lower() != "transcribe":
        raise UserError(f"--task {task}: srupp-asr transcribes, it does not translate (--task transcribe)")


def _probe(jobs: list[_Job], report: Callable[[str], None]) -> list[_Job]:
    """The jobs whose audio opens, each with its length in samples; each one that does not is reported."""
    readable = []
    for job in jobs:
        try:
            with job.open() as reader:
                job.num_samples = reader.num_samples
            readable.append(job)
        except UserError as err:
            report(str(err))
    return readable


def _transcript(
    path: str, result: Decoded, model_dir: str, decoding: dict[str, Any], max_segment_words: int, segment_pause: float
) -> Transcript:
    """The transcript of a decoded file from its words (absolute times) or, without words, its text."""
    from srupp_asr.audio import SAMPLE_RATE

    duration = result.num_samples / SAMPLE_RATE
    if result.words:
        segments = segment_words(result.words, max_segment_words, segment_pause)
    else:
        segments = [Segment(0.0, duration, result.text)] if result.text else []
    return Transcript(
        path=path,
        duration=duration,
        text=transcript_text(segments),
        segments=segments,
        model=model_dir,
        decoding=decoding,
        chunks=result.chunks,
        processing_seconds=result.seconds,
    )


def _report_failure(path: str, err: Exception, report: Callable[[str], None]) -> None:
    """Report what went wrong with the file ``path``: its UserError, or, for an unexpected error (a bug), one line
    naming the file and the error, so that one file never stops a batch."""
    if isinstance(err, UserError):
        report(str(err))
        return
    if is_out_of_memory(err):
        report(f"{printable(path)}: {out_of_memory_line(err, 'decoding', DECODING_MEMORY_REMEDY)}")
        return
    log.debug("transcribing %s failed", path, exc_info=err)
    report(f"{printable(path)}: internal error ({type(err).__name__}: {first_line(err)}); please report it")


def samples_readers(audio: Any, sample_rate: int | None) -> tuple[list[SamplesReader], list[str]] | None:
    """``audio`` as samples in memory: the readers of the arrays that can be used and one-line problems for those
    that cannot (named ``samples-N`` by position); None when ``audio`` holds paths, not samples. A list mixing
    the two, or a ``sample_rate`` given with paths, is a UserError."""
    from srupp_asr.audio import SamplesReader, is_samples

    if is_samples(audio):
        items = [audio]
    elif isinstance(audio, Sequence) and not isinstance(audio, str | bytes) and any(map(is_samples, audio)):
        items = list(audio)
        if not all(map(is_samples, items)):
            raise UserError("give either paths or sample arrays to transcribe, not both in one list")
    else:
        if sample_rate is not None:
            raise UserError("sample_rate is for samples given as arrays: files carry their own rate")
        return None
    readers, problems = [], []
    for i, samples in enumerate(items, 1):
        try:
            readers.append(SamplesReader(samples, sample_rate, name=f"samples-{i}"))
        except UserError as err:
            problems.append(str(err))
    return readers, problems


def _check_settings(
    batch_size: int | None,
    threads: int | None,
    max_chunk_seconds: float,
    chunk_overlap: float,
    max_segment_words: int,
    segment_pause: float,
) -> None:
    check_batch_size(batch_size)
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
    check_language_and_task(args.language, args.task)
    keep_freed_memory()
    inputs = list(args.inputs) + [f"@{path}" for path in args.list or []]
    if not inputs:
        raise UserError("no audio given (files, directories, @LIST or --list LIST)")
    formats = parse_formats(args.output_format)
    found = find_inputs(inputs)  # once: how to print depends on how many files there are
    on_transcript = None
    if args.output_dir is None:
        if len(formats) > 1:
            raise UserError("several output formats need --output-dir")
        several = len(found.files) > 1
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
        found,
        args.model,
        output_dir=args.output_dir,
        output_format=formats,
        device=args.device,
        compute_type=args.compute_type,
        engine=args.engine,
        batch_size=args.batch_size,
        decoding=args.decoding,
        beam=args.beam,
        ctc_weight=args.ctc_weight,
        length_penalty=args.length_penalty,
        lexicon_weight=args.lexicon_weight,
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
            if fused.get("lexicon_weight"):
                line += f", its word list at {fused['lexicon_weight']:g} (--lexicon-weight 0: without)"
        if fused.get("length_penalty"):
            line += f"; length bonus {fused['length_penalty']:g} a token (--length-penalty 0: without)"
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
        f"({_builtin_model_text()}), trained mostly on synthetic English speech plus a few hours of real words, "
        "digits and read sentences: far below whisper on real sentences; train on your own data for real use "
        "(docs/training.md). Exit status: 0 all inputs transcribed; 1 some inputs "
        "failed (one error line each, counted in the closing line); 2 a usage or model error. Whisper's spellings "
        "--output_format, --output_dir, --beam_size, --word_timestamps, --language en and --task transcribe are "
        "accepted.",
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
    add_compute_type_argument(p)
    add_engine_argument(p)
    p.add_argument("--threads", type=int, help="CPU threads (default: one per core)")
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
    p.add_argument("--task", metavar="TASK", help="whisper's --task: transcribe is the only one (translate is refused)")
    p.add_argument(
        "--word_timestamps",
        nargs="?",
        const="True",
        choices=("True", "False"),
        help="accepted as whisper takes it; words always carry times here (json, tsv)",
    )
    p.set_defaults(func=transcribe_command)
    return p
