"""``srupp-asr cmvn CUTS --out stats.json``: the global CMVN statistics of a cut manifest, as training reads them.

The statistics themselves (:func:`srupp_asr.frontend.compute_cmvn_stats`, ``save_cmvn``, ``load_cmvn``) belong to
the frontend that applies them; this module is the command over them, light to import (no torch) so that
``srupp-asr cmvn --help`` starts fast.
"""

from __future__ import annotations

import argparse
import sys

from srupp_asr.checks import check_size
from srupp_asr.errors import UserError

# The frontend's N_MELS, written out so that --help imports no torch (tests/test_inference_imports.py checks it).
DEFAULT_N_MELS = 80


def cmvn_command(args: argparse.Namespace) -> int:
    """``srupp-asr cmvn CUTS --out stats.json``: global CMVN statistics of a cut manifest.

    Cuts whose audio does not load get one error line each and are left out; the statistics of the others are
    still written, and the exit code is then 1."""
    from srupp_asr.frontend import compute_cmvn_stats, save_cmvn
    from srupp_asr.manifest import load_cuts

    try:
        n_mels = check_size("--n-mels", args.n_mels)
    except ValueError as err:
        raise UserError(str(err)) from None
    errors: list[str] = []
    cuts = load_cuts(args.cuts, lazy=True, allow_command_sources=args.allow_command_sources)
    mean, std = compute_cmvn_stats(cuts, args.max_cuts, errors, n_mels)
    save_cmvn(args.out, mean, std)
    for line in errors:
        print(f"srupp-asr cmvn: error: {line}", file=sys.stderr)
    left_out = f"; {len(errors)} cut(s) left out: their audio did not load" if errors else ""
    print(f"wrote {args.out} (mean and std of {mean.numel()} features{left_out})")
    return 1 if errors else 0


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the ``cmvn`` sub-command."""
    p = subparsers.add_parser("cmvn", help="compute global CMVN statistics of a cut manifest")
    p.add_argument("cuts", help="lhotse cut manifest (.jsonl.gz)")
    p.add_argument("--out", required=True, help="JSON file to write (atomically)")
    p.add_argument("--max-cuts", type=int, default=None, help="use only the first N cuts")
    p.add_argument(
        "--n-mels",
        type=int,
        default=DEFAULT_N_MELS,
        help=f"mel bins: the model's model.n_mels (default {DEFAULT_N_MELS})",
    )
    p.add_argument(
        "--allow-command-sources",
        action="store_true",
        help="let audio sources that run a shell command (a Kaldi wav.scp pipe) run; only for manifests you trust",
    )
    p.set_defaults(func=cmvn_command)
    return p
