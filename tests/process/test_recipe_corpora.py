"""recipes/{librispeech,tedlium3,aishell1}/run.sh on tiny fake copies of the corpora in their real on-disk layouts.

Each test writes a few espeak-ng utterances as the corpus would hold them (LibriSpeech: FLAC per utterance and a
``*.trans.txt`` per chapter; TED-LIUM 3: whole talks as NIST SPHERE with STM transcripts, ``<unk>``, ``{NOISE}``,
split contractions and ``ignore_time_segment_in_scoring`` segments; AISHELL-1: WAV per utterance under speaker
folders and one transcript file of space-separated words), then runs the recipe from the manifests through the
tokenizer, a few training steps, averaging, decoding (greedy CTC and joint CTC/attention) and scoring, and checks
what each stage wrote. The download stage is checked offline (an unreachable proxy stands in for no network).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import yaml
from lhotse import AudioSource, MonoCut, Recording

from srupp_asr.audio import SAMPLE_RATE, load_audio
from srupp_asr.corpora import normalize_tedlium_text
from srupp_asr.manifest import load_cuts
from srupp_asr.model_dir import load_model_dir
from srupp_asr.scoring.talks import scored_hypothesis

ROOT = Path(__file__).resolve().parents[2]
ESPEAK = shutil.which("espeak-ng")

pytestmark = pytest.mark.skipif(ESPEAK is None, reason="needs espeak-ng (apt-get install espeak-ng)")

ENGLISH = [
    "the cat sat on the mat",
    "a dog ran in the park",
    "she reads a book every night",
    "we walked to the old bridge",
    "the sun is warm today",
    "he plays the piano well",
    "birds sing in the morning",
    "my friend has a red car",
    "the river flows to the sea",
    "they eat bread and cheese",
    "it is a quiet little town",
    "the train leaves at noon",
]
MANDARIN = ["今天 天气 很 好", "我 喜欢 读 书", "他 在 公园 跑步", "我们 去 北京", "这 是 一 个 苹果", "她 会 唱歌"]
# Training steps: one short epoch, so validation runs and leaves a checkpoint to average.
TRAIN_ARGS = "--trainer.max_epochs 1 --trainer.limit_train_batches 3 --trainer.limit_val_batches 2"


def _speak(text: str, folder: Path, voice: str = "en-us") -> np.ndarray:
    """``text`` spoken by espeak-ng, as a 16 kHz float waveform."""
    wav = folder / "espeak.wav"
    subprocess.run([ESPEAK, "-v", voice, "-w", str(wav), text], check=True, capture_output=True, timeout=60)
    return load_audio(wav)


def _run(recipe: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    # The recipe calls `srupp-asr`: the one installed beside this interpreter (the venv need not be activated).
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "PATH": path, **(env or {})}
    script = ROOT / "recipes" / recipe / "run.sh"
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, timeout=1800, env=env)


def _ok(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout + out.stderr


def _results(folder: Path) -> dict:
    return json.loads((folder / "results.json").read_text())


# ---- fake corpora -------------------------------------------------------------------------------------------------


def make_librispeech(root: Path) -> Path:
    """``root/LibriSpeech/<part>/<speaker>/<chapter>/<speaker>-<chapter>-<nnnn>.flac`` and ``.trans.txt`` files."""
    corpus = root / "LibriSpeech"
    parts = {"train-clean-100": (2, 4), "dev-clean": (1, 3), "dev-other": (1, 3), "test-clean": (1, 3)}
    parts["test-other"] = (1, 3)
    sentence = 0
    for p, (part, (speakers, per_chapter)) in enumerate(parts.items()):
        for s in range(speakers):
            speaker, chapter = 100 + 10 * p + s, 2000 + p
            folder = corpus / part / str(speaker) / str(chapter)
            folder.mkdir(parents=True)
            lines = []
            for u in range(per_chapter):
                utt = f"{speaker}-{chapter}-{u:04d}"
                text = ENGLISH[sentence % len(ENGLISH)]
                sentence += 1
                sf.write(folder / f"{utt}.flac", _speak(text, root), SAMPLE_RATE)
                lines.append(f"{utt} {text.upper()}\n")
            (folder / f"{speaker}-{chapter}.trans.txt").write_text("".join(lines))
    return corpus


# (text as the STM has it, or None for an ignore_time_segment_in_scoring stretch of speech)
TALKS = {
    "train": {
        "AliceSmith_2010": ["the cat sat on the mat", "a dog ran in the {NOISE} park", "it 's a quiet little town"],
        "BobJones_2011": ["she reads a book every night", None, "we walked to the old <unk> bridge"],
    },
    "dev": {"CarolWhite_2009": ["the sun is warm today", "he plays the piano well"]},
    "test": {
        "DavidBrown_2012": ["birds sing in the morning", None, "my friend has a red car", "the river flows(2) to sea"],
        "EveBlack_2008": ["they eat bread and cheese", "the train leaves at noon"],
    },
}


def make_tedlium(root: Path) -> Path:
    """``root/TEDLIUM_release-3/legacy/<split>/{sph,stm}/<talk>.{sph,stm}``: each talk one SPHERE recording of its
    segments with pauses between them, the pauses and a leading stretch of silence unsegmented."""
    corpus = root / "TEDLIUM_release-3"
    pause = np.zeros(int(0.6 * SAMPLE_RATE), dtype=np.float32)
    for split, talks in TALKS.items():
        (corpus / "legacy" / split / "sph").mkdir(parents=True)
        (corpus / "legacy" / split / "stm").mkdir(parents=True)
        for talk, segments in talks.items():
            audio, lines = [pause], []
            for k, text in enumerate(segments):
                spoken = ENGLISH[k] if text is None else text.replace("{NOISE} ", "").replace("<unk> ", "")
                speech = _speak(spoken.replace("(2)", "").replace(" 's", "'s"), root)
                start = sum(len(a) for a in audio) / SAMPLE_RATE
                end = start + len(speech) / SAMPLE_RATE
                label = "ignore_time_segment_in_scoring" if text is None else text
                speaker = "inter_segment_gap" if text is None else talk.split("_")[0]
                lines.append(f"{talk} 1 {speaker} {start:.2f} {end:.2f} <o,f0,male> {label}\n")
                audio += [speech, pause]
            sph = corpus / "legacy" / split / "sph" / f"{talk}.sph"
            sf.write(sph, np.concatenate(audio), SAMPLE_RATE, format="NIST", subtype="PCM_16")
            (corpus / "legacy" / split / "stm" / f"{talk}.stm").write_text("".join(lines))
    return corpus


def make_aishell(root: Path) -> Path:
    """``root/aishell/data_aishell/wav/<split>/<speaker>/BAC009<speaker>W<nnnn>.wav`` and
    ``data_aishell/transcript/aishell_transcript_v0.8.txt`` (words separated by spaces), plus an utterance without
    a transcript (lhotse leaves it out)."""
    corpus = root / "aishell"
    lines = []
    n = 0
    for split, speakers in {"train": ("S0002", "S0003"), "dev": ("S0724",), "test": ("S0764",)}.items():
        for speaker in speakers:
            folder = corpus / "data_aishell" / "wav" / split / speaker
            folder.mkdir(parents=True)
            for _ in range(3):
                utt = f"BAC009{speaker}W{n:04d}"
                text = MANDARIN[n % len(MANDARIN)]
                n += 1
                sf.write(folder / f"{utt}.wav", _speak(text.replace(" ", ""), root, "cmn"), SAMPLE_RATE)
                lines.append(f"{utt} {text}\n")
    sf.write(corpus / "data_aishell/wav/train/S0002/BAC009S0002W9999.wav", _speak("你好", root, "cmn"), SAMPLE_RATE)
    transcript = corpus / "data_aishell" / "transcript" / "aishell_transcript_v0.8.txt"
    transcript.parent.mkdir(parents=True)
    transcript.write_text("".join(lines), encoding="utf-8")
    return corpus


# ---- tests -------------------------------------------------------------------------------------------------------


def _common(tmp_path: Path, corpus: Path) -> list[str]:
    return ["--corpus-dir", str(corpus), "--data", str(tmp_path / "data"), "--exp", str(tmp_path / "exp")]


def _decode_args() -> list[str]:
    return ["--decodings", "ctc_greedy joint", "--beam", "2", "--device", "cpu"]


def test_librispeech_recipe_prepares_trains_decodes_and_scores_and_rerun_skips_done_work(tmp_path):
    corpus = make_librispeech(tmp_path / "corpus")
    common = [*_common(tmp_path, corpus), "--subset", "100", "--nj", "2"]
    model = ["--config", "conf/tiny_cpu.yaml", "--vocab-size", "40", "--num-avg", "1", "--train-args", TRAIN_ARGS]
    log = _ok(_run("librispeech", *common, *model, *_decode_args(), "--test-sets", "test_clean test_other"))

    manifests = tmp_path / "data" / "manifests"
    train = load_cuts(manifests / "train_cuts.jsonl.gz")
    assert len(train) == 8 and train[0].id == "100-2000-0000"
    assert train[0].supervisions[0].text == ENGLISH[0].upper() and train[0].supervisions[0].speaker == "100"
    assert len(load_cuts(manifests / "dev_cuts.jsonl.gz")) == 6  # dev-clean + dev-other
    for name in ("dev_clean", "dev_other", "test_clean", "test_other"):
        assert len(load_cuts(manifests / f"{name}_cuts.jsonl.gz")) == 3
    perturbed = load_cuts(manifests / "train_sp_cuts.jsonl.gz")
    assert [c.id for c in perturbed][:3] == ["100-2000-0000_sp0.9", "100-2000-0000", "100-2000-0000_sp1.1"]
    assert len(perturbed) == 24 and perturbed[0].duration == pytest.approx(train[0].duration / 0.9, abs=1e-3)
    net, tokenizer = load_model_dir(tmp_path / "exp" / "model")
    assert tokenizer.vocab_size == net.vocab_size == 40
    for mode in ("ctc_greedy", "joint"):
        for name in ("test_clean", "test_other"):
            results = _results(tmp_path / "exp" / f"decode_{mode}" / name)
            assert results["name"] == name and results["WER"]["sentences"] == 3
            assert (tmp_path / "exp" / f"decode_{mode}" / name / "report.html").is_file()
    assert "beam=2" in (tmp_path / "exp" / "decode_joint" / "test_clean" / "results.md").read_text()
    summary = (tmp_path / "exp" / "RESULTS.md").read_text()
    assert summary.startswith("# LibriSpeech 100 h results") and summary.count("| joint | test_") == 2
    assert "using the existing copy" in log

    again = _ok(_run("librispeech", *common, "--stage", "1", "--stop-stage", "4"))
    for done in ("_cuts.jsonl.gz exist, skipping", "train_sp_cuts.jsonl.gz exists", "cmvn.json exists"):
        assert done in again
    again = _ok(_run("librispeech", *common, *_decode_args(), "--test-sets", "test_clean", "--stage", "8"))
    assert again.count("results.json exists, skipping") == 2

    # stage 7: an LM on two text files (one with spaces in its path), then fused into the beam modes with
    # conf/decode_librispeech.yaml's weight
    texts = [tmp_path / "lm texts" / "part 1.txt", tmp_path / "part2.txt"]
    texts[0].parent.mkdir()
    texts[0].write_text("".join(f"{sup.text}\n" for cut in train for sup in cut.supervisions))
    texts[1].write_text("THE CAT SAT\nA DOG RAN\n")
    lm = ["--use-lm", "true", "--lm-args", "--d-model 32 --num-layers 1 --attn-dim 16 --num-heads 1 --max-epochs 1"]
    lm += [a for text in texts for a in ("--lm-text", str(text))]
    log = _ok(_run("librispeech", *common, *_decode_args(), *lm, "--test-sets", "test_clean", "--stage", "7"))
    assert f"train-lm: {len(train) + 2} training sentences" in log  # both files, read whole
    assert (tmp_path / "exp" / "lm" / "model.safetensors").is_file()
    fused = (tmp_path / "exp" / "decode_joint_lm" / "test_clean" / "results.md").read_text()
    assert "mode=joint beam=2 ctc_weight=0.3 lm_weight=0.6" in fused


def test_tedlium_recipe_scores_segments_and_whole_talks(tmp_path):
    corpus = make_tedlium(tmp_path / "corpus")
    common = [*_common(tmp_path, corpus), "--nj", "2"]
    model = ["--config", "conf/tiny_cpu.yaml", "--vocab-size", "30", "--num-avg", "1", "--train-args", TRAIN_ARGS]
    longform = ["--longform-decodings", "ctc_greedy", "--longform-max-seconds", "8"]
    _ok(_run("tedlium3", *common, *model, *_decode_args(), *longform))

    manifests = tmp_path / "data" / "manifests"
    train = {c.id: c for c in load_cuts(manifests / "train_cuts.jsonl.gz")}
    assert len(train) == 5  # the ignore_time_segment_in_scoring segment left out
    texts = sorted(c.supervisions[0].text for c in train.values())
    assert "a dog ran in the park" in texts and "it's a quiet little town" in texts
    assert "we walked to the old bridge" in texts
    first = train["AliceSmith_2010-0"]  # widened by 0.15 s before (from 0.60 s) and 0.1 s after
    assert first.start == pytest.approx(0.45, abs=0.011)
    assert first.supervisions[0].start == 0 and first.supervisions[0].duration == pytest.approx(first.duration)
    test = load_cuts(manifests / "test_cuts.jsonl.gz")
    assert "the river flows to sea" in {c.supervisions[0].text for c in test}  # "(2)" gone
    assert test[0].id == "DavidBrown_2012-0" and test[0].start == pytest.approx(0.6, abs=0.011)  # STM times kept
    talks = {c.id: c for c in load_cuts(manifests / "test_talks_cuts.jsonl.gz")}
    assert sorted(talks) == ["DavidBrown_2012", "EveBlack_2008"]
    talk = talks["DavidBrown_2012"]
    assert len(talk.supervisions) == 3 and talk.start == pytest.approx(0.6, abs=0.011)
    assert len(talk.custom["unscored"]) == 1 and talk.custom["unscored"][0][0] > talk.start

    exp = tmp_path / "exp"
    for mode in ("ctc_greedy", "joint"):
        assert _results(exp / f"decode_{mode}" / "test")["WER"]["sentences"] == 5
    longform = _results(exp / "decode_longform_ctc_greedy" / "test_talks")
    assert longform["name"] == "test_talks" and longform["WER"]["sentences"] == 2
    assert longform["WER"]["tokens"] == 26  # the talks' scored words, the ignored segment's not among them
    transcripts = exp / "decode_longform_ctc_greedy" / "test_talks" / "transcripts"
    chunks = json.loads((transcripts / "DavidBrown_2012.json").read_text())["chunks"]
    assert len(chunks) >= 2 and chunks[0][0] == 0  # the whole recording, decoded in overlapping chunks
    assert "| longform_ctc_greedy | test_talks |" in (exp / "RESULTS.md").read_text()


def test_aishell_recipe_models_characters(tmp_path):
    corpus = make_aishell(tmp_path / "corpus")
    common = _common(tmp_path, corpus)
    model = ["--config", "conf/tiny_cpu.yaml", "--num-avg", "1", "--train-args", TRAIN_ARGS]
    _ok(_run("aishell1", *common, *model, *_decode_args()))

    manifests = tmp_path / "data" / "manifests"
    train = load_cuts(manifests / "train_cuts.jsonl.gz")
    assert len(train) == 6 and all(" " not in c.supervisions[0].text for c in train)
    assert train[0].id == "BAC009S0002W0000" and train[0].supervisions[0].speaker == "S0002"
    assert train[0].supervisions[0].text == MANDARIN[0].replace(" ", "")
    _, tokenizer = load_model_dir(tmp_path / "exp" / "model")
    pieces = {tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)}
    assert {"今", "天", "气", "很", "好"} <= pieces  # one piece per character
    for mode in ("ctc_greedy", "joint"):
        for name in ("dev", "test"):
            results = _results(tmp_path / "exp" / f"decode_{mode}" / name)
            assert results["WER"]["sentences"] == 3 and results["CER"]["tokens"] > 9


@pytest.mark.parametrize("recipe", ["librispeech", "tedlium3", "aishell1"])
def test_download_stage_offline_says_to_pass_corpus_dir(tmp_path, recipe):
    unreachable = "http://127.0.0.1:9"  # nothing listens on the discard port: as if offline, even with a network
    env = {"http_proxy": unreachable, "https_proxy": unreachable, "HTTP_PROXY": unreachable, "no_proxy": ""}
    args = ["--stop-stage", "0", "--download-dir", str(tmp_path / "downloads"), "--data", str(tmp_path / "data")]
    out = _run(recipe, *args, env=env)
    assert out.returncode != 0
    line = out.stderr.strip().splitlines()[-1]
    assert "cannot download" in line and "offline?" in line and "--corpus-dir DIR" in line
    assert not any(p.is_file() for p in (tmp_path / "downloads").rglob("*"))  # no empty archive left behind


def test_long_form_scoring_keeps_the_words_of_the_scored_stretches_only():
    recording = Recording(
        id="talk",
        sources=[AudioSource(type="file", channels=[0], source="talk.sph")],
        sampling_rate=SAMPLE_RATE,
        num_samples=20 * SAMPLE_RATE,
        duration=20.0,
    )
    # the talk is scored from 2 s to 16 s, except 6-8 s (an ignore_time_segment_in_scoring stretch)
    cut = MonoCut(id="talk", start=2.0, duration=14.0, channel=0, recording=recording, custom={"unscored": [[6, 8]]})
    words = [("a", 1.0, 1.5), ("b", 3.0, 3.4), ("c", 6.5, 7.0), ("d", 7.8, 8.4), ("e", 15.9, 16.3)]
    transcript = {
        "segments": [
            {
                "start": 1.0,
                "end": 16.3,
                "text": "a b c d e",
                "words": [{"word": w, "start": a, "end": b} for w, a, b in words],
            },
            {"start": 4.0, "end": 5.0, "text": "x y", "words": []},  # a segment without word times: its midpoint
        ]
    }
    assert scored_hypothesis(transcript, cut) == "b d x y"  # a before, e after the scored span; c unscored


def test_librispeech_configs_are_one_flag_apart():
    srupp = yaml.safe_load((ROOT / "conf" / "librispeech_srupp.yaml").read_text())
    conformer = yaml.safe_load((ROOT / "conf" / "librispeech_conformer.yaml").read_text())
    for conf in (srupp, conformer):
        conf["model"].pop("encoder_conf"), conf["model"].pop("encoder"), conf["trainer"].pop("default_root_dir")
    assert srupp == conformer


def test_tedlium_transcripts_are_cleaned_as_kaldi_does():
    stm = "it 's what they 're doing {NOISE} <unk> now(2) <sil>"
    assert normalize_tedlium_text(stm) == "it's what they're doing now"
    assert normalize_tedlium_text("rock and roll ' cause (AliceSmith_2010-001)") == "rock and roll 'cause"
    assert normalize_tedlium_text("[NOISE] <unk>") == ""
