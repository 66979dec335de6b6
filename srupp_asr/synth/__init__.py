"""A synthetic English speech corpus from the offline TTS voices and texts that Debian ships.

- :mod:`~srupp_asr.synth.voices`: the voice registry (engine, voice id, donor speaker, licence), availability,
  synthesis;
- :mod:`~srupp_asr.synth.texts`: sentences from Debian's text packages; :mod:`~srupp_asr.synth.verbalize`: numbers
  and symbols spelled out;
- :mod:`~srupp_asr.synth.variation`: per-utterance rate, pitch, level, noise, reverberation, telephone band;
- :mod:`~srupp_asr.synth.splits`: train / dev / test_seen / test_unseen without voice, donor or sentence leaks;
- :mod:`~srupp_asr.synth.corpus`: :func:`build_corpus` and the ``srupp-asr synth-corpus`` command.
"""

from srupp_asr.synth.corpus import CorpusSummary, build_corpus
from srupp_asr.synth.texts import collect_sentences
from srupp_asr.synth.voices import VOICES, Voice

__all__ = ["VOICES", "CorpusSummary", "Voice", "build_corpus", "collect_sentences"]
