"""``srupp-asr evaluate``: decode a lhotse cut manifest with a model directory and score it (WER/CER report).

Audio is loaded as training loads it (:func:`srupp_asr.manifest.load_cut_audio`, then resampled to 16 kHz mono
as :class:`srupp_asr.data.ASRDataset` does) and the references are the cuts' supervision texts normalised as
training normalises them (:func:`srupp_asr.manifest.cut_text`). The decoding is ``transcribe``'s batched driver
(:class:`srupp_asr.decoding.batch.BatchDecoder`): cuts longest first, ``batch_size`` at a time, each decoded whole.
The report adds the decoding speed: audio hours, decoding seconds and the real-time factor (decoding time / audio
time; the time to read audio files is reported apart). A model directory's own LM (``lm/``) is fused by default, as
``transcribe`` does (:meth:`srupp_asr.loading.LoadedModel.fuse`); the report names the LM and its weight. The model
is loaded as ``transcribe`` and the Python API load it (:class:`srupp_asr.loading.LoadedModel`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srupp_asr.allocator import keep_freed_memory
from srupp_asr.compute_types import DEFAULT_COMPUTE_TYPE, add_compute_type_argument
from srupp_asr.decoding.settings import (
    DEFAULT_OPTIONS,
    add_decoding_arguments,
    batch_size_for,
    check_batch_size,
    requested_options,
)
from srupp_asr.errors import UserError
from srupp_asr.loading import LoadedModel, add_engine_argument
from srupp_asr.scoring.analysis import ScoreResult, score_transcripts
from srupp_asr.scoring.formats import UtteranceText, jsonl_text
from srupp_asr.scoring.report import WORST, ReportInfo, write_report
from srupp_asr.scoring.score import add_report_arguments, print_summary

if TYPE_CHECKING:
    import numpy as np
    from lhotse.cut import Cut

    from srupp_asr.decoding import DecodingOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecodingSpeed:
    """How long decoding took for how much audio."""

    audio_seconds: float
    decode_seconds: float  # model forward + search (what the real-time factor measures)
    load_seconds: float  # reading and resampling audio files
    utterances: int
    device: str
    lm: str = ""  # the fused LM and its weight (empty: none), for the closing line

    @property
    def rtf(self) -> float | None:
        """Real-time factor: decoding seconds per second of audio (None without audio)."""
        return self.decode_seconds / self.audio_seconds if self.audio_seconds > 0 else None

    def details(self) -> dict[str, str]:
        """Report lines: audio hours, times, RTF."""
        rtf = "-" if self.rtf is None else f"{self.rtf:.4f}"
        audio = f"{self.audio_seconds / 3600:.3f} h ({self.audio_seconds:.1f} s, {self.utterances} utterances)"
        took = f"{self.decode_seconds:.1f} s on {self.device} (+ {self.load_seconds:.1f} s reading audio)"
        return {"audio": audio, "decoding time": took, "real-time factor": rtf}


def _manifest_name(path: str | os.PathLike) -> str:
    name = Path(path).name
    for suffix in (".jsonl.gz", ".jsonl", ".json.gz", ".json"):
        name = name.removesuffix(suffix)
    return name


class _CutAudio:
    """A cut's audio as training reads it (16 kHz mono, clipped to full scale), read whole: the decode driver's
    reader of a cut."""

    def __init__(self, cut: Cut) -> None:
        from srupp_asr.audio import SAMPLE_RATE

        self.cut = cut if cut.sampling_rate == SAMPLE_RATE else cut.resample(SAMPLE_RATE)
        self.num_samples = self.cut.num_samples

    def read(self, start: int, end: int) -> np.ndarray:
        from srupp_asr.audio import prepare_waveform
        from srupp_asr.manifest import load_cut_audio

        return prepare_waveform(load_cut_audio(self.cut), self.cut.sampling_rate)[start:end]

    def level_warning(self) -> str | None:
        return None

    def __enter__(self) -> _CutAudio:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def evaluate(
    model: str | os.PathLike | None,
    cuts: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    options: DecodingOptions = DEFAULT_OPTIONS,
    lm: str | os.PathLike | None = None,
    no_lm: bool = False,
    device: str = "auto",
    compute_type: str = DEFAULT_COMPUTE_TYPE,
    engine: str = "auto",
    batch_size: int | None = None,
    train_log: str | os.PathLike | None = None,
    name: str | None = None,
    worst: int = WORST,
    progress: bool = False,
    allow_command_sources: bool = False,
    errors: list[str] | None = None,
    **decode_options: Any,
) -> tuple[ScoreResult, DecodingSpeed]:
    """Decode every cut of ``cuts`` with the model directory ``model`` (None: the built-in model), score against
    the cuts' texts and write the report (plus ``hyp.jsonl`` / ``ref.jsonl``) into ``out_dir``.

    ``options``, ``**decode_options`` (``decoding``, ``beam``, ...), ``lm``, ``no_lm``, ``compute_type`` and
    ``engine`` are as in :func:`srupp_asr.transcribe`; ``batch_size`` cuts are decoded together (None: 8 on a CPU, 32
    on a GPU). A cut whose audio does not load is left out of the scores
    (the report says how many) and its one-line error goes to ``errors`` (a warning in the log when ``errors`` is
    None). Audio sources that run a shell command are refused unless ``allow_command_sources``."""
    from tqdm import tqdm

    from srupp_asr.audio import SAMPLE_RATE
    from srupp_asr.decoding.batch import BatchDecoder, Batching, Recording, concurrent_batches
    from srupp_asr.manifest import cut_text, load_cuts

    check_batch_size(batch_size)
    # checked before anything is read; the LM weight applies once the LM is chosen
    options, lm_weight = requested_options("evaluate", options, decode_options, lm, no_lm)
    cutset = load_cuts(cuts, allow_command_sources=allow_command_sources)
    loaded = LoadedModel.load(model, device, compute_type, engine)
    options, fusion_lm, choice = loaded.fuse(options, lm, lm_weight, no_lm)
    batching = Batching(batch_size_for(batch_size, loaded.device), workers=concurrent_batches(loaded.device))
    net = loaded.net_for(options)
    decoder = BatchDecoder(net, loaded.tokenizer, options, fusion_lm, batching, loaded.model_dir)

    def speaker(cut) -> str | None:
        return next((s.speaker for s in cut.supervisions if s.speaker), None)

    all_cuts = sorted(cutset, key=lambda c: -c.duration)  # longest first: the driver's batches, in this order
    refs = [UtteranceText(c.id, cut_text(c), speaker(c)) for c in all_cuts]
    speakers = {r.utt_id: r.speaker for r in refs}
    hyps: list[UtteranceText] = []
    failed: dict[str, str] = {}  # cut id -> why its audio did not load
    decode_seconds = load_seconds = audio_samples = 0.0
    recordings = [Recording(c.id, _CutAudio(c).num_samples, lambda c=c: _CutAudio(c)) for c in all_cuts]
    with tqdm(total=len(all_cuts), unit="utt", desc="decoding", disable=not progress, file=sys.stderr) as bar:
        for cut, result in zip(all_cuts, decoder.run(recordings), strict=True):
            load_seconds += result.read_seconds
            if isinstance(result.error, UserError):  # its audio did not load: left out, not the evaluation
                if errors is None:
                    log.warning("skipping %s", result.error)
                failed[cut.id] = str(result.error)
            elif result.error is not None:
                raise result.error
            else:
                decode_seconds += result.decode_seconds
                audio_samples += result.num_samples
                hyps.append(UtteranceText(cut.id, result.text, speakers[cut.id]))
            bar.update(1)
    if errors is not None:
        errors += failed.values()
    refs = [r for r in refs if r.utt_id not in failed]

    order = {c.id: k for k, c in enumerate(cutset)}  # report in manifest order
    refs.sort(key=lambda t: order[t.utt_id])
    hyps.sort(key=lambda t: order[t.utt_id])
    result = score_transcripts(refs, hyps)
    fused = f"{choice.path} (weight {choice.weight:g}, {choice.origin})" if choice.path is not None else ""
    if options.word_penalty:
        fused += f", its word list at {options.word_penalty:g}"
    device = str(loaded.device)
    speed = DecodingSpeed(audio_samples / SAMPLE_RATE, decode_seconds, load_seconds, len(hyps), device, fused)
    details = {"model": loaded.model_dir, "compute type": compute_type, "decoding": _describe(options)}
    details.update(speed.details())
    if fused:
        details["lm"] = fused
    if failed:
        details["left out"] = f"{len(failed)} cut(s) whose audio did not load (not scored)"
    info = ReportInfo(name or _manifest_name(cuts), str(cuts), str(Path(out_dir) / "hyp.jsonl"), True, details)
    transcripts = {"hyp.jsonl": jsonl_text(hyps), "ref.jsonl": jsonl_text(refs)}
    write_report(result, out_dir, info, train_log, worst, extra=transcripts)  # one set: all of it or nothing
    return result, speed


def _describe(options: DecodingOptions) -> str:
    fields = {"mode": options.mode}
    if options.mode != "ctc_greedy":
        fields["beam"] = options.beam
    if options.mode in ("joint", "rescoring"):
        fields["ctc_weight"] = options.ctc_weight
    if options.length_penalty:
        fields["length_penalty"] = options.length_penalty
    if options.lm_weight:
        fields["lm_weight"] = options.lm_weight
    if options.word_penalty:
        fields["lexicon_weight"] = options.lexicon_weight
    return " ".join(f"{k}={v}" for k, v in fields.items())


def evaluate_command(args: argparse.Namespace) -> int:
    """Run ``srupp-asr evaluate`` from parsed arguments; exit code 1 when some cuts' audio did not load."""
    errors: list[str] = []
    keep_freed_memory()
    result, speed = evaluate(
        args.model,
        args.cuts,
        args.out_dir,
        decoding=args.decoding,
        beam=args.beam,
        ctc_weight=args.ctc_weight,
        length_penalty=args.length_penalty,
        lexicon_weight=args.lexicon_weight,
        lm=args.lm,
        lm_weight=args.lm_weight,
        no_lm=args.no_lm,
        device=args.device,
        compute_type=args.compute_type,
        engine=args.engine,
        batch_size=args.batch_size,
        train_log=args.train_log,
        name=args.name,
        worst=args.worst,
        progress=sys.stderr.isatty(),
        allow_command_sources=args.allow_command_sources,
        errors=errors,
    )
    for line in errors:
        print(f"srupp-asr evaluate: error: {line}", file=sys.stderr)
    print_summary(result, args.name or _manifest_name(args.cuts), args.out_dir, args.cuts)
    rtf = "-" if speed.rtf is None else f"{speed.rtf:.4f}"
    fused = f" with the language model {speed.lm}" if speed.lm else ""
    print(f"decoded {speed.audio_seconds / 3600:.3f} h of audio in {speed.decode_seconds:.1f} s, RTF {rtf}{fused}")
    if errors:
        print(f"{len(errors)} cut(s) left out of the scores: their audio did not load (errors above)")
    return 1 if errors else 0


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the ``evaluate`` sub-command."""
    p = subparsers.add_parser(
        "evaluate",
        help="decode a cut manifest with a model and score it (WER/CER report)",
        description="Decode a lhotse cut manifest with a model directory, score the hypotheses against the cuts' "
        "texts (sclite-compatible counts) and write the report (results.md, report.html, alignments, plots, "
        "hyp.jsonl) with the decoding speed.",
    )
    p.add_argument(
        "--model", metavar="DIR", help="model directory (srupp-asr average --out; default: the built-in model)"
    )
    p.add_argument("--cuts", required=True, help="lhotse cut manifest (.jsonl.gz) with reference texts")
    p.add_argument("--out-dir", required=True, help="where the report files go")
    add_decoding_arguments(p, batch_help="utterances decoded together")
    add_compute_type_argument(p)
    add_engine_argument(p)
    add_report_arguments(p)
    p.add_argument(
        "--allow-command-sources",
        action="store_true",
        help="let audio sources that run a shell command (a Kaldi wav.scp pipe) run; only for manifests you trust",
    )
    p.set_defaults(func=evaluate_command)
    return p
