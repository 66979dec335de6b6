"""Training faults: ``kill -9`` at any moment (checkpoint writes included), corrupt checkpoints, a full disk.

Every run here is ``srupp-asr train fit`` in a subprocess on the spoken corpus of
``tests/test_training_acceptance.py`` (conf/tiny_cpu.yaml with dropout and SpecAugment on, so a resume must also
restore the random generators). The claim proven: whenever a run dies, ``--ckpt_path last`` goes on from the last
complete checkpoint, no half-written checkpoint is ever picked up, and the final weights equal an uninterrupted
run's.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from srupp_asr import kernels
from srupp_asr.checkpoints import PARTIAL_SUFFIX, load_checkpoint
from srupp_asr.errors import UserError
from srupp_asr.lightning_checkpoints import AtomicCheckpointIO
from srupp_asr.train import run_train
from tests.helpers import REPO
from tests.process.runs import assert_same_weights, corpus_args, load_weights, srupp_asr_train, train_args

TOTAL_STEPS = 8


class KillWhileSaving(AtomicCheckpointIO):
    """Writes half of the checkpoint of step ``step`` and then kills its own process with SIGKILL."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step

    def _dump(self, checkpoint: dict[str, Any], tmp: Path) -> None:
        if checkpoint["global_step"] < self.step:
            return super()._dump(checkpoint, tmp)
        super()._dump(checkpoint, tmp)
        data = tmp.read_bytes()
        with open(tmp, "wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
            os.fsync(f.fileno())
        os.kill(os.getpid(), signal.SIGKILL)


@pytest.fixture(scope="module")
def straight(corpus, overrides, tmp_path_factory) -> tuple[dict[str, torch.Tensor], float]:
    """The final weights of the uninterrupted 8-step run, and its wall time in seconds.

    The CPU extension is built first (a no-op when torch's cache has it): the first run after a change to the
    kernel's source would otherwise include the build (about 20 s) in the time the kill delays scale by, and
    every kill would then land after the killed run had finished."""
    kernels.cpu_extension()
    folder = tmp_path_factory.mktemp("straight")
    start = time.monotonic()
    srupp_asr_train(train_args(corpus, folder / "exp", folder / "weights", 4, overrides))
    return load_weights(folder / "weights" / "rank0.pt"), time.monotonic() - start


def assert_every_checkpoint_complete(folder: Path) -> list[int]:
    """Each ``*.ckpt`` loads (weights_only); returns their global steps."""
    return sorted(load_checkpoint(p)["global_step"] for p in folder.glob("*.ckpt"))


def test_kill_during_a_checkpoint_write_keeps_the_previous_one_and_resume_matches(
    corpus,
    overrides,
    straight,
    tmp_path,
):
    root, weights = tmp_path / "exp", tmp_path / "weights"
    args = train_args(corpus, root, weights, 3, overrides)
    kill = ["--trainer.plugins+=tests.process.test_training_faults.KillWhileSaving", "--trainer.plugins.step=6"]
    srupp_asr_train([*args, *kill], expect_returncode=-signal.SIGKILL)
    folder = root / "checkpoints"
    partial = list(folder.glob(f".*{PARTIAL_SUFFIX}"))
    assert len(partial) == 1, partial  # the half-written file, under a name no checkpoint search matches
    assert set(assert_every_checkpoint_complete(folder)) == {3}  # step 6's save died half-way: step 3 is intact
    srupp_asr_train([*args, "--ckpt_path=last"])
    assert not list(folder.glob(f".*{PARTIAL_SUFFIX}"))  # the next save cleared the leftover
    assert_same_weights(straight[0], load_weights(weights / "rank0.pt"))


def test_kill_9_at_random_moments_then_resume_ends_where_an_uninterrupted_run_does(
    corpus,
    overrides,
    straight,
    tmp_path,
):
    root, weights = tmp_path / "exp", tmp_path / "weights"
    args = train_args(corpus, root, weights, 1, overrides)
    env = {**os.environ, "PYTHONPATH": str(REPO), "SRUPP_ASR_TRUSTED_CLASSES": "tests"}
    rng = random.Random(9)
    kills, steps_seen, delays = 0, [], []
    for attempt in range(12):
        # A kill between a step's top-k save and its last.ckpt leaves a checkpoint but no last.ckpt: that folder is
        # an earlier run's too (a fresh fit into it is refused), so any checkpoint means resume.
        resume = ["--ckpt_path=last"] if any((root / "checkpoints").glob("*.ckpt")) else []
        cmd = [sys.executable, "-m", "srupp_asr.cli", "train", *args, *resume]
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        # Anywhere from start-up to the last steps (a save follows every step, so some kills land mid-save).
        delay = rng.uniform(0.3, 1.0) * straight[1] if attempt < 4 else None
        delays.append(delay)
        try:
            _, stderr = proc.communicate(timeout=delay or 300)
            assert proc.returncode == 0, stderr[-3000:]
            break
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
            kills += 1
        steps_seen.append(assert_every_checkpoint_complete(root / "checkpoints"))
    assert kills >= 1, "no kill landed before the run finished; raise the delays"
    # On a failure, say when the kills landed (the uninterrupted run's time sets them) and what each left.
    context = f"; uninterrupted run {straight[1]:.1f} s, kill delays {delays}, checkpoint steps after each {steps_seen}"
    if (weights / "rank0.pt").exists():
        final = load_weights(weights / "rank0.pt")
    else:
        # The last kill landed after the final step's checkpoint but before training's end hook dumped the weights:
        # the resume found nothing left to do (and ran no hook), so the final weights are the last checkpoint's.
        last = torch.load(root / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
        assert last["global_step"] == TOTAL_STEPS, f"the run did not finish{context}"
        final = last["state_dict"]
    assert_same_weights(straight[0], final, context)


def test_a_corrupt_last_checkpoint_is_a_one_line_error_naming_it(corpus, overrides, tmp_path):
    folder = tmp_path / "exp" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "last.ckpt").write_bytes(b"PK\x03\x04 truncated by someone else's tool")
    args = train_args(corpus, tmp_path / "exp", tmp_path / "weights", 1, overrides)
    with pytest.raises(UserError, match=rf"^{folder / 'last.ckpt'}: not a readable PyTorch checkpoint"):
        run_train([*args[:-2], "--ckpt_path=last"])


def test_a_fresh_fit_into_a_folder_holding_an_earlier_run_is_refused_unless_asked_to_overwrite(
    corpus, tmp_path, capsys
):
    """Lightning wrote ``last-v1.ckpt`` and ``...-v1.ckpt`` beside the earlier run's files, and ``--ckpt_path
    last`` then picked ``-v1``."""
    from srupp_asr.cli import main

    root = tmp_path / "exp"
    one_step = ["train", *corpus_args(corpus, root), "--trainer.max_steps=1", "--trainer.limit_val_batches=0"]
    assert main(one_step) == 0
    folder = root / "checkpoints"
    before = {p.name: p.read_bytes() for p in folder.glob("*.ckpt")}
    assert "last.ckpt" in before
    capsys.readouterr()
    assert main(one_step) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"srupp-asr train: error: {folder}: holds the checkpoints of an earlier")
    assert "--ckpt_path last" in err[0] and "--overwrite true" in err[0]
    assert {p.name: p.read_bytes() for p in folder.glob("*.ckpt")} == before  # nothing written, nothing lost
    assert main([*one_step, "--trainer.max_steps=2", "--ckpt_path=last"]) == 0  # a resume is not a fresh fit
    assert main([*one_step, "--overwrite=true"]) == 0
    names = sorted(p.name for p in folder.glob("*.ckpt"))
    assert not [n for n in names if "-v1" in n], names
    assert load_checkpoint(folder / "last.ckpt")["global_step"] == 1  # the new run's
