"""Helpers shared by several test modules: constants, builders and runners, no tests and no fixtures (those are
in ``tests/conftest.py``). Test modules import from here, never from each other."""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import importlib.util
import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import soundfile as sf
import torch
from lhotse import CutSet
from lightning.pytorch.callbacks import ModelCheckpoint

from srupp_asr.audio import SAMPLE_RATE
from srupp_asr.data import ASRDataModule, ASRDataset
from srupp_asr.lightning_module import ASRLightningModule, word_errors
from srupp_asr.model import ASRModel

REPO = Path(__file__).resolve().parent.parent
TINY_CONFIG = REPO / "conf" / "tiny_cpu.yaml"
SPOKEN = ["hello world", "the cat sat on the mat", "good morning to you", "speech recognition is fun"]
# The text the ``char_tokenizer`` fixture is trained on.
CHAR_CORPUS = [*SPOKEN, "one two three four five six seven"]
# A tiny SRU++ network (the ``seeded_model`` default).
TINY = {
    "d_model": 16,
    "encoder_conf": {"d_model": 32, "num_layers": 1, "attn_dim": 16},
    "decoder_conf": {"d_model": 16, "num_layers": 1, "num_heads": 2, "ffn_dim": 32},
    "specaugment": None,
}


def _sclite() -> list[str] | None:
    if path := shutil.which("sclite"):
        return [path]
    if Path("/usr/lib/sctk/bin/sclite").is_file():  # Debian keeps it off PATH, behind the `sctk` wrapper
        return ["/usr/lib/sctk/bin/sclite"]
    return None


# The command that runs NIST sclite (Debian's sctk), or None where it is not installed.
SCLITE = _sclite()


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
# with the test's seed, since floating-point details differ between CPUs: on all 20 utterances 160 for srupp, 90
# for conformer, 320 for blstm (over seeds 0-3: 140-260, 80-110 and 320 to over 700); on the first 8, which the
# acceptance test gives the baselines, 50 for conformer and 180 for blstm (2026-11-30). The BLSTM sits on the CTC
# blank plateau for long unless its learning rate is high from the first steps, hence its short warm-up.
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


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """The folder ``name`` that ``build(folder)`` filled, built once per test run: under xdist the workers share
    the run's temporary root (the parent of each worker's own), and an ``flock`` makes the others wait for the
    one building. A build that raised leaves no completion mark, so the next one to ask builds it again."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    folder = root / name
    with open(root / f"{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".built").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            (folder / ".built").touch()
    return folder


@contextlib.contextmanager
def benchmark_module(name: str):
    """``benchmarks/NAME.py`` imported as the module ``NAME``, with ``benchmarks/`` on ``sys.path`` meanwhile (for
    the scripts that import their siblings); both undone after."""
    folder = str(REPO / "benchmarks")
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, folder)
    sys.modules[name] = module  # dataclasses look their module up by name
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)
        sys.path.remove(folder)


def write_manifest(path: Path, lines: list) -> Path:
    text = "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(text)
    return path


def lossy_formats() -> list[tuple[str, str | None, str]]:
    """(format, subtype, extension) of the lossy codecs this libsndfile writes: Ogg Vorbis, Ogg Opus, MP3."""
    formats = sf.available_formats()
    wanted = [("OGG", "VORBIS", "ogg"), ("OGG", "OPUS", "opus"), ("MP3", None, "mp3")]
    return [(f, s, e) for f, s, e in wanted if f in formats and (s is None or s in sf.available_subtypes(f))]


def chirp(seconds: float = 8.0) -> np.ndarray:
    """A 16 kHz chirp rising from 200 Hz, at 0.3 of full scale."""
    t = np.arange(round(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    return (0.3 * np.sin(2 * np.pi * (200 + 300 * t) * t)).astype(np.float32)


def one_line_error(capsys, command: str) -> str:
    """The command's single stderr line (``srupp-asr COMMAND: error: ...``), without the prefix."""
    err = capsys.readouterr().err
    prefix = f"srupp-asr {command}: error: "
    assert err.count("\n") == 1 and err.startswith(prefix), err
    return err[len(prefix) :].rstrip("\n")


def write_checkpoint(
    path: Path,
    model: ASRModel,
    step: int,
    scores: dict[str, float] | None = None,
    monitor: str = "valid/loss",
    mode: str = "min",
    last: bool = False,
) -> Path:
    """A Lightning-format checkpoint as ModelCheckpoint writes it: top-k files list themselves in best_k_models."""
    folder = path.parent
    state = {
        "monitor": monitor,
        "best_model_score": None,
        "best_model_path": "",
        "current_score": None,
        "dirpath": str(folder),
        "best_k_models": {str(folder / name): torch.tensor(v) for name, v in (scores or {}).items()},
        "kth_best_model_path": "",
        "kth_value": torch.tensor(float("inf")),
        "last_model_path": str(folder / "last.ckpt") if last else "",
    }
    hparams = {"tokenizer": "tok.model", "cmvn": None, **{k: v for k, v in model.config.items() if k != "vocab_size"}}
    ckpt = {
        "epoch": step,
        "global_step": step,
        "state_dict": {f"model.{k}": v.clone() for k, v in model.state_dict().items()},
        "callbacks": {ModelCheckpoint(monitor=monitor, mode=mode).state_key: state},
        "hyper_parameters": hparams,
    }
    torch.save(ckpt, path)
    return path


def seeded_model(seed: int, vocab_size: int, **overrides) -> ASRModel:
    torch.manual_seed(seed)
    model = ASRModel(vocab_size, **{**TINY, **overrides})
    model.set_cmvn(torch.linspace(-1.0, 1.0, 80), torch.full((80,), 2.0))
    return model


def write_tone(path, seconds: float, rate: int = 16000, channels: int = 1):
    """A quiet 440 Hz tone of exactly ``seconds`` (rounded to samples)."""
    t = np.arange(round(seconds * rate)) / rate
    tone = 0.1 * np.sin(2 * np.pi * 440 * t).astype(np.float32)
    sf.write(path, np.stack([tone] * channels, axis=1) if channels > 1 else tone, rate)
    return path


@dataclass
class W:
    """A decoded word as the writers take it."""

    text: str
    start: float
    end: float
    confidence: float = 0.9


def bytes_name(folder: Path, name: bytes) -> str:
    """The str Python uses for ``folder/name`` when ``name`` is not UTF-8 (lone surrogates, as os.listdir gives)."""
    return os.fsdecode(os.fsencode(folder) + b"/" + name)


def run_transcribe_cli(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    """``srupp-asr transcribe ARGS`` in a child process with a strict UTF-8 stdout (``PYTHONIOENCODING=utf-8:strict``,
    as under an ``en_US.UTF-8`` locale: a non-UTF-8 file name that reached stdout unescaped would crash it);
    stdout and stderr as bytes."""
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}
    command = [sys.executable, "-m", "srupp_asr.cli", "transcribe", *args]
    return subprocess.run(command, capture_output=True, env=env, timeout=timeout, check=False)


class RunsCode:
    """Unpickling this creates ``marker``: the proof that a loader unpickled it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def evil_pickle(folder: Path, name: str) -> Path:
    """Write a pickle ``folder/name`` whose unpickling creates the file returned (beside ``folder``)."""
    marker = folder.parent / "unpickled"
    (folder / name).write_bytes(pickle.dumps(RunsCode(marker)))
    return marker


def transcribe_measured(model: Path, audio: Path, folder: Path) -> tuple[float, float]:
    """Transcribe ``audio`` in a fresh process (JSON into ``folder``): its own peak RSS in MiB (VmHWM, polled: wait4's
    ru_maxrss would also count a compiler building the CPU extension) and its wall seconds."""
    command = [sys.executable, "-m", "srupp_asr.cli", "transcribe", "-q", "--model", str(model), "--threads", "2"]
    command += ["--decoding", "ctc_greedy", "-f", "json", "-o", str(folder), str(audio)]
    peak, begin = 0.0, time.perf_counter()
    with open(folder / "stderr.txt", "wb") as err:
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
        while child.poll() is None:
            with contextlib.suppress(OSError, StopIteration, ValueError):
                status = Path(f"/proc/{child.pid}/status").read_text().splitlines()
                peak = max(peak, int(next(x for x in status if x.startswith("VmHWM:")).split()[1]) / 1024)
            time.sleep(0.2)
    assert child.returncode == 0, (folder / "stderr.txt").read_text()
    return peak, time.perf_counter() - begin


class FusedAdamMixin:
    """For a LightningModule: fused Adam, as CUDA's optimizer is (torch's CPU kernel takes ``found_inf`` too), so
    that the non-finite guard runs on the device."""

    def configure_optimizers(self) -> dict:
        from srupp_asr.schedulers import NoamLR, build_optimizer

        config = super().configure_optimizers()
        hp = self.hparams
        optimizer = build_optimizer(hp.optimizer, self.parameters(), hp.lr, hp.weight_decay, fused=True)
        config["optimizer"] = optimizer
        config["lr_scheduler"]["scheduler"] = NoamLR(optimizer, warmup_steps=hp.warmup_steps)
        return config


def cpu_trainer(max_steps: int, callbacks: list[L.Callback] = (), **kwargs) -> L.Trainer:
    """A quiet one-process CPU Lightning trainer for ``max_steps`` steps: no logger, checkpoints, progress bar,
    model summary or validation (``kwargs`` override)."""
    options = {"accelerator": "cpu", "devices": 1, "logger": False, "enable_checkpointing": False}
    options.update(enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    return L.Trainer(max_steps=max_steps, callbacks=list(callbacks), **{**options, **kwargs})


def error_within(seconds: float, call: Callable[[], object]) -> BaseException | None:
    """What ``call()`` raised (None if it returned), failing the test if it runs longer than ``seconds``: a read
    that waits on a named pipe or reads ``/dev/zero`` for ever fails instead of hanging the suite."""
    import threading

    raised: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            raised.append(None)
        except BaseException as err:  # handed to the test
            raised.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"still running after {seconds} s (waiting on a pipe or reading without a bound?)")
    return raised[0]
