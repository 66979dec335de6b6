"""Decode a lhotse cut manifest with pocketsphinx (its bundled en-us model), a real pretrained recogniser to
compare against; write sclite trn files of the references and hypotheses for ``srupp-asr score``.

    python recipes/synth_en/local/pocketsphinx_decode.py CUTS.jsonl.gz OUT_DIR [--jobs 2]

Writes OUT_DIR/pocketsphinx.ref.trn and OUT_DIR/pocketsphinx.hyp.trn (``text (speaker-utterance)`` per line;
the speaker is the cut's voice) and OUT_DIR/decode_info.json (audio seconds, wall seconds, real-time factor).
pocketsphinx is installed by the recipe's stage 0 (``pip install pocketsphinx``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from pathlib import Path

import numpy as np

_DECODER = None


def _decoder():
    global _DECODER
    if _DECODER is None:
        from pocketsphinx import Decoder

        _DECODER = Decoder(samprate=16000, loglevel="FATAL")
    return _DECODER


def decode_samples(samples: np.ndarray) -> str:
    """pocketsphinx's best hypothesis for 16 kHz float samples in [-1, 1] (one utterance)."""
    pcm = (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
    decoder = _decoder()
    decoder.start_utt()
    decoder.process_raw(pcm, no_search=False, full_utt=True)
    decoder.end_utt()
    hyp = decoder.hyp()
    return "" if hyp is None else hyp.hypstr


def _decode_cut(item: tuple[str, str, np.ndarray]) -> tuple[str, str]:
    cut_id, speaker, samples = item
    return f"{speaker}-{cut_id}", decode_samples(samples)


def _cut_items(cuts):
    for cut in cuts:
        sup = cut.supervisions[0]
        if cut.sampling_rate != 16000:  # the en-us model is for 16 kHz; real corpora come at 8 or 22.05 kHz
            cut = cut.resample(16000)
        yield cut.id, (sup.speaker or "unknown").replace("-", "_"), cut.load_audio()[0]


def main() -> int:
    """Decode the manifest and write the trn files; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cuts", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    try:
        import pocketsphinx  # noqa: F401
    except ImportError:
        print(
            "pocketsphinx_decode.py: error: pocketsphinx is not installed (pip install pocketsphinx)", file=sys.stderr
        )
        return 2
    from lhotse import CutSet

    from srupp_asr.fileio import atomic_write_text
    from srupp_asr.text import normalize_text

    cuts = CutSet.from_file(args.cuts).to_eager()
    refs = {}
    for cut in cuts:
        speaker = (cut.supervisions[0].speaker or "unknown").replace("-", "_")
        refs[f"{speaker}-{cut.id}"] = normalize_text(cut.supervisions[0].text)
    audio_s = sum(c.duration for c in cuts)
    start = time.perf_counter()
    with multiprocessing.Pool(args.jobs) as pool:
        hyps = dict(pool.imap(_decode_cut, _cut_items(cuts), chunksize=4))
    wall = time.perf_counter() - start
    args.out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out_dir / "pocketsphinx.ref.trn", "".join(f"{t} ({k})\n" for k, t in refs.items()))
    atomic_write_text(
        args.out_dir / "pocketsphinx.hyp.trn", "".join(f"{normalize_text(hyps[k])} ({k})\n" for k in refs)
    )
    info = {
        "decoder": "pocketsphinx (bundled en-us)",
        "jobs": args.jobs,
        "audio_seconds": round(audio_s, 2),
        "wall_seconds": round(wall, 2),
        "rtf": round(wall / max(audio_s, 1e-9), 4),
        "utterances": len(refs),
    }
    atomic_write_text(args.out_dir / "decode_info.json", json.dumps(info, indent=2) + "\n")
    print(f"pocketsphinx: {len(refs)} utterances, {audio_s / 60:.1f} min of audio in {wall:.0f} s (RTF {info['rtf']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
