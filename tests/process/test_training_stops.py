# ruff: noqa: F811  (the imported fixture ``corpus`` is a parameter name of the tests)
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
from typing import Any

import lightning as L
import pytest
import torch

from srupp_asr.checkpoints import load_checkpoint
from srupp_asr.cli import main
from srupp_asr.fileio import atomic_output, make_temp_dir, remove_stale_temps
from tests.test_reliability_training import assert_same_weights, train_args
from tests.test_training_acceptance import (  # noqa: F401 (corpus: a fixture)
    REPO,
    augmented_config,
    corpus,
    corpus_args,
    load_weights,
    srupp_asr_train,
)

TOTAL_STEPS = 10  # the corpus makes 6 batches an epoch: the runs cross an epoch boundary
NO_STEP_CHECKPOINTS = 1000  # every_n_train_steps beyond the runs' ends


def send(sig: str, times: int = 1) -> None:
    """Send ``sig`` ``times`` times: to this process (what ``kill PID`` or a scheduler does), or with ``SIGINT`` to
    its whole process group, data-loader workers included (what Ctrl-C in a terminal does)."""
    for _ in range(times):
        if sig == "SIGINT":
            os.killpg(os.getpgid(0), signal.SIGINT)
        else:
            os.kill(os.getpid(), getattr(signal, sig))


class TermAtStep(L.Callback):
    """Sends ``sig`` (SIGTERM by default) ``times`` times as step ``step`` starts (under DDP: from rank 0 only)."""

    def __init__(self, step: int, sig: str = "SIGTERM", times: int = 1) -> None:
        self.step, self.sig, self.times = step, sig, times

    def on_train_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.step and trainer.global_rank == 0:
            send(self.sig, self.times)


class TermInValidation(L.Callback):
    """Sends SIGTERM as the first validation batch after step ``step`` starts."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_validation_batch_start(self, trainer: L.Trainer, module: L.LightningModule, *args: Any) -> None:
        if trainer.global_step == self.step and args[1] == 0 and not trainer.sanity_checking:
            send("SIGTERM")


@pytest.fixture(scope="module")
def overrides(tmp_path_factory) -> Path:
    return augmented_config(tmp_path_factory.mktemp("config") / "augmented.yaml", speed_perturb=False)


def run_args(corpus, root: Path, weights: Path, overrides: Path, steps: int, every: int = NO_STEP_CHECKPOINTS):
    """A ``steps``-step run that dumps its final weights; without step checkpoints (``last.ckpt`` is saved where
    it stops) unless ``every`` (0: Lightning's default, a save at every epoch's end)."""
    return train_args(corpus, root, weights, every, overrides, steps)


@pytest.fixture(scope="module")
def straight(corpus, overrides, tmp_path_factory) -> dict[str, torch.Tensor]:
    """The final weights of an uninterrupted run of TOTAL_STEPS steps."""
    folder = tmp_path_factory.mktemp("straight")
    srupp_asr_train(run_args(corpus, folder / "exp", folder / "weights", overrides, TOTAL_STEPS))
    return load_weights(folder / "weights" / "rank0.pt")


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


def train_with_signal(
    args: list[str], sig: str, step: int, times: int = 1, in_validation: bool = False
) -> subprocess.CompletedProcess:
    """``srupp-asr train ARGS`` that sends itself ``sig`` ``times`` times as step ``step`` starts (or SIGTERM as
    the validation after step ``step`` starts)."""
    if in_validation:
        signal_at = ["--trainer.callbacks+=tests.test_reliability_stops.TermInValidation"]
    else:
        signal_at = [
            "--trainer.callbacks+=tests.test_reliability_stops.TermAtStep",
            f"--trainer.callbacks.sig={sig}",
            f"--trainer.callbacks.times={times}",
        ]
    signal_at.append(f"--trainer.callbacks.step={step}")
    env = {**os.environ, "PYTHONPATH": str(REPO), "SRUPP_ASR_TRUSTED_CLASSES": "tests"}
    cmd = [sys.executable, "-m", "srupp_asr.cli", "train", *args, *signal_at]
    # A session of its own, so that a hang (a rank waiting for ever) fails the test and ends every rank.
    with subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail(f"srupp-asr train did not stop within 300 s of {sig} at step {step}")
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


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


def stop_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("srupp-asr train:")]


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


def test_a_forked_worker_gets_sigterms_default_action_back():
    """A Python handler runs only between bytecodes: a pool worker blocked in C would never die of the SIGTERM
    its parent's ``Pool.terminate`` sends, and the parent would wait for ever (a synth-corpus run hung so)."""
    script = textwrap.dedent(
        """
        import os, signal, sys
        from srupp_asr.interrupts import sigterm_raises

        with sigterm_raises():
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
            pid = os.fork()
            if pid == 0:
                os._exit(0 if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL else 3)
            _, status = os.waitpid(pid, 0)
            sys.exit(os.waitstatus_to_exitcode(status))
        """
    )
    assert subprocess.run([sys.executable, "-c", script], cwd=REPO, timeout=60).returncode == 0


def test_a_deferred_ctrl_c_notices_once_raises_the_second_time_and_forked_workers_ignore_it():
    script = textwrap.dedent(
        """
        import os, signal, sys
        from srupp_asr.interrupts import defer_sigint

        notices = []
        defer_sigint(lambda: notices.append(1))
        pid = os.fork()
        if pid == 0:  # a data-loader worker: the terminal's Ctrl-C reaches it too, and must not kill it
            os._exit(0 if signal.getsignal(signal.SIGINT) is signal.SIG_IGN else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the forked child does not ignore SIGINT"
        os.kill(os.getpid(), signal.SIGINT)
        assert notices == [1]
        try:
            os.kill(os.getpid(), signal.SIGINT)
            sys.exit(4)
        except KeyboardInterrupt:
            pass
        defer_sigint(None)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, timeout=60, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
