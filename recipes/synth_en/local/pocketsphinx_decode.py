"""Decode a lhotse cut manifest with pocketsphinx (its bundled en-us model), a real pretrained recogniser to
compare against; write sclite trn files of the references and hypotheses for ``srupp-asr score``.

    python recipes/synth_en/local/pocketsphinx_decode.py CUTS.jsonl.gz OUT_DIR [--jobs 2]

Writes OUT_DIR/pocketsphinx.ref.trn and OUT_DIR/pocketsphinx.hyp.trn (``text (speaker-utterance)`` per line;
the speaker is the cut's voice) and OUT_DIR/decode_info.json (audio seconds, wall seconds, real-time factor).
pocketsphinx is installed by the recipe's stage 0 (``pip install pocketsphinx``); the decoding is
``benchmarks/peers.py``'s, shared with the benchmarks.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))  # the peers live with the benchmarks
import peers


def _trn_key(cut) -> str:
    """The cut's trn utterance key: ``speaker-cut id`` (the speaker's own dashes made underscores)."""
    return f"{(cut.supervisions[0].speaker or 'unknown').replace('-', '_')}-{cut.id}"


def _cut_items(cuts):
    """(trn key, 16 kHz samples) of each cut, read as the decoder asks for them."""
    for cut in cuts:
        if cut.sampling_rate != peers.SAMPLE_RATE:  # the en-us model is for 16 kHz; real corpora come at 8 or 22.05
            cut = cut.resample(peers.SAMPLE_RATE)
        yield _trn_key(cut), cut.load_audio()[0]


def main() -> int:
    """Decode the manifest and write the trn files; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cuts", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    from lhotse import CutSet

    from srupp_asr.fileio import atomic_write_text
    from srupp_asr.text import normalize_text

    cuts = CutSet.from_file(args.cuts).to_eager()
    refs = {_trn_key(cut): normalize_text(cut.supervisions[0].text) for cut in cuts}
    audio_s = sum(c.duration for c in cuts)
    start = time.perf_counter()
    try:
        hyps = peers.pocketsphinx(_cut_items(cuts), jobs=args.jobs).hypotheses
    except peers.PeerMissing as err:
        print(f"pocketsphinx_decode.py: error: {err}", file=sys.stderr)
        return 2
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
