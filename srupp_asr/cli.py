"""The ``srupp-asr`` command line: a thin layer over the Python functions of the same names.

Each command lives in the module that holds its function and registers itself there with
``add_parser(subparsers)``. Only the module of the command being run is imported, so
``srupp-asr --help`` and light commands start fast.
"""

from __future__ import annotations

import argparse
import atexit
import difflib
import importlib
import os
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

from srupp_asr import __version__
from srupp_asr.errors import PROCESS_MEMORY_REMEDY, UserError, first_line, is_out_of_memory, out_of_memory_line
from srupp_asr.interrupts import Terminated, sigterm_raises

# command -> (module with its add_parser, one-line help shown by `srupp-asr --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "info": ("srupp_asr.cli", "show versions and which recurrence backends work here"),
    "prepare": (
        "srupp_asr.prepare",
        "import your own data (a Kaldi data dir, NeMo manifest, table of transcripts, or audio a teacher "
        "transcribes) as lhotse cut manifests; a published corpus by name: corpus prepare",
    ),
    "corpus": ("srupp_asr.corpora", "download and prepare LibriSpeech, TED-LIUM 3 and AISHELL-1 for the recipes"),
    "cmvn": ("srupp_asr.cmvn", "compute global CMVN statistics of a cut manifest"),
    "tokenizer": ("srupp_asr.tokenizer", "train a sentencepiece tokenizer on transcripts"),
    "train": ("srupp_asr.train", "train or validate a model (LightningCLI: train fit --config conf/train_srupp.yaml)"),
    "train-lm": ("srupp_asr.lm_train", "train an SRU++ language model for shallow fusion (--lm)"),
    "synth-corpus": ("srupp_asr.synth.corpus", "build an English speech corpus from Debian's offline TTS voices"),
    "average": ("srupp_asr.average", "average the best checkpoints of a run and export a model directory"),
    "transcribe": ("srupp_asr.transcribe", "transcribe audio files (txt, json, srt, vtt, tsv; long recordings)"),
    "evaluate": ("srupp_asr.scoring.evaluate", "decode a cut manifest with a model and score it (WER/CER report)"),
    "score": ("srupp_asr.scoring.score", "score hypotheses against references (sclite-compatible counts)"),
    "sclite": ("srupp_asr.scoring.sclite", "NIST sclite's command line and reports: -r REF [trn|stm] -h HYP [trn|ctm]"),
    "summarize": ("srupp_asr.scoring.summary", "collect the scoring reports of an experiment into one results table"),
}


def info_command(_args: argparse.Namespace) -> int:
    """Print versions and which recurrence backends work on this machine."""
    import platform

    import torch

    from srupp_asr import kernels

    print(f"srupp-asr {__version__}  python {platform.python_version()}  torch {torch.__version__}")
    print(f"cpu threads: {torch.get_num_threads()}")
    try:
        kernels.cpu_extension()
        print("recurrence cpu: native C++ extension")
    except kernels.BackendUnavailable as err:
        print(f"recurrence cpu: per-step PyTorch loop ({err})")
    if not torch.cuda.is_available():
        print("recurrence cuda: no CUDA device")
    else:
        try:
            import cupy

            print(f"recurrence cuda: CuPy {cupy.__version__} on {torch.cuda.get_device_name()}")
        except ImportError:
            print("recurrence cuda: CuPy missing (pip install 'srupp-asr[gpu]')")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the ``info`` sub-command."""
    p = subparsers.add_parser("info", help=COMMANDS["info"][1])
    p.set_defaults(func=info_command)
    return p


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser; the sub-parser of ``command`` is the real one, the others are stubs for --help."""
    parser = argparse.ArgumentParser(
        prog="srupp-asr",
        description="English speech recognition with SRU++ encoders: train, transcribe, evaluate. "
        "`srupp-asr transcribe FILE` needs no training: it uses the built-in model, trained mostly on synthetic "
        "English speech plus a few hours of real words, digits and read sentences (far below whisper on real "
        "sentences). Exit status: 0 success; 1 some inputs failed; 2 a usage or model error.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        if name == command:
            importlib.import_module(module).add_parser(sub)
        else:
            sub.add_parser(name, help=help_text, add_help=False)
    _no_abbreviations(parser)
    return parser


def _no_abbreviations(parser: argparse.ArgumentParser) -> None:
    """Turn off argparse's abbreviations in ``parser`` and its sub-parsers: ``evaluate --cut`` is then a misspelt
    ``--cuts`` with a suggestion, not an abbreviation that a new option could make ambiguous."""
    parser.allow_abbrev = False
    for sub in _subparsers(parser).values():
        _no_abbreviations(sub)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``srupp-asr`` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    if command is not None and command not in COMMANDS:
        print(f"srupp-asr: error: {_no_such_command(command)}", file=sys.stderr)
        return 2
    if command == "sclite":  # sclite's own command line (-h is its hypothesis file), not argparse's
        from srupp_asr.scoring import sclite

        return _run(command, lambda: sclite.main(argv[argv.index(command) + 1 :]))
    parser = build_parser(command)
    sub, rest = _command_parser(parser, argv)
    # A misspelt option is named before argparse parses anything: parsing would first complain of a required
    # option it then lacks (score --hypp h.txt: "--hyp is required"), with the usage and no suggestion.
    option = _unknown_option(sub, rest) if command != "train" else None  # train: LightningCLI checks its own
    if option is not None:
        print(f"{sub.prog}: error: {_unknown_argument(sub, option)}", file=sys.stderr)
        return 2
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        print(f"{sub.prog}: error: {_unknown_argument(sub, unknown[0])}", file=sys.stderr)
        return 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    return _run(args.command, lambda: args.func(args))


def console_main() -> NoReturn:
    """The ``srupp-asr`` console script: :func:`main`, then :func:`exit_without_teardown`."""
    exit_without_teardown(main())


def exit_without_teardown(code: int) -> NoReturn:
    """Exit with ``code`` once the atexit handlers have run and the standard streams are flushed, without
    Python's teardown of every module object and the native libraries' exit handlers.

    Once torch is imported, that teardown takes 0.6 s and the exit handlers of the CUDA libraries torch's wheel
    loads (libcublasLt, libcusparseLt) take 127 MB more memory, which is the peak of a short command
    (``benchmarks/cpu_inference.py``; docs/benchmarks.md). What a command must leave behind is already written:
    outputs are closed (written atomically), and logging, temporary folders and child processes are finished by
    their atexit handlers, which still run. A command that leaves a non-daemon thread running exits the usual
    way, after it."""
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # as Python's own exit does when stdout cannot be flushed: status 120
            code = code or 120
    os._exit(code)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _command_parser(parser: argparse.ArgumentParser, argv: Sequence[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The parser of the (sub-)command ``argv`` names (``srupp-asr``'s own, ``transcribe``'s, ``prepare kaldi``'s)
    and the words after its name."""
    rest = list(argv)
    while subs := _subparsers(parser):
        i = next((i for i, word in enumerate(rest) if not word.startswith("-")), None)
        if i is None or rest[i] not in subs:
            break
        parser, rest = subs[rest[i]], rest[i + 1 :]
    return parser, rest


def _unknown_option(parser: argparse.ArgumentParser, words: Sequence[str]) -> str | None:
    """The first of ``words`` that looks like an option (``--name``, ``--name=value``, ``-x``) and is none of
    ``parser``'s; None when all are. Negative numbers, ``-`` and anything after ``--`` are values."""
    known = parser._option_string_actions
    for word in words:
        if word == "--":
            break
        if not word.startswith("-") or word == "-" or parser._negative_number_matcher.match(word):
            continue
        option = word.split("=", 1)[0]
        if option in known or (not option.startswith("--") and option[:2] in known):  # -x, -xVALUE
            continue
        return option
    return None


def _no_such_command(word: str) -> str:
    """One line for a first word that is no command: the nearest command, or how to transcribe a file."""
    close = difflib.get_close_matches(word, COMMANDS, n=1, cutoff=0.6)
    if close:
        hint = f"did you mean {close[0]}?"
    elif os.path.splitext(word)[1] or os.path.exists(word):
        hint = f"to transcribe a file: srupp-asr transcribe {word}"
    else:
        hint = "see srupp-asr --help"
    return f"no command {word!r} ({hint})"


def _unknown_argument(parser: argparse.ArgumentParser, word: str) -> str:
    """One line for an argument ``parser`` does not take, naming the options it begins (``--out`` ->
    ``--output-dir or --output-format``), else the nearest one (``_`` and ``-`` alike, the option's main spelling
    suggested: ``--beam-size`` -> ``--beam``)."""
    if not word.startswith("-"):
        return f"unexpected argument {word!r} (see {parser.prog} --help)"
    option = word.split("=", 1)[0]
    spellings: dict[str, str] = {}
    for action in parser._actions:
        longs = [s for s in action.option_strings if s.startswith("--")]
        for spelling in action.option_strings:
            spellings.setdefault(spelling.lower().replace("_", "-"), longs[0] if longs else spelling)
    word = option.lower().replace("_", "-")
    begun = sorted({spellings[s] for s in spellings if s.startswith(word)}) if word.startswith("--") else []
    close = begun[:3] or [spellings[s] for s in difflib.get_close_matches(word, spellings, n=1, cutoff=0.6)]
    hint = f"did you mean {' or '.join(close)}?" if close else f"see {parser.prog} --help"
    return f"unknown option {option} ({hint})"


def _run(command: str, fn) -> int:
    """Run a command; user errors (2) and operating-system errors (1: a folder that cannot be written, a full
    disk, ...) become one line on stderr. ``SRUPP_TRACEBACK=1`` re-raises the latter, for debugging. Ctrl-C (130)
    and SIGTERM (143) stop it with one line, after its ``finally`` blocks have removed temporary files."""
    try:
        with sigterm_raises():
            return int(fn() or 0)
    except UserError as err:
        print(f"srupp-asr {command}: error: {err}", file=sys.stderr)
        return 2
    except Terminated as err:
        if str(err):  # empty: a process that is not the one the user started (a DDP rank) stops quietly
            print(f"srupp-asr {command}: {first_line(err)}", file=sys.stderr)
        return err.status
    except KeyboardInterrupt:  # Ctrl-C: outputs are written atomically, so stop with one line, as shells expect
        print(f"srupp-asr {command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout went away (`| head`): stop quietly, as other tools do
        _silence_stdout()
        return 1
    except Exception as err:
        if os.environ.get("SRUPP_TRACEBACK") == "1" or not (isinstance(err, OSError) or is_out_of_memory(err)):
            raise  # a bug keeps its traceback
        if is_out_of_memory(err):  # a small `ulimit -v` at start-up (libtorch cannot be mapped), or a big job
            line = out_of_memory_line(err, f"running {command}", PROCESS_MEMORY_REMEDY)
            print(f"srupp-asr {command}: error: {line}", file=sys.stderr)
            return 1
        print(f"srupp-asr {command}: error: {describe_os_error(err)}", file=sys.stderr)
        _silence_stdout()  # stdout itself may be what failed: its flush at exit must not print a traceback
        return 1


def describe_os_error(err: OSError) -> str:
    """``FILE: what went wrong`` (both files for a rename), or the message when no file is named."""
    reason = err.strerror or first_line(err)
    if isinstance(err, FileExistsError) and err.filename is not None and not os.path.isdir(err.filename):
        reason = "exists and is not a folder"
    if err.filename is None:
        return f"cannot write or read: {reason}" if err.strerror else reason
    where = f"{err.filename} -> {err.filename2}" if err.filename2 is not None else str(err.filename)
    return f"{where}: {reason}"


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (captured by a test)
        pass


if __name__ == "__main__":
    console_main()
