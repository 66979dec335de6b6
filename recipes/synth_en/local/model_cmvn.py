"""Write the CMVN statistics a model directory's weights hold as a CMVN stats file (``srupp-asr cmvn``'s format):
the walkthrough's stage 2, which fine-tunes that model and so normalises its features as the model was trained to.

    python recipes/synth_en/local/model_cmvn.py MODEL_DIR OUT.json

The model stores the mean and the inverse standard deviation (``cmvn.mean``, ``cmvn.istd``); the file holds the
mean and the standard deviation, which give back the same float32 buffers when training loads them.
"""

from __future__ import annotations

import argparse
import sys

import torch

from srupp_asr.errors import UserError
from srupp_asr.frontend import save_cmvn
from srupp_asr.model_dir import read_weights


def model_cmvn(model_dir: str, out: str) -> None:
    """Read ``cmvn.mean`` and ``cmvn.istd`` from the weights of ``model_dir`` and save them to ``out``."""
    weights = read_weights(model_dir)
    if "cmvn.mean" not in weights or "cmvn.istd" not in weights:
        raise UserError(f"{model_dir}: its weights hold no CMVN statistics (cmvn.mean, cmvn.istd)")
    mean = weights["cmvn.mean"].to(torch.float64)
    std = 1.0 / weights["cmvn.istd"].to(torch.float64)
    save_cmvn(out, mean, std)


def main(argv: list[str] | None = None) -> int:
    """Command line: MODEL_DIR OUT.json."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", help="a model directory (srupp-asr average / export output)")
    parser.add_argument("out", help="the CMVN stats file to write (JSON)")
    args = parser.parse_args(argv)
    try:
        model_cmvn(args.model_dir, args.out)
    except UserError as err:
        print(f"model_cmvn.py: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
