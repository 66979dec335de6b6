"""Write a synthetic corpus' LM text without synthesising its audio: ``lm_train.txt`` (the pool's training side,
as ``srupp-asr synth-corpus`` writes it) and ``dev.txt`` (the pool's dev sentences, never in ``lm_train.txt``).

The built-in model's corpus is ``--hours 30 --seed 0`` (recipes/synth_en/RESULTS.md); its LM was trained on::

    .venv/bin/python recipes/synth_en/local/lm_text.py exp/lm_builtin/text --hours 30 --seed 0

The split depends only on the sentence pool (Debian's texts installed here, as synth-corpus collects them), the
hours and the seed, so this gives the same sentences as a full build on the same texts.

``--brown DIR`` also writes the Brown Corpus (:mod:`srupp_asr.brown`; ``local/fetch_brown.sh`` fetches it) as
``brown_train.txt`` and ``brown_dev.txt`` (the first sample of each genre, ``ca01`` ... ``cr01``), spoken as the
pool's sentences are, without a sentence of the pool and without any sentence that shares six words in a row with
a line of the ``--held-out`` files (a test set's transcripts, one per line)::

    .venv/bin/python recipes/synth_en/local/lm_text.py exp/lm_text --hours 30 --seed 0 \\
        --brown data/brown --held-out exp/arctic_prompts.txt
"""

from __future__ import annotations

import argparse
from pathlib import Path

from srupp_asr.errors import UserError, run_script
from srupp_asr.fileio import atomic_write_text
from srupp_asr.synth.corpus import _split_pool, lm_training_text
from srupp_asr.synth.texts import Sentence, SourceReport, collect_sentences, filter_sentences
from srupp_asr.text import normalize_text

HELD_OUT_WORDS = 6  # a Brown sentence sharing this many words in a row with a held-out transcript is left out


def brown_text(root: Path, pool: list[Sentence], held_out: list[str]) -> tuple[list[str], list[str], str]:
    """The Brown Corpus' training and dev sentences (spoken form), and a line saying what was left out."""
    from srupp_asr.brown import brown_sentences, contaminated

    written = list(brown_sentences(root))
    report: dict[str, SourceReport] = {}
    kept = filter_sentences([(f"brown-{name}", text) for name, text in written], report)
    pool_keys = {normalize_text(s.spoken) for s in pool}  # the pool's own sentences are in its LM text already
    new = [normalize_text(s.spoken) not in pool_keys for s in kept]
    in_pool = len(kept) - sum(new)
    kept = [s for s, keep in zip(kept, new, strict=True) if keep]
    bad = contaminated([s.spoken for s in kept], held_out, HELD_OUT_WORDS)
    train = [s.spoken for s, b in zip(kept, bad, strict=True) if not b and not s.source.endswith("01")]
    dev = [s.spoken for s, b in zip(kept, bad, strict=True) if not b and s.source.endswith("01")]
    dropped: dict[str, int] = {}
    for rep in report.values():
        for why, count in rep.dropped.items():
            dropped[why] = dropped.get(why, 0) + count
    dropped["in the pool"] = in_pool
    why = ", ".join(f"{count} {what}" for what, count in sorted(dropped.items()))
    shared = f"{sum(bad)} sharing {HELD_OUT_WORDS} words with --held-out"
    return train, dev, f"{len(written)} Brown sentences: {why}, {shared}"


def main() -> int:
    """Collect the pool, split it as the corpus does and write the two text files."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir", type=Path)
    p.add_argument("--hours", type=float, required=True, help="the corpus' --hours")
    p.add_argument("--seed", type=int, default=0, help="the corpus' --seed (default 0)")
    p.add_argument("--brown", type=Path, help="also write the Brown Corpus under this folder (ca01 ... cr09)")
    p.add_argument(
        "--held-out", type=Path, nargs="+", default=[], help="transcripts (one per line) no Brown sentence may share"
    )
    args = p.parse_args()
    if args.held_out and args.brown is None:
        raise UserError("--held-out needs --brown (the held-out transcripts filter the Brown sentences)")
    held_out = [line for path in args.held_out for line in _read_lines(path)]
    if args.brown is not None:
        from srupp_asr.brown import sample_files

        sample_files(args.brown)  # a wrong folder fails now, not after the pool is collected
    sentences = collect_sentences()
    if not sentences:
        raise UserError("sentences: no usable sentence (install fortunes-min, wordnet-base or dict-gcide)")
    train = lm_training_text(sentences, args.hours, args.seed)
    dev = [s.spoken for s, _ in _split_pool(sentences, args.hours, args.seed)[1]]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out_dir / "lm_train.txt", "\n".join(train) + "\n")
    atomic_write_text(args.out_dir / "dev.txt", "\n".join(dev) + "\n")
    print(f"{len(sentences)} sentences in the pool: {len(train)} LM training, {len(dev)} dev -> {args.out_dir}")
    if args.brown is not None:
        brown_train, brown_dev, what = brown_text(args.brown, sentences, held_out)
        atomic_write_text(args.out_dir / "brown_train.txt", "\n".join(brown_train) + "\n")
        atomic_write_text(args.out_dir / "brown_dev.txt", "\n".join(brown_dev) + "\n")
        print(f"{what}; {len(brown_train)} LM training, {len(brown_dev)} dev -> {args.out_dir}")
    return 0


def _read_lines(path: Path) -> list[str]:
    try:
        return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: cannot read ({err.__class__.__name__}: {err})") from None


if __name__ == "__main__":
    run_script(main, "lm_text.py")
