"""The SRU++ language model in numpy (float32), for shallow fusion: :class:`srupp_asr.lm.SRUppLM`'s token-by-token
:meth:`~srupp_asr.lm.SRUppLM.step` (token embedding -> causal SRU++ layers -> layernorm -> log-softmax), its layers
run one step at a time with their recurrent states and key/value caches (:mod:`srupp_asr.runtime.sru`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from srupp_asr.checks import ConfigValueError, check_int, check_keywords, check_size
from srupp_asr.runtime.ops import Weights, layer_norm, linear, log_softmax
from srupp_asr.runtime.sru import TRAINING_OPTIONS, LayerState, SRUppEncoder
from srupp_asr.tokenizer import Tokenizer

if TYPE_CHECKING:
    from srupp_asr.decoding.lexicon import WordList

SOS_EOS_ID = Tokenizer.sos_eos_id  # the vocabulary exceeds it


class SRUppLM:
    """Causal SRU++ language model over token ids, stepped a token at a time; ``word_list``: the word list its
    directory carries, as the search reads it (:mod:`srupp_asr.decoding.lexicon`; set by the loader)."""

    word_list: WordList | None = None

    def __init__(
        self,
        weights: Weights,
        vocab_size: int,
        d_model: int = 512,
        num_layers: int = 4,
        attn_dim: int = 256,
        num_heads: int = 4,
        attn_every: int = 1,
    ) -> None:
        check_int("vocab_size", vocab_size, minimum=SOS_EOS_ID + 1)
        check_size("d_model", d_model)
        self.vocab_size = vocab_size
        self.embed = weights.take("embed.weight", (vocab_size, d_model))
        self.body = SRUppEncoder(
            weights.sub("body"),
            d_model,
            d_model,
            num_layers,
            attn_dim,
            num_heads,
            attn_every,
            bidirectional=False,
            causal=True,
        )
        self.norm = weights.take("norm.weight", (d_model,)), weights.take("norm.bias", (d_model,))
        self.out = weights.take("out.weight", (vocab_size, d_model)), weights.take("out.bias", (vocab_size,))

    @classmethod
    def from_config(cls, config: Mapping[str, Any], weights: Weights) -> SRUppLM:
        """The LM of the SRUppLM arguments ``config`` (an LM directory's config.yaml ``lm:``), its weights taken from
        ``weights``; NotImplementedError, one line, for a config this runtime does not run (an option it does not
        know, a value torch would refuse)."""
        options = {k: v for k, v in config.items() if k not in TRAINING_OPTIONS}
        try:
            check_keywords(cls, options, internal=("weights",))
            return cls(weights, **options)
        except ConfigValueError as err:
            raise NotImplementedError(f"the numpy runtime cannot run this LM: {err}") from None

    def step(self, tokens: np.ndarray, states: list[LayerState] | None = None) -> tuple[np.ndarray, list[LayerState]]:
        """Feed one token per row (``(N,)``; ``<sos/eos>`` first) -> ``(N, V)`` float32 log-probabilities of the
        next token, and the new states (None before the first token)."""
        h, states = self.body.step(self.embed[np.asarray(tokens, dtype=np.int64)], states)
        return log_softmax(linear(layer_norm(h, *self.norm), *self.out)), states

    def select(self, states: list[LayerState] | None, rows: np.ndarray) -> list[LayerState] | None:
        """The states of rows ``rows`` (in that order; a row may come more than once)."""
        return None if states is None else [state.select(rows) for state in states]
