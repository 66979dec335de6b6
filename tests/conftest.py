"""Shared fixtures: real speech synthesised with espeak-ng at test time (no downloaded audio), the spoken corpus
and the model overfit on it; markers by folder; settings for parallel runs (pytest-xdist).

``synthesize_speech(text, name="speech.wav")`` writes a 22.05 kHz 16-bit mono WAV of ``text`` spoken by
espeak-ng into a session-wide temporary folder and returns its path; the same text and name are only
synthesised once per session. Tests asking for it are skipped, with the reason, where espeak-ng is missing.

The expensive fixtures (``corpus``, ``overfit_model_dir``, ``tiny_synth_corpus``) are built once per run,
whatever the number of xdist workers: the first worker to need one builds it in the run's shared temporary folder
under a lock, the others wait for it and read it (:func:`built_once`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import CHAR_CORPUS, OVERFIT, SENTENCES, Corpus, built_once, seeded_model, train_to_zero_wer

TESTS = Path(__file__).resolve().parent
# The longest test files, longest first (measured with --durations on 2 cores): they start first, so that no
# worker is left with a long file at the end while the others idle. xdist hands out files in collection order only
# with --no-loadscope-reorder (the Makefile's); without it, the files with the most tests go first.
LONGEST_FIRST = [
    "process/test_training_acceptance.py",
    "process/test_recipe_synth_en.py",
    "process/test_recipe_corpora.py",
    "process/test_training_stops.py",
    "process/test_resume_matrix.py",
    "test_train.py",
    "test_lm_train.py",
    "process/test_cpu_extension_build.py",
    "process/test_training_faults.py",
    "test_transcribe.py",
    "test_audio.py",
    "test_lm.py",
    "process/test_recipe_args.py",
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests in tests/process/ ``process``: ``make test-fast`` leaves them out.
    Run the files of LONGEST_FIRST first (a stable sort: the order within a file is kept)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    for item in items:
        path = Path(str(item.path))
        if TESTS / "process" in path.parents:
            item.add_marker(pytest.mark.process)

    def order(item: pytest.Item) -> int:
        path = Path(str(item.path))
        return rank.get(path.relative_to(TESTS).as_posix(), len(rank)) if TESTS in path.parents else len(rank)

    items.sort(key=order)


def pytest_configure(config: pytest.Config) -> None:
    """In an xdist worker: torch gets an equal share of the CPU cores (two workers on two cores each taking both
    would fight over them), and so do the child processes the tests start (``OMP_NUM_THREADS``)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers is None:
        return
    threads = max(1, (os.cpu_count() or 1) // int(workers))
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    import torch

    torch.set_num_threads(threads)


# Training steps of the overfit model beyond greedy-CTC WER 0 (see overfit_model_dir).
OVERFIT_EXTRA_STEPS = 100

SPEECH_TEXT = "The quick brown fox jumps over the lazy dog, then sleeps until seven."


@pytest.fixture(scope="session")
def synthesize_speech(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """A function ``(text=SPEECH_TEXT, name="speech.wav") -> Path`` that speaks ``text`` into a WAV file."""
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng); it synthesises the test speech")
    folder = tmp_path_factory.mktemp("speech")
    made: dict[tuple[str, str], Path] = {}

    def synthesize(text: str = SPEECH_TEXT, name: str = "speech.wav") -> Path:
        key = (text, name)
        if key not in made:
            path = folder / name
            subprocess.run([espeak, "-w", str(path), text], check=True, capture_output=True, timeout=60)
            made[key] = path
        return made[key]

    return synthesize


@pytest.fixture(scope="session")
def corpus(synthesize_speech, tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    """:data:`tests.helpers.SENTENCES` spoken by espeak-ng as 16 kHz WAVs ``utt00.wav``...``utt19.wav`` (the
    recording and cut ids), with a char tokenizer and CMVN stats trained on them."""

    def build(folder: Path) -> None:
        import soundfile as sf
        from lhotse import CutSet, MonoCut, Recording, SupervisionSegment

        from srupp_asr.audio import SAMPLE_RATE, load_audio
        from srupp_asr.frontend import compute_cmvn_stats, save_cmvn
        from srupp_asr.tokenizer import Tokenizer

        cuts = []
        for i, text in enumerate(SENTENCES):
            utt = f"utt{i:02d}"
            wav = folder / f"{utt}.wav"
            # espeak-ng speaks at 22.05 kHz; store the model's rate so that loading needs no resampling.
            sf.write(wav, load_audio(synthesize_speech(text, f"acceptance_{utt}.wav")), SAMPLE_RATE)
            rec = Recording.from_file(wav, recording_id=utt)
            sup = SupervisionSegment(id=utt, recording_id=utt, start=0.0, duration=rec.duration, text=text)
            cuts.append(MonoCut(id=utt, start=0.0, duration=rec.duration, channel=0, recording=rec, supervisions=[sup]))
        cutset = CutSet.from_cuts(cuts)
        cutset.to_file(folder / "cuts.jsonl.gz")
        save_cmvn(folder / "cmvn.json", *compute_cmvn_stats(cutset))
        # A char model holds every character of the text (vocab_size is an upper bound for char models).
        Tokenizer.train(SENTENCES, folder / "tokenizer.model", vocab_size=40, model_type="char")

    folder = built_once(tmp_path_factory, "spoken_corpus", build)
    return Corpus(str(folder / "cuts.jsonl.gz"), str(folder / "tokenizer.model"), str(folder / "cmvn.json"))


@pytest.fixture(scope="session")
def overfit_model_dir(corpus: Corpus, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[Path, str]]]:
    """``overfit_model_dir`` -> ``(model_dir, [(wav_path, text), ...])``: a small SRU++ model trained (once per
    run) on the spoken ``corpus`` until its greedy-CTC WER on it is 0, exported with
    :func:`srupp_asr.model_dir.export_model`, and the corpus' utterances as 16 kHz WAVs with their texts (as
    written, not normalised). The model is trained with ctc_weight 0.5, for OVERFIT_EXTRA_STEPS steps beyond
    greedy WER 0 so that the attention decoder memorises too (at WER 0 it could still drop a doubled letter,
    "door" -> "dor"), and its attention decoder alone is weaker than its CTC head: decode ``joint``/``rescoring``
    with ``ctc_weight=0.5``. About 20-50 s of CPU the first time."""

    def build(folder: Path) -> None:
        import torch

        from srupp_asr.model_dir import export_model

        # One thread whatever the run's worker count: float sums differ between thread counts, so the model (and
        # whether its decoder keeps a doubled letter) would otherwise depend on -n.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            module, _, stopper, _ = train_to_zero_wer(
                corpus.cuts, corpus.tokenizer, corpus.cmvn, "srupp", extra_steps=OVERFIT_EXTRA_STEPS
            )
        finally:
            torch.set_num_threads(threads)
        if stopper.zero_at is None:
            pytest.fail(f"the overfit model did not reach WER 0 in {OVERFIT['srupp'][1]} steps: {stopper.history}")
        export_model(module.model.state_dict(), module.model.config, corpus.tokenizer, folder / "model")

    folder = built_once(tmp_path_factory, "overfit_model", build)
    wavs = Path(corpus.cuts).parent
    return folder / "model", [(wavs / f"utt{i:02d}.wav", text) for i, text in enumerate(SENTENCES)]


@pytest.fixture(scope="session")
def tiny_synth_corpus(tmp_path_factory: pytest.TempPathFactory):
    """``srupp-asr synth-corpus --size tiny --seed 0`` (what the synth_en recipe's stage 1 makes with ``--size
    tiny``), built once per run: (its folder, the build's summary). Tests read it or copy it; none may change it."""
    import pickle

    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")
    from srupp_asr.synth.corpus import build_corpus

    def build(folder: Path) -> None:
        summary = build_corpus(folder / "corpus", size="tiny", seed=0, jobs=2, progress=False)
        (folder / "summary.pickle").write_bytes(pickle.dumps(summary))

    folder = built_once(tmp_path_factory, "tiny_synth_corpus", build)
    return folder / "corpus", pickle.loads((folder / "summary.pickle").read_bytes())


@pytest.fixture(scope="module")
def char_tokenizer(tmp_path_factory: pytest.TempPathFactory):
    """A char sentencepiece tokenizer trained on :data:`tests.helpers.CHAR_CORPUS` (one per test module)."""
    from srupp_asr.tokenizer import Tokenizer

    path = tmp_path_factory.mktemp("lang") / "tokenizer.model"
    return Tokenizer.train(CHAR_CORPUS, path, vocab_size=60, model_type="char")


@pytest.fixture()
def model_dir(tmp_path: Path, char_tokenizer) -> Path:
    """An untrained tiny model (:func:`tests.helpers.seeded_model` with seed 0) exported with ``char_tokenizer``
    to ``tmp_path / "model"``."""
    from srupp_asr.model_dir import export_model

    model = seeded_model(0, char_tokenizer.vocab_size)
    return export_model(model.state_dict(), model.config, char_tokenizer.path, tmp_path / "model")
