"""``srupp-asr train-lm``: train an SRU++ language model (:class:`srupp_asr.lm.SRUppLM`) on text.

::

    srupp-asr train-lm --tokenizer data/tokenizer.model --train-text lm_train.txt --train-cuts train_cuts.jsonl.gz \\
        --valid-cuts dev_cuts.jsonl.gz --out-dir exp/lm --max-time 10

Sentences (lines of text files, supervision texts of cut manifests) are normalised and tokenised with the ASR
model's tokenizer, grouped by length into batches of at most ``--batch-tokens`` padded tokens and shuffled per
epoch. Adam with the Noam schedule (linear warm-up, then ``1/sqrt(step)``), gradient clipping. After every epoch
(and every ``--valid-every`` steps) the validation perplexity is measured; the best LM so far is written to
``--out-dir`` atomically. The run ends after ``--max-epochs`` or ``--max-time`` minutes, whichever comes first.

Resuming: the training state (weights, optimiser, schedule, epoch, position in the epoch, best perplexity) is saved
to ``OUT_DIR.train.pt`` at every validation (atomically; tensors and plain values only, read back with
``torch.load(weights_only=True)``); ``--resume`` continues from it. The log lines go to stderr, one per
``--log-every`` steps.
"""

from __future__ import annotations

import argparse
import logging
import math
import random
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from srupp_asr.checks import (
    ConfigValueError,
    check_divides,
    check_int,
    check_number,
    check_probability,
    check_size,
)
from srupp_asr.errors import UserError
from srupp_asr.fileio import atomic_output
from srupp_asr.interrupts import Terminated, defer_sigterm, sigterm_pending
from srupp_asr.lm import SRUppLM, save_lm
from srupp_asr.schedulers import NoamLR
from srupp_asr.tokenizer import Tokenizer, texts_from_sources

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


def evaluate_perplexity(model: SRUppLM, sentences: Sequence[Sequence[int]], batch_tokens: int) -> float:
    """Per-token perplexity of ``sentences`` (``<sos/eos>`` at the end counted as a token)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    with torch.inference_mode():
        for batch in make_batches(sentences, batch_tokens):
            chosen = [sentences[i] for i in batch]
            total += float(model.sentence_nll(chosen).sum())
            count += sum(len(y) + 1 for y in chosen)
    model.train(was_training)
    return math.exp(total / max(count, 1))


def _load_sentences(cfg_text: Sequence[str], cfg_cuts: Sequence[str], tokenizer: Tokenizer, max_len: int, what: str):
    sentences, dropped = tokenize(texts_from_sources(list(cfg_cuts), list(cfg_text)), tokenizer, max_len)
    if not sentences:
        raise UserError(f"{what}: no non-empty sentence in {', '.join([*cfg_text, *cfg_cuts]) or 'nothing given'}")
    if dropped:
        log.warning("%s: dropped %d sentences longer than %d tokens", what, dropped, max_len)
    return sentences


def train_lm(cfg: LMTrainConfig) -> dict[str, float]:
    """Train, writing the best LM to ``cfg.out_dir``; returns the final numbers (steps, epochs, best valid ppl)."""
    if not cfg.train_text and not cfg.train_cuts:
        raise UserError("train-lm: give training text with --train-text and/or --train-cuts")
    if not cfg.valid_text and not cfg.valid_cuts:
        raise UserError("train-lm: give validation text with --valid-text and/or --valid-cuts")
    device = torch.device(cfg.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("train-lm: --device cuda asked for, but no CUDA device is available")
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
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = NoamLR(optimizer, cfg.warmup_steps)
    state_path = Path(f"{cfg.out_dir.rstrip('/')}.train.pt")
    progress = {"epoch": 0, "batch": 0, "step": 0, "best": math.inf}
    if cfg.resume:
        progress = _restore(state_path, model, optimizer, scheduler)
        log.info("train-lm: resumed from %s at epoch %d, batch %d", state_path, progress["epoch"], progress["batch"])

    def checkpoint() -> float:
        ppl = evaluate_perplexity(model, valid, cfg.batch_tokens)
        improved = ppl < progress["best"]
        if improved:
            progress["best"] = ppl
            save_lm(model, cfg.tokenizer, cfg.out_dir)
        _save_state(state_path, model, optimizer, scheduler, progress)
        log.info(
            "train-lm: epoch %d step %d valid ppl %.2f%s",
            progress["epoch"],
            progress["step"],
            ppl,
            f" (best; wrote {cfg.out_dir})" if improved else f" (best {progress['best']:.2f})",
        )
        return ppl

    batches = make_batches(train, cfg.batch_tokens)
    start = time.monotonic()
    out_of_time = False
    model.train()
    defer_sigterm(True)  # a SIGTERM is acted on at a step's end (below)
    try:
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
                if sigterm_pending():  # stop after this step, its state saved: --resume goes on from here
                    _save_state(state_path, model, optimizer, scheduler, progress)
                    raise Terminated(
                        f"terminated (SIGTERM) after step {progress['step']}: saved {state_path}; resume with --resume"
                    )
                if cfg.max_time is not None and time.monotonic() - start > cfg.max_time * 60:
                    out_of_time = True
                    break
                if cfg.valid_every and progress["step"] % cfg.valid_every == 0 and progress["batch"] < len(order):
                    checkpoint()
            if not out_of_time:
                progress["epoch"] += 1
                progress["batch"] = 0
            checkpoint()
    finally:
        defer_sigterm(False)
    return {
        "steps": progress["step"],
        "epochs": progress["epoch"],
        "best_valid_ppl": progress["best"],
        "seconds": time.monotonic() - start,
        "params": model.num_params(),
    }


def _save_state(path: Path, model, optimizer, scheduler, progress: dict) -> None:
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "progress": dict(progress),
        "config": dict(model.config),
    }
    with atomic_output(path) as tmp:
        torch.save(state, tmp)


def _restore(path: Path, model, optimizer, scheduler) -> dict:
    if not path.is_file():
        raise UserError(f"{path}: no training state to resume from (run without --resume first)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a truncated or foreign file
        raise UserError(f"{path}: not a readable train-lm state ({str(err).splitlines()[0]})") from None
    if state.get("config") != model.config:
        raise UserError(f"{path}: saved for another LM shape ({state.get('config')}); use the same options")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
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
