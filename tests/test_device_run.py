"""recipes/synth_en/local/device_run.sh: GPU jobs that run in the background across short device calls.

Fast: usage and unknown jobs are one-line errors with exit status 2, `wait` reports a job that failed (exit 1) or
finished (exit 0, its RESULTS.md printed), `collect` copies what the job left, the job waits for a model a later
call brings, and the script passes shellcheck. lease_tree.sh (in a clone) sizes what a call sends, and hides and
restores the committed default model. pack_real_en.py packs the real speech the read-mix job trains on.
Slow (``-m slow``, a few minutes): the default-model job end to end on the CPU on a tiny corpus, as docs/recipes.md's
dry run: its model directory is float16 shards that ``srupp-asr transcribe`` loads.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "recipes" / "synth_en" / "local" / "device_run.sh"
CURRENT = ROOT / "exp" / "device_job.txt"
LEASE_TREE = Path("recipes") / "synth_en" / "local" / "lease_tree.sh"
PACK = ROOT / "recipes" / "synth_en" / "local" / "pack_real_en.py"


def _run(args: list[str], env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )


@pytest.fixture
def keep_current_job():
    """The test points exp/device_job.txt at its own folder; whatever it named before is put back."""
    before = CURRENT.read_text() if CURRENT.is_file() else None
    yield
    if before is None:
        CURRENT.unlink(missing_ok=True)
    else:
        CURRENT.write_text(before)


def test_usage_and_an_unknown_job_are_one_line_errors():
    done = _run([])
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "usage:" in done.stderr
    done = _run(["start", "bogus"])
    assert done.returncode == 2
    assert done.stderr == "device_run.sh: unknown job 'bogus' (default-model, compare or read-mix)\n"


def _sourced(code: str) -> subprocess.CompletedProcess:
    """Runs ``code`` in bash after sourcing the script (its functions, without running a command)."""
    return subprocess.run(
        ["bash", "-c", f'source "{SCRIPT}"; {code}'], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_job_waits_for_a_model_that_a_later_call_brings(tmp_path):
    config = tmp_path / "model" / "config.yaml"
    done = _sourced(f'( sleep 1; mkdir -p "{config.parent}"; touch "{config}" ) & wait_for "{config}" 30')
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"waiting for {config}" in done.stdout and done.stdout.rstrip().endswith(f"{config} is here")
    done = _sourced(f'wait_for "{tmp_path}/never" 0')
    assert done.returncode == 1 and done.stdout.rstrip().endswith(f"{tmp_path}/never did not arrive within 0 s")


@pytest.mark.parametrize("outcome", ["DONE", "FAILED"])
def test_wait_reports_how_the_job_ended(tmp_path, keep_current_job, outcome):
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "pipeline.log").write_text("[00:00:00] job started\n[00:00:01] last words\n")
    (exp / "RESULTS.md").write_text("| system | WER |\n")
    (exp / outcome).touch()
    CURRENT.parent.mkdir(parents=True, exist_ok=True)
    CURRENT.write_text(f"{exp}\n")
    done = _run(["wait", "30"])
    assert "last words" in done.stdout
    if outcome == "DONE":
        assert done.returncode == 0 and "DONE" in done.stdout and "| system | WER |" in done.stdout
    else:
        assert done.returncode == 1 and "FAILED" in done.stdout and "| system | WER |" not in done.stdout


def test_collect_copies_the_model_results_and_logs(tmp_path, keep_current_job):
    exp = tmp_path / "exp"
    (exp / "model").mkdir(parents=True)
    for name in ("config.yaml", "model-00001-of-00002.safetensors", "tokenizer.model"):
        (exp / "model" / name).write_text(name)
    (exp / "RESULTS.md").write_text("results\n")
    (exp / "plot.png").write_bytes(b"png")
    (exp / "pipeline.log").write_text("log\n")
    (exp / "checkpoints").mkdir()
    (exp / "checkpoints" / "last.ckpt").write_bytes(b"x" * 1000)
    CURRENT.parent.mkdir(parents=True, exist_ok=True)
    CURRENT.write_text(f"{exp}\n")
    out = tmp_path / "out"
    done = _run(["collect", str(out)])
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (out / "model").iterdir()) == sorted(p.name for p in (exp / "model").iterdir())
    assert (out / "RESULTS.md").read_text() == "results\n" and (out / "plot.png").is_file()
    listing = subprocess.run(["tar", "-tzf", str(out / "logs.tar.gz")], capture_output=True, text=True).stdout
    assert "pipeline.log" in listing and "last.ckpt" not in listing


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="needs shellcheck")
def test_shellcheck_clean():
    done = subprocess.run(
        ["shellcheck", "-x", str(SCRIPT), str(ROOT / LEASE_TREE), str(SCRIPT.parent / "prepare_lease.sh")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs the TTS engines")
def test_default_model_job_dry_run_on_the_cpu(tmp_path, keep_current_job):
    """The whole default-model job on the CPU: tiny corpus, 20 training steps; the exported model loads."""
    if os.geteuid() != 0:
        pytest.skip("install_debs.sh needs root")
    if not (ROOT / ".debs").is_dir():
        pytest.skip("no .debs (recipes/synth_en/local/fetch_debs.sh)")
    env = {
        "PYTHON": sys.executable,
        "NO_WHEELS": "1",
        "DEVICE": "cpu",
        "DATA": str(tmp_path / "data"),
        "EXP": str(tmp_path / "exp"),
        "TRAIN_ARGS": "--trainer.accelerator cpu --trainer.precision 32-true --trainer.max_steps 20 "
        "--trainer.val_check_interval 10 --data.max_duration 30 --data.num_workers 1",
    }
    done = _run(["start", "default-model", "0.4"], env, timeout=900)
    assert done.returncode == 0 and "DONE" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
    out = tmp_path / "out"
    assert _run(["collect", str(out)], env).returncode == 0
    model = out / "model"
    assert (model / "model.safetensors.index.json").is_file()
    assert all(p.stat().st_size <= 15 * 2**20 for p in model.glob("*.safetensors"))
    wav = sorted((tmp_path / "data" / "corpus" / "audio" / "test_seen").rglob("*.flac"))[0]
    cli = [sys.executable, "-m", "srupp_asr.cli", "transcribe", "--model", str(model), str(wav)]
    assert subprocess.run(cli, capture_output=True, text=True, timeout=120).returncode == 0


def test_lease_tree_keeps_the_default_model_out_of_a_call_and_brings_it_back(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    (clone / ".git" / "info" / "exclude").write_text("/.carry/\n")  # carried folders are ignored ones
    (clone / ".carry").mkdir()
    with open(clone / ".carry" / "wheels.bin", "wb") as f:
        f.truncate(36 * 2**20)  # sparse: its size is what counts

    def lease_tree(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(clone / LEASE_TREE), *args], capture_output=True, text=True, timeout=60, check=False
        )

    over = lease_tree("size", ".carry")
    assert over.returncode == 1 and "over the limit" in over.stderr and "+ carried 36.0 MiB" in over.stdout
    assert lease_tree("hide").returncode == 0
    status = subprocess.run(["git", "-C", str(clone), "status", "--porcelain"], capture_output=True, text=True)
    assert status.stdout.splitlines() and all(
        line.startswith("D  srupp_asr/default_model/") for line in status.stdout.splitlines()
    )
    under = lease_tree("size", ".carry")
    assert under.returncode == 0 and under.stdout.startswith("checkout ")
    assert (clone / "srupp_asr" / "default_model" / "config.yaml").is_file()  # the files stay where they are
    assert lease_tree("restore").returncode == 0
    status = subprocess.run(["git", "-C", str(clone), "status", "--porcelain"], capture_output=True, text=True)
    assert status.stdout == "" and (clone / ".git" / "info" / "exclude").read_text() == "/.carry/\n"
    lease_tree("hide")
    (clone / "srupp_asr" / "default_model" / "config.yaml").write_text("changed: true\n")
    changed = lease_tree("restore")
    assert changed.returncode == 1 and "differs from the last commit" in changed.stderr


def _tiny_real_en(root: Path) -> None:
    """Two corpus folders as real_en lays them out: a 16-kHz set (FLAC, a licence file) and an 8-kHz one."""
    import numpy as np
    import soundfile as sf

    for name, rate, lengths in (("arctic_axb", 16000, (16000, 23456)), ("fsdd", 8000, (4000,))):
        (root / name / "audio" / "word").mkdir(parents=True)
        rows = ["path\tduration_s\tspeaker\ttext\tsplit"]
        for i, n in enumerate(lengths):
            t = np.arange(n) / rate
            path = f"audio/{'word/' if i else ''}c{i}.flac"  # Speech Commands keeps a folder per word
            sf.write(root / name / path, 0.3 * np.sin(2 * np.pi * 220 * t) * np.hanning(n), rate)
            rows.append(f"{path}\t{n / rate:.3f}\tspk\tWords, as written {i}.\t{'train' if i else 'dev'}")
        (root / name / "manifest.tsv").write_text("\n".join(rows) + "\n")
    (root / "arctic_axb" / "COPYING").write_text("the CMU ARCTIC notice\n")
    (root / "README.md").write_text("real_en\n")


def test_the_real_speech_pack_keeps_the_layout_lengths_and_licences_as_opus(tmp_path):
    import soundfile as sf

    source, pack = tmp_path / "real_en", tmp_path / "pack"
    _tiny_real_en(source)
    run = [sys.executable, str(PACK), str(source), str(pack), "--sets", "arctic_axb", "fsdd", "--jobs", "1"]
    done = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (pack / "arctic_axb" / "COPYING").read_text() == "the CMU ARCTIC notice\n"
    assert (pack / "README.md").is_file() and "MiB (Opus" in (pack / "PACKED").read_text()
    for name in ("arctic_axb", "fsdd"):
        before = (source / name / "manifest.tsv").read_text().splitlines()
        after = (pack / name / "manifest.tsv").read_text().splitlines()
        assert after == [line.replace(".flac", ".opus") for line in before]  # texts, splits, durations as they were
        for line in after[1:]:
            path = line.split("\t")[0]
            with (
                sf.SoundFile(pack / name / path) as packed,
                sf.SoundFile(source / name / path.replace(".opus", ".flac")) as original,
            ):
                assert (packed.format, packed.subtype) == ("OGG", "OPUS")
                assert (packed.samplerate, packed.frames) == (original.samplerate, original.frames)
    stamp = (pack / "PACKED").stat().st_mtime_ns
    again = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and (pack / "PACKED").stat().st_mtime_ns == stamp  # a complete pack is reused
    over = subprocess.run(
        [*run[:3], str(tmp_path / "small"), "--sets", "fsdd", "--max-mib", "0.0001"], capture_output=True, text=True
    )
    assert over.returncode == 1 and "over --max-mib 0.0001: raise --level" in over.stderr
    assert not (tmp_path / "small" / "PACKED").exists()
    absent = subprocess.run([*run[:2], str(tmp_path / "nowhere"), str(pack)], capture_output=True, text=True)
    assert absent.returncode == 2 and absent.stderr.startswith(f"pack_real_en: {tmp_path / 'nowhere'}: no such folder")


def test_the_read_mix_job_trains_on_the_pack_with_the_gpu_arguments_and_averages_three(tmp_path):
    """job_read_mix with its commands stubbed (the real ones are tested where they live): it synthesises the
    corpus, waits for the pack and the model a later call brings, trains the +read row with the GPU's arguments
    after the CPU's, and averages the row's 3 best checkpoints into a float16 model with the model's LM."""
    log, real, init, exp = tmp_path / "calls.log", tmp_path / "pack", tmp_path / "init", tmp_path / "exp"
    stub = tmp_path / "python"
    stub.write_text(f'#!/bin/bash\necho "python $*" >> {log}\nmkdir -p {exp}/ablation/steps1000000_read_from_init\n')
    stub.chmod(0o755)
    code = f"""
setup() {{ :; }}
srupp-asr() {{ echo "srupp-asr $*" >> {log}; if [ "$1" = average ]; then mkdir -p {exp}/model; fi; }}
( sleep 1; mkdir -p {real} {init}; touch {real}/PACKED {init}/config.yaml ) &
py={stub} device=cuda EXP={exp} REAL={real} INIT={init} DATA={tmp_path}/data job_read_mix 7
"""
    done = _sourced(code)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"waiting for {real}/PACKED" in done.stdout and f"{init}/config.yaml is here" in done.stdout
    synth, train, average = log.read_text().splitlines()
    assert synth.startswith(f"srupp-asr synth-corpus {tmp_path}/data --hours 30 --max-utts 814 --jobs")
    assert train.startswith("python benchmarks/real_speech.py --ablation --train-only --rows +read")
    for given in (f"--real-dev {real}", f"--base {init}", "--max-minutes 7", f"--exp {exp} "):
        assert given in train
    assert train.split("--train-args ", 1)[1].startswith("--trainer.accelerator gpu --trainer.precision bf16-mixed")
    assert average == (
        f"srupp-asr average --exp-dir {exp}/ablation/steps1000000_read_from_init --num 3 --out {exp}/model "
        f"--dtype float16 --max-shard-size 15MiB --lm {init}/lm"
    )


def test_prepare_lease_refuses_an_unknown_option_in_one_line():
    done = subprocess.run(
        ["bash", str(SCRIPT.parent / "prepare_lease.sh"), "--bogus"], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 2 and done.stdout == ""
    usage = "prepare_lease.sh: unknown option --bogus (usage: prepare_lease.sh [--no-pack])"
    assert done.stderr.splitlines() == [usage]
