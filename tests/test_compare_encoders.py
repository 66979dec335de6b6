"""benchmarks/compare_encoders.py: matched configs that differ only in the encoder, the long-form recordings and
the training-log reader (the training and decoding it drives are tested elsewhere)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import yaml

from srupp_asr.audio import SAMPLE_RATE

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
ROOT = BENCH.parent


@pytest.fixture(scope="module")
def ce():
    sys.path.insert(0, str(BENCH))  # the script imports its sibling benchmarks
    try:
        spec = importlib.util.spec_from_file_location("compare_encoders", BENCH / "compare_encoders.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCH))


@pytest.mark.parametrize(("config", "presets"), [("synth_en_cpu.yaml", "cpu"), ("synth_en_gpu.yaml", "gpu")])
def test_configs_match_parameters_and_differ_only_in_the_encoder(ce, config, presets):
    base = yaml.safe_load((ROOT / "conf" / config).read_text())
    configs = ce.encoder_configs(base, vocab_size=256, presets=presets)
    assert set(configs) == {"srupp", "conformer", "blstm"}
    counts = {}
    for name, config in configs.items():
        assert config["model"]["encoder"] == name
        rest = {k: v for k, v in config["model"].items() if k not in ("encoder", "encoder_conf")}
        assert rest == {k: v for k, v in base["model"].items() if k not in ("encoder", "encoder_conf")}
        assert {k: v for k, v in config.items() if k != "model"} == {k: v for k, v in base.items() if k != "model"}
        model = {k: v for k, v in config["model"].items() if k not in ce.NOT_MODEL}
        counts[name] = ce.count_params({"vocab_size": 256, **model})[0]
    assert configs["srupp"]["model"]["encoder_conf"] == base["model"]["encoder_conf"]
    for name in ("conformer", "blstm"):  # the preset's shape, except the width knob that was searched
        knob = "ffn_dim" if name == "conformer" else "d_model"
        conf = {k: v for k, v in configs[name]["model"]["encoder_conf"].items() if k != knob}
        assert conf == {k: v for k, v in ce.PRESETS[presets][name].items() if k != knob}
    assert max(counts.values()) / min(counts.values()) - 1 <= ce.MAX_SPREAD


def test_long_recordings_join_utterances_with_pauses_and_their_texts(ce, tmp_path):
    from lhotse import CutSet, MonoCut, Recording, SupervisionSegment

    folder = tmp_path / "corpus" / "manifests"
    folder.mkdir(parents=True)
    cuts = []
    for i, text in enumerate(["one two", "three", "four five six"]):
        wav = tmp_path / f"u{i}.wav"
        sf.write(wav, np.full(SAMPLE_RATE * (i + 1), 0.1, np.float32), SAMPLE_RATE)
        rec = Recording.from_file(wav, recording_id=f"u{i}")
        sup = SupervisionSegment(f"u{i}", f"u{i}", 0.0, rec.duration, text=text)
        cuts.append(MonoCut(f"u{i}", 0.0, rec.duration, 0, recording=rec, supervisions=[sup]))
    CutSet.from_cuts(cuts).to_file(folder / "test_seen_cuts.jsonl.gz")
    args = argparse.Namespace(exp=tmp_path / "exp", data=tmp_path, lengths=[0.1, 0.25])
    made = ce.build_longform(args)
    assert [m for m, _, _ in made] == [0.1, 0.25]
    for minutes, path, _ in made:
        info = sf.info(path)
        assert minutes * 60 <= info.duration < minutes * 60 + 3 + 0.8  # stops after the utterance that fills it
        audio, _ = sf.read(path)
        assert (np.abs(audio) < 1e-4).sum() >= 0.3 * SAMPLE_RATE  # the pauses are silent
    assert made[0][2] == "one two three four five six"  # 1 + 2 + 3 s of speech and pauses fill 6 s
    assert made[1][2].startswith("one two three four five six one two")
    assert ce.build_longform(args)[1][2] == made[1][2]  # made once, read back


def test_training_curve_and_epochs_from_the_csv_log(ce, tmp_path):
    log = tmp_path / "csv" / "version_0"
    log.mkdir(parents=True)
    rows = ["epoch,step,train/loss,valid/loss,valid/wer"]
    rows += [f"0,{s},9.0,," for s in range(0, 100, 20)] + ["0,99,,50.0,90.0"]
    rows += [f"1,{s},8.0,," for s in range(120, 150, 20)] + ["1,149,,40.0,80.0"]
    (log / "metrics.csv").write_text("\n".join(rows) + "\n")
    steps, epochs, curve = ce.read_curve(tmp_path)
    assert steps == 150 and epochs == pytest.approx(150 / 120) and curve == [(100, 50.0, 90.0), (150, 40.0, 80.0)]
