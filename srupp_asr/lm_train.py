"""``srupp-asr train-lm``: train an SRU++ language model (:class:`srupp_asr.lm.SRUppLM`) on text.

::

    srupp-asr train-lm --tokenizer data/tokenizer.model --train-text lm_train.txt --train-cuts train_cuts.jsonl.gz \\
        --valid-cuts dev_cuts.jsonl.gz --out-dir exp/lm --max-time 10

Sentences (lines of text files, supervision texts of cut manifests) are normalised and tokenised with the ASR
model's tokenizer, grouped by length into batches of at most ``--batch-tokens`` padded tokens and shuffled per
epoch. Adam with the Noam schedule (linear warm-up, then ``1/sqrt(step)``), gradient clipping. Training runs in the
same Lightning loop as ``srupp-asr train`` (:mod:`srupp_asr.lm_lightning`: the module and the data): at every
epoch's end (and every ``--valid-every`` batches of an epoch) the validation perplexity is measured; the best LM so
far is written to ``--out-dir`` atomically. The run ends after ``--max-epochs``, or when its training time reaches
``--max-time`` minutes (counted over every resume, as Lightning's ``max_time``), whichever comes first.

Resuming: the training state is a Lightning checkpoint, ``OUT_DIR.train.pt``, written atomically after every
validation and at a stop (weights, optimiser, schedule, loops, the position in the epoch, the random generators'
states that dropout draws from, the best perplexity, and the settings that shape training; tensors and plain
values only, read back with ``torch.load(weights_only=True)``); ``--resume`` continues from it and ends with the
weights of a run that was never stopped (the same device; on a GPU, kernels permitting). A resume whose tokenizer,
text, model or optimisation options differ from the saved run's is refused, naming the state file and the first
difference; ``--max-epochs``, ``--max-time``, ``--valid-every``, ``--log-every`` and ``--device`` may change. A
``kill -9`` loses the steps since the last save (``--valid-every`` bounds them). A run holds ``OUT_DIR.train.lock``
(``flock``): a second train-lm into the same ``--out-dir`` is refused.

Finishing: a run that ends as asked (``--max-epochs`` or ``--max-time`` reached) writes ``OUT_DIR.train.done``, a JSON
file of its final numbers, after its last state save; every run (fresh or resumed) first removes it. So a script can
tell a finished run (``.train.done``) from one that stopped before its end (``.train.pt`` only: resume it), as the
recipes' LM stage does.

Stopping (:class:`srupp_asr.train.StopCheckpoint`, as ``srupp-asr train``): SIGTERM, or a first Ctrl-C, stops the run
after the step under way (or during validation, after the batch under way) with its state saved: one line, exit
status 143 (130 for Ctrl-C); a validation it cut short is not run again (the next comes at its time). A
``--max-time`` stop validates (the best LM may then be the one of that moment) and saves the state. The log lines go
to stderr, one per ``--log-every`` steps.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import math
import os
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
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
from srupp_asr.fileio import LockHeld, atomic_write_text, take_pid_lock

if TYPE_CHECKING:
    import torch

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
    init_from: str | None = None  # an LM directory whose weights (and shape) a fresh run starts from


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
# The LM's shape: taken from --init-from's LM when given (an option given too must agree with it).
SHAPE_OPTIONS = ("d_model", "num_layers", "attn_dim", "num_heads", "attn_every")
# What a train-lm checkpoint holds besides Lightning's own keys (lm_lightning.SETTINGS_KEY's parts).
STATE_KEYS = ("state_dict", "optimizer_states", "lr_schedulers", "loops", "train_lm")


def state_paths(out_dir: str) -> tuple[Path, Path, Path]:
    """``OUT_DIR.train.pt`` (the training state: a Lightning checkpoint), ``OUT_DIR.train.done`` (written when a
    run ends as asked) and ``OUT_DIR.train.lock`` (held while a run trains)."""
    base = out_dir.rstrip("/")
    return Path(f"{base}.train.pt"), Path(f"{base}.train.done"), Path(f"{base}.train.lock")


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
    state_path, done_path, lock_path = state_paths(cfg.out_dir)
    with _run_lock(lock_path, cfg.out_dir):
        done_path.unlink(missing_ok=True)  # this run is not finished (yet), whatever an earlier one was
        result = _train(cfg, device, state_path)
        numbers = {k: v if not isinstance(v, float) or math.isfinite(v) else None for k, v in result.items()}
        atomic_write_text(done_path, json.dumps({**numbers, "state": str(state_path)}, indent=1) + "\n")
        return result


def _train(cfg: LMTrainConfig, device: torch.device, state_path: Path) -> dict[str, float]:
    import torch

    from srupp_asr.lm_lightning import LMDataModule, LMLightningModule
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
    settings = _settings(cfg, train, valid, device)
    lm_config = {
        "vocab_size": tokenizer.vocab_size,
        "d_model": cfg.d_model,
        "num_layers": cfg.num_layers,
        "attn_dim": cfg.attn_dim,
        "num_heads": cfg.num_heads,
        "attn_every": cfg.attn_every,
        "dropout": cfg.dropout,
        "attn_dropout": cfg.dropout,
    }
    module = LMLightningModule(
        lm_config, cfg.lr, cfg.warmup_steps, cfg.weight_decay, cfg.out_dir, cfg.tokenizer, settings, cfg.log_every
    )
    log.info("train-lm: SRU++ LM with %s parameters", f"{module.lm.num_params():,}")
    data = LMDataModule(train, valid, cfg.batch_tokens, cfg.seed)
    if cfg.init_from and saved is None:
        from srupp_asr.model_dir import initial_weights

        module.lm.load_state_dict(initial_weights(cfg.init_from, module.lm, tokenizer))
        log.info("train-lm: starting from the weights of %s", cfg.init_from)
    if saved is not None:
        _check_resumable(state_path, saved, settings, module.lm.config)
        _check_usable(state_path, saved, module)
    start = time.monotonic()
    with _lightning_quiet():
        trainer = _trainer(cfg, device, state_path)
        _fit(trainer, module, data, state_path if saved is not None else None)
    return {
        "steps": trainer.global_step,
        "epochs": trainer.current_epoch,
        "best_valid_ppl": module.best,
        "seconds": time.monotonic() - start,
        "params": module.lm.num_params(),
    }


def _trainer(cfg: LMTrainConfig, device: torch.device, state_path: Path):
    """A Lightning Trainer with the ASR trainer's pieces: atomic checkpoints (``state_path``, written after every
    validation and at a stop), the stop on SIGTERM or Ctrl-C after a step; no loggers or bars (log lines instead)."""
    import datetime

    import lightning as L

    from srupp_asr.lightning_checkpoints import StateFileCheckpoint
    from srupp_asr.progress import quiet_lightning
    from srupp_asr.train import stop_checkpoint_class, with_atomic_checkpoints

    quiet_lightning()
    accelerator = {"cpu": "cpu", "cuda": "gpu"}.get(device.type, device.type)
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=[device.index or 0] if device.type == "cuda" else 1,
        precision="32-true",
        max_epochs=cfg.max_epochs,
        max_time=datetime.timedelta(minutes=cfg.max_time) if cfg.max_time is not None else None,
        val_check_interval=cfg.valid_every or None,
        num_sanity_val_steps=0,
        gradient_clip_val=cfg.clip,
        gradient_clip_algorithm="norm",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[StateFileCheckpoint(state_path), stop_checkpoint_class()()],
        plugins=with_atomic_checkpoints(None),
        default_root_dir=str(state_path.parent),
    )
    _validate_at_epoch_ends(trainer)
    return trainer


def _validate_at_epoch_ends(trainer) -> None:
    """Validate at every epoch's last batch, also with ``--valid-every`` (Lightning, given an integer
    ``val_check_interval`` and a loader without a length, validates every N batches only, so the last steps of a
    run would never be validated). Wraps the epoch loop's decision (Lightning 2.6, pinned below 2.7)."""
    loop = trainer.fit_loop.epoch_loop
    should_check = loop._should_check_val_fx

    def or_at_the_epoch_end(data_fetcher) -> bool:
        return should_check(data_fetcher) or (loop._should_check_val_epoch() and loop.batch_progress.is_last_batch)

    loop._should_check_val_fx = or_at_the_epoch_end


@contextlib.contextmanager
def _lightning_quiet() -> Iterator[None]:
    """While training: no Lightning info lines ("GPU available: ..."; train-lm logs its own) and no note that the
    loaders have no workers (the sentences are in memory); both as they were afterwards."""
    import warnings

    lightning_log = logging.getLogger("lightning.pytorch")
    level = lightning_log.level
    lightning_log.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*does not have many workers")
            yield
    finally:
        lightning_log.setLevel(level)


def _fit(trainer, module, data, ckpt_path: Path | None) -> None:
    """``trainer.fit``; a stop on SIGTERM or Ctrl-C is a :class:`Terminated` naming the state file saved."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from srupp_asr.train import stop_saved, stopped_by_signal

    stop_saved.clear()
    try:
        trainer.fit(module, datamodule=data, ckpt_path=str(ckpt_path) if ckpt_path is not None else None)
    except SIGTERMException:  # Lightning's stop after StopCheckpoint saved the state
        raise stopped_by_signal("--resume") from None
    except SystemExit as err:
        if isinstance(err.__context__, KeyboardInterrupt):  # Lightning's sys.exit(1) after a second Ctrl-C
            raise KeyboardInterrupt from None
        raise


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
    settings["init_sha256"] = _weights_digest(cfg.init_from) if cfg.init_from else None
    return settings


def _weights_digest(lm_dir: str) -> str:
    """SHA-256 of an LM directory's weight files (a resume must start from the same weights)."""
    from srupp_asr.model_files import weight_files

    files = weight_files(Path(lm_dir))
    digest = hashlib.sha256()
    for path in sorted(files.shards) or [files.path]:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def shape_from_init(cfg: LMTrainConfig, given: set[str]) -> LMTrainConfig:
    """``cfg`` with the LM shape of ``cfg.init_from``'s LM (``given``: the shape options set on the command line,
    which must agree with it); a one-line UserError naming its config otherwise."""
    import dataclasses

    from srupp_asr.model_files import read_lm_config

    config_path, data = read_lm_config(cfg.init_from)
    shape = {name: data["lm"].get(name) for name in SHAPE_OPTIONS}
    for name in SHAPE_OPTIONS:
        if name in given and getattr(cfg, name) != shape[name]:
            raise UserError(
                f"{config_path}: --init-from's LM has {_option(name)} {shape[name]}, not {getattr(cfg, name)}"
                " (leave the shape options out: they are taken from it)"
            )
    return dataclasses.replace(cfg, **{k: v for k, v in shape.items() if v is not None})


def _read_state(path: Path) -> dict:
    """The saved state of ``path`` (read with ``weights_only=True``); every problem is a one-line UserError."""
    from srupp_asr.checkpoints import load_checkpoint

    if not path.is_file():
        raise UserError(f"{path}: no training state to resume from (run without --resume first)")
    state = load_checkpoint(path, map_location="cpu", mmap=False, lightning=False)
    missing = [k for k in STATE_KEYS if k not in state] if isinstance(state, dict) else list(STATE_KEYS)
    if missing:
        raise UserError(f"{path}: not a train-lm state (no {', '.join(missing)})")
    saved = state["train_lm"]
    bad = [
        name
        for name, ok in (
            ("settings", isinstance(saved, dict) and isinstance(saved.get("settings"), dict)),
            ("config", isinstance(saved, dict) and isinstance(saved.get("config"), dict)),
            ("best", isinstance(saved, dict) and is_real_number(saved.get("best"))),
            ("global_step", _is_count(state.get("global_step"))),
            ("epoch", _is_count(state.get("epoch"))),
        )
        if not ok
    ]
    if bad:
        raise UserError(f"{path}: not a train-lm state (bad {', '.join(bad)})")
    return state


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _option(name: str) -> str:
    return "--" + {"attn_dropout": "dropout"}.get(name, name).replace("_", "-")


def _check_resumable(path: Path, state: dict, settings: dict, config: dict) -> None:
    """A one-line UserError naming ``path`` and the first setting of this run that differs from the saved run's."""
    hint = "resume with the saved run's options, or start afresh without --resume"
    saved, saved_config = state["train_lm"]["settings"], state["train_lm"]["config"]
    if saved.get("tokenizer_sha256", settings["tokenizer_sha256"]) != settings["tokenizer_sha256"]:
        raise UserError(f"{path}: saved with another tokenizer; {hint}")
    for key, value in config.items():
        if key == "vocab_size" and saved_config.get(key) != value:
            raise UserError(f"{path}: saved with another tokenizer; {hint}")
        if saved_config.get(key) != value:
            raise UserError(f"{path}: saved with {_option(key)} {saved_config.get(key)}, now {value}; {hint}")
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
    if saved.get("init_sha256") != settings["init_sha256"]:
        if not saved.get("init_sha256"):
            what = "a run without --init-from"
        elif settings["init_sha256"]:
            what = "a run from other --init-from weights"
        else:
            what = "a run from --init-from weights (give the same --init-from)"
        raise UserError(f"{path}: saved for {what}; {hint}")
    if saved.get("device_type") != settings["device_type"]:
        saved_on = saved.get("device_type")
        log.warning("train-lm: %s was saved on %s: dropout will differ from an unstopped run", path, saved_on)


def _check_usable(path: Path, state: dict, module) -> None:
    """A one-line UserError naming ``path`` when its weights or generator states do not fit ``module`` (before
    Lightning loads them, mid-way); when the LM directory is gone, the saved weights are written there now."""

    from srupp_asr.lightning_module import rng_states, set_rng_states
    from srupp_asr.lm import save_lm
    from srupp_asr.model_dir import CONFIG_FILE

    before = rng_states()
    try:
        module.load_state_dict(state["state_dict"])
        set_rng_states(state["rng_states"])
    except (RuntimeError, KeyError, TypeError, ValueError, IndexError) as err:
        raise UserError(f"{path}: not a usable train-lm state ({first_line(err)})") from None
    finally:
        set_rng_states(before)
    best = float(state["train_lm"]["best"])
    if math.isfinite(best) and not Path(module.out_dir, CONFIG_FILE).is_file():
        # The best LM so far is gone (deleted, moved): the saved weights stand in until a validation beats them.
        log.warning("train-lm: %s holds no LM any more: wrote the saved weights there", module.out_dir)
        save_lm(module.lm, module.tokenizer_path, module.out_dir)
        module.best_reset = True


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
    if cfg.init_from:
        cfg = shape_from_init(cfg, {name for name in SHAPE_OPTIONS if getattr(args, name, None) is not None})
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
        ("max_time", float, "training minutes in all, counted over every --resume (default: no limit)"),
        ("max_len", int, "drop sentences longer than this many tokens"),
        ("valid_every", int, "also validate every N batches of an epoch (0: after each epoch only)"),
        ("log_every", int, "log the training perplexity every N steps"),
        ("device", str, "cpu or cuda"),
        ("seed", int, "random seed"),
    ):
        default = getattr(d, name)
        p.add_argument(  # a shape option left out is None here: --init-from's LM then gives it
            f"--{name.replace('_', '-')}",
            type=kind,
            default=None if name in SHAPE_OPTIONS else default,
            help=f"{help_text} (default {default}{'; with --init-from, its LM' if name in SHAPE_OPTIONS else ''})",
        )
    p.add_argument(
        "--init-from",
        metavar="LM_DIR",
        help="start from this LM directory's weights (fine-tuning on new text); its tokenizer must be --tokenizer's",
    )
    p.add_argument("--resume", action="store_true", help="continue from OUT_DIR.train.pt")
    p.set_defaults(func=train_lm_command)
    return p
