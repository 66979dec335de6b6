"""The ``srupp-asr`` command line: a thin layer over the Python functions of the same names."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from srupp_asr import __version__
from srupp_asr.errors import UserError


def info(_args: argparse.Namespace) -> int:
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


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one sub-parser per command."""
    parser = argparse.ArgumentParser(
        prog="srupp-asr",
        description="Speech recognition with SRU++ encoders: train, transcribe, evaluate.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("info", help="show versions and which recurrence backends work here")
    p.set_defaults(func=info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``srupp-asr`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return args.func(args)
    except UserError as err:
        print(f"srupp-asr {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
