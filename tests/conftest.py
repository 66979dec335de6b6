"""Shared fixtures: real speech synthesised with espeak-ng at test time (no downloaded audio).

``synthesize_speech(text, name="speech.wav")`` writes a 22.05 kHz 16-bit mono WAV of ``text`` spoken by
espeak-ng into a session-wide temporary folder and returns its path; the same text and name are only
synthesised once per session. Tests asking for it are skipped, with the reason, where espeak-ng is missing.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

# Training steps of the overfit model beyond greedy-CTC WER 0 (see overfit_model_dir).
OVERFIT_EXTRA_STEPS = 60

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
def overfit_model_dir(
    synthesize_speech, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, list[tuple[Path, str]]]:
    """``overfit_model_dir`` -> ``(model_dir, [(wav_path, text), ...])``: a small SRU++ model trained (once per
    session) on the 20 espeak-ng sentences of ``tests/test_training_acceptance.py`` until its greedy-CTC WER on
    them is 0, exported with :func:`srupp_asr.model_dir.export_model`, and those utterances as 16 kHz WAVs with
    their texts (as written, not normalised). The model is trained with ctc_weight 0.5, for OVERFIT_EXTRA_STEPS
    steps beyond greedy WER 0 so that the attention decoder memorises too (at WER 0 it could still drop a doubled
    letter, "door" -> "dor"), and its attention decoder alone is weaker than its CTC head: decode
    ``joint``/``rescoring`` with ``ctc_weight=0.5``. About 20-50 s of CPU the first time."""
    import soundfile as sf
    from lhotse import CutSet, MonoCut, Recording, SupervisionSegment

    from srupp_asr.audio import SAMPLE_RATE, load_audio
    from srupp_asr.frontend import compute_cmvn_stats, save_cmvn
    from srupp_asr.model_dir import export_model
    from srupp_asr.tokenizer import Tokenizer
    from tests.test_training_acceptance import OVERFIT, SENTENCES, train_to_zero_wer

    folder = tmp_path_factory.mktemp("overfit_model")
    utterances, cuts = [], []
    for i, text in enumerate(SENTENCES):
        wav = folder / f"utt{i:02d}.wav"
        sf.write(wav, load_audio(synthesize_speech(text, f"overfit_utt{i:02d}.wav")).numpy(), SAMPLE_RATE)
        utterances.append((wav, text))
        rec = Recording.from_file(wav, recording_id=wav.stem)
        sup = SupervisionSegment(id=wav.stem, recording_id=wav.stem, start=0.0, duration=rec.duration, text=text)
        cuts.append(
            MonoCut(id=wav.stem, start=0.0, duration=rec.duration, channel=0, recording=rec, supervisions=[sup])
        )
    cutset = CutSet.from_cuts(cuts)
    cutset.to_file(folder / "cuts.jsonl.gz")
    save_cmvn(folder / "cmvn.json", *compute_cmvn_stats(cutset))
    Tokenizer.train(SENTENCES, folder / "tokenizer.model", vocab_size=40, model_type="char")

    module, _, stopper, _ = train_to_zero_wer(
        str(folder / "cuts.jsonl.gz"),
        str(folder / "tokenizer.model"),
        str(folder / "cmvn.json"),
        "srupp",
        extra_steps=OVERFIT_EXTRA_STEPS,
    )
    if stopper.zero_at is None:
        pytest.fail(f"the overfit model did not reach WER 0 in {OVERFIT['srupp'][1]} steps: {stopper.history}")
    model_dir = export_model(
        module.model.state_dict(), module.model.config, folder / "tokenizer.model", folder / "model"
    )
    return model_dir, utterances
