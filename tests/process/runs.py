"""Helpers of the process-level tests: ``srupp-asr train`` run as a child process, the callbacks those runs load by
name (``tests.process.runs.<Name>``), signals and the comparison of final weights."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import yaml

from tests.helpers import REPO, TINY_CONFIG, Corpus

CLI_TIMEOUT_S = 300  # a hung DDP rendezvous must fail the test, not the CI job


class DumpWeights(L.Callback):
    """Writes each rank's state_dict to ``<out_dir>/rank<N>_start.pt`` when training starts and to
    ``<out_dir>/rank<N>.pt`` when it ends (with ``rank<N>.json``: the final global step and world size)."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)

    def _save(self, module: L.LightningModule, name: str) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        torch.save({k: v.detach().cpu().clone() for k, v in module.state_dict().items()}, self.out_dir / name)

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        """Save the weights training starts from."""
        self._save(module, f"rank{trainer.global_rank}_start.pt")

    def on_train_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        """Save the final weights and where training stopped."""
        self._save(module, f"rank{trainer.global_rank}.pt")
        record = {"global_step": trainer.global_step, "world_size": trainer.world_size}
        (self.out_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


class KillAtStep(L.Callback):
    """Kills its own process with SIGKILL as the step after ``step`` is about to start (a crash, not a stop)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        """The checkpoint of step ``step`` was written at that step's end; die before the next one."""
        if trainer.global_step >= self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def corpus_args(corpus: Corpus, root: Path) -> list[str]:
    """``srupp-asr train fit`` arguments: conf/tiny_cpu.yaml on the corpus, run folder ``root``."""
    return [
        "fit",
        "--config",
        str(TINY_CONFIG),
        f"--data.train_cuts={corpus.cuts}",
        f"--data.valid_cuts={corpus.cuts}",
        f"--data.tokenizer={corpus.tokenizer}",
        f"--model.cmvn={corpus.cmvn}",
        f"--trainer.default_root_dir={root}",
    ]


def srupp_asr_train(args: list[str], expect_returncode: int = 0) -> None:
    """Run ``python -m srupp_asr.cli train ARGS`` from the repository root; check its exit status."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env["SRUPP_ASR_TRUSTED_CLASSES"] = "tests"  # the test callbacks (DumpWeights, KillAtStep) are named by class
    # A session of its own, so that a timeout also ends the other ranks Lightning started.
    with subprocess.Popen(
        [sys.executable, "-m", "srupp_asr.cli", "train", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            _, stderr = proc.communicate(timeout=CLI_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail(f"srupp-asr train did not finish in {CLI_TIMEOUT_S} s")
    assert proc.returncode == expect_returncode, f"exit status {proc.returncode}:\n{stderr[-4000:]}"


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    """A state_dict written by :class:`DumpWeights`."""
    return torch.load(path, map_location="cpu", weights_only=True)


def augmented_config(path: Path, speed_perturb: bool) -> Path:
    """A config on top of conf/tiny_cpu.yaml with dropout and SpecAugment on (and speed perturbation if asked)."""
    tiny = yaml.safe_load(TINY_CONFIG.read_text())
    model = tiny["model"]
    config = {
        "model": {
            "encoder_conf": {**model["encoder_conf"], "dropout": 0.1, "attn_dropout": 0.1},
            "decoder_conf": {**model["decoder_conf"], "dropout": 0.1},
            "specaugment": {"time_warp": 5, "freq_masks": 2, "freq_width": 10},
        },
        "data": {"max_duration": 6.0, "speed_perturb": [0.9, 1.0, 1.1] if speed_perturb else None},
    }
    path.write_text(yaml.safe_dump(config))
    return path


def train_args(
    corpus, root: Path, weights: Path, every: int, overrides: Path, steps: int = 8
) -> list[str]:  # 8: the fault tests
    """Arguments of a ``steps``-step run saving ``last.ckpt`` every ``every`` steps and dumping its final weights."""
    return [
        *corpus_args(corpus, root),
        "--config",
        str(overrides),
        f"--trainer.max_steps={steps}",
        "--trainer.limit_val_batches=0",
        "--checkpoint.monitor=null",  # step checkpoints without a validation metric
        "--checkpoint.save_top_k=1",
        f"--checkpoint.every_n_train_steps={every}",
        "--trainer.callbacks+=tests.process.runs.DumpWeights",
        f"--trainer.callbacks.out_dir={weights}",
    ]


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], context: str = "") -> None:
    assert a.keys() == b.keys()
    worst = max((a[k].double() - b[k].double()).abs().max().item() for k in a)
    assert worst <= 1e-6, f"the resumed run's weights differ from the uninterrupted run's by up to {worst:.3g}{context}"


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


def run_args(corpus, root: Path, weights: Path, overrides: Path, steps: int, every: int = NO_STEP_CHECKPOINTS):
    """A ``steps``-step run that dumps its final weights; without step checkpoints (``last.ckpt`` is saved where
    it stops) unless ``every`` (0: Lightning's default, a save at every epoch's end)."""
    return train_args(corpus, root, weights, every, overrides, steps)


def train_with_signal(
    args: list[str], sig: str, step: int, times: int = 1, in_validation: bool = False
) -> subprocess.CompletedProcess:
    """``srupp-asr train ARGS`` that sends itself ``sig`` ``times`` times as step ``step`` starts (or SIGTERM as
    the validation after step ``step`` starts)."""
    if in_validation:
        signal_at = ["--trainer.callbacks+=tests.process.runs.TermInValidation"]
    else:
        signal_at = [
            "--trainer.callbacks+=tests.process.runs.TermAtStep",
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


def stop_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("srupp-asr train:")]
