"""Which voices and sentences each split of a synthetic corpus gets, so that no test condition leaks into training.

==============  ==================================  ===========================================
split           voices                              sentences
==============  ==================================  ===========================================
train           training voices                     training sentences (repeated when too few)
dev             training voices                     dev sentences
test_seen       training voices                     test sentences
test_unseen     held-out voices                     the same test sentences
==============  ==================================  ===========================================

Sentences: the pool is shuffled by the seed and cut into test, dev and training sentences; dev and test sentences
never occur in training (compared after :func:`srupp_asr.text.normalize_text`, which also deduplicates the pool).
test_seen and test_unseen read the same sentences, so their error rates differ by voice alone.

Voices are held out by donor speaker, not by voice name: a voice is held out when its donor is in
:data:`HELD_OUT_DONORS`. The donors held out are

- ``kal``, ``ked``, ``slt``: every main-section festival voice, so the whole **festival** engine (in the default,
  Debian-main voice set) is unseen in training; and since kal and slt are also flite voices, flite ``kal``,
  ``kal16`` and ``slt`` are held out too (flite ``awb`` and ``rms`` train);
- ``espeak-ng+m7``, ``espeak-ng+f4``: two espeak-ng timbres (variants), in every accent;
- with ``--non-free``: ``pico-en-US`` and ``pico-en-GB``, the whole **pico** engine, and ``mbrola-us3`` (through
  espeak-ng and festival alike). Festival's MBROLA voices us1, us2 and en1 then train, so in that set pico is the
  engine held out whole.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from srupp_asr.synth.voices import Voice

SPLITS = ("train", "dev", "test_seen", "test_unseen")
HELD_OUT_DONORS = frozenset(
    {"kal", "ked", "slt", "espeak-ng+m7", "espeak-ng+f4", "mbrola-us3", "pico-en-US", "pico-en-GB"}
)


@dataclass(frozen=True)
class VoiceSplit:
    """Training voices (train, dev, test_seen) and held-out voices (test_unseen) of one voice set."""

    train: tuple[Voice, ...]
    held_out: tuple[Voice, ...]

    @property
    def whole_engines(self) -> tuple[str, ...]:
        """Engines none of whose voices train (all of their voices in this set are held out)."""
        training = {v.engine for v in self.train}
        return tuple(sorted({v.engine for v in self.held_out} - training))

    def voices(self, split: str) -> tuple[Voice, ...]:
        """The voices that speak ``split``."""
        return self.held_out if split == "test_unseen" else self.train


def split_voices(voices: Iterable[Voice]) -> VoiceSplit:
    """Divide ``voices`` by donor speaker into training and held-out voices (see :data:`HELD_OUT_DONORS`)."""
    voices = tuple(voices)
    return VoiceSplit(
        train=tuple(v for v in voices if v.donor not in HELD_OUT_DONORS),
        held_out=tuple(v for v in voices if v.donor in HELD_OUT_DONORS),
    )


def describe_splits(split: VoiceSplit) -> str:
    """The split definition of one voice set in words (printed by the builder and written to SPLITS.txt)."""
    held_donors = sorted({v.donor for v in split.held_out})
    engines = split.whole_engines
    lines = [
        "Splits (no voice, donor speaker or sentence of a test set occurs in training):",
        "  train        training voices  x training sentences",
        "  dev          training voices  x dev sentences (not in train)",
        "  test_seen    training voices  x test sentences (not in train or dev)",
        "  test_unseen  held-out voices  x the same test sentences",
        f"Held out by donor speaker: {', '.join(held_donors) or 'none'}.",
        "Whole engines held out: "
        + (", ".join(engines) if engines else "none (no engine of this voice set has only held-out donors)")
        + ".",
        f"Training voices ({len(split.train)}): {', '.join(v.name for v in split.train)}",
        f"Held-out voices ({len(split.held_out)}): {', '.join(v.name for v in split.held_out)}",
    ]
    return "\n".join(lines) + "\n"
