"""Acceptance tests of training on real (espeak-ng) speech: each encoder overfits a small corpus to WER 0,
``srupp-asr train`` runs 2-process DDP on CPU with identical ranks, and a killed run resumed from its last
checkpoint ends exactly where the uninterrupted run does.

The DDP and resume tests run ``python -m srupp_asr.cli train fit`` in subprocesses with the repository root as
working directory, so LightningCLI can import the callbacks below as ``tests.test_training_acceptance.<Name>``.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch

from srupp_asr.text import normalize_text
from tests.helpers import OVERFIT, Corpus, corpus_wer, greedy_transcripts, train_to_zero_wer
from tests.process.runs import augmented_config, corpus_args, load_weights, srupp_asr_train

# ---------------------------------------------------------------------------------------------- overfitting


# The utterances each encoder memorises: SRU++ (the product) all 20; the baselines, which share everything but the
# encoder, the first 8 (a third of the cost: the BLSTM's steps are the slowest of the suite on 2 cores).
UTTERANCES = {"srupp": 20, "conformer": 8, "blstm": 8}


@pytest.mark.parametrize("encoder", list(OVERFIT))
def test_model_overfits_a_small_spoken_corpus_to_zero_wer(corpus: Corpus, encoder: str, tmp_path: Path) -> None:
    """Trained and evaluated on the same utterances, the greedy-CTC transcripts become exactly the references."""
    from lhotse import CutSet

    cuts = tmp_path / "cuts.jsonl.gz"
    CutSet.from_file(corpus.cuts).subset(first=UTTERANCES[encoder]).to_file(cuts)
    module, everything, stopper, trainer = train_to_zero_wer(str(cuts), corpus.tokenizer, corpus.cmvn, encoder)
    assert len(everything["texts"]) == UTTERANCES[encoder]
    hyps = greedy_transcripts(module, everything)
    pairs = zip(everything["texts"], hyps, strict=True)
    wrong = [(ref, hyp) for ref, hyp in pairs if normalize_text(ref) != normalize_text(hyp)]
    assert corpus_wer(module, everything) == 0.0, f"{trainer.global_step} steps, WER {stopper.history}; {wrong}"


# ---------------------------------------------------------------------------------------------- CLI runs


def test_ddp_on_two_cpu_processes_ends_with_identical_ranks(corpus: Corpus, tmp_path: Path) -> None:
    """``srupp-asr train`` with 2 gloo processes: both ranks take the same 3 updates (each from its own batches)."""
    out = tmp_path / "weights"
    srupp_asr_train(
        [
            *corpus_args(corpus, tmp_path / "exp"),
            "--trainer.accelerator=cpu",
            "--trainer.devices=2",
            "--trainer.strategy=ddp",
            "--trainer.max_steps=3",
            "--trainer.limit_val_batches=1",
            "--data.max_duration=8",
            "--trainer.callbacks+=tests.process.runs.DumpWeights",
            f"--trainer.callbacks.out_dir={out}",
        ]
    )
    records = [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert records == [{"global_step": 3, "world_size": 2}] * 2
    final = [load_weights(out / f"rank{rank}.pt") for rank in (0, 1)]
    start = load_weights(out / "rank0_start.pt")
    assert final[0].keys() == final[1].keys() == start.keys()
    different = [k for k in final[0] if not torch.equal(final[0][k], final[1][k])]
    assert not different, f"the ranks' weights differ in {different}"
    assert not torch.equal(final[0]["model.ctc.weight"], start["model.ctc.weight"])  # it trained
    changed = [k for k, v in start.items() if v.is_floating_point() and not torch.equal(v, final[0][k])]
    assert len(changed) > len(start) // 2


# ---------------------------------------------------------------------------------------------- kill and resume


RESUME_KILL_STEP = 3  # mid-epoch: an epoch of the corpus is 6 batches of at most 6 s
EPOCH_BATCHES = 6
RESUME_TOTAL_STEPS = 8  # the resumed run crosses into the next epoch


@pytest.mark.parametrize(
    "speed_perturb,kill_step",
    [
        pytest.param(False, RESUME_KILL_STEP, id="dropout+specaugment"),
        pytest.param(True, RESUME_KILL_STEP, id="dropout+specaugment+speed_perturb"),
        # the checkpoint of an epoch's last batch: Lightning would count the next epoch as done as well
        # (srupp_asr.lightning_checkpoints.prepare_resume)
        pytest.param(False, EPOCH_BATCHES, id="after-the-epochs-last-batch"),
    ],
)
def test_killed_run_resumed_from_last_checkpoint_matches_an_uninterrupted_run(
    corpus: Corpus, tmp_path: Path, speed_perturb: bool, kill_step: int
) -> None:
    """SIGKILL after step 3's (or 6's) checkpoint, ``--ckpt_path last``, on to step 8: the same weights as 8 steps
    in one go."""
    overrides = augmented_config(tmp_path / "augmented.yaml", speed_perturb)

    def run(root: Path, out: Path, *extra: str, returncode: int = 0) -> None:
        srupp_asr_train(
            [
                *corpus_args(corpus, root),
                "--config",
                str(overrides),
                f"--trainer.max_steps={RESUME_TOTAL_STEPS}",
                "--trainer.limit_val_batches=0",
                # Lightning defers step checkpoints until the monitored metric exists: monitor nothing here.
                "--checkpoint.monitor=null",
                "--checkpoint.save_top_k=1",
                f"--checkpoint.every_n_train_steps={kill_step}",
                "--trainer.callbacks+=tests.process.runs.DumpWeights",
                f"--trainer.callbacks.out_dir={out}",
                *extra,
            ],
            expect_returncode=returncode,
        )

    run(tmp_path / "straight", tmp_path / "straight_weights")
    killed = tmp_path / "killed"
    kill = [
        "--trainer.callbacks+=tests.process.runs.KillAtStep",
        f"--trainer.callbacks.step={kill_step}",
    ]
    run(killed, tmp_path / "killed_weights", *kill, returncode=-signal.SIGKILL)
    last = killed / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, map_location="cpu", weights_only=True)  # what checkpoint averaging does
    assert checkpoint["global_step"] == kill_step and "rng_states" in checkpoint
    assert checkpoint["ASRDataModule"] == {"epoch": 0, "batches_done": kill_step}  # within epoch 0
    assert not (tmp_path / "killed_weights" / "rank0.pt").exists()  # it died before the end

    run(killed, tmp_path / "resumed_weights", "--ckpt_path=last")
    straight = load_weights(tmp_path / "straight_weights" / "rank0.pt")
    resumed = load_weights(tmp_path / "resumed_weights" / "rank0.pt")
    for name in ("straight_weights", "resumed_weights"):
        assert json.loads((tmp_path / name / "rank0.json").read_text())["global_step"] == RESUME_TOTAL_STEPS
    assert straight.keys() == resumed.keys()
    worst = max((straight[k].double() - resumed[k].double()).abs().max().item() for k in straight)
    assert worst <= 1e-6, f"the resumed run's weights differ from the uninterrupted run's by up to {worst:.3g}"
