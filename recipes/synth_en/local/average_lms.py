"""Average LM directories of one shape and tokenizer into a new one (:func:`srupp_asr.average.average_lms`)::

    .venv/bin/python recipes/synth_en/local/average_lms.py OUT_DIR LM_DIR LM_DIR [LM_DIR ...]

The built-in model's LM is the average of the LM before it and that LM fine-tuned on the Brown Corpus
(``train-lm --init-from``; benchmarks/RESULTS.md): the fine-tuned one alone reads prose better and the transcripts
of the fine-tuning mix worse.
"""

from __future__ import annotations

import argparse

from srupp_asr.average import average_lms
from srupp_asr.errors import run_script


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("lm_dirs", nargs="+")
    args = p.parse_args()
    print(f"wrote {average_lms(args.lm_dirs, args.out_dir)}: the mean of {len(args.lm_dirs)} LMs")
    return 0


if __name__ == "__main__":
    run_script(main, "average_lms.py")
