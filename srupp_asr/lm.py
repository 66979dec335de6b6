"""The SRU++ language model of the seeds: token embedding -> causal SRU++ layers -> layernorm -> softmax.

A sentence-level LM over the ASR tokenizer's pieces: it reads ``<sos/eos> y_1 .. y_n`` and predicts
``y_1 .. y_n <sos/eos>``, so its scores plug straight into the decoders' beam search (shallow fusion, see
:class:`srupp_asr.decoding.scorers.LMScorer`) and into n-best rescoring. The layers are unidirectional SRU++ layers
with causal attention (:class:`srupp_asr.sru.SRUppLayer` with ``causal=True``); decoding runs them one token at a
time with their recurrent states and key/value caches (:meth:`SRUppLM.step`), which gives the same log-probabilities
as the whole-sentence forward.

An LM directory is written like a model directory (:func:`srupp_asr.model_dir.write_model_dir`), nothing pickled::

    LM_DIR/config.yaml         format_version and ``lm:`` (the SRUppLM constructor arguments)
    LM_DIR/model.safetensors   the SRUppLM state dict (or its shards and their index, as a model directory's)
    LM_DIR/tokenizer.model     the tokenizer it was trained with (must be the ASR model's)
    LM_DIR/words.txt[.gz]      optional: a word list the search charges words outside of (its weight:
                               ``lexicon_weight`` in config.yaml; :mod:`srupp_asr.decoding.lexicon`)

A model directory may carry its LM as ``MODEL_DIR/lm/`` (:data:`LM_SUBDIR`, written by ``srupp-asr average --lm``
or :func:`srupp_asr.average.ship_lm`); its ``config.yaml`` then also holds ``fusion_weight``, the shallow-fusion
weight chosen for that ASR model, which ``transcribe`` and ``evaluate`` use by default (:func:`read_fusion_weight`).
The weight lives beside the LM, not in the model's config, so ``--lm MODEL_DIR/lm`` decodes exactly as the default.

Training is :mod:`srupp_asr.lm_train` (``srupp-asr train-lm``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from srupp_asr.checks import check_size
from srupp_asr.errors import UserError
from srupp_asr.model_dir import build_with_weights, write_model_dir
from srupp_asr.model_files import (  # the LM directory's files, read without torch; re-exported
    FORMAT_VERSION,
    FUSION_WEIGHT_KEY,
    LENGTH_PENALTY_KEY,
    LEXICON_WEIGHT_KEY,
    check_fusion_weight,
    read_lm_config,
    read_tokenizer,
)
from srupp_asr.sru import LayerState, SRUppEncoder
from srupp_asr.tokenizer import Tokenizer

if TYPE_CHECKING:
    from srupp_asr.decoding.lexicon import WordList

SOS_EOS_ID = Tokenizer.sos_eos_id
PAD_ID = Tokenizer.blank_id  # never a target: the blank is not a text token


class SRUppLM(nn.Module):
    """Causal SRU++ language model over token ids; ``word_list``: the word list its directory carries, as the search
    reads it (:mod:`srupp_asr.decoding.lexicon`; set by :func:`srupp_asr.loading.load_fusion_lm`)."""

    word_list: WordList | None = None

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 512,
        num_layers: int = 4,
        attn_dim: int = 256,
        num_heads: int = 4,
        attn_every: int = 1,
        dropout: float = 0.1,
        attn_dropout: float = 0.1,
        highway_bias: float = -2.0,
    ) -> None:
        super().__init__()
        if vocab_size <= SOS_EOS_ID:
            raise ValueError(f"vocab_size must exceed the special ids (0-{SOS_EOS_ID}), got {vocab_size}")
        self.config: dict[str, Any] = {
            "vocab_size": vocab_size,
            "d_model": d_model,
            "num_layers": num_layers,
            "attn_dim": attn_dim,
            "num_heads": num_heads,
            "attn_every": attn_every,
            "dropout": dropout,
            "attn_dropout": attn_dropout,
            "highway_bias": highway_bias,
        }
        self.vocab_size = vocab_size
        check_size("d_model", d_model)  # the embedding comes first; the SRU++ layers check the other arguments
        self.embed = nn.Embedding(vocab_size, d_model)
        self.body = SRUppEncoder(
            d_model,
            d_model,
            num_layers,
            attn_dim,
            num_heads,
            attn_every,
            bidirectional=False,
            dropout=dropout,
            attn_dropout=attn_dropout,
            highway_bias=highway_bias,
            causal=True,
        )
        self.norm = nn.LayerNorm(d_model)
        self.out = nn.Linear(d_model, vocab_size)
        self.emb_dropout = nn.Dropout(dropout)

    def num_params(self) -> int:
        """Number of parameters."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``tokens`` ``(B, L)`` (valid up to ``lengths`` ``(B,)``) -> ``(B, L, V)`` next-token logits."""
        h, _ = self.body(self.emb_dropout(self.embed(tokens)), lengths)
        return self.out(self.norm(h))

    def sentence_nll(self, sentences: Sequence[Sequence[int]]) -> torch.Tensor:
        """``-log P(y_1 .. y_n <sos/eos>)`` ``(B,)`` of each token sequence (without ``<sos/eos>``), summed over its
        tokens."""
        inputs, targets, lengths = self.batch(sentences)
        logits = self(inputs, lengths)
        nll = F.cross_entropy(logits.transpose(1, 2).float(), targets, ignore_index=PAD_ID, reduction="none")
        return nll.sum(1)

    def batch(self, sentences: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Padded ``(inputs, targets, lengths)``: ``<sos/eos> + y`` and ``y + <sos/eos>`` (padding: :data:`PAD_ID`)."""
        device = self.embed.weight.device
        lengths = torch.tensor([len(y) + 1 for y in sentences], dtype=torch.long)
        inputs = torch.full((len(sentences), max(len(y) for y in sentences) + 1), PAD_ID, dtype=torch.long)
        targets = inputs.clone()
        for i, y in enumerate(sentences):
            y = torch.as_tensor(list(y), dtype=torch.long)
            inputs[i, 0] = SOS_EOS_ID
            inputs[i, 1 : len(y) + 1] = y
            targets[i, : len(y)] = y
            targets[i, len(y)] = SOS_EOS_ID
        return inputs.to(device), targets.to(device), lengths.to(device)

    def step(
        self, tokens: torch.Tensor, states: list[LayerState] | None = None
    ) -> tuple[torch.Tensor, list[LayerState]]:
        """Feed one token per row (``(N,)``; ``<sos/eos>`` first) -> ``(N, V)`` float32 log-probabilities of the
        next token, and the new states (None before the first token)."""
        h, states = self.body.step(self.embed(tokens), states)
        return self.out(self.norm(h)).float().log_softmax(-1), states


def save_lm(
    model: SRUppLM,
    tokenizer_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    fusion_weight: float | None = None,
    dtype: torch.dtype = torch.float32,
    lexicon: Path | None = None,
    lexicon_weight: float | None = None,
    length_penalty: float | None = None,
) -> Path:
    """Write an LM directory atomically (an existing LM or model directory at ``out_dir`` is replaced), its floating
    weights stored in ``dtype`` (loading casts them back); ``fusion_weight``, when given, is recorded as the weight
    to fuse it with by default (see :func:`read_fusion_weight`); ``lexicon``, a word list file, is copied in under
    its name, with ``lexicon_weight`` recorded when given; ``length_penalty``, when given, is recorded as the length
    penalty to decode with when it is fused."""
    tokenizer = Tokenizer(tokenizer_path)
    if tokenizer.vocab_size != model.vocab_size:
        raise UserError(f"{tokenizer_path}: tokenizer has {tokenizer.vocab_size} pieces, the LM {model.vocab_size}")
    weights = {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}
    weights = {k: v.to(dtype) if v.is_floating_point() else v for k, v in weights.items()}
    for key, value in weights.items():
        if not value.isfinite().all():
            raise UserError(f"{out_dir}: LM weight {key} is not finite in {dtype} (store it as float32)")
    config: dict[str, Any] = {"format_version": FORMAT_VERSION, "lm": dict(model.config)}
    if fusion_weight is not None:
        config[FUSION_WEIGHT_KEY] = check_fusion_weight(fusion_weight, f"{out_dir}: {FUSION_WEIGHT_KEY}")
    if lexicon is not None and lexicon_weight is not None:
        config[LEXICON_WEIGHT_KEY] = check_fusion_weight(lexicon_weight, f"{out_dir}: {LEXICON_WEIGHT_KEY}")
    if length_penalty is not None:
        config[LENGTH_PENALTY_KEY] = float(length_penalty)
    files = {lexicon.name: lexicon} if lexicon is not None else None
    return write_model_dir(out_dir, config, weights, tokenizer_path, files=files)


def load_lm(lm_dir: str | os.PathLike, device: str | torch.device = "cpu") -> tuple[SRUppLM, Tokenizer]:
    """The LM (eval mode, on ``device``) and tokenizer of an LM directory; reads no pickle."""
    lm_dir = Path(lm_dir)
    config_path, data = read_lm_config(lm_dir)
    tokenizer = None

    def check_tokenizer(skeleton: torch.nn.Module) -> None:
        nonlocal tokenizer
        tokenizer = read_tokenizer(lm_dir, skeleton.vocab_size, f"the LM {skeleton.vocab_size}", "an LM directory")

    model = build_with_weights(lambda: SRUppLM(**data["lm"]), config_path, lm_dir, "LM", check_tokenizer)
    return model.to(device).eval(), tokenizer
