"""Acceptance tests of training on real (espeak-ng) speech: each encoder overfits a small corpus to WER 0,
``srupp-asr train`` runs 2-process DDP on CPU with identical ranks, and a killed run resumed from its last
checkpoint ends exactly where the uninterrupted run does.

The DDP and resume tests run ``python -m srupp_asr.cli train fit`` in subprocesses with the repository root as
working directory, so LightningCLI can import the callbacks below as ``tests.test_training_acceptance.<Name>``.
"""

from __future__ import annotations

import io
import json
import os
import random
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import soundfile as sf
import torch
import yaml
from lhotse import CutSet, MonoCut, Recording, SupervisionSegment

from srupp_asr.audio import SAMPLE_RATE, load_audio
from srupp_asr.data import ASRDataModule, ASRDataset
from srupp_asr.frontend import compute_cmvn_stats, save_cmvn
from srupp_asr.lightning_module import ASRLightningModule, rng_states, set_rng_states, word_errors
from srupp_asr.text import normalize_text
from srupp_asr.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parent.parent
TINY_CONFIG = REPO / "conf" / "tiny_cpu.yaml"
CLI_TIMEOUT_S = 300  # a hung DDP rendezvous must fail the test, not the CI job

# Twenty distinct short sentences (about 1.2-1.7 s each as espeak-ng speaks them).
SENTENCES = [
    "the sun is warm today",
    "open the red door",
    "my dog likes to run",
    "we ate fresh bread",
    "please call me later",
    "the train left early",
    "she reads a long book",
    "birds sing in spring",
    "turn off the light",
    "he plays the guitar",
    "cold water tastes good",
    "the kids went home",
    "a small boat sailed by",
    "rain fell all night",
    "clean your room now",
    "the old man smiled",
    "green apples are sour",
    "we walked to school",
    "the clock struck nine",
    "snow covers the hill",
]

# Per encoder: a small network that overfits quickly, and a step budget with a margin over the steps it needed
# with the test's seed (140 for srupp, 100 for conformer, 320 for blstm; over seeds 0-3: 140-260, 80-110 and
# 320 to over 700), since floating-point details differ between CPUs. The BLSTM sits on the CTC blank plateau
# for long unless its learning rate is high from the first steps, hence its short warm-up.
OVERFIT: dict[str, tuple[dict[str, Any], int]] = {
    "srupp": (
        {
            "d_model": 32,
            "encoder_conf": {
                "d_model": 128,
                "num_layers": 2,
                "attn_dim": 64,
                "num_heads": 2,
                "attn_every": 2,
                "dropout": 0.0,
                "attn_dropout": 0.0,
            },
            "lr": 0.01,
            "warmup_steps": 20,
        },
        500,
    ),
    "conformer": (
        {
            "d_model": 64,
            "encoder_conf": {
                "d_model": 64,
                "num_layers": 2,
                "num_heads": 2,
                "ffn_dim": 128,
                "depthwise_conv_kernel_size": 15,
                "dropout": 0.0,
            },
            "lr": 0.005,
            "warmup_steps": 20,
        },
        300,
    ),
    "blstm": (
        {
            "d_model": 32,
            "encoder_conf": {"d_model": 128, "num_layers": 2, "dropout": 0.0},
            "lr": 0.03,
            "warmup_steps": 3,
        },
        700,
    ),
}
# No dropout (above) or SpecAugment: the fastest way to memorise.
OVERFIT_COMMON = {
    "decoder_conf": {"d_model": 64, "num_layers": 1, "num_heads": 2, "ffn_dim": 128, "dropout": 0.0},
    "ctc_weight": 0.5,
    "specaugment": None,
}
CHECK_EVERY = 10  # steps between greedy-CTC evaluations of the overfit run


@dataclass(frozen=True)
class Corpus:
    """Paths of the spoken corpus: cut manifest, char tokenizer, CMVN stats."""

    cuts: str
    tokenizer: str
    cmvn: str


@pytest.fixture(scope="module")
def corpus(synthesize_speech, tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    """:data:`SENTENCES` spoken by espeak-ng as 16 kHz WAVs, with a char tokenizer and CMVN stats trained on them."""
    folder = tmp_path_factory.mktemp("acceptance_corpus")
    cuts = []
    for i, text in enumerate(SENTENCES):
        utt = f"utt{i:02d}"
        wav = folder / f"{utt}.wav"
        # espeak-ng speaks at 22.05 kHz; store the model's rate so that loading needs no resampling.
        sf.write(wav, load_audio(synthesize_speech(text, f"acceptance_{utt}.wav")).numpy(), SAMPLE_RATE)
        rec = Recording.from_file(wav, recording_id=utt)
        sup = SupervisionSegment(id=utt, recording_id=utt, start=0.0, duration=rec.duration, text=text)
        cuts.append(MonoCut(id=utt, start=0.0, duration=rec.duration, channel=0, recording=rec, supervisions=[sup]))
    cutset = CutSet.from_cuts(cuts)
    cutset.to_file(folder / "cuts.jsonl.gz")
    save_cmvn(folder / "cmvn.json", *compute_cmvn_stats(cutset))
    # A char model holds every character of the text (vocab_size is an upper bound for char models).
    Tokenizer.train(SENTENCES, folder / "tokenizer.model", vocab_size=40, model_type="char")
    return Corpus(str(folder / "cuts.jsonl.gz"), str(folder / "tokenizer.model"), str(folder / "cmvn.json"))


# ---------------------------------------------------------------------------------------------- overfitting


def greedy_transcripts(module: ASRLightningModule, batch: dict[str, Any]) -> list[str]:
    """Greedy-CTC transcripts of ``batch`` by ``module`` in eval mode (its training mode is restored)."""
    was_training = module.training
    module.eval()
    try:
        hyps = module.model.ctc_greedy(batch["audio"], batch["audio_lens"])
    finally:
        module.train(was_training)
    return [module.tokenizer.decode(ids) for ids in hyps]


def corpus_wer(module: ASRLightningModule, batch: dict[str, Any]) -> float:
    """Greedy-CTC word error rate of ``module`` on ``batch``: all word errors over all reference words."""
    counts = [word_errors(ref, hyp) for ref, hyp in zip(batch["texts"], greedy_transcripts(module, batch), strict=True)]
    return sum(e for e, _ in counts) / sum(w for _, w in counts)


class StopAtZeroWER(L.Callback):
    """Every ``every`` steps, decodes ``batch`` with greedy CTC and stops training once its WER is 0, or ``extra``
    steps after that (the attention decoder memorises more slowly than the CTC head)."""

    def __init__(self, batch: dict[str, Any], every: int, extra: int = 0) -> None:
        self.batch, self.every, self.extra = batch, every, extra
        self.history: list[tuple[int, float]] = []
        self.zero_at: int | None = None

    def on_train_batch_end(
        self, trainer: L.Trainer, module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Evaluate at every ``every``-th step until WER 0; ask the trainer to stop ``extra`` steps after that."""
        if self.zero_at is None and trainer.global_step % self.every == 0:
            wer = corpus_wer(module, self.batch)
            self.history.append((trainer.global_step, round(wer, 3)))
            if wer == 0.0:
                self.zero_at = trainer.global_step
        if self.zero_at is not None and trainer.global_step >= self.zero_at + self.extra:
            trainer.should_stop = True


def train_to_zero_wer(
    cuts: str, tokenizer: str, cmvn: str, encoder: str, extra_steps: int = 0
) -> tuple[ASRLightningModule, dict[str, Any], StopAtZeroWER, L.Trainer]:
    """Train ``encoder``'s OVERFIT network on every utterance of ``cuts`` until greedy-CTC WER 0 on them (checked
    every CHECK_EVERY steps) and then ``extra_steps`` more, or its step budget; returns (module, the utterances as
    one batch, stopper, trainer)."""
    network, max_steps = OVERFIT[encoder]
    max_steps += extra_steps
    torch.manual_seed(0)
    module = ASRLightningModule(tokenizer, cmvn=cmvn, encoder=encoder, **network, **OVERFIT_COMMON)
    # All 20 utterances (28 s) in each epoch's two batches (one per duration bucket): few updates, cheap ones.
    data = ASRDataModule(cuts, None, tokenizer, max_duration=60.0, num_buckets=2, speed_perturb=None, num_workers=0)
    data.setup("fit")
    everything = ASRDataset(module.tokenizer)[CutSet.from_cuts(data.train_cuts)]
    stopper = StopAtZeroWER(everything, CHECK_EVERY, extra_steps)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        gradient_clip_val=5.0,
        limit_val_batches=0,
        callbacks=[stopper],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
    )
    trainer.fit(module, datamodule=data)
    return module, everything, stopper, trainer


@pytest.mark.parametrize("encoder", list(OVERFIT))
def test_model_overfits_a_small_spoken_corpus_to_zero_wer(corpus: Corpus, encoder: str) -> None:
    """Trained and evaluated on the same 20 utterances, the greedy-CTC transcripts become exactly the references."""
    module, everything, stopper, trainer = train_to_zero_wer(corpus.cuts, corpus.tokenizer, corpus.cmvn, encoder)
    hyps = greedy_transcripts(module, everything)
    pairs = zip(everything["texts"], hyps, strict=True)
    wrong = [(ref, hyp) for ref, hyp in pairs if normalize_text(ref) != normalize_text(hyp)]
    assert corpus_wer(module, everything) == 0.0, f"{trainer.global_step} steps, WER {stopper.history}; {wrong}"


# ---------------------------------------------------------------------------------------------- CLI runs


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
            "--trainer.callbacks+=tests.test_training_acceptance.DumpWeights",
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


def test_random_states_survive_a_weights_only_checkpoint_round_trip() -> None:
    """The states a checkpoint stores load with weights_only=True and replay torch, numpy and Python draws."""

    def draws() -> tuple[list[float], list[float], list[float]]:
        return torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in range(3)]

    np.random.randn()  # leaves a cached Gaussian in numpy's state, which must survive too
    buffer = io.BytesIO()
    torch.save({"rng_states": rng_states()}, buffer)
    expected = draws()
    buffer.seek(0)
    set_rng_states(torch.load(buffer, weights_only=True)["rng_states"])
    assert draws() == expected


RESUME_KILL_STEP = 3  # mid-epoch: an epoch of the corpus is 6 batches of at most 6 s
EPOCH_BATCHES = 6
RESUME_TOTAL_STEPS = 8  # the resumed run crosses into the next epoch


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


@pytest.mark.parametrize(
    "speed_perturb,kill_step",
    [
        pytest.param(False, RESUME_KILL_STEP, id="dropout+specaugment"),
        pytest.param(True, RESUME_KILL_STEP, id="dropout+specaugment+speed_perturb"),
        # the checkpoint of an epoch's last batch: Lightning would count the next epoch as done as well
        # (srupp_asr.data.prepare_resume)
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
                "--trainer.callbacks+=tests.test_training_acceptance.DumpWeights",
                f"--trainer.callbacks.out_dir={out}",
                *extra,
            ],
            expect_returncode=returncode,
        )

    run(tmp_path / "straight", tmp_path / "straight_weights")
    killed = tmp_path / "killed"
    kill = [
        "--trainer.callbacks+=tests.test_training_acceptance.KillAtStep",
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
