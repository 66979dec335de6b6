"""The whisper-shaped Python API: ``srupp_asr.load_model()`` once, ``model.transcribe(...)`` on paths, lists and
samples in memory (numpy, torch, any rate, int or float, mono or (channels, samples)), checked against the
one-call ``srupp_asr.transcribe`` on the same files; bad samples get one-line errors; field names match JSON."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio.functional as F

import srupp_asr
from srupp_asr.audio import SAMPLE_RATE
from srupp_asr.errors import UserError
from srupp_asr.inputs import DEFAULT_MODEL_ENV
from srupp_asr.writers import to_dict

GREEDY = {"decoding": "ctc_greedy"}  # exact on the overfit utterances


@pytest.fixture(scope="module")
def loaded(overfit_model_dir):
    return srupp_asr.load_model(overfit_model_dir[0], device="cpu")


@pytest.fixture(scope="module")
def utts(overfit_model_dir):
    return overfit_model_dir[1]


def _words(t):
    return [(w.word, w.start, w.end, w.confidence) for s in t.segments for w in s.words]


def test_a_path_gives_one_transcript_a_list_gives_a_list_as_the_one_call_form(loaded, utts, overfit_model_dir):
    (wav, text), (wav2, text2) = utts[:2]
    one = loaded.transcribe(str(wav), **GREEDY)
    assert one.text == text and one.path == str(wav)
    several = loaded.transcribe([wav2, wav], **GREEDY)
    assert [t.text for t in several] == [text2, text]
    reference = srupp_asr.transcribe([wav2, wav], overfit_model_dir[0], **GREEDY)
    assert [_words(t) for t in several] == [_words(t) for t in reference]
    # Alone or in a batch: the same words and times; the confidences within float32 rounding (the numpy runtime's
    # matrix products round a row by how many rows go with it: about 1e-7 here).
    alone, batched = _words(one), _words(several[1])
    assert [w[:3] for w in batched] == [w[:3] for w in alone]
    assert [w[3] for w in batched] == pytest.approx([w[3] for w in alone], abs=1e-6)


def test_the_model_is_loaded_once(loaded, utts, monkeypatch):
    import srupp_asr.model_dir

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded again")

    monkeypatch.setattr(srupp_asr.model_dir, "load_model_dir", no_loading)
    for wav, text in utts[:2]:
        assert loaded.transcribe(wav, **GREEDY).text == text


def test_samples_in_memory_give_the_files_transcript(loaded, utts):
    wav, text = utts[0]
    from_file = loaded.transcribe(wav, **GREEDY)
    samples, rate = sf.read(wav, dtype="float32")
    assert rate == SAMPLE_RATE
    as_numpy = loaded.transcribe(samples, sample_rate=rate, **GREEDY)
    as_torch = loaded.transcribe(torch.from_numpy(samples), sample_rate=rate, **GREEDY)
    assert as_numpy.path == as_torch.path == "samples-1"
    assert _words(as_numpy) == _words(as_torch) == _words(from_file)
    # int16 at full scale, as soundfile or scipy give a 16-bit file: the same words
    as_int16 = loaded.transcribe(sf.read(wav, dtype="int16")[0], sample_rate=rate, **GREEDY)
    assert as_int16.text == text
    # an int16 torch tensor is scaled as the int16 array is (not taken as float values far beyond full scale)
    int16_tensor = torch.from_numpy(sf.read(wav, dtype="int16")[0])
    assert _words(loaded.transcribe(int16_tensor, sample_rate=rate, **GREEDY)) == _words(as_int16)
    # two channels at 44.1 kHz: mixed down and resampled to 16 kHz like a file would be
    stereo = F.resample(torch.from_numpy(samples), rate, 44100).repeat(2, 1)
    assert loaded.transcribe(stereo, sample_rate=44100, **GREEDY).text == text
    listed = loaded.transcribe([samples, samples[: len(samples) // 2]], sample_rate=rate, **GREEDY)
    assert [t.path for t in listed] == ["samples-1", "samples-2"] and listed[0].text == text


def test_long_samples_are_decoded_in_chunks_as_the_file_is(loaded, utts):
    """Samples longer than the chunk budget take the long-recording path, read from memory like a file."""
    wav, _ = utts[0]
    samples = sf.read(wav, dtype="float32")[0]
    options = {**GREEDY, "max_chunk_seconds": 1.0}
    from_file = loaded.transcribe(wav, **options)
    from_samples = loaded.transcribe(samples, sample_rate=SAMPLE_RATE, **options)
    assert len(from_samples.chunks) > 1 and from_samples.chunks == from_file.chunks
    assert _words(from_samples) == _words(from_file) and from_samples.text


def test_bad_samples_are_one_line_errors_and_the_others_go_on(loaded, utts):
    samples = sf.read(utts[0][0], dtype="float32")[0]
    with pytest.raises(UserError, match=r"^samples-1: audio given as samples needs its sample_rate"):
        loaded.transcribe(samples)
    with pytest.raises(UserError, match=r"look like \(samples, channels\); give \(channels, samples\)"):
        loaded.transcribe(np.stack([samples, samples], axis=1), sample_rate=SAMPLE_RATE)
    with pytest.raises(UserError, match="holds no audio samples"):
        loaded.transcribe(np.zeros(0, np.float32), sample_rate=SAMPLE_RATE)
    with pytest.raises(UserError, match="must be float or int8/int16/int32"):
        loaded.transcribe(samples.astype(np.uint8), sample_rate=SAMPLE_RATE)
    with pytest.raises(UserError, match="not both"):
        loaded.transcribe([samples, str(utts[0][0])], sample_rate=SAMPLE_RATE)
    with pytest.raises(UserError, match="sample_rate is for samples"):
        loaded.transcribe(utts[0][0], sample_rate=SAMPLE_RATE)
    for rate in (10**12, 999):  # 10**12 Hz tried a 26 GB resampling kernel, then a bare RuntimeError
        with pytest.raises(UserError, match=rf"^samples-1: sample_rate {rate} Hz is outside 1000-1000000 Hz"):
            loaded.transcribe(samples, sample_rate=rate)
    with pytest.raises(UserError, match=r"decoding options: beam must be an integer in \[1, 128\]"):
        loaded.transcribe(samples, sample_rate=SAMPLE_RATE, decoding="joint", beam=10**9)  # tried 19.5 GB
    with pytest.raises(UserError, match=r"decoding options: lm_weight must be a number in \[0, 1000\]"):
        loaded.transcribe(samples, sample_rate=SAMPLE_RATE, decoding="joint", lm_weight=1e300)
    errors: list[str] = []
    bad = samples.copy()
    bad[100] = np.nan
    done = loaded.transcribe([bad, samples], sample_rate=SAMPLE_RATE, on_error=errors.append, **GREEDY)
    assert errors == ["samples-1: not usable audio (it holds NaN or infinite samples)"]
    assert [t.path for t in done] == ["samples-2"] and done[0].text == utts[0][1]
    assert loaded.transcribe(bad, sample_rate=SAMPLE_RATE, on_error=errors.append) is None


def test_loud_samples_are_clipped_with_a_warning(loaded, utts):
    samples = sf.read(utts[0][0], dtype="float32")[0]
    warnings: list[str] = []
    loaded.transcribe(samples * 5, sample_rate=SAMPLE_RATE, on_warning=warnings.append, **GREEDY)
    assert len(warnings) == 1 and warnings[0].startswith("samples-1: its samples reach")


def test_word_fields_are_named_as_in_json(loaded, utts):
    t = loaded.transcribe(utts[0][0], **GREEDY)
    data = to_dict(t)
    assert data["text"] == t.text
    for segment, seg_data in zip(t.segments, data["segments"], strict=True):
        for name in ("start", "end", "text"):
            assert getattr(segment, name) == pytest.approx(seg_data[name], abs=1e-3)
        assert len(segment.words) == len(seg_data["words"]) > 0
        for word, word_data in zip(segment.words, seg_data["words"], strict=True):
            assert set(word_data) == {"word", "start", "end", "confidence"}
            for name, value in word_data.items():
                expected = getattr(word, name)
                assert value == (expected if isinstance(value, str) else pytest.approx(expected, abs=1e-3))


def test_model_names_and_missing_directories(overfit_model_dir, monkeypatch, tmp_path):
    monkeypatch.setenv(DEFAULT_MODEL_ENV, str(overfit_model_dir[0]))
    for name in (None, "default"):
        assert srupp_asr.load_model(name, device="cpu").model_dir == str(overfit_model_dir[0])
    with pytest.raises(UserError, match=r"no-model: model directory not found"):
        srupp_asr.load_model(tmp_path / "no-model")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"^base.en: model directory not found \(srupp-asr has no whisper-sized"):
        srupp_asr.load_model("base.en")
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match=r"--device cuda: no CUDA device"):
            srupp_asr.load_model(overfit_model_dir[0], device="cuda")


def test_the_loaded_models_own_device_and_model_are_not_overridden(loaded, utts):
    with pytest.raises(TypeError, match="'device'"):
        loaded.transcribe(utts[0][0], device="cpu")


def test_decoding_options_as_an_object_or_as_keywords(loaded, utts, overfit_model_dir):
    """``options=DecodingOptions(...)`` decodes as the same settings given as keywords (whisper's
    ``**decode_options``); keywords set fields over ``options``; the default is joint with the LM's own weight."""
    from srupp_asr.decoding import DecodingOptions
    from srupp_asr.decoding.settings import DEFAULT_OPTIONS

    assert (DEFAULT_OPTIONS.mode, DEFAULT_OPTIONS.lm_weight) == ("joint", None)
    wav, text = utts[0]
    by_keywords = loaded.transcribe(wav, **GREEDY)
    by_options = loaded.transcribe(wav, options=DecodingOptions("ctc_greedy"))
    assert _words(by_options) == _words(by_keywords) and by_options.text == text
    assert by_options.decoding == by_keywords.decoding and by_options.decoding["lm_weight"] == 0.0
    (one_call,) = srupp_asr.transcribe(wav, overfit_model_dir[0], options=DecodingOptions("ctc_greedy"))
    assert _words(one_call) == _words(by_options)
    over = loaded.transcribe(wav, options=DecodingOptions("joint", beam=4), decoding="ctc_greedy", beam=None)
    assert (over.decoding["mode"], over.decoding["beam"]) == ("ctc_greedy", 4)  # None leaves the field as it is
    assert loaded.transcribe(wav, options=DecodingOptions("joint", beam=2)).decoding["beam"] == 2


def test_bad_decoding_keywords_are_one_line_errors(loaded, utts):
    wav = utts[0][0]
    with pytest.raises(TypeError, match=r"^transcribe\(\) got an unexpected keyword argument 'best_of'$"):
        loaded.transcribe(wav, best_of=5)  # whisper's sampling: srupp-asr has none
    with pytest.raises(TypeError, match=r"as decoding= or as mode=, not both"):
        loaded.transcribe(wav, decoding="joint", mode="ctc_greedy")
    with pytest.raises(UserError, match=r"^decoding options: beam must be an integer in \[1, 128\] .*, got 0$"):
        loaded.transcribe(wav, beam=0)
    with pytest.raises(UserError, match=r"^decoding options: mode must be one of .*, got 'greedy'$"):
        loaded.transcribe(wav, decoding="greedy")


def test_importing_the_package_leaves_torch_and_numpy_unloaded():
    code = "import sys, srupp_asr; print('torch' in sys.modules or 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_readme_python_example_runs(overfit_model_dir, monkeypatch, tmp_path, capsys):
    """The README's Python block, as written, on a synthesised hello.wav (the built-in model stood in for by the
    overfit model, which loads faster)."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    block = readme.split("```python\n", 1)[1].split("```", 1)[0]
    wav, text = overfit_model_dir[1][0]
    (tmp_path / "hello.wav").write_bytes(wav.read_bytes())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(DEFAULT_MODEL_ENV, str(overfit_model_dir[0]))
    exec(compile(block, "README.md", "exec"), {})
    assert capsys.readouterr().out.startswith(text + " [(")


def test_whispers_keyword_names_are_taken_as_the_command_line_takes_them(loaded, utts):
    wav = utts[0][0]
    whisper = loaded.transcribe(wav, decoding="joint", beam_size=3, language="en", task="transcribe")
    assert whisper.decoding["beam"] == 3 and whisper.text == loaded.transcribe(wav, decoding="joint", beam=3).text
    with pytest.raises(TypeError, match="beam= or as beam_size="):
        loaded.transcribe(wav, beam=3, beam_size=4)
    with pytest.raises(UserError, match="--language fr: srupp-asr recognises English only"):
        loaded.transcribe(wav, language="fr")
    with pytest.raises(UserError, match="--task translate: srupp-asr transcribes, it does not translate"):
        loaded.transcribe(wav, task="translate")
