"""Write a synthetic corpus' LM text without synthesising its audio: ``lm_train.txt`` (the pool's training side,
as ``srupp-asr synth-corpus`` writes it) and ``dev.txt`` (the pool's dev sentences, never in ``lm_train.txt``).

The built-in model's corpus is ``--hours 30 --seed 0`` (recipes/synth_en/RESULTS.md); its LM was trained on::

    .venv/bin/python recipes/synth_en/local/lm_text.py exp/lm_builtin/text --hours 30 --seed 0

The split depends only on the sentence pool (Debian's texts installed here, as synth-corpus collects them), the
hours and the seed, so this gives the same sentences as a full build on the same texts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from srupp_asr.errors import UserError
from srupp_asr.fileio import atomic_write_text
from srupp_asr.synth.corpus import _split_pool, lm_training_text
from srupp_asr.synth.texts import collect_sentences


def main() -> int:
    """Collect the pool, split it as the corpus does and write the two text files."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir", type=Path)
    p.add_argument("--hours", type=float, required=True, help="the corpus' --hours")
    p.add_argument("--seed", type=int, default=0, help="the corpus' --seed (default 0)")
    args = p.parse_args()
    sentences = collect_sentences()
    if not sentences:
        raise UserError("sentences: no usable sentence (install fortunes-min, wordnet-base or dict-gcide)")
    train = lm_training_text(sentences, args.hours, args.seed)
    dev = [s.spoken for s, _ in _split_pool(sentences, args.hours, args.seed)[1]]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out_dir / "lm_train.txt", "\n".join(train) + "\n")
    atomic_write_text(args.out_dir / "dev.txt", "\n".join(dev) + "\n")
    print(f"{len(sentences)} sentences in the pool: {len(train)} LM training, {len(dev)} dev -> {args.out_dir}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as err:
        print(f"lm_text.py: error: {err}", file=sys.stderr)
        sys.exit(2)
