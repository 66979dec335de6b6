"""benchmarks/real_speech.py: the real dev sets imported by the table importer and scored by the project's
evaluate and scorer (WER after lower-casing and dropping punctuation), pocketsphinx on the same 16 kHz audio, and
a clean skip without the real data. Runs on a few real files of ../shared/data/real_en; skipped where it is absent
(a user's clone)."""

from __future__ import annotations

import csv
import functools
import importlib.util
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from srupp_asr.manifest import load_cuts, save_cuts

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
ROOT = BENCH.parent
RUN = ROOT / "recipes" / "synth_en" / "run.sh"
REAL_DEV = ROOT.parent / "shared" / "data" / "real_en"
# The real dev sets the recipe scores (recipes/synth_en/run.sh real_sets), as real_speech.py's REAL_SETS.
REAL_SETS = ("ljspeech32", "pocketsphinx_testdata", "vctk_dev", "arctic_cathy", "arctic_axb", "fsdd", "speech_commands")
needs_real = pytest.mark.skipif(
    not REAL_DEV.is_dir(), reason=f"no real speech at {REAL_DEV} (a clone without ../shared)"
)


@pytest.fixture(scope="module")
def rs():
    spec = importlib.util.spec_from_file_location("real_speech", BENCH / "real_speech.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _words(text: str) -> list[str]:
    """Lower-cased words without punctuation, written independently of srupp_asr.text."""
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower().replace("-", " ")).split()


def _edits(ref: list[str], hyp: list[str]) -> int:
    """Word-level Levenshtein distance."""
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1]


@needs_real
def test_the_real_sets_import_with_the_table_importer_and_their_durations(rs, tmp_path):
    manifests = rs.import_real_sets(REAL_DEV, tmp_path, ("pocketsphinx_testdata",))
    assert list(manifests) == ["pocketsphinx_testdata"] and list(manifests["pocketsphinx_testdata"]) == ["dev"]
    cuts = {c.id: c for c in load_cuts(manifests["pocketsphinx_testdata"]["dev"])}
    with open(REAL_DEV / "pocketsphinx_testdata" / "manifest.tsv", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    assert len(cuts) == len(rows) == 10
    for row in rows:
        cut = cuts[Path(row["path"]).stem]
        assert abs(cut.duration - float(row["duration_s"])) < 1e-3  # from the audio header, same as the source
        assert (cut.supervisions[0].text, cut.supervisions[0].speaker) == (row["text"], row["speaker"])


@needs_real
def test_real_dev_scoring_of_the_built_in_model_is_wer_after_lowercasing_and_dropping_punctuation(rs, tmp_path):
    manifests = rs.import_real_sets(REAL_DEV, tmp_path / "m", ("ljspeech32", "fsdd"))
    few = [*list(load_cuts(manifests["ljspeech32"]["dev"]))[1:3], *list(load_cuts(manifests["fsdd"]["dev"]))[:2]]
    assert {c.sampling_rate for c in few} == {22050, 8000}  # resampled to 16 kHz on the way in
    save_cuts(few, tmp_path / "few_cuts.jsonl.gz")
    from srupp_asr.inputs import default_model_dir

    wer, rtf = rs.score_model(default_model_dir(), tmp_path / "few_cuts.jsonl.gz", tmp_path / "out")
    hyps = {h["id"]: h["text"] for h in map(json.loads, (tmp_path / "out" / "hyp.jsonl").read_text().splitlines())}
    assert set(hyps) == {c.id for c in few}
    refs = {c.id: _words(c.supervisions[0].text) for c in few}
    assert any(c.supervisions[0].text != " ".join(refs[c.id]) for c in few)  # the raw texts carry case, commas
    errors = sum(_edits(refs[i], _words(hyps[i])) for i in refs)
    assert wer == pytest.approx(100 * errors / sum(len(r) for r in refs.values()))
    assert rtf > 0


@needs_real
def test_pocketsphinx_decodes_real_audio_at_16_khz(rs, tmp_path):
    if not rs.pocketsphinx_available():
        pytest.skip("pocketsphinx is not installed")
    manifests = rs.import_real_sets(REAL_DEV, tmp_path / "m", ("pocketsphinx_testdata", "fsdd"))
    cards = [c for c in load_cuts(manifests["pocketsphinx_testdata"]["dev"]) if c.id.startswith("cards")][:2]
    digits = list(load_cuts(manifests["fsdd"]["dev"]))[:1]
    save_cuts([*cards, *digits], tmp_path / "few_cuts.jsonl.gz")
    wer, _ = rs.score_pocketsphinx(tmp_path / "few_cuts.jsonl.gz", tmp_path / "ps", jobs=1)
    hyps = (tmp_path / "ps" / "pocketsphinx.hyp.trn").read_text().splitlines()
    refs = (tmp_path / "ps" / "pocketsphinx.ref.trn").read_text().splitlines()
    assert len(hyps) == len(refs) == 3
    errors = sum(
        _edits(r.rsplit(" (", 1)[0].split(), h.rsplit(" (", 1)[0].split()) for r, h in zip(refs, hyps, strict=True)
    )
    assert wer == pytest.approx(100 * errors / sum(len(r.rsplit(" (", 1)[0].split()) for r in refs))
    assert wer < 50  # mostly its own test data, at the rate its model expects


@needs_real
@pytest.mark.process  # loads whisper tiny.en (seconds on an idle machine): not in the edit-test loop
def test_whisper_tiny_en_decodes_the_same_cuts_and_is_scored_by_the_project_scorer(rs, tmp_path):
    if not rs.whisper_available():
        pytest.skip("whisper tiny.en is not installed (pip install -e '.[peers]')")
    manifests = rs.import_real_sets(REAL_DEV, tmp_path / "m", ("pocketsphinx_testdata", "fsdd"))
    sentences = [c for c in load_cuts(manifests["pocketsphinx_testdata"]["dev"]) if not c.id.startswith("cards")][:1]
    digits = list(load_cuts(manifests["fsdd"]["dev"]))[:1]  # 8 kHz audio: resampled to 16 kHz for whisper
    save_cuts([*sentences, *digits], tmp_path / "few_cuts.jsonl.gz")
    wer, rtf = rs.score_whisper(tmp_path / "few_cuts.jsonl.gz", tmp_path / "w", threads=1)
    refs = (tmp_path / "w" / "whisper.ref.trn").read_text().splitlines()
    hyps = (tmp_path / "w" / "whisper.hyp.trn").read_text().splitlines()
    assert len(refs) == len(hyps) == 2 and rtf > 0
    words = [len(r.rsplit(" (", 1)[0].split()) for r in refs]
    errors = sum(
        _edits(r.rsplit(" (", 1)[0].split(), h.rsplit(" (", 1)[0].split()) for r, h in zip(refs, hyps, strict=True)
    )
    assert wer == pytest.approx(100 * errors / sum(words)) and wer < 30  # a read sentence and a digit
    (tmp_path / "w" / "whisper.hyp.trn").write_text("".join(f"x ({r.rsplit(' (', 1)[1]}\n" for r in refs))
    again, _ = rs.score_whisper(tmp_path / "few_cuts.jsonl.gz", tmp_path / "w", threads=1)
    assert again > wer  # its transcripts are reused, not decoded again


def test_without_the_real_data_the_benchmark_says_so_and_exits_0(rs, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rs, "DEFAULT_REAL_DEV", tmp_path / "absent")
    assert rs.find_real_dev(None) is None
    monkeypatch.setattr(sys, "argv", ["real_speech.py", "--exp", str(tmp_path / "exp")])
    assert rs.main() == 0
    assert "real_speech: skipped: no real speech at" in capsys.readouterr().out
    assert not (tmp_path / "exp").exists()
    monkeypatch.setattr(sys, "argv", ["real_speech.py", "--real-dev", str(tmp_path)])
    assert rs.main() == 2
    assert "no real_en sets in it" in capsys.readouterr().err


def _mini_real_en(folder: Path, rows_per_set: int = 1) -> Path:
    """A real_en folder with the first rows of each real set (absolute audio paths into ../shared)."""
    for name in REAL_SETS:
        lines = (REAL_DEV / name / "manifest.tsv").read_text().splitlines()
        header, rows = lines[0], [r for r in lines[1:] if r.split("\t")[4] == "dev"][:rows_per_set]
        rows = [f"{REAL_DEV / name / r.split(chr(9), 1)[0]}\t{r.split(chr(9), 1)[1]}" for r in rows]
        (folder / name).mkdir(parents=True)
        (folder / name / "manifest.tsv").write_text("\n".join([header, *rows]) + "\n")
    return folder


@needs_real
@pytest.mark.slow  # a corpus, then eight sets decoded by fresh processes: minutes on a busy 2-core machine
@pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("espeak-ng", "flite", "sox")), reason="needs espeak-ng, flite and sox"
)
def test_the_synth_en_recipe_scores_the_real_dev_sets_beside_the_synthetic_ones(tmp_path):
    data, exp = tmp_path / "data", tmp_path / "exp"
    common = ["--size", "tiny", "--nj", "2", "--data", str(data), "--exp", str(exp), "--lm", "false"]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}

    def run(*args: str) -> str:
        out = subprocess.run(["bash", str(RUN), *common, *args], capture_output=True, text=True, timeout=1200, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout + out.stderr

    run("--stage", "1", "--stop-stage", "1")
    shutil.copytree(ROOT / "srupp_asr" / "default_model", exp / "model")
    mini = _mini_real_en(tmp_path / "real_en")
    ps = "true" if importlib.util.find_spec("pocketsphinx") else "false"
    run("--stage", "6", "--stop-stage", "7", "--decodings", "ctc_greedy", "--pocketsphinx", ps, "--real-dev", str(mini))
    real = [f"real_{name}" for name in REAL_SETS]
    for name in real:
        assert load_cuts(data / "real_en" / name.removeprefix("real_") / "dev_cuts.jsonl.gz")  # imported by the table
        results = json.loads((exp / "decode_ctc_greedy" / name / "results.json").read_text())
        assert results["name"] == name and results["WER"]["sentences"] == 1
    summary = (exp / "RESULTS.md").read_text()
    assert all(f"| ctc_greedy | {name} |" in summary for name in ["test_seen", "test_unseen", *real])
    if ps == "true":
        assert all(f"| pocketsphinx | {name} |" in summary for name in real)
    log = run(
        "--stage",
        "6",
        "--stop-stage",
        "6",
        "--decodings",
        "ctc_greedy",
        "--pocketsphinx",
        "false",
        "--real-dev",
        "none",
    )
    assert "no real speech (--real-dev" in log and "scoring the synthetic sets only" in log


def _tone_corpus(root: Path, name: str, count: int, seconds: float) -> Path:
    """A manifest of ``count`` tones of ``seconds`` each, transcribed "word", imported from a table in ``root/name``."""
    from srupp_asr.prepare import import_table, save_splits
    from tests.helpers import write_tone

    folder = root / name
    folder.mkdir()
    for k in range(count):
        write_tone(folder / f"{name}{k}.wav", seconds)
    (folder / "t.tsv").write_text("path\ttext\n" + "".join(f"{name}{k}.wav\tword\n" for k in range(count)))
    (path,) = save_splits(import_table(folder / "t.tsv"), folder)
    return path


def test_the_ablation_mixes_hold_every_real_cut_and_an_equal_share_of_synthetic_audio(rs, tmp_path):
    corpus = functools.partial(_tone_corpus, tmp_path)

    words, digits, synth = corpus("words", 6, 1.0), corpus("digits", 3, 0.5), corpus("synth", 2, 1.5)
    real = load_cuts(rs.training_mix("real", [words, digits], None, tmp_path / "real.jsonl.gz"))
    assert sorted(c.id for c in real) == sorted([f"words{k}" for k in range(6)] + [f"digits{k}" for k in range(3)])
    mixed = list(load_cuts(rs.training_mix("real+synth", [words, digits], synth, tmp_path / "mix.jsonl.gz")))
    synthetic = [c for c in mixed if c.id.startswith("synth")]
    assert len(mixed) == 9 + len(synthetic) and len({c.id for c in mixed}) == len(mixed)
    assert sum(c.duration for c in synthetic) == 6.0  # 7.5 s of real audio: 3 s of synthetic repeated twice
    with pytest.raises(ValueError, match="unknown mix"):
        rs.training_mix("synth", [words], synth, tmp_path / "x.jsonl.gz")


def _longest_zero_run(samples) -> int:
    import numpy as np

    zero = np.concatenate([[False], samples == 0, [False]])
    edges = np.flatnonzero(np.diff(zero.astype(np.int8)))
    return int((edges[1::2] - edges[::2]).max()) if len(edges) else 0


def test_the_long_mix_strings_one_speakers_words_together_and_adds_silences_with_empty_transcripts(rs, tmp_path):
    import numpy as np
    import soundfile as sf

    from srupp_asr.manifest import cut_text
    from srupp_asr.prepare import import_table, save_splits
    from tests.helpers import write_tone

    folder = tmp_path / "words"
    folder.mkdir()
    rows = []
    for k in range(12):  # two speakers, a word each at its own 8 kHz tone length, as FSDD's 8 kHz digits
        write_tone(folder / f"w{k}.wav", 0.3 + 0.05 * k, rate=8000)
        rows.append(f"w{k}.wav\tword{k}\tspk{k % 2}\n")
    (folder / "t.tsv").write_text("path\ttext\tspeaker\n" + "".join(rows))
    (words,) = save_splits(import_table(folder / "t.tsv"), folder)
    synth = tmp_path / "synth"
    synth.mkdir()
    for k in range(3):
        write_tone(synth / f"s{k}.wav", 2.0)
    (synth / "t.tsv").write_text("path\ttext\tspeaker\n" + "".join(f"s{k}.wav\tsynth{k}\tvoice\n" for k in range(3)))
    (synth_cuts,) = save_splits(import_table(synth / "t.tsv"), synth)

    out = tmp_path / "mix.jsonl.gz"
    mixed = list(load_cuts(rs.training_mix("real+long+synth", [words], synth_cuts, out)))
    real_seconds = sum(0.3 + 0.05 * k for k in range(12))
    kinds = ("w", "sequences", "silences", "s", "synth")
    by_kind = {kind: [c for c in mixed if re.sub(r"\d+$", "", re.sub(r"[-_].*", "", c.id)) == kind] for kind in kinds}
    assert sum(map(len, by_kind.values())) == len(mixed)
    assert len(by_kind["w"]) == 12  # every real word, once
    sequences, silences = by_kind["sequences"], by_kind["silences"]
    assert sequences and silences and by_kind["synth"]
    assert real_seconds <= sum(c.duration for c in sequences) < real_seconds + 12  # less than one more
    assert rs.SILENCE_SHARE * real_seconds <= sum(c.duration for c in silences) < rs.SILENCE_SHARE * real_seconds + 15
    for cut in sequences:
        texts = cut_text(cut).split()
        ids = [int(t.removeprefix("word")) for t in texts]
        assert 2 <= len(ids) <= 6 and len(set(ids)) == len(ids)  # at most the speaker's 6 words, none twice
        assert len({i % 2 for i in ids}) == 1  # one speaker's words
        assert cut.supervisions[0].speaker == f"spk{ids[0] % 2}" and cut.sampling_rate == 16000
        spoken = sum(0.3 + 0.05 * i for i in ids)
        assert spoken + 0.05 * (len(ids) - 1) - 0.01 <= cut.duration <= spoken + 0.6 * (len(ids) - 1) + 3.0 + 0.01
        audio = cut.load_audio()[0]
        assert np.abs(audio).max() > 0.05  # the words are in it, at 16 kHz
        assert _longest_zero_run(audio) < 8  # pauses hold room tone, never digital silence
    for cut in by_kind["synth"]:  # synthetic utterances in a row, digital silence between, as TTS writes it
        ids = [int(t.removeprefix("synth")) for t in cut_text(cut).split()]
        assert 2 <= len(ids) <= 3 and len(set(ids)) == len(ids)
        assert 2.0 * len(ids) + 0.2 * (len(ids) - 1) - 0.01 <= cut.duration <= 2.0 * len(ids) + len(ids) + 2.0 + 0.01
        assert _longest_zero_run(cut.load_audio()[0]) >= 0.2 * 16000 - 1
    for cut in silences:
        assert cut_text(cut) == "" and 0.5 <= cut.duration <= 15.0
        assert np.sqrt(np.mean(cut.load_audio()[0] ** 2)) < 10 ** (-40 / 20) * 1.01
    synthetic = by_kind["s"] + by_kind["synth"]
    once = sum(c.duration for c in synthetic if not re.search(r"_repeat[1-9]\d*$", c.id))
    assert 6.0 <= once - 6.0 < 6.0 + 3 * 2.0 + 3.0  # the utterances, and as much again in a row (less than one more)
    made = real_seconds + sum(c.duration for c in sequences + silences)
    times = max(1, round(made / once))  # an equal share of synthetic audio, repeated
    assert sum(c.duration for c in synthetic) == pytest.approx(times * once)
    made_files = sorted((tmp_path / "mix_made").rglob("*.wav"))
    assert len(made_files) == len(sequences) + len(silences) + len({c.id.split("_repeat")[0] for c in by_kind["synth"]})
    assert sf.info(made_files[0]).samplerate == 16000
    stamps = [f.stat().st_mtime_ns for f in made_files]
    out.unlink()  # made again: the written recordings are imported, not written anew
    again = load_cuts(rs.training_mix("real+long+synth", [words], synth_cuts, out))
    assert sorted(c.id for c in again) == sorted(c.id for c in mixed)
    assert [f.stat().st_mtime_ns for f in made_files] == stamps


def test_each_ablation_row_trains_a_fixed_number_of_steps_with_one_change(rs, tmp_path):
    from srupp_asr.augment import ChannelAugment

    rows = {row.name: row for row in rs.ABLATION_ROWS}
    assert len(rows) == len(rs.ABLATION_ROWS) and set(rs.DEFAULT_ROWS) <= set(rows)
    assert rows["real+synth"].args == () and all(row.mix in rs.MIXES for row in rows.values())
    recipe_sets = re.search(r'^real_sets="([^"]*)"', RUN.read_text(), re.M).group(1).split()
    assert rs.REAL_SETS == REAL_SETS == tuple(recipe_sets)  # the benchmark and the recipe score the same sets
    base = tmp_path / "base"
    commands = {}
    for name, row in rows.items():
        cmd = rs.fine_tune_command(
            tmp_path / "mix.jsonl.gz", tmp_path / "dev.jsonl.gz", tmp_path / name, 7, base, row.args
        )
        options = dict(zip(cmd[5::2], cmd[6::2], strict=False))  # after: python -m srupp_asr.cli train fit
        assert options["--trainer.max_steps"] == "7" and options["--trainer.max_time"] == "null"
        assert options["--model.init_from"] == str(base)
        if "--data.channel_augment" in options:  # a setting training accepts, with one step switched on
            augment = ChannelAugment.from_config(json.loads(options["--data.channel_augment"]))
            switched_on = sum(
                p > 0 for p in (augment.pitch_prob, augment.vtlp_prob, augment.eq_prob, augment.codec_prob)
            )
            assert switched_on == (2 if name.startswith("+read") else 1)  # VTLP and EQ: the built-in model's recipe
        commands[name] = cmd
    baseline = commands["real+synth"]
    for name in rs.DEFAULT_ROWS:
        if rows[name].mix != "real+synth":  # a row that changes the data: the baseline's command itself
            own = [a for a in commands[name] if not a.startswith(str(tmp_path))]
            assert rows[name].args == () and own == [a for a in baseline if not a.startswith(str(tmp_path))]
        elif name != "real+synth":  # the baseline's command plus this row's own arguments, nothing else
            extra = [a for a in commands[name] if a not in baseline and not a.startswith(str(tmp_path))]
            assert extra == [a for a in rows[name].args if a not in baseline] and extra


def test_the_read_mix_gives_half_its_audio_to_read_sentences_and_keeps_the_rest(rs, tmp_path):
    corpus = functools.partial(_tone_corpus, tmp_path)

    words, synth = corpus("words", 6, 1.0), corpus("synth", 2, 1.5)
    read_a, read_b = corpus("reada", 2, 1.5), corpus("readb", 1, 1.0)
    rest = load_cuts(rs.training_mix("real+synth", [words], synth, tmp_path / "rest.jsonl.gz"))
    out = tmp_path / "mix.jsonl.gz"
    mixed = list(load_cuts(rs.training_mix("read+real+synth", [words], synth, out, read_train=[read_a, read_b])))
    read = [c for c in mixed if c.id.startswith("read")]
    assert sorted(c.id for c in mixed if not c.id.startswith("read")) == sorted(c.id for c in rest)
    rest_seconds, read_once = sum(c.duration for c in rest), 4.0
    times = round(rs.READ_SHARE / (1 - rs.READ_SHARE) * rest_seconds / read_once)
    assert times == 3 and sum(c.duration for c in read) == pytest.approx(times * read_once)  # 12 s of 24 s
    assert {c.id.split("_repeat")[0] for c in read} == {"reada0", "reada1", "readb0"}
    first_half = mixed[: len(mixed) // 2]  # interleaved by counts: read sentences all the way through
    assert 0.25 < sum(c.id.startswith("read") for c in first_half) / len(first_half) < 0.75
    with pytest.raises(ValueError, match="needs read_train"):
        rs.training_mix("read+real+synth", [words], synth, tmp_path / "x.jsonl.gz")


def _strung_digits(folder: Path, speaker: str, digits: list[list[int]], gap: float = 0.25):
    """Recordings of FSDD ``speaker``'s digits (train takes) in a row, ``gap`` seconds of quiet room tone between:
    the table (one row per recording, the digits' words) and where each digit's audio lies in each, in seconds."""
    import numpy as np
    import soundfile as sf

    from srupp_asr.audio import SAMPLE_RATE
    from srupp_asr.synth.verbalize import verbalize_transcript

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    rows, spans = ["path\ttext\tspeaker"], []
    for k, row in enumerate(digits):
        pieces, where, at = [], [], 0.0
        for take, digit in enumerate(row):
            audio, rate = sf.read(REAL_DEV / "fsdd" / "audio" / f"{digit}_{speaker}_{10 + take}.flac", dtype="float32")
            audio = np.interp(np.arange(0, len(audio), rate / SAMPLE_RATE), np.arange(len(audio)), audio)
            quiet = (rng.standard_normal(round(gap * SAMPLE_RATE)) * 1e-4).astype(np.float32)
            pieces += [quiet, audio.astype(np.float32)]
            power = 10 * np.log10(np.convolve(audio**2, np.ones(160) / 160, mode="valid") + 1e-12)
            loud = np.flatnonzero(power > power.max() - 25)  # the digit: within 25 dB of its loudest 10 ms
            where.append((at + gap + loud[0] / SAMPLE_RATE, at + gap + (loud[-1] + 160) / SAMPLE_RATE))
            at += gap + len(audio) / SAMPLE_RATE
        pieces.append(pieces[0])
        sf.write(folder / f"r{k}.wav", np.concatenate(pieces), SAMPLE_RATE, subtype="FLOAT")
        rows.append(f"r{k}.wav\t{verbalize_transcript(' '.join(map(str, row)))}\t{speaker}")
        spans.append(where)
    (folder / "t.tsv").write_text("\n".join(rows) + "\n")
    return folder / "t.tsv", spans


@needs_real
def test_splices_cut_read_speech_between_its_words_and_join_one_speakers_runs_of_words(rs, tmp_path):
    import numpy as np

    from srupp_asr.inputs import default_model_dir
    from srupp_asr.manifest import cut_text
    from srupp_asr.prepare import import_table

    # The ground truth is known: digits whose audio lies between stretches of quiet room tone.
    table, spans = _strung_digits(tmp_path / "digits", "jackson", [[1, 2, 3, 4], [5, 6, 7], [8, 9, 0, 1]])
    cuts = import_table(table)["all"].to_eager()
    points = rs.word_cut_points(cuts, default_model_dir())
    assert sorted(points) == sorted(c.id for c in cuts)
    for cut, where in zip(cuts, spans, strict=True):
        words, bounds = points[cut.id]
        assert words == cut_text(cut).split() and len(bounds) == len(words) + 1
        assert bounds[0] == 0 and bounds[-1] == cut.duration
        for ((_, end), (start, _)), point in zip(itertools.pairwise(where), bounds[1:-1], strict=True):
            assert end <= point <= start  # between two digits, never inside one

    made, model = tmp_path / "splices", default_model_dir()
    spliced = list(rs.splices([cuts], made, 6.0, model, seed=3, words=(4, 6), chunk=(2, 3)))
    assert 6.0 <= sum(c.duration for c in spliced) < 6.0 + 4 * 1.5
    sources = [cut_text(c).split() for c in cuts]
    runs = {tuple(s[i:j]) for s in sources for i in range(len(s)) for j in range(i + 2, min(i + 3, len(s)) + 1)}
    fresh = 0
    for cut in spliced:
        said = cut_text(cut).split()
        assert 4 <= len(said) <= 6 and cut.supervisions[0].speaker == "jackson" and cut.sampling_rate == 16000
        # runs of 2-3 words of one recording each (a single word only where a recording had no more to give)
        splits = [k for k in range(2, len(said) + 1) if tuple(said[:k]) in runs]
        assert splits, said
        fresh += not any(" ".join(said) in " ".join(s) for s in sources)
        audio = cut.load_audio()[0]
        assert np.abs(audio[:40]).max() < 0.01 and np.abs(audio[-40:]).max() < 0.01  # faded in and out
    assert fresh >= len(spliced) // 2  # word sequences no recording holds
    stamps = sorted(p.stat().st_mtime_ns for p in made.rglob("*.wav"))
    again = list(rs.splices([cuts], made, 6.0, model, seed=3))
    assert [c.id for c in again] == [c.id for c in spliced]  # kept: imported again, not written anew
    assert sorted(p.stat().st_mtime_ns for p in made.rglob("*.wav")) == stamps

    # The read+splice mix: the read part grown by as much audio again of splices, aligned by the given model.
    read = tmp_path / "read_cuts.jsonl.gz"
    save_cuts(cuts, read)
    words, synth = _tone_corpus(tmp_path, "words", 6, 1.0), _tone_corpus(tmp_path, "synth", 2, 1.5)
    out = tmp_path / "mix.jsonl.gz"
    mix = rs.training_mix("read+splice+real+synth", [words], synth, out, read_train=[read], splice_model=model)
    mixed = load_cuts(mix)
    once = {c.id.split("_repeat")[0]: c.duration for c in mixed}
    assert {c.id for c in cuts} | {"words0", "synth0"} <= set(once)
    made_seconds = sum(d for name, d in once.items() if name.startswith("splices-"))
    assert sum(c.duration for c in cuts) <= made_seconds < sum(c.duration for c in cuts) + 18 * 1.5
    assert (out.parent / "mix_made" / "splices" / "manifest.tsv").is_file()
    with pytest.raises(ValueError, match="needs a splice_model"):
        rs.training_mix("read+splice+real+synth", [words], synth, tmp_path / "x.jsonl.gz", read_train=[read])


@needs_real
def test_the_validation_set_is_unseen_read_speech_and_some_of_every_other_dev_set(rs, tmp_path):
    sets = ("vctk_dev", "pocketsphinx_testdata")
    manifests = rs.import_real_sets(REAL_DEV, tmp_path / "m", sets)
    manifests["fsdd"] = manifests.pop("pocketsphinx_testdata")  # 10 utterances standing in for a dev set
    valid = load_cuts(rs.validation_set(manifests, tmp_path / "absent.jsonl.gz", tmp_path / "valid.jsonl.gz"))
    vctk = {c.id for c in load_cuts(manifests["vctk_dev"]["dev"])}
    assert len(vctk) == 68 and vctk <= {c.id for c in valid} and len(valid) == 68 + 10


def test_a_gpu_lease_trains_the_rows_with_its_own_arguments_and_scores_none(rs, tmp_path, monkeypatch, capsys):
    """device_run.sh's read-mix job: `--train-args` go after each row's own arguments (the last of an option wins
    in `train fit`), and `--train-only` trains and exports without decoding (the lease's minutes go to training)."""
    synth = tmp_path / "synth"
    (synth / "manifests").mkdir(parents=True)
    (synth / "manifests" / "train_cuts.jsonl.gz").touch()
    (tmp_path / "vctk_dev").mkdir()
    (tmp_path / "vctk_dev" / "manifest.tsv").touch()  # a real_en folder, as far as finding it goes
    names = ("vctk_dev", "speech_commands", "fsdd", *rs.READ_TRAIN)
    monkeypatch.setattr(
        rs, "import_real_sets", lambda dev, out, sets: {n: {"train": out / n, "dev": out / n} for n in names}
    )
    monkeypatch.setattr(rs, "validation_set", lambda manifests, synth_dev, out: out)
    monkeypatch.setattr(rs, "training_mix", lambda *args, **kwargs: None)
    monkeypatch.setattr(rs, "trained_steps", lambda exp: (12, 480.0))
    trained = []

    def fine_tune(mix, valid, exp, steps, base, extra, max_minutes):
        trained.append((exp.name, extra, max_minutes))
        return exp / "model", 3.0

    def never(*args, **kwargs):
        raise AssertionError("--train-only decoded a set")

    monkeypatch.setattr(rs, "fine_tune", fine_tune)
    monkeypatch.setattr(rs, "score_model", never)
    argv = ["real_speech.py", "--real-dev", str(tmp_path), "--ablation", "--synth", str(synth), "--rows", "+read"]
    argv += ["--sets", "vctk_dev", "--exp", str(tmp_path / "exp"), "--max-minutes", "6", "--base", str(tmp_path)]
    argv += ["--train-only", "--train-args", "--trainer.accelerator gpu --data.max_duration 400"]
    monkeypatch.setattr(sys, "argv", argv)
    assert rs.main() == 0
    row = {r.name: r for r in rs.ABLATION_ROWS}["+read"]
    assert trained == [
        (
            f"steps30_read_from_{tmp_path.name}",
            (*row.args, "--trainer.accelerator", "gpu", "--data.max_duration", "400"),
            6,
        )
    ]
    table = capsys.readouterr().out
    assert f"| +read | {row.change} | 12 | 3.0 | {tmp_path / 'exp' / 'ablation'}" in table


@pytest.mark.parametrize("minutes", [1, 6, 38, 85, 1500, 2.5])
def test_a_row_s_minutes_are_a_duration_lightning_takes(rs, minutes):
    """`--max-minutes 6` was written 00:00:6:00, which Lightning refuses (two digits each): the GPU job's dry run
    failed there."""
    from lightning.pytorch.callbacks import Timer

    assert Timer(duration=rs.max_time(minutes))._duration == pytest.approx(minutes * 60)
