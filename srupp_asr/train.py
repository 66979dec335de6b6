"""``srupp-asr train``: LightningCLI over :class:`ASRLightningModule` and :class:`ASRDataModule`.

Everything after ``train`` goes to LightningCLI: a subcommand (``fit``, ``validate``), ``--config`` YAML files
(a path, or the name of a config shipped in ``conf/``: ``--config tiny_cpu``, see :mod:`srupp_asr.configs`) and
overrides of any option, e.g.::

    srupp-asr train fit --config conf/train_srupp.yaml --trainer.max_steps 100 --model.lr 0.002
    srupp-asr train fit --config conf/train_srupp.yaml --ckpt_path last      # resume
    srupp-asr train fit --help                                               # every option

Added to what LightningCLI offers:

- ``data.tokenizer`` is linked to ``model.tokenizer`` (give it once, under ``data``);
- a ``checkpoint`` block configures the :class:`ModelCheckpoint` callback (top-k by ``valid/loss`` and a
  ``last.ckpt``); its directory is always ``<trainer.default_root_dir>/checkpoints``, fixed so that
  ``--ckpt_path last`` finds the previous run's last checkpoint whatever the logger's version;
- only classes from ``lightning``, ``torch`` and ``srupp_asr`` may be named (``class_path`` in a config, or a
  class given on the command line), checked in the YAML files before anything is imported and in the parsed
  config before anything is instantiated: a config from a stranger cannot make training build an arbitrary
  object. ``SRUPP_ASR_TRUSTED_CLASSES=pkg,other.module`` adds module prefixes (your own callbacks);
- checkpoints are written atomically and read with ``weights_only=True``
  (:class:`~srupp_asr.lightning_checkpoints.AtomicCheckpointIO`);
- without a ``trainer.logger``, logs go to ``<trainer.default_root_dir>/csv`` (CSVLogger) and, when tensorboard
  is installed, ``<trainer.default_root_dir>/tensorboard``; the resolved config is saved beside them;
- ``fit`` holds a lock on ``<trainer.default_root_dir>/.train.lock``: a second ``fit`` into the same folder while
  one runs is refused (their checkpoints would mix); a fresh ``fit`` (no ``--ckpt_path``) into a folder holding an
  earlier run's checkpoints is refused too, unless ``--overwrite true`` (which deletes them);
- SIGTERM (``kill``, a scheduler's stop) or a first Ctrl-C ends training after the current step (or validation
  batch): :class:`StopCheckpoint` saves the last checkpoint there and the command exits with status 143 (130 for
  Ctrl-C), so ``--ckpt_path last`` goes on from that step; a second Ctrl-C stops at once, saving nothing.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import re
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srupp_asr.checks import ConfigValueError
from srupp_asr.configs import resolve_config_args
from srupp_asr.errors import UserError, first_line
from srupp_asr.fileio import LockHeld, read_yaml_mapping, take_pid_lock
from srupp_asr.interrupts import EXIT_STATUS, INTERRUPTED_STATUS, Terminated, defer_sigint, defer_sigterm

if TYPE_CHECKING:
    from lightning.pytorch.cli import LightningCLI
    from lightning.pytorch.loggers import Logger

log = logging.getLogger(__name__)
SUBCOMMANDS = ("fit", "validate")
TRUSTED_CLASS_MODULES = ("lightning", "torch", "srupp_asr")
TRUSTED_CLASSES_ENV = "SRUPP_ASR_TRUSTED_CLASSES"
CHECKPOINT_DEFAULTS = {
    "checkpoint.monitor": "valid/loss",
    "checkpoint.mode": "min",
    "checkpoint.save_top_k": 10,
    "checkpoint.save_last": True,
}
CKPT_PATH_NAMES = ("last", "best", "hpc")  # what Lightning resolves itself (and "registry[:...]")
LOCK_FILE = ".train.lock"  # in default_root_dir, held by a running fit
_held_locks: list[int] = []  # file descriptors of the locks this process holds (released when run_train returns)
_PARSERS: list[Any] = []  # the parsers LightningCLI built in this process (their option names)
stop_saved: dict[str, Any] = {}  # StopCheckpoint's stop: {"reason": "SIGTERM"|"Ctrl-C", "path": ..., "step": ...}


def checkpoint_dir(default_root_dir: str | os.PathLike[str] | None) -> str:
    """Where checkpoints go: ``<default_root_dir>/checkpoints`` (the current directory's when unset)."""
    return os.path.join(os.fspath(default_root_dir or "."), "checkpoints")


def default_loggers(default_root_dir: str | os.PathLike[str] | None) -> list[Logger]:
    """CSV and TensorBoard loggers under ``default_root_dir`` (the run's config.yaml goes beside the CSV log)."""
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    root = os.fspath(default_root_dir or ".")
    return [CSVLogger(root, name="csv"), TensorBoardLogger(root, name="tensorboard")]


def trusted_class_modules() -> tuple[str, ...]:
    """The module prefixes a config may name classes from: the built-in ones and those of
    ``$SRUPP_ASR_TRUSTED_CLASSES`` (comma-separated)."""
    extra = [m.strip() for m in os.environ.get(TRUSTED_CLASSES_ENV, "").split(",") if m.strip()]
    return (*TRUSTED_CLASS_MODULES, *extra)


def _class_paths(node: Any, key: str = "") -> list[tuple[str, Any]]:
    """``(where, class_path)`` for every ``class_path`` entry in a nested config of mappings and lists."""
    found = []
    if isinstance(node, dict):
        for k, v in node.items():
            where = f"{key}.{k}" if key else str(k)
            if k == "class_path":
                found.append((key or "class_path", v))
            else:
                found += _class_paths(v, where)
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            found += _class_paths(v, f"{key}[{i}]")
    return found


def check_trusted_classes(config: Any, source: str) -> None:
    """Raise UserError, naming ``source`` and the key, when ``config`` names a class outside the trusted modules."""
    trusted = trusted_class_modules()
    for where, name in _class_paths(config):
        name_ok = isinstance(name, str) and (
            "." not in name or any(name == m or name.startswith(f"{m}.") for m in trusted)
        )
        if not name_ok:
            raise UserError(
                f"{source}: {where}: class {name!r} is not allowed (configs may name classes from"
                f" {', '.join(trusted)}; add module prefixes with {TRUSTED_CLASSES_ENV}=...)"
            )


def with_atomic_checkpoints(plugins: Any) -> list[Any]:
    """``plugins`` (None, one or a list) plus an :class:`~srupp_asr.lightning_checkpoints.AtomicCheckpointIO`
    unless they hold a CheckpointIO already."""
    from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO

    from srupp_asr.lightning_checkpoints import AtomicCheckpointIO

    plugins = [] if plugins is None else list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
    if not any(isinstance(p, CheckpointIO) for p in plugins):
        plugins.append(AtomicCheckpointIO())
    return plugins


def _is_rank_zero() -> bool:
    """Whether this process is rank 0 of its run (the one a user started; DDP's other ranks have a nonzero rank
    in their environment)."""
    return all(os.environ.get(v, "0") == "0" for v in ("RANK", "LOCAL_RANK", "NODE_RANK"))


def lock_run_dir(default_root_dir: str | os.PathLike[str] | None) -> None:
    """Take ``<default_root_dir>/.train.lock`` for this process (rank 0 of a run; the other ranks share its
    folder); a UserError naming the folder when another ``fit`` holds it. Released by :func:`release_run_dirs`
    or when the process ends, however it ends."""
    if not _is_rank_zero():
        return
    try:
        fd = take_pid_lock(os.path.join(os.fspath(default_root_dir or "."), LOCK_FILE))
    except LockHeld as held:
        raise UserError(
            f"{default_root_dir or '.'}: another `srupp-asr train fit` (pid {held.holder}) is writing to this folder;"
            " give this run its own trainer.default_root_dir"
        ) from None
    _held_locks.append(fd)


def release_run_dirs() -> None:
    """Release the run folder locks :func:`lock_run_dir` took."""
    while _held_locks:
        os.close(_held_locks.pop())


@functools.cache
def stop_checkpoint_class() -> type:
    """The :class:`StopCheckpoint` callback class, defined on first use (registering ``train`` must not import
    Lightning); ``srupp_asr.train.StopCheckpoint`` names it (:func:`__getattr__`)."""
    from lightning.pytorch import Callback
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    class StopCheckpoint(Callback):
        """Stop on SIGTERM or a first Ctrl-C, on every rank at the same step, and save ``last.ckpt`` (the run's
        ModelCheckpoint's) there, so ``--ckpt_path last`` resumes from that step.

        Lightning's own SIGTERM handler is replaced (before it is registered): under DDP it broadcasts from
        inside the handler, wherever the signal lands, and that broadcast pairs with another collective of the
        other ranks (a gradient all-reduce), so a run crashed or hung. Here the handlers only note the signal
        (SIGTERM is passed on to the processes Lightning started; a Ctrl-C reaches them from the terminal); at
        each training step's end the ranks agree whether any of them saw one, and all set Lightning's flag,
        which stops them after that step. A signal that comes during validation stops a single process after
        the validation batch under way (the resumed run validates at its next check); DDP ranks may have
        different numbers of validation batches, so they agree when validation ends. A second Ctrl-C stops at
        once, saving nothing."""

        def __init__(self) -> None:
            self._reason: str | None = None

        def setup(self, trainer, pl_module, stage: str) -> None:
            """Put :meth:`_notice` in the place of Lightning's SIGTERM handler (registered after this hook)."""
            connector = getattr(trainer, "_signal_connector", None)
            if connector is not None and hasattr(connector, "_sigterm_notifier_fn"):
                connector._sigterm_notifier_fn = self._notice
            self._trainer, self._reason = trainer, None

        def _notice(self, signum: int, frame: Any) -> None:
            log.info("received SIGTERM: stopping after this step")
            launcher = self._trainer.strategy.launcher
            if self._reason is None and launcher is not None:
                launcher.kill(signum)  # the processes it started stop too
            self._reason = self._reason or "SIGTERM"

        def _interrupted(self) -> None:
            if self._trainer.is_global_zero:
                print(
                    "\nCtrl-C: stopping after this step and saving a checkpoint (Ctrl-C again: stop now, save nothing)",
                    file=sys.stderr,
                    flush=True,
                )
            self._reason = self._reason or "Ctrl-C"

        def on_train_start(self, trainer, pl_module) -> None:
            """From here on SIGTERM and a first Ctrl-C stop training at a step's end: the CLI's handlers must not
            raise at once."""
            defer_sigterm(True)
            defer_sigint(self._interrupted)

        def _agree(self, trainer) -> None:
            """Whether any rank saw a stop signal (all ranks call this at the same point): then Lightning stops
            them all."""
            seen = self._reason is not None
            if trainer.world_size > 1:
                seen = trainer.strategy.reduce_boolean_decision(seen, all=False)
            if seen:
                trainer._signal_connector.received_sigterm = True

        def on_train_batch_end(self, trainer, pl_module, outputs: Any, batch: Any, batch_idx: int) -> None:
            self._agree(trainer)

        def on_validation_batch_end(self, trainer, pl_module, outputs: Any, batch: Any, batch_idx: int, *_) -> None:
            """A single process stops validation here (Lightning raises after this hook, unless it was the last
            batch: then it stops once validation ends)."""
            if trainer.world_size == 1 and self._in_fit_validation(trainer) and self._reason is not None:
                trainer._signal_connector.received_sigterm = True

        def on_validation_end(self, trainer, pl_module) -> None:
            """DDP ranks agree here, all at once; Lightning stops them before the next training step."""
            if self._in_fit_validation(trainer):
                self._agree(trainer)

        @staticmethod
        def _in_fit_validation(trainer) -> bool:
            return trainer.state.fn == "fit" and not trainer.sanity_checking

        def teardown(self, trainer, pl_module, stage: str) -> None:
            defer_sigterm(False)
            defer_sigint(None)

        def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
            """Save ``last.ckpt`` when the exception is Lightning's stop (every rank takes part)."""
            if not isinstance(exception, SIGTERMException):
                return
            stop_saved["reason"] = self._reason or "SIGTERM"  # another rank's signal: this rank's own is unknown
            checkpoint = trainer.checkpoint_callback
            if not isinstance(checkpoint, ModelCheckpoint) or checkpoint.dirpath is None:
                return
            path = checkpoint.last_model_path or os.path.join(
                checkpoint.dirpath, checkpoint.CHECKPOINT_NAME_LAST + checkpoint.FILE_EXTENSION
            )
            trainer.save_checkpoint(path)
            checkpoint.last_model_path = path
            stop_saved.update(path=path, step=trainer.global_step)

    StopCheckpoint.__qualname__ = "StopCheckpoint"  # found by its name in this module (pickle, class_path)
    return StopCheckpoint


@functools.cache
def asr_lightning_cli() -> type[LightningCLI]:
    """The ``ASRLightningCLI`` class, defined on first use: registering ``train`` must not import Lightning;
    ``srupp_asr.train.ASRLightningCLI`` names it (:func:`__getattr__`)."""
    from lightning.pytorch import Trainer
    from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

    from srupp_asr.lightning_checkpoints import ResumableModelCheckpoint

    class ASRLightningCLI(LightningCLI):
        """LightningCLI with the tokenizer link, a configurable ModelCheckpoint and default loggers."""

        @staticmethod
        def subcommands() -> dict[str, set[str]]:
            """``fit`` and ``validate`` only: the data module has no test or predict loaders."""
            return {k: v for k, v in LightningCLI.subcommands().items() if k in SUBCOMMANDS}

        def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
            """Link data.tokenizer -> model.tokenizer; add the ``checkpoint`` block."""
            _PARSERS.append(parser)  # its option names, for "did you mean" after an unknown option
            parser.link_arguments("data.tokenizer", "model.tokenizer")
            parser.add_lightning_class_args(ResumableModelCheckpoint, "checkpoint")
            parser.set_defaults(CHECKPOINT_DEFAULTS)
            parser.link_arguments("trainer.default_root_dir", "checkpoint.dirpath", compute_fn=checkpoint_dir)
            parser.add_argument(
                "--overwrite",
                type=bool,
                default=False,
                help="fit: delete the checkpoints an earlier run left in trainer.default_root_dir and start afresh"
                " (without it, a fresh fit into such a folder is refused: resume it with --ckpt_path last)",
            )

        def before_instantiate_classes(self) -> None:
            """Refuse classes from untrusted modules, whatever named them (a file, the command line, a default)."""
            check_trusted_classes(self.config.as_dict(), "config")

        def instantiate_trainer(self, **kwargs: Any) -> Trainer:
            """The Trainer, with :func:`default_loggers` where the config names no logger and
            :class:`~srupp_asr.lightning_checkpoints.AtomicCheckpointIO` where it names no checkpoint plugin; a
            ``default_root_dir`` that cannot be written, or a value Lightning refuses, is a ConfigValueError."""
            from lightning.fabric.utilities.exceptions import MisconfigurationException

            config = self._get(self.config_init, "trainer", default={})
            check_output_dir(config.get("default_root_dir"))
            if config.get("logger") in (None, True) and "logger" not in kwargs:
                kwargs["logger"] = default_loggers(config.get("default_root_dir"))
            kwargs["plugins"] = with_atomic_checkpoints(kwargs.get("plugins", config.get("plugins")))
            if self.subcommand == "fit":
                lock_run_dir(config.get("default_root_dir"))
                if not self._get(self.config_init, "ckpt_path"):
                    check_no_earlier_run(config.get("default_root_dir"), self._get(self.config_init, "overwrite"))
            try:
                trainer = super().instantiate_trainer(**kwargs)
            except MisconfigurationException as err:  # Lightning's own check of a trainer option
                name = re.search(r"`(\w+)`", str(err))
                option = f"trainer.{name[1]}" if name else "trainer"
                raise ConfigValueError(option, f"is refused: {first_line(err)}") from None
            trainer.callbacks.append(stop_checkpoint_class()())
            from srupp_asr.progress import use_run_progress_bar

            use_run_progress_bar(trainer)  # one bar over the run, with its ETA (on a terminal)
            return trainer

        def _parse_ckpt_path(self) -> None:
            """Lightning's (it reads the checkpoint's hyperparameters into the config), after
            :func:`check_ckpt_path`."""
            subcommand = self.config.get("subcommand")
            if subcommand:
                check_ckpt_path(self.config[subcommand].get("ckpt_path"))
            super()._parse_ckpt_path()

    ASRLightningCLI.__qualname__ = "ASRLightningCLI"
    return ASRLightningCLI


# The classes that need Lightning, by name (``from srupp_asr.train import StopCheckpoint``), defined when first asked
_LIGHTNING_CLASSES = {"StopCheckpoint": stop_checkpoint_class, "ASRLightningCLI": asr_lightning_cli}


def __getattr__(name: str) -> Any:
    """``StopCheckpoint`` and ``ASRLightningCLI`` as attributes of this module (PEP 562), built on first use."""
    if name in _LIGHTNING_CLASSES:
        return _LIGHTNING_CLASSES[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_output_dir(default_root_dir: str | os.PathLike[str] | None) -> None:
    """Create ``trainer.default_root_dir`` (where logs and checkpoints go); a ConfigValueError when that fails or
    the folder is not writable, instead of a failure at the first log line or checkpoint."""
    root = Path(default_root_dir or ".")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        reason = "exists and is not a folder" if isinstance(err, FileExistsError) else err.strerror or first_line(err)
        raise ConfigValueError("trainer.default_root_dir", f"cannot be created: {root}: {reason}") from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise ConfigValueError("trainer.default_root_dir", f"is not writable: {root}")


def check_no_earlier_run(default_root_dir: str | os.PathLike[str] | None, overwrite: bool) -> None:
    """Before a fresh ``fit`` (no ``ckpt_path``): a UserError when ``<default_root_dir>/checkpoints`` holds the
    checkpoints of an earlier run, or with ``overwrite`` delete them. (Lightning would write ``last-v1.ckpt`` and
    ``...-v1.ckpt`` beside them, ``--ckpt_path last`` would then pick the new run's ``-v1``, and ``average`` would mix
    both runs' checkpoints.) Rank 0 only, under the run folder's lock: the other ranks start into the same folder."""
    from srupp_asr.checkpoints import PARTIAL_SUFFIX

    if not _is_rank_zero():
        return
    folder = Path(checkpoint_dir(default_root_dir))
    earlier = sorted(p for p in folder.glob("*.ckpt") if p.is_file() or p.is_symlink()) if folder.is_dir() else []
    if not earlier:
        return
    if not overwrite:
        names = ", ".join(p.name for p in earlier[:3]) + (f" and {len(earlier) - 3} more" if len(earlier) > 3 else "")
        raise UserError(
            f"{folder}: holds the checkpoints of an earlier run ({names}); resume it with --ckpt_path last, or choose"
            " another trainer.default_root_dir (--overwrite true deletes them)"
        )
    for path in [*earlier, *folder.glob(f".*{PARTIAL_SUFFIX}")]:
        path.unlink(missing_ok=True)
    log.warning("deleted %d checkpoint(s) of an earlier run in %s (--overwrite)", len(earlier), folder)


def check_ckpt_path(ckpt_path: str | None) -> None:
    """Refuse a ``ckpt_path`` that is not a readable Lightning checkpoint (missing, truncated, foreign, a pickle
    that ``weights_only`` refuses) with a one-line UserError naming it; Lightning's own names (``last``, ...) pass."""
    from srupp_asr.checkpoints import load_checkpoint

    if not ckpt_path or ckpt_path in CKPT_PATH_NAMES or str(ckpt_path).startswith("registry"):
        return
    try:
        load_checkpoint(ckpt_path)  # memory-mapped: cheap, and Lightning reads it again
    except UserError as err:
        raise UserError(f"ckpt_path: {err}") from None


def _config_paths(argv: Sequence[str]) -> list[str]:
    """The files given to ``-c`` / ``--config`` in ``argv``."""
    paths = []
    for i, arg in enumerate(argv):
        if arg in ("-c", "--config") and i + 1 < len(argv):
            paths.append(argv[i + 1])
        elif arg.startswith("--config="):
            paths.append(arg.split("=", 1)[1])
    return paths


def check_config_file(path: str) -> None:
    """Raise UserError unless ``path`` is a readable YAML file holding a mapping that names trusted classes only."""
    check_trusted_classes(read_yaml_mapping(path), path)


def run_train(argv: Sequence[str]) -> LightningCLI:
    """Run LightningCLI on ``argv`` (the words after ``srupp-asr train``); returns the finished CLI object."""
    from srupp_asr.data import ASRDataModule
    from srupp_asr.lightning_module import ASRLightningModule

    argv = resolve_config_args(argv)  # --config tiny_cpu: a shipped config by name, from any directory
    from srupp_asr.progress import quiet_lightning

    quiet_lightning()  # no "Tip: try litlogger" advert, no known deprecation warnings
    # sys.argv stays as it is (DDP's launcher re-runs it for the other ranks), so LightningCLI sees both.
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended", category=UserWarning)
    # ASRLightningModule.transfer_batch_to_device keeps the batch's lengths on the host on purpose (no device syncs);
    # the data module has none, so Lightning's note that the module's is used says nothing to a user.
    warnings.filterwarnings("ignore", message="You have overridden `transfer_batch_to_device` in `LightningModule`")
    configs = _config_paths(argv)
    for path in configs:
        check_config_file(path)
    stop_saved.clear()
    try:
        return asr_lightning_cli()(
            ASRLightningModule,
            ASRDataModule,
            args=argv,
            run=True,
            save_config_kwargs={"overwrite": True},
            auto_configure_optimizers=False,  # one place for the optimiser: model.optimizer / model.lr
            parser_kwargs={"prog": "srupp-asr train", "exit_on_error": False, "allow_abbrev": False},
        )
    except argparse.ArgumentError as err:
        raise UserError(_one_line(str(err), argv, configs)) from None
    except ConfigValueError as err:  # a value a constructor (model, data module, trainer) refused
        raise UserError(f"{_source(err.option, argv, configs)}: {err}") from None
    except SystemExit as err:
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        if isinstance(err, SIGTERMException):  # Lightning's stop after SIGTERM (a SystemExit that would exit 0)
            stopped = stopped_by_signal("--ckpt_path last")
            raise Terminated(str(stopped) if _is_rank_zero() else "", stopped.status) from None  # others: quiet
        if isinstance(err.__context__, KeyboardInterrupt):  # Lightning's sys.exit(1) after Ctrl-C: the CLI's 130
            raise KeyboardInterrupt from None
        raise
    finally:
        release_run_dirs()


def stopped_by_signal(resume: str) -> Terminated:
    """What :class:`StopCheckpoint` did at a SIGTERM or Ctrl-C stop, as the one line and exit status the CLI gives
    (``resume``: the option that goes on from the saved checkpoint)."""
    ctrl_c = stop_saved.get("reason") == "Ctrl-C"
    how = "interrupted (Ctrl-C)" if ctrl_c else "terminated (SIGTERM)"
    status = INTERRUPTED_STATUS if ctrl_c else EXIT_STATUS
    if "path" not in stop_saved:
        return Terminated(f"{how}; no checkpoint saved at the stop", status)
    saved = f"after step {stop_saved['step']}: saved {stop_saved['path']}"
    return Terminated(f"{how} {saved}; resume with {resume}", status)


def _one_line(message: str, argv: Sequence[str], configs: Sequence[str]) -> str:
    """jsonargparse's (often multi-line) parse error as one line, naming the config files unless the option
    it names was given on the command line."""
    text = re.sub(r"\s+", " ", message).strip()
    unknown = re.match(r"unrecognized arguments: (--[\w.-]+)", text)
    if unknown:  # an override misspelt on the command line (a config file's unknown key is named differently)
        return f"command line: unknown option {unknown[1]}{_did_you_mean(unknown[1])}"
    if len(text) > 300:
        text = text[:297] + "..."
    key = re.search(r"""(?:key|option) ["']([\w.]+)["']""", text)
    return f"{_source(key[1] if key else None, argv, configs)}: {text}"


def _did_you_mean(option: str) -> str:
    """`` (did you mean --model.lr?)`` for the nearest option of the parsers LightningCLI built, or ``""``."""
    import difflib

    known = {s for parser in _PARSERS for action in parser._actions for s in action.option_strings}
    close = difflib.get_close_matches(option, sorted(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else " (see srupp-asr train fit --help)"


def _source(key: str | None, argv: Sequence[str], configs: Sequence[str]) -> str:
    """Where option ``key`` (``model.lr``) was set: ``command line``, or the last config file setting it (all
    of them when none does, or when the key is unknown)."""
    on_command_line = key is not None and any(arg == f"--{key}" or arg.startswith(f"--{key}=") for arg in argv)
    if configs and not on_command_line:
        holding = [c for c in configs if key is not None and _has_key(c, key)]
        return ", ".join(holding[-1:] or configs)  # the last file setting it wins
    return "command line"


def _has_key(config: str, dotted: str) -> bool:
    """Whether the YAML file ``config`` sets the option ``dotted`` (``model.lr``; a leading ``fit.`` ignored)."""
    node: Any = read_yaml_mapping(config)
    parts = dotted.split(".")
    if parts[0] in SUBCOMMANDS and parts[0] not in node:
        parts = parts[1:]
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


# ``srupp-asr train --help``, printed without importing Lightning (LightningCLI's own takes seconds to build);
# ``train fit --help`` is LightningCLI's, with every option.
TRAIN_HELP = f"""usage: srupp-asr train [-c CONFIG] {{{",".join(SUBCOMMANDS)}}} ...

Train or validate a model: LightningCLI over the ASR model and its data module.

subcommands:
  fit                   run the full optimization routine
  validate              run one evaluation epoch over the validation set

options:
  -h, --help            show this help message and exit
  -c CONFIG, --config CONFIG
                        a YAML config: a path, or the name of one shipped in conf/ (tiny_cpu, ...)

`srupp-asr train fit --help` lists every option (LightningCLI's). Example:
  srupp-asr train fit --config conf/train_srupp.yaml --trainer.max_steps 100 --model.lr 0.002
"""


def train_command(args: argparse.Namespace) -> int:
    """``srupp-asr train ...``: hand the remaining words to LightningCLI (``--help`` alone: :data:`TRAIN_HELP`)."""
    if args.lightning_args in (["-h"], ["--help"]):
        print(TRAIN_HELP, end="")
        return 0
    run_train(args.lightning_args)
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the ``train`` sub-command (its arguments, ``--help`` included, are LightningCLI's)."""
    p = subparsers.add_parser(
        "train",
        help="train or validate a model (LightningCLI: train fit --config conf/train_srupp.yaml)",
        add_help=False,
        prefix_chars="\0",  # no option of its own: every word, options included, goes to LightningCLI
    )
    p.add_argument("lightning_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=train_command)
    return p
