"""``srupp-asr train-lm``: train an SRU++ language model (:class:`srupp_asr.lm.SRUppLM`) on text.

::

    srupp-asr train-lm --tokenizer data/tokenizer.model --train-text lm_train.txt --train-cuts train_cuts.jsonl.gz \\
        --valid-cuts dev_cuts.jsonl.gz --out-dir exp/lm --max-time 10

Sentences (lines of text files, supervision texts of cut manifests) are normalised and tokenised with the ASR
model's tokenizer, grouped by length into batches of at most ``--batch-tokens`` padded tokens and shuffled per
epoch. Adam with the Noam schedule (linear warm-up, then ``1/sqrt(step)``), gradient clipping. After every epoch
(and every ``--valid-every`` steps) the validation perplexity is measured; the best LM so far is written to
``--out-dir`` atomically. The run ends after ``--max-epochs`` or ``--max-time`` minutes, whichever comes first.

Resuming: the training state (weights, optimiser, schedule, epoch, position in the epoch, best perplexity, the
random generators' states that dropout draws from, and the settings that shape training) is saved to
``OUT_DIR.train.pt`` at every validation and at a stop (atomically; tensors and plain values only, read back with
``torch.load(weights_only=True)``); ``--resume`` continues from it and ends with the weights of a run that was never
stopped (the same device; on a GPU, kernels permitting). A resume whose tokenizer, text, model or optimisation
options differ from the saved run's is refused, naming the state file and the first difference; ``--max-epochs``,
``--max-time``, ``--valid-every``, ``--log-every`` and ``--device`` may change. A ``kill -9`` loses the steps since
the last save (``--valid-every`` bounds them). A run holds ``OUT_DIR.train.lock`` (``flock``): a second train-lm into
the same ``--out-dir`` is refused.

Finishing: a run that ends as asked (``--max-epochs`` or ``--max-time`` reached) writes ``OUT_DIR.train.done``, a JSON
file of its final numbers, after its last state save; every run (fresh or resumed) first removes it. So a script can
tell a finished run (``.train.done``) from one that stopped before its end (``.train.pt`` only: resume it), as the
recipes' LM stage does.

Stopping: SIGTERM, or a first Ctrl-C, stops the run after the step under way (or during validation, after the batch
under way) with its state saved: one line, exit status 143 (130 for Ctrl-C); a validation it cut short is run again
first by ``--resume``. A ``--max-time`` stop validates (the best LM may then be the one of that moment) and saves the
state. The log lines go to stderr, one per ``--log-every`` steps.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import math
import os
import random
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srupp_asr.checks import (
    ConfigValueError,
    check_divides,
    check_int,
    check_number,
    check_probability,
    check_size,
    is_real_number,
)
from srupp_asr.errors import UserError, first_line
from srupp_asr.fileio import LockHeld, atomic_output, atomic_write_text, fsync_directory, take_pid_lock
from srupp_asr.interrupts import (
    EXIT_STATUS,
    INTERRUPTED_STATUS,
    Terminated,
    defer_sigint,
    defer_sigterm,
    sigterm_pending,
)

if TYPE_CHECKING:
    import torch

    from srupp_asr.lm import SRUppLM
    from srupp_asr.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass
class LMTrainConfig:
    """What ``srupp-asr train-lm`` is asked to do (the command's options, with the same names)."""

    tokenizer: str
    out_dir: str
    train_text: Sequence[str] = ()
    train_cuts: Sequence[str] = ()
    valid_text: Sequence[str] = ()
    valid_cuts: Sequence[str] = ()
    d_model: int = 512
    num_layers: int = 4
    attn_dim: int = 256
    num_heads: int = 4
    attn_every: int = 1
    dropout: float = 0.1
    batch_tokens: int = 8000
    lr: float = 2e-3
    warmup_steps: int = 1000
    weight_decay: float = 0.0
    clip: float = 5.0
    max_epochs: int = 20
    max_time: float | None = None  # minutes
    max_len: int = 200  # tokens; longer sentences are dropped (counted in the log)
    valid_every: int = 0  # steps; 0: after every epoch only
    log_every: int = 100
    device: str = "cpu"
    seed: int = 0
    resume: bool = False


def tokenize(texts: Iterable[str], tokenizer: Tokenizer, max_len: int) -> tuple[list[list[int]], int]:
    """Token ids of every non-empty sentence of at most ``max_len`` tokens, and how many longer ones were dropped."""
    out, dropped = [], 0
    for text in texts:
        ids = tokenizer.encode(text)
        if not ids:
            continue
        if len(ids) > max_len:
            dropped += 1
            continue
        out.append(ids)
    return out, dropped


def make_batches(sentences: Sequence[Sequence[int]], batch_tokens: int) -> list[list[int]]:
    """Indices of ``sentences`` grouped by length so that a batch holds at most ``batch_tokens`` padded tokens
    (``<sos/eos>`` included; a sentence longer than that is a batch by itself)."""
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        width = len(sentences[i]) + 1  # sorted: the newest sentence is the longest of the batch
        if current and width * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


class ValidationStopped(Exception):
    """:func:`evaluate_perplexity` was asked to stop (``should_stop``) before its last batch."""


def evaluate_perplexity(
    model: SRUppLM,
    sentences: Sequence[Sequence[int]],
    batch_tokens: int,
    should_stop: Callable[[], bool] | None = None,
) -> float:
    """Per-token perplexity of ``sentences`` (``<sos/eos>`` at the end counted as a token); draws no random numbers.
    ``should_stop`` is asked before each batch but the first: True raises :class:`ValidationStopped`."""
    import torch

    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        with torch.inference_mode():
            for k, batch in enumerate(make_batches(sentences, batch_tokens)):
                if k and should_stop is not None and should_stop():
                    raise ValidationStopped
                chosen = [sentences[i] for i in batch]
                total += float(model.sentence_nll(chosen).double().sum())
                count += sum(len(y) + 1 for y in chosen)
    finally:
        model.train(was_training)
    return math.exp(total / max(count, 1))


def _load_sentences(cfg_text: Sequence[str], cfg_cuts: Sequence[str], tokenizer: Tokenizer, max_len: int, what: str):
    from srupp_asr.tokenizer import texts_from_sources

    sentences, dropped = tokenize(texts_from_sources(list(cfg_cuts), list(cfg_text)), tokenizer, max_len)
    if not sentences:
        raise UserError(f"{what}: no non-empty sentence in {', '.join([*cfg_text, *cfg_cuts]) or 'nothing given'}")
    if dropped:
        log.warning("%s: dropped %d sentences longer than %d tokens", what, dropped, max_len)
    return sentences


# What a resumed run must share with the saved one (besides the LM's shape, its tokenizer and its text): the options
# that shape training. The others (--max-epochs, --max-time, --valid-every, --log-every, --device) may change.
RESUME_OPTIONS = ("batch_tokens", "max_len", "seed", "lr", "warmup_steps", "weight_decay", "clip")
STATE_KEYS = ("model", "optimizer", "scheduler", "progress", "config")
PROGRESS_KEYS = {"epoch": int, "batch": int, "step": int, "best": float}


def train_lm(cfg: LMTrainConfig) -> dict[str, float]:
    """Train, writing the best LM to ``cfg.out_dir``; returns the final numbers (steps, epochs, best valid ppl)."""
    import torch

    if not cfg.train_text and not cfg.train_cuts:
        raise UserError("train-lm: give training text with --train-text and/or --train-cuts")
    if not cfg.valid_text and not cfg.valid_cuts:
        raise UserError("train-lm: give validation text with --valid-text and/or --valid-cuts")
    device = torch.device(cfg.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("train-lm: --device cuda asked for, but no CUDA device is available")
    base = cfg.out_dir.rstrip("/")
    state_path, done_path = Path(f"{base}.train.pt"), Path(f"{base}.train.done")
    with _run_lock(Path(f"{base}.train.lock"), cfg.out_dir):
        done_path.unlink(missing_ok=True)  # this run is not finished (yet), whatever an earlier one was
        result = _train(cfg, device, state_path)
        numbers = {k: v if not isinstance(v, float) or math.isfinite(v) else None for k, v in result.items()}
        atomic_write_text(done_path, json.dumps({**numbers, "state": str(state_path)}, indent=1) + "\n")
        return result


def _train(cfg: LMTrainConfig, device: torch.device, state_path: Path) -> dict[str, float]:
    import torch

    from srupp_asr.lm import SRUppLM, save_lm
    from srupp_asr.model_dir import CONFIG_FILE
    from srupp_asr.schedulers import NoamLR, build_optimizer
    from srupp_asr.tokenizer import Tokenizer

    saved = _read_state(state_path) if cfg.resume else None  # before the text is read: a bad file fails at once
    tokenizer = Tokenizer(cfg.tokenizer)
    train = _load_sentences(cfg.train_text, cfg.train_cuts, tokenizer, cfg.max_len, "training text")
    valid = _load_sentences(cfg.valid_text, cfg.valid_cuts, tokenizer, cfg.max_len, "validation text")
    log.info(
        "train-lm: %d training sentences (%d tokens), %d validation sentences",
        len(train),
        sum(map(len, train)),
        len(valid),
    )

    torch.manual_seed(cfg.seed)
    model = SRUppLM(
        tokenizer.vocab_size,
        d_model=cfg.d_model,
        num_layers=cfg.num_layers,
        attn_dim=cfg.attn_dim,
        num_heads=cfg.num_heads,
        attn_every=cfg.attn_every,
        dropout=cfg.dropout,
        attn_dropout=cfg.dropout,
    ).to(device)
    log.info("train-lm: SRU++ LM with %s parameters", f"{model.num_params():,}")
    optimizer = build_optimizer("adam", model.parameters(), cfg.lr, cfg.weight_decay)
    scheduler = NoamLR(optimizer, cfg.warmup_steps)
    settings = _settings(cfg, train, valid, device)
    progress: dict[str, Any] = {"epoch": 0, "batch": 0, "step": 0, "best": math.inf, "validate": False}
    if saved is not None:
        _check_resumable(state_path, saved, settings, model.config)
        progress.update(_restore(state_path, saved, model, optimizer, scheduler, device))
        log.info("train-lm: resumed from %s at epoch %d, batch %d", state_path, progress["epoch"], progress["batch"])
        if math.isfinite(progress["best"]) and not Path(cfg.out_dir, CONFIG_FILE).is_file():
            # The best LM so far is gone (deleted, moved): validate at once, so that the run ends with an LM.
            log.warning("train-lm: %s holds no LM any more: the next validation writes one", cfg.out_dir)
            progress["best"], progress["validate"] = math.inf, True

    stop: dict[str, str | None] = {"reason": None}

    def on_ctrl_c() -> None:
        print("\nCtrl-C: stopping after this step and saving the state (Ctrl-C again: stop now)", file=sys.stderr)
        stop["reason"] = stop["reason"] or "Ctrl-C"

    def stop_requested() -> bool:
        if stop["reason"] is None and sigterm_pending():
            stop["reason"] = "SIGTERM"
        return stop["reason"] is not None

    def stopped(when: str) -> Terminated:
        how, status = "terminated (SIGTERM)", EXIT_STATUS
        if stop["reason"] == "Ctrl-C":
            how, status = "interrupted (Ctrl-C)", INTERRUPTED_STATUS
        return Terminated(f"{how} {when} step {progress['step']}: saved {state_path}; resume with --resume", status)

    def save() -> None:
        _save_state(state_path, model, optimizer, scheduler, progress, settings, device)

    def checkpoint(more: bool) -> None:
        """Validate, write the LM when it is the best so far, save the state; a stop request during it stops the
        run (after the batch under way; the resumed run validates first) and, with ``more`` training to come,
        after it."""
        try:
            ppl = evaluate_perplexity(model, valid, cfg.batch_tokens, should_stop=stop_requested)
        except ValidationStopped:
            progress["validate"] = True
            save()
            raise stopped("during the validation after") from None
        progress["validate"] = False
        improved = ppl < progress["best"]
        if improved:
            progress["best"] = ppl
            save_lm(model, cfg.tokenizer, cfg.out_dir)
        save()
        log.info(
            "train-lm: epoch %d step %d valid ppl %.2f%s",
            progress["epoch"],
            progress["step"],
            ppl,
            f" (best; wrote {cfg.out_dir})" if improved else f" (best {progress['best']:.2f})",
        )
        if more and stop_requested():
            raise stopped("after")

    batches = make_batches(train, cfg.batch_tokens)
    start = time.monotonic()
    out_of_time = False
    model.train()
    defer_sigterm(True)  # a SIGTERM is acted on at a step's end (below)
    defer_sigint(on_ctrl_c)  # and so is a first Ctrl-C
    try:
        if progress["validate"]:  # the validation a stop cut short
            checkpoint(more=True)
        while progress["epoch"] < cfg.max_epochs and not out_of_time:
            order = list(range(len(batches)))
            random.Random(cfg.seed * 100003 + progress["epoch"]).shuffle(order)
            loss_sum, token_sum = 0.0, 0
            while progress["batch"] < len(order):
                chosen = [train[i] for i in batches[order[progress["batch"]]]]
                nll = model.sentence_nll(chosen)
                tokens = sum(len(y) + 1 for y in chosen)
                loss = nll.sum() / tokens
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
                optimizer.step()
                scheduler.step()
                progress["batch"] += 1
                progress["step"] += 1
                loss_sum, token_sum = loss_sum + float(loss.detach()) * tokens, token_sum + tokens
                if cfg.log_every and progress["step"] % cfg.log_every == 0:
                    log.info(
                        "train-lm: epoch %d step %d train ppl %.2f lr %.2e",
                        progress["epoch"],
                        progress["step"],
                        math.exp(loss_sum / token_sum),
                        scheduler.get_last_lr()[0],
                    )
                    loss_sum, token_sum = 0.0, 0
                if stop_requested():  # stop after this step, its state saved: --resume goes on from here
                    save()
                    raise stopped("after")
                if cfg.max_time is not None and time.monotonic() - start > cfg.max_time * 60:
                    out_of_time = True
                    break
                if cfg.valid_every and progress["step"] % cfg.valid_every == 0 and progress["batch"] < len(order):
                    checkpoint(more=True)
            if not out_of_time:
                progress["epoch"] += 1
                progress["batch"] = 0
            checkpoint(more=not out_of_time and progress["epoch"] < cfg.max_epochs)
    finally:
        defer_sigterm(False)
        defer_sigint(None)
    return {
        "steps": progress["step"],
        "epochs": progress["epoch"],
        "best_valid_ppl": progress["best"],
        "seconds": time.monotonic() - start,
        "params": model.num_params(),
    }


@contextlib.contextmanager
def _run_lock(path: Path, out_dir: str) -> Iterator[None]:
    """Hold ``path`` (``flock``) while training: a second train-lm into the same ``out_dir`` is a UserError naming
    the first one's pid. The lock goes with the process, however it ends."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = take_pid_lock(path)
    except LockHeld as held:
        raise UserError(
            f"{out_dir}: another train-lm (pid {held.holder}) is training into it; give this one its own --out-dir"
        ) from None
    try:
        yield
    finally:
        os.close(fd)


def _fingerprint(sentences: Sequence[Sequence[int]]) -> str:
    """SHA-256 of token id sequences, in order."""
    digest = hashlib.sha256()
    for y in sentences:
        digest.update((",".join(map(str, y)) + "\n").encode())
    return digest.hexdigest()


def _settings(cfg: LMTrainConfig, train, valid, device: torch.device) -> dict[str, Any]:
    """What :func:`_check_resumable` compares (besides the LM's shape), and the device the state was saved on."""
    settings: dict[str, Any] = {name: getattr(cfg, name) for name in RESUME_OPTIONS}
    settings["tokenizer_sha256"] = hashlib.sha256(Path(cfg.tokenizer).read_bytes()).hexdigest()
    settings["train_sentences"], settings["train_sha256"] = len(train), _fingerprint(train)
    settings["valid_sentences"], settings["valid_sha256"] = len(valid), _fingerprint(valid)
    settings["device_type"] = device.type
    return settings


def _save_state(path: Path, model, optimizer, scheduler, progress: dict, settings: dict, device) -> None:
    import torch

    rng = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(device)
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "progress": dict(progress),
        "config": dict(model.config),
        "settings": dict(settings),
        "rng": rng,
    }
    with atomic_output(path) as tmp:
        torch.save(state, tmp)
    fsync_directory(path.parent)


def _read_state(path: Path) -> dict:
    """The saved state of ``path`` (read with ``weights_only=True``); every problem is a one-line UserError."""
    from srupp_asr.checkpoints import load_checkpoint

    if not path.is_file():
        raise UserError(f"{path}: no training state to resume from (run without --resume first)")
    state = load_checkpoint(path, map_location="cpu", mmap=False, lightning=False)
    missing = [k for k in STATE_KEYS if k not in state] if isinstance(state, dict) else list(STATE_KEYS)
    if missing:
        raise UserError(f"{path}: not a train-lm state (no {', '.join(missing)})")
    progress = state["progress"]
    bad = [k for k, kind in PROGRESS_KEYS.items() if not isinstance(progress, dict) or not _is(progress.get(k), kind)]
    if bad or not isinstance(state["config"], dict):
        raise UserError(f"{path}: not a train-lm state (bad {', '.join(bad) or 'config'})")
    return state


def _is(value: Any, kind: type) -> bool:
    if kind is float:
        return is_real_number(value)
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _option(name: str) -> str:
    return "--" + {"attn_dropout": "dropout"}.get(name, name).replace("_", "-")


def _check_resumable(path: Path, state: dict, settings: dict, config: dict) -> None:
    """A one-line UserError naming ``path`` and the first setting of this run that differs from the saved run's."""
    hint = "resume with the saved run's options, or start afresh without --resume"
    saved = state.get("settings")
    if not isinstance(saved, dict):  # written before the settings were saved
        log.warning("train-lm: %s holds no settings to compare with this run's; resuming as asked", path)
        saved = {}
    if saved.get("tokenizer_sha256", settings["tokenizer_sha256"]) != settings["tokenizer_sha256"]:
        raise UserError(f"{path}: saved with another tokenizer; {hint}")
    for key, value in config.items():
        if key == "vocab_size" and state["config"].get(key) != value:
            raise UserError(f"{path}: saved with another tokenizer; {hint}")
        if state["config"].get(key) != value:
            raise UserError(f"{path}: saved with {_option(key)} {state['config'].get(key)}, now {value}; {hint}")
    for key in RESUME_OPTIONS:
        if key in saved and saved[key] != settings[key]:
            raise UserError(f"{path}: saved with {_option(key)} {saved[key]}, now {settings[key]}; {hint}")
    for side in ("train", "valid"):
        key, count = f"{side}_sha256", f"{side}_sentences"
        if key in saved and saved[key] != settings[key]:
            what = "training" if side == "train" else "validation"
            raise UserError(
                f"{path}: saved for other {what} text ({saved.get(count)} sentences then, {settings[count]} now); "
                f"{hint}"
            )


def _restore(path: Path, state: dict, model, optimizer, scheduler, device: torch.device) -> dict:
    """Load ``state`` into the model, optimiser and schedule and set the random generators as they were at the save
    (dropout then draws what the run that was not stopped drew); the saved progress."""
    import torch

    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        rng = state.get("rng")
        if isinstance(rng, dict) and "cpu" in rng:
            torch.set_rng_state(rng["cpu"])
            settings = state.get("settings")
            saved_on = settings.get("device_type") if isinstance(settings, dict) else None
            if device.type == "cuda" and "cuda" in rng:
                torch.cuda.set_rng_state(rng["cuda"], device)
            elif device.type != saved_on:
                log.warning("train-lm: %s was saved on %s: dropout will differ from an unstopped run", path, saved_on)
        else:
            log.warning("train-lm: %s holds no generator states: dropout will differ from an unstopped run", path)
    except (RuntimeError, KeyError, TypeError, ValueError, IndexError) as err:
        raise UserError(f"{path}: not a usable train-lm state ({first_line(err)})") from None
    return dict(state["progress"])


def check_lm_options(cfg: LMTrainConfig) -> None:
    """A ConfigValueError naming the first numeric option of ``cfg`` out of range (before any text is read)."""
    for name in ("d_model", "num_layers", "attn_dim"):
        check_size(name, getattr(cfg, name))
    check_divides("num_heads", cfg.num_heads, "--attn-dim", cfg.attn_dim)
    for name in ("batch_tokens", "max_epochs", "max_len", "warmup_steps"):
        check_int(name, getattr(cfg, name))
    for name in ("attn_every", "valid_every", "log_every"):
        check_int(name, getattr(cfg, name), minimum=0)
    check_probability("dropout", cfg.dropout)
    check_number("lr", cfg.lr, above=0.0)
    check_number("weight_decay", cfg.weight_decay, at_least=0.0)
    check_number("clip", cfg.clip, above=0.0)
    if cfg.max_time is not None:
        check_number("max_time", cfg.max_time, at_least=0.0)


def train_lm_command(args: argparse.Namespace) -> int:
    """``srupp-asr train-lm``: build the config from the options and train."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    fields = LMTrainConfig.__dataclass_fields__
    cfg = LMTrainConfig(**{k: v for k, v in vars(args).items() if k in fields and v is not None})
    try:
        check_lm_options(cfg)
    except ConfigValueError as err:
        raise UserError(f"train-lm: --{err.option.replace('_', '-')} {err.problem}") from None
    result = train_lm(cfg)
    print(
        f"wrote {cfg.out_dir}: best valid perplexity {result['best_valid_ppl']:.2f} after {result['steps']} steps "
        f"({result['epochs']} epochs, {result['seconds'] / 60:.1f} min, {result['params']:,} parameters)"
    )
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the ``train-lm`` sub-command."""
    d = LMTrainConfig
    p = subparsers.add_parser("train-lm", help="train an SRU++ language model for shallow fusion (--lm)")
    p.add_argument("--tokenizer", required=True, help="the ASR model's sentencepiece model")
    p.add_argument("--out-dir", required=True, help="LM directory to write (replaced atomically when better)")
    p.add_argument("--train-text", nargs="+", metavar="TXT", help="text files, one sentence per line")
    p.add_argument("--train-cuts", nargs="+", metavar="CUTS", help="cut manifests whose transcripts to use")
    p.add_argument("--valid-text", nargs="+", metavar="TXT", help="validation text files")
    p.add_argument("--valid-cuts", nargs="+", metavar="CUTS", help="validation cut manifests")
    for name, kind, help_text in (
        ("d_model", int, "width of the SRU++ layers"),
        ("num_layers", int, "SRU++ layers"),
        ("attn_dim", int, "attention dimension"),
        ("num_heads", int, "attention heads"),
        ("attn_every", int, "attention in every k-th layer (0: none)"),
        ("dropout", float, "dropout (also on attention)"),
        ("batch_tokens", int, "padded tokens per batch"),
        ("lr", float, "peak learning rate (Noam schedule)"),
        ("warmup_steps", int, "steps of linear warm-up"),
        ("weight_decay", float, "Adam weight decay"),
        ("clip", float, "gradient norm clipping"),
        ("max_epochs", int, "epochs at most"),
        ("max_time", float, "minutes at most (default: no limit)"),
        ("max_len", int, "drop sentences longer than this many tokens"),
        ("valid_every", int, "also validate every N steps (0: after each epoch only)"),
        ("log_every", int, "log the training perplexity every N steps"),
        ("device", str, "cpu or cuda"),
        ("seed", int, "random seed"),
    ):
        default = getattr(d, name)
        p.add_argument(
            f"--{name.replace('_', '-')}", type=kind, default=default, help=f"{help_text} (default {default})"
        )
    p.add_argument("--resume", action="store_true", help="continue from OUT_DIR.train.pt")
    p.set_defaults(func=train_lm_command)
    return p
