"""Stops that are not crashes: a ``max_steps`` stop in mid-epoch, SIGTERM (training and any other command), a
write killed half-way, and two training runs into one folder.

The claim proven for training: a run stopped at step k and resumed with ``--ckpt_path last`` ends with the same
weights as a run that never stopped (the rest of the stopped epoch is trained, not skipped).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from srupp_asr.checkpoints import load_checkpoint
from srupp_asr.cli import main
from srupp_asr.fileio import atomic_output, make_temp_dir, remove_stale_temps
from tests.helpers import REPO
from tests.process.runs import (
    NO_STEP_CHECKPOINTS,
    TOTAL_STEPS,
    assert_same_weights,
    corpus_args,
    load_weights,
    run_args,
    srupp_asr_train,
    stop_lines,
    train_with_signal,
)


# Stops in mid-epoch 0, at its end, in mid-epoch 1. The checkpoint at the stop is written at the epoch's end
# (every=0: Lightning counts the epoch as processed, not completed) or at the end of training (every=1000: it
# counts it as completed, and would go on with the next epoch). The last case validates at every epoch's end, as
# the recipes do (validation once drew from torch's generator, which shifted the runs' dropout masks).
@pytest.mark.parametrize(
    ("stop", "every", "validate"),
    [(3, 0, False), (8, 0, False), (3, NO_STEP_CHECKPOINTS, False), (6, NO_STEP_CHECKPOINTS, False), (6, 0, True)],
)
def test_a_max_steps_stop_resumed_with_more_steps_ends_where_an_uninterrupted_run_does(
    corpus, overrides, straight, tmp_path, stop, every, validate
):
    root = tmp_path / "exp"
    validation = ["--trainer.limit_val_batches=3"] if validate else []
    srupp_asr_train([*run_args(corpus, root, tmp_path / "first", overrides, stop, every), *validation])
    assert load_checkpoint(root / "checkpoints" / "last.ckpt")["global_step"] == stop
    resume = [*run_args(corpus, root, tmp_path / "weights", overrides, TOTAL_STEPS, every), *validation]
    resume.append("--ckpt_path=last")
    srupp_asr_train(resume)
    assert json.loads((tmp_path / "weights" / "rank0.json").read_text())["global_step"] == TOTAL_STEPS
    assert_same_weights(straight, load_weights(tmp_path / "weights" / "rank0.pt"), f" (stopped at step {stop})")


def test_sigterm_saves_the_step_it_stops_at_exits_143_and_the_resume_matches(corpus, overrides, straight, tmp_path):
    root = tmp_path / "exp"
    args = run_args(corpus, root, tmp_path / "weights", overrides, TOTAL_STEPS)
    # No step checkpoints: what is there to resume from is the one saved at the stop.
    proc = train_with_signal(args, "SIGTERM", 4)
    assert proc.returncode == 143, proc.stderr[-3000:]
    last = root / "checkpoints" / "last.ckpt"
    lines = [line for line in proc.stderr.splitlines() if line.startswith("srupp-asr train:")]
    assert lines == [f"srupp-asr train: terminated (SIGTERM) after step 5: saved {last}; resume with --ckpt_path last"]
    assert load_checkpoint(last)["global_step"] == 5  # the step under way when the signal came was finished
    assert not (tmp_path / "weights" / "rank0.pt").exists()
    srupp_asr_train([*args, "--ckpt_path=last"])
    assert_same_weights(straight, load_weights(tmp_path / "weights" / "rank0.pt"))


def test_sigterm_to_rank_0_of_a_ddp_run_stops_every_rank_with_one_checkpoint(corpus, overrides, tmp_path):
    """Lightning passes the signal on to the other rank; both stop after the same step (no rank waits for ever
    at the save's barrier) and the checkpoint of that step is written once."""
    root = tmp_path / "exp"
    ddp = ["--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp", "--data.max_duration=8"]
    proc = train_with_signal([*run_args(corpus, root, tmp_path / "weights", overrides, 6), *ddp], "SIGTERM", 2)
    assert proc.returncode == 143, proc.stderr[-3000:]
    last = root / "checkpoints" / "last.ckpt"
    lines = [line for line in proc.stderr.splitlines() if line.startswith("srupp-asr train:")]
    assert lines == [f"srupp-asr train: terminated (SIGTERM) after step 3: saved {last}; resume with --ckpt_path last"]
    assert load_checkpoint(last)["global_step"] == 3
    assert sorted(p.name for p in (root / "checkpoints").iterdir()) == ["last.ckpt"]


def test_sigterm_during_validation_stops_it_saves_the_step_and_the_resume_matches(
    corpus, overrides, straight, tmp_path
):
    """Validation after step 3 (of 6 an epoch) is stopped after its first batch, not run to its end and followed
    by another training step: a scheduler's grace period may be shorter than a validation pass."""
    root = tmp_path / "exp"
    validate = ["--trainer.limit_val_batches=3", "--trainer.val_check_interval=3"]
    args = [*run_args(corpus, root, tmp_path / "weights", overrides, TOTAL_STEPS), *validate]
    proc = train_with_signal(args, "SIGTERM", 3, in_validation=True)
    assert proc.returncode == 143, proc.stderr[-3000:]
    last = root / "checkpoints" / "last.ckpt"
    assert stop_lines(proc) == [
        f"srupp-asr train: terminated (SIGTERM) after step 3: saved {last}; resume with --ckpt_path last"
    ]
    assert load_checkpoint(last)["global_step"] == 3
    metrics = (root / "csv" / "version_0" / "metrics.csv").read_text()
    assert "valid/loss" not in metrics.splitlines()[0] or all(
        not row.split(",")[0] for row in metrics.splitlines()[1:]
    ), "the stopped validation logged a loss"
    srupp_asr_train([*args, "--ckpt_path=last"])
    assert json.loads((tmp_path / "weights" / "rank0.json").read_text())["global_step"] == TOTAL_STEPS
    # Against the run without validation: validation must not shift training's random draws either.
    assert_same_weights(straight, load_weights(tmp_path / "weights" / "rank0.pt"))


def test_ctrl_c_stops_after_the_step_saves_it_exits_130_and_the_resume_matches(corpus, overrides, straight, tmp_path):
    """Ctrl-C reaches the whole process group, the data-loader workers too: they must not die of it (the parent
    stops them after the step), and the checkpoint of that step resumes to the uninterrupted run's weights."""
    root = tmp_path / "exp"
    args = [*run_args(corpus, root, tmp_path / "weights", overrides, TOTAL_STEPS), "--data.num_workers=2"]
    proc = train_with_signal(args, "SIGINT", 2)
    assert proc.returncode == 130, proc.stderr[-3000:]
    last = root / "checkpoints" / "last.ckpt"
    assert stop_lines(proc) == [
        f"srupp-asr train: interrupted (Ctrl-C) after step 3: saved {last}; resume with --ckpt_path last"
    ]
    # Once: the data-loader workers (the signal reaches them too) ignore it while the parent handles it.
    assert proc.stderr.count("Ctrl-C: stopping after this step") == 1, proc.stderr[-3000:]
    assert load_checkpoint(last)["global_step"] == 3
    srupp_asr_train([*args, "--ckpt_path=last"])
    assert_same_weights(straight, load_weights(tmp_path / "weights" / "rank0.pt"))


def test_a_second_ctrl_c_stops_at_once_with_one_line_and_exit_130(corpus, overrides, tmp_path):
    root = tmp_path / "exp"
    proc = train_with_signal(run_args(corpus, root, tmp_path / "weights", overrides, 4), "SIGINT", 2, times=2)
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == "srupp-asr train: interrupted"
    assert not (root / "checkpoints" / "last.ckpt").exists()  # nothing saved: no step checkpoints in this run


def test_a_second_fit_into_a_folder_a_running_fit_writes_to_is_refused(corpus, tmp_path, capsys):
    root = tmp_path / "exp"
    root.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from srupp_asr.train import lock_run_dir; lock_run_dir(sys.argv[1]);"
            " print('locked', flush=True); time.sleep(60)",
            str(root),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        rc = main(["train", *corpus_args(corpus, root), "--trainer.max_steps=1"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2
        assert err[-1] == (
            f"srupp-asr train: error: {root}: another `srupp-asr train fit` (pid {holder.pid}) is writing to this"
            " folder; give this run its own trainer.default_root_dir"
        )
        assert not (root / "checkpoints").exists()
    finally:
        holder.kill()
        holder.wait()
    # Once the holder is gone (killed: the kernel drops its lock), the folder is free again.
    assert main(["train", *corpus_args(corpus, root), "--trainer.max_steps=1", "--trainer.limit_val_batches=0"]) == 0


WRITER = textwrap.dedent(
    """
    import os, signal, sys
    from srupp_asr.cli import _run
    from srupp_asr.fileio import atomic_output

    def write():
        with atomic_output(sys.argv[1]) as tmp:
            tmp.write_text("half")
            os.kill(os.getpid(), getattr(signal, sys.argv[2]))
            tmp.write_text("all of it")

    sys.exit(_run("test", write))
    """
)


def run_writer(target: Path, sig: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", WRITER, str(target), sig], cwd=REPO, capture_output=True, text=True, timeout=60
    )


def test_sigterm_mid_write_is_one_line_exit_143_and_leaves_no_temporary_file(tmp_path):
    proc = run_writer(tmp_path / "out.txt", "SIGTERM")
    assert proc.returncode == 143
    assert proc.stderr.strip() == "srupp-asr test: terminated (SIGTERM)"
    assert list(tmp_path.iterdir()) == []


def test_what_a_write_killed_with_sigkill_left_is_removed_by_the_next_write_there(tmp_path):
    proc = run_writer(tmp_path / "out.txt", "SIGKILL")
    assert proc.returncode == -signal.SIGKILL
    (leftover,) = tmp_path.iterdir()
    assert leftover.name.startswith(".") and ".tmp" in leftover.name
    live = tmp_path / f"{leftover.name.split('-')[0]}-{os.getpid()}-abcdefgh.tmp"  # a live writer's: kept
    live.write_text("in progress")
    with atomic_output(tmp_path / "other.txt") as tmp:
        tmp.write_text("x")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, "other.txt"])
    assert remove_stale_temps(tmp_path, force=True) == []  # the live one stays however often the folder is swept


def test_what_an_export_killed_half_way_left_is_removed_by_the_next_export(tmp_path):
    folder = tmp_path / "model"
    script = (
        "import os, signal, sys; from srupp_asr.fileio import make_temp_dir;"
        " d = make_temp_dir(sys.argv[1]); (d / 'model.safetensors').write_bytes(b'half');"
        " os.kill(os.getpid(), signal.SIGKILL)"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(folder)], cwd=REPO, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    (leftover,) = tmp_path.iterdir()
    assert leftover.is_dir() and leftover.name.endswith(".tmp")
    fresh = make_temp_dir(folder)  # what export_model calls first
    assert list(tmp_path.iterdir()) == [fresh]
