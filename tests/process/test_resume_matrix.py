"""Exact resumes in the configurations the other stop tests leave out: augmentation in the data set with and without
DataLoader workers, a stop in the middle of a gradient accumulation cycle, two resumes in a row across an epoch's
end, and DDP.

Each CLI test compares the final weights of a run stopped at step k and resumed with ``--ckpt_path last`` with
those of a run that never stopped (within 1e-6, on CPU with ``trainer.deterministic``), on the spoken corpus and the
dropout + SpecAugment config of ``tests/test_reliability_stops.py``. Every test here failed before the fix it
names (the differences are in RELIABILITY.md).
"""

from __future__ import annotations

import json
import random
import signal
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import soundfile as sf
import torch
from lhotse import CutSet, MonoCut, Recording

from srupp_asr.checkpoints import load_checkpoint
from srupp_asr.data import ASRDataset
from srupp_asr.lightning_module import ASRLightningModule
from srupp_asr.manifest import load_cuts
from srupp_asr.samplers import SeededBatch
from tests.process.runs import (
    NO_STEP_CHECKPOINTS,
    TOTAL_STEPS,
    assert_same_weights,
    load_weights,
    run_args,
    srupp_asr_train,
    stop_lines,
    train_with_signal,
)

EPOCH_BATCHES = 6  # of the corpus with the overrides' max_duration (6 s)
DDP = ["--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp", "--data.max_duration=8"]


@pytest.fixture(scope="module")
def noise(tmp_path_factory) -> Path:
    """A manifest of three short white-noise recordings (shorter than the utterances: several are mixed into one)."""
    folder = tmp_path_factory.mktemp("noise")
    rng = np.random.default_rng(0)
    cuts = []
    for i, seconds in enumerate([0.7, 1.1, 0.5]):
        wav = folder / f"noise{i}.wav"
        sf.write(wav, (0.1 * rng.standard_normal(round(16000 * seconds))).astype(np.float32), 16000)
        rec = Recording.from_file(wav, recording_id=wav.stem)
        cuts.append(MonoCut(id=wav.stem, start=0.0, duration=rec.duration, channel=0, recording=rec))
    CutSet.from_cuts(cuts).to_file(folder / "noise.jsonl.gz")
    return folder / "noise.jsonl.gz"


# ------------------------------------------------------------------------------------------ augmentation


def test_a_seeded_batch_is_augmented_alike_whatever_the_global_generators_and_thread_count(corpus, noise):
    """lhotse's reverberation seeded its simulated room from ``uuid4()``, and generating the impulse response draws
    from torch's global generator and, on several threads, races; the data set now seeds both from the batch and
    loads augmented audio on one thread, leaving the process's generators where they were."""
    cuts = CutSet.from_cuts(list(load_cuts(corpus.cuts))[:6])
    dataset = ASRDataset(
        corpus.tokenizer,
        speed_perturb=[0.9, 1.1],
        noise_cuts=load_cuts(noise),
        noise_prob=1.0,
        reverb_prob=1.0,
    )
    threads = torch.get_num_threads()
    audio = []
    try:
        for n_threads, global_seed in [(2, 0), (1, 1), (2, 2), (2, 0)]:
            torch.set_num_threads(n_threads)
            torch.manual_seed(global_seed)
            np.random.seed(global_seed)
            random.seed(global_seed)
            before = torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()
            audio.append(dataset[SeededBatch(cuts, 3)]["audio"])
            assert torch.equal(torch.get_rng_state(), before[0]), "loading moved torch's global generator"
            assert np.array_equal(np.random.get_state()[1], before[1]), "loading moved numpy's global generator"
            assert random.getstate() == before[2], "loading moved Python's global generator"
            assert torch.get_num_threads() == n_threads
    finally:
        torch.set_num_threads(threads)
    worst = max((audio[0] - a).abs().max().item() for a in audio[1:])
    assert worst == 0.0, f"the same batch was augmented differently, by up to {worst:.3g}"
    assert not torch.equal(dataset[SeededBatch(cuts, 4)]["audio"], audio[0])  # another batch: other choices


def test_noise_reverberation_and_speed_perturbation_resume_exactly_and_do_not_depend_on_num_workers(
    corpus, overrides, noise, tmp_path
):
    """Uninterrupted in the main process; stopped at an epoch's end and resumed with 2 DataLoader workers."""
    augment = [
        f"--data.noise_cuts={noise}",
        "--data.noise_prob=0.5",
        "--data.reverb_prob=0.3",
        "--data.speed_perturb=[0.9,1.0,1.1]",
    ]
    total = EPOCH_BATCHES + 2
    srupp_asr_train([*run_args(corpus, tmp_path / "straight", tmp_path / "w0", overrides, total), *augment])
    root, workers = tmp_path / "exp", [*augment, "--data.num_workers=2"]
    srupp_asr_train([*run_args(corpus, root, tmp_path / "first", overrides, EPOCH_BATCHES), *workers])
    srupp_asr_train([*run_args(corpus, root, tmp_path / "w2", overrides, total), *workers, "--ckpt_path=last"])
    assert json.loads((tmp_path / "w2" / "rank0.json").read_text())["global_step"] == total
    assert_same_weights(load_weights(tmp_path / "w0" / "rank0.pt"), load_weights(tmp_path / "w2" / "rank0.pt"))


# ------------------------------------------------------------------------------------------ epoch ends


@pytest.mark.parametrize(
    "every",
    [
        pytest.param(0, id="epoch-end-checkpoint"),  # ModelCheckpoint's save at the epoch's end
        pytest.param(NO_STEP_CHECKPOINTS, id="checkpoint-as-training-ends", marks=pytest.mark.slow),
    ],
)
def test_a_run_resumed_at_an_epochs_end_and_stopped_again_in_the_next_epoch_resumes_exactly(
    corpus, overrides, straight, tmp_path, every
):
    """Resumed from an epoch's end, Lightning counted the next epoch's batches on from the finished epoch's (6, 7,
    ... instead of 0, 1, ...); the data module stored that count as the batches done in the epoch, and the second
    resume skipped the rest of the epoch."""
    root = tmp_path / "exp"
    for steps in (EPOCH_BATCHES, EPOCH_BATCHES + 2):
        resume = ["--ckpt_path=last"] if steps > EPOCH_BATCHES else []
        srupp_asr_train([*run_args(corpus, root, tmp_path / f"w{steps}", overrides, steps, every), *resume])
    record = load_checkpoint(root / "checkpoints" / "last.ckpt")["ASRDataModule"]
    srupp_asr_train([*run_args(corpus, root, tmp_path / "weights", overrides, TOTAL_STEPS, every), "--ckpt_path=last"])
    assert_same_weights(straight, load_weights(tmp_path / "weights" / "rank0.pt"), " (resumed twice)")
    assert record == {"epoch": 1, "batches_done": 2}  # after the first resume, 2 steps into epoch 1


# ------------------------------------------------------------------------------------------ gradient accumulation

ACCUMULATE = ["--trainer.accumulate_grad_batches=2"]
ACCUMULATED_STEPS = 5  # 10 micro-batches: across the first epoch's end


@pytest.fixture(scope="module")
def straight_accumulated(corpus, overrides, tmp_path_factory) -> dict[str, torch.Tensor]:
    folder = tmp_path_factory.mktemp("straight_accumulated")
    args = run_args(corpus, folder / "exp", folder / "weights", overrides, ACCUMULATED_STEPS)
    srupp_asr_train([*args, *ACCUMULATE])
    return load_weights(folder / "weights" / "rank0.pt")


@pytest.mark.parametrize(
    "how",
    [
        pytest.param("sigterm", id="sigterm-after-the-first-micro-batch"),
        # validation every 3 micro-batches: its checkpoint falls between the two micro-batches of step 2
        pytest.param("kill-after-validation", id="kill-9-after-a-validation-checkpoint", marks=pytest.mark.slow),
    ],
)
def test_a_checkpoint_written_in_the_middle_of_an_accumulation_cycle_resumes_exactly(
    corpus, overrides, straight_accumulated, tmp_path, how
):
    """The checkpoint held the count of micro-batches done but not the gradient they had accumulated: the resumed
    run stepped on the cycle's last micro-batch alone."""
    root = tmp_path / "exp"
    args = [*run_args(corpus, root, tmp_path / "weights", overrides, ACCUMULATED_STEPS), *ACCUMULATE]
    if how == "sigterm":
        proc = train_with_signal(args, "SIGTERM", 1)  # as micro-batch 3 (the first of step 2) starts
        assert proc.returncode == 143, proc.stderr[-3000:]
        assert stop_lines(proc)[0].startswith("srupp-asr train: terminated (SIGTERM) after step 1: saved")
    else:
        args += [
            "--trainer.limit_val_batches=2",
            "--trainer.val_check_interval=3",
            "--checkpoint.monitor=valid/loss",
            "--checkpoint.every_n_train_steps=null",
        ]
        kill = ["--trainer.callbacks+=tests.process.runs.KillAtStep", "--trainer.callbacks.step=2"]
        srupp_asr_train([*args, *kill], expect_returncode=-signal.SIGKILL)
    checkpoint = load_checkpoint(root / "checkpoints" / "last.ckpt")
    assert checkpoint["global_step"] == 1 and checkpoint["ASRDataModule"] == {"epoch": 0, "batches_done": 3}
    srupp_asr_train([*args, "--ckpt_path=last"])
    assert_same_weights(straight_accumulated, load_weights(tmp_path / "weights" / "rank0.pt"))
    assert len(checkpoint["accumulated_gradients"]) == 1  # one rank's


# ------------------------------------------------------------------------------------------ DDP

DDP_STEPS = 6  # 3 batches a rank an epoch with max_duration 8: two epochs


@pytest.fixture(scope="module")
def straight_ddp(corpus, overrides, tmp_path_factory) -> dict[str, torch.Tensor]:
    folder = tmp_path_factory.mktemp("straight_ddp")
    srupp_asr_train([*run_args(corpus, folder / "exp", folder / "weights", overrides, DDP_STEPS), *DDP])
    return load_weights(folder / "weights" / "rank0.pt")


def test_a_ddp_run_stopped_and_resumed_with_as_many_ranks_ends_where_an_uninterrupted_one_does(
    corpus, overrides, straight_ddp, tmp_path
):
    """The ranks' random generators part after the first step (each rank's dropout draws as many numbers as its
    batch is long); checkpoints held rank 0's states only and every rank resumed from them."""
    root = tmp_path / "exp"
    srupp_asr_train([*run_args(corpus, root, tmp_path / "first", overrides, 2), *DDP])
    assert len(load_checkpoint(root / "checkpoints" / "last.ckpt")["rng_states_per_rank"]) == 2
    srupp_asr_train([*run_args(corpus, root, tmp_path / "weights", overrides, DDP_STEPS), *DDP, "--ckpt_path=last"])
    ranks = [load_weights(tmp_path / "weights" / f"rank{rank}.pt") for rank in (0, 1)]
    assert_same_weights(ranks[0], ranks[1], " (between the ranks)")
    assert_same_weights(straight_ddp, ranks[0])


@pytest.mark.slow
def test_sigterm_in_the_middle_of_an_accumulation_cycle_of_a_ddp_run_resumes_exactly(corpus, overrides, tmp_path):
    """Every rank's accumulated gradients are saved (under DDP each rank holds its own until the cycle's end)."""
    steps = 4  # 3 micro-batches a rank an epoch: steps of 2, 1, 2, 1 micro-batches
    args = [*DDP, *ACCUMULATE]
    srupp_asr_train([*run_args(corpus, tmp_path / "straight", tmp_path / "straight_w", overrides, steps), *args])
    root = tmp_path / "exp"
    resumed = [*run_args(corpus, root, tmp_path / "weights", overrides, steps), *args]
    proc = train_with_signal(resumed, "SIGTERM", 2)  # as the first micro-batch of epoch 1 starts
    assert proc.returncode == 143, proc.stderr[-3000:]
    checkpoint = load_checkpoint(root / "checkpoints" / "last.ckpt")
    assert checkpoint["ASRDataModule"] == {"epoch": 1, "batches_done": 1}
    srupp_asr_train([*resumed, "--ckpt_path=last"])
    straight_weights = load_weights(tmp_path / "straight_w" / "rank0.pt")
    assert_same_weights(straight_weights, load_weights(tmp_path / "weights" / "rank0.pt"))
    assert len(checkpoint["accumulated_gradients"]) == 2  # both ranks'


# ------------------------------------------------------------------------------------------ counters


def test_the_count_of_non_finite_losses_in_a_row_survives_a_resume(corpus):
    """A run resumed in the middle of a run of non-finite losses stops where the uninterrupted run would (it
    counted from zero again, and could skip up to twice ``max_consecutive_nonfinite`` batches in a row)."""
    small = {"d_model": 32, "encoder_conf": {"d_model": 32, "num_layers": 1, "attn_dim": 16, "num_heads": 1}}
    module = ASRLightningModule(corpus.tokenizer, max_consecutive_nonfinite=4, **small)
    for _ in range(3):
        module._count_nonfinite()
    checkpoint: dict = {}
    module.on_save_checkpoint(checkpoint)
    resumed = ASRLightningModule(corpus.tokenizer, max_consecutive_nonfinite=4, **small)
    resumed.on_load_checkpoint(checkpoint)
    assert resumed.nonfinite_skipped == 3
    with pytest.raises(RuntimeError, match="not finite for 4 batches in a row"):
        resumed._count_nonfinite()


# ------------------------------------------------------------------------------------------ periodic checkpoints


class RecordSaves(L.Callback):
    """Appends the global step of every checkpoint the run saves to ``out`` (one number a line)."""

    def __init__(self, out: str) -> None:
        self.out = out

    def on_save_checkpoint(self, trainer: L.Trainer, module: L.LightningModule, checkpoint: dict) -> None:
        with open(self.out, "a") as f:
            f.write(f"{checkpoint['global_step']}\n")


def saved_steps(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


@pytest.mark.parametrize("how", ["last", "copy"])
def test_periodic_checkpoints_go_on_after_a_mid_epoch_resume(corpus, overrides, tmp_path, how):
    """Resumed from a step checkpoint (``--ckpt_path last`` after a kill, or a plain copy of a good checkpoint),
    a run with ``every_n_train_steps`` went on without saving until training ended, and then as ``last-v1.ckpt``:
    a second kill lost everything since the resume."""
    every, kill_at, total = 2, 8, 16  # the first validation (at epoch 0's end, step 6) comes before the kill
    root = tmp_path / "exp"
    record = ["--trainer.callbacks+=tests.process.test_resume_matrix.RecordSaves"]
    first = [
        *run_args(corpus, root, tmp_path / "w1", overrides, total, every),
        "--checkpoint.monitor=valid/loss",  # as the recipes: top-k by validation loss, saved every `every` steps
        "--checkpoint.save_top_k=-1",
        "--trainer.limit_val_batches=2",
    ]
    kill = ["--trainer.callbacks+=tests.process.runs.KillAtStep", f"--trainer.callbacks.step={kill_at}"]
    srupp_asr_train(
        [*first, *kill, *record, f"--trainer.callbacks.out={tmp_path / 'first.txt'}"],
        expect_returncode=-signal.SIGKILL,
    )
    assert saved_steps(tmp_path / "first.txt")[-1] == kill_at
    ckpt = "last"
    if how == "copy":
        ckpt = str(tmp_path / "copy.ckpt")
        (tmp_path / "copy.ckpt").write_bytes((root / "checkpoints" / "last.ckpt").read_bytes())
    resume = [*first, *record, f"--trainer.callbacks.out={tmp_path / 'resumed.txt'}", f"--ckpt_path={ckpt}"]
    srupp_asr_train(resume)
    steps = saved_steps(tmp_path / "resumed.txt")
    assert [s for s in range(kill_at + every, total + 1, every) if s not in steps] == [], steps
    scores = load_checkpoint(root / "checkpoints" / "last.ckpt")["callbacks"]
    state = next(v for k, v in scores.items() if k.startswith("ModelCheckpoint{"))  # Lightning's key: average reads it
    kept = {load_checkpoint(p)["global_step"] for p in state["best_k_models"]}
    assert kept >= set(range(kill_at, total + 1, every)), kept  # the resumed run's step checkpoints are scored
    names = sorted(p.name for p in (root / "checkpoints").glob("*.ckpt"))
    assert not [n for n in names if "-v1" in n], names
    assert load_checkpoint(root / "checkpoints" / "last.ckpt")["global_step"] == total


def test_the_resumable_checkpoint_callback_keeps_lightnings_state_key_and_pickles():
    """Its state key is Lightning's, so earlier runs resume and ``average`` reads the scores; pickle (DDP spawn)
    finds the class by name."""
    import pickle

    from lightning.pytorch.callbacks import ModelCheckpoint

    from srupp_asr.lightning_checkpoints import ResumableModelCheckpoint

    ours = ResumableModelCheckpoint(monitor="valid/loss", every_n_train_steps=2)
    assert ours.state_key == ModelCheckpoint(monitor="valid/loss", every_n_train_steps=2).state_key
    assert type(pickle.loads(pickle.dumps(ours))) is ResumableModelCheckpoint
