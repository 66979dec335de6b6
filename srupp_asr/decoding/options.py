"""What decoding is asked to do (:class:`DecodingOptions`) and what it returns (:class:`Hypothesis`, :class:`Word`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from srupp_asr.checks import is_real_number, lm_weight_problem

Mode = Literal["ctc_greedy", "ctc_prefix_beam", "joint", "rescoring"]
MODES: tuple[str, ...] = ("ctc_greedy", "ctc_prefix_beam", "joint", "rescoring")
# The widest beam taken. Decoding memory grows with the beam: ctc_prefix_beam with the built-in model's LM on 30 s of
# audio peaks at 1.0 GiB with a beam of 10, 1.8 GiB with 128, 3.2 GiB with 256 and 10.4 GiB with 1,024
# (benchmarks/reliability_probe.py --beam-memory; docs/reliability.md). Published recipes use 4-60.
MAX_BEAM = 128
# The beam unless one is asked for (ESPnet's is 20): with the built-in model's word list and length bonus a beam of
# 20 gains another point on read speech in 1.5 times the decoding time (benchmarks/RESULTS.md, "The beam of the
# defaults"), and 10 keeps transcribe as fast as before the word list.
DEFAULT_BEAM = 10
# The largest length penalty (either sign) per token, for the same reason: it is added to float32 scores (1e300 is
# infinite there), and a bonus of 1,000 per token already outweighs any log-probability.
MAX_LENGTH_PENALTY = 1000.0


@dataclass(frozen=True)
class DecodingOptions:
    """Decoding settings; every value is checked when the options are made (a ``ValueError`` names the field).

    - ``mode``: ``ctc_greedy`` (best path), ``ctc_prefix_beam`` (CTC prefix beam search), ``joint`` (one-pass
      attention beam search with a CTC prefix scorer, ESPnet-style) or ``rescoring`` (the CTC prefix beam's
      n-best rescored by the attention decoder, WeNet-style).
    - ``beam``: hypotheses kept per utterance (the beam modes).
    - ``ctc_weight``: ``joint`` and ``rescoring`` score ``ctc_weight * ctc + (1 - ctc_weight) * attention``.
    - ``length_penalty``: added to a hypothesis' score once per output token (ESPnet's length bonus; > 0 favours
      longer outputs). Applied during the search in the beam modes; ``ctc_greedy`` ignores it. None (the default):
      0 for :func:`decode`; ``transcribe`` / ``evaluate`` use the one recorded with the LM they fuse, if any
      (it balances the LM's and its word list's charges per word), else 0.
    - ``maxlen_ratio``: the most output tokens is ``maxlen_ratio * encoder frames`` (at least 1); 0 means the number
      of encoder frames (the label-synchronous search only: ``joint``, and ``ctc_prefix_beam`` with an LM; CTC
      cannot emit more tokens than frames anyway).
    - ``nbest``: hypotheses returned per utterance by :func:`~srupp_asr.decoding.decode_encoded` (at most ``beam``;
      ``ctc_greedy`` always returns one).
    - ``lm_weight``: shallow fusion with an SRU++ LM (given to the decoding functions): ``lm_weight * log P_lm`` is
      added to every hypothesis' score, during the search (``joint``; ``ctc_prefix_beam`` then runs the
      label-synchronous search with the CTC prefix scorer and the LM) or to each n-best entry (``rescoring``).
      0 decodes without an LM; ``ctc_greedy`` takes none. None (the default): not chosen here; :func:`decode`
      then fuses no LM, and ``transcribe`` / ``evaluate`` use the weight recorded with the LM they fuse (the model
      directory's own ``lm/`` by default, see :func:`srupp_asr.loading.choose_lm`).
    - ``lexicon_weight``: what each word outside the fused LM's word list costs a hypothesis in the label-synchronous
      search (``joint``, ``ctc_prefix_beam`` with an LM; :mod:`srupp_asr.decoding.lexicon`): an LM directory may
      carry one (``words.txt``). 0: no word list. None (the default): not chosen here; :func:`decode` then checks
      no words, and ``transcribe`` / ``evaluate`` use the weight recorded with the LM's word list.
    """

    mode: Mode = "ctc_greedy"
    beam: int = DEFAULT_BEAM
    ctc_weight: float = 0.3
    length_penalty: float | None = None
    maxlen_ratio: float = 0.0
    nbest: int = 1
    lm_weight: float | None = None
    lexicon_weight: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if not isinstance(self.beam, int) or isinstance(self.beam, bool) or not 1 <= self.beam <= MAX_BEAM:
            raise ValueError(f"beam must be an integer in [1, {MAX_BEAM}] (memory grows with it), got {self.beam!r}")
        if not is_real_number(self.ctc_weight) or not 0.0 <= self.ctc_weight <= 1.0:
            raise ValueError(f"ctc_weight must be in [0, 1], got {self.ctc_weight!r}")
        if self.length_penalty is not None and length_penalty_problem(self.length_penalty):
            raise ValueError(f"length_penalty {length_penalty_problem(self.length_penalty)}")
        if not is_real_number(self.maxlen_ratio) or not math.isfinite(self.maxlen_ratio) or self.maxlen_ratio < 0:
            raise ValueError(f"maxlen_ratio must be a finite number >= 0, got {self.maxlen_ratio!r}")
        if not isinstance(self.nbest, int) or isinstance(self.nbest, bool) or not 1 <= self.nbest <= self.beam:
            raise ValueError(f"nbest must be an integer in [1, beam={self.beam}], got {self.nbest!r}")
        if self.lm_weight is not None and lm_weight_problem(self.lm_weight):
            raise ValueError(f"lm_weight {lm_weight_problem(self.lm_weight)}")
        if self.lexicon_weight is not None and lm_weight_problem(self.lexicon_weight):
            raise ValueError(f"lexicon_weight {lm_weight_problem(self.lexicon_weight)}")
        if self.fusion_weight > 0 and self.mode == "ctc_greedy":
            raise ValueError("lm_weight needs a beam mode (ctc_prefix_beam, joint or rescoring), not ctc_greedy")

    @property
    def fusion_weight(self) -> float:
        """The LM weight decoding applies: ``lm_weight``, 0 when None."""
        return self.lm_weight or 0.0

    @property
    def token_bonus(self) -> float:
        """The length penalty decoding applies: ``length_penalty``, 0 when None."""
        return self.length_penalty or 0.0

    @property
    def word_penalty(self) -> float:
        """The lexicon weight decoding applies: ``lexicon_weight`` when an LM is fused, else 0 (the word list is
        the LM's)."""
        return (self.lexicon_weight or 0.0) if self.fusion_weight > 0 else 0.0


def length_penalty_problem(value: object) -> str | None:
    """What is wrong with ``value`` as a length penalty, or None: it must be a number in
    [-:data:`MAX_LENGTH_PENALTY`, :data:`MAX_LENGTH_PENALTY`]."""
    if is_real_number(value) and abs(value) <= MAX_LENGTH_PENALTY:
        return None
    limit = f"{MAX_LENGTH_PENALTY:g}"
    return f"must be a number in [-{limit}, {limit}], got {value!r}"


def unmet_needs(
    options: DecodingOptions, vocab_size: int, has_ctc: bool, has_decoder: bool, lm_vocab_size: int | None
) -> str | None:
    """Why a model (``vocab_size`` tokens, with or without its CTC head and attention decoder) and an LM
    (``lm_vocab_size`` tokens, None: none) cannot decode with ``options``, or None when they can."""
    if options.fusion_weight > 0 and lm_vocab_size is None:
        return f"lm_weight={options.lm_weight} needs a language model (none given)"
    if options.fusion_weight > 0 and lm_vocab_size != vocab_size:
        return f"the LM has {lm_vocab_size} tokens, the model {vocab_size}"
    needs_ctc = options.mode in ("ctc_greedy", "ctc_prefix_beam", "rescoring") or (
        options.mode == "joint" and options.ctc_weight > 0.0
    )
    needs_decoder = options.mode in ("joint", "rescoring") and options.ctc_weight < 1.0
    head = (
        "a CTC head"
        if needs_ctc and not has_ctc
        else "an attention decoder"
        if needs_decoder and not has_decoder
        else ""
    )
    if head:
        return f"mode {options.mode} with ctc_weight={options.ctc_weight} needs {head}; the model has none"
    return None


@dataclass
class Word:
    """A word of a hypothesis: its text, start and end in seconds from the start of the decoded audio, and a
    confidence in [0, 1] (see :func:`srupp_asr.decoding.alignment.align_hypothesis`)."""

    text: str
    start: float
    end: float
    confidence: float

    @property
    def word(self) -> str:
        """The word's text under the name the JSON output (and whisper) gives it: ``word``."""
        return self.text


@dataclass
class Hypothesis:
    """A decoded token sequence with its text, score (log domain, the mode's own measure), the start time in
    seconds of each token (from the CTC forced alignment) and its words."""

    tokens: list[int]
    text: str
    score: float
    token_times: list[float] = field(default_factory=list)
    words: list[Word] = field(default_factory=list)
