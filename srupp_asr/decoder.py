"""The Transformer attention decoder, its label-smoothing loss, and the sos/eos target convention.

Token convention: one id, ``sos_eos_id``, both starts and ends a sequence; ``IGNORE_ID`` (-1)
pads targets. For a transcript ``y``::

    ys_in  = [sos] + y      (padded with eos: any real id will do, causality hides it)
    ys_out = y + [eos]      (padded with -1: ignored by the loss)

The decoder follows ESPnet's ``TransformerDecoder`` with pre-LayerNorm layers: scaled token
embedding plus sinusoidal positions; per layer, causal self-attention, cross-attention to the
encoder memory (its padded frames masked) and a ReLU feed-forward block, each as a residual
branch behind a LayerNorm; a final LayerNorm; a linear projection to the vocabulary.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from srupp_asr.checks import check_divides, check_probability, check_size
from srupp_asr.encoders import sequence_mask, sinusoidal_positions

IGNORE_ID = -1


def add_sos_eos(
    tokens: torch.Tensor, lens: torch.Tensor, sos_eos_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From ``tokens`` ``(B, U)`` (valid up to ``lens``) make ``(ys_in, ys_out, ys_lens)``, each ``(B, U + 1)``."""
    B, U = tokens.shape
    lens = lens.to(tokens.device)
    valid = sequence_mask(lens, U)
    ys_in = tokens.new_full((B, U + 1), sos_eos_id)
    ys_in[:, 1:] = torch.where(valid, tokens, sos_eos_id)
    ys_out = tokens.new_full((B, U + 1), IGNORE_ID)
    ys_out[:, :U] = torch.where(valid, tokens, IGNORE_ID)
    ys_out[torch.arange(B, device=tokens.device), lens] = sos_eos_id
    return ys_in, ys_out, lens + 1


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention; keys and values may have their own width."""

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0, kv_dim: int | None = None) -> None:
        super().__init__()
        check_divides("num_heads", num_heads, "d_model", check_size("d_model", d_model))
        kv_dim = d_model if kv_dim is None else kv_dim
        self.num_heads, self.dropout = num_heads, dropout
        self.wq = nn.Linear(d_model, d_model)
        self.wk = nn.Linear(kv_dim, d_model)
        self.wv = nn.Linear(kv_dim, d_model)
        self.wo = nn.Linear(d_model, d_model)

    def _split(self, t: torch.Tensor) -> torch.Tensor:  # (B, L, d) -> (B, heads, L, d / heads)
        B, _, d = t.shape
        return t.view(B, -1, self.num_heads, d // self.num_heads).transpose(1, 2)

    def project_kv(self, key_value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``key_value`` ``(B, Lk, kv_dim)``, each ``(B, heads, Lk, d / heads)``: computed once,
        they serve any number of :meth:`forward` calls (the encoder memory during a beam search)."""
        return self._split(self.wk(key_value)), self._split(self.wv(key_value))

    def forward(
        self,
        query: torch.Tensor,
        key_value: torch.Tensor | None,
        mask: torch.Tensor | None,
        kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``query`` ``(B, Lq, d)``, ``key_value`` ``(B, Lk, kv_dim)`` (or its :meth:`project_kv` as ``kv``),
        ``mask`` broadcastable to ``(B, 1, Lq, Lk)``, True where a query may attend. Returns ``(B, Lq, d)``."""
        B, Lq, d = query.shape
        q = self._split(self.wq(query))  # q first: the autograd graph (and a trained model) as before the kv option
        k, v = kv if kv is not None else self.project_kv(key_value)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        return self.wo(a.transpose(1, 2).reshape(B, Lq, d))


class DecoderLayer(nn.Module):
    """Pre-LayerNorm Transformer decoder layer: causal self-attention, cross-attention, feed-forward."""

    def __init__(self, d_model: int, num_heads: int, ffn_dim: int, dropout: float, memory_dim: int) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout, kv_dim=memory_dim)
        self.ffn = nn.Sequential(
            nn.Linear(d_model, ffn_dim), nn.ReLU(), nn.Dropout(dropout), nn.Linear(ffn_dim, d_model)
        )
        self.norm_self, self.norm_cross, self.norm_ffn = (nn.LayerNorm(d_model) for _ in range(3))
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        self_mask: torch.Tensor | None,
        memory: torch.Tensor | None,
        memory_mask: torch.Tensor,
        last_only: bool = False,
        memory_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``x`` ``(B, U, d)``; with ``last_only`` compute the output of the last position only ``(B, 1, d)``;
        ``memory_kv``: the cross-attention's keys and values of ``memory``, precomputed (then ``memory`` may be
        None)."""
        normed = self.norm_self(x)
        # Incremental decoding: the last position's query still sees every earlier key, so the
        # result equals the full pass while the earlier positions' outputs come from the cache.
        query, residual = (normed[:, -1:], x[:, -1:]) if last_only else (normed, x)
        h = residual + self.dropout(self.self_attn(query, normed, self_mask))
        h = h + self.dropout(self.cross_attn(self.norm_cross(h), memory, memory_mask, memory_kv))
        return h + self.dropout(self.ffn(self.norm_ffn(h)))


class TransformerDecoder(nn.Module):
    """Attention decoder over encoder memory; :meth:`forward` for training, :meth:`score_step` for search."""

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 256,
        num_layers: int = 6,
        num_heads: int = 4,
        ffn_dim: int = 2048,
        dropout: float = 0.1,
        memory_dim: int | None = None,
    ) -> None:
        super().__init__()
        check_size("num_layers", num_layers)
        check_divides("num_heads", num_heads, "d_model", check_size("d_model", d_model))
        check_size("ffn_dim", ffn_dim)
        check_probability("dropout", dropout)
        self.vocab_size, self.d_model = vocab_size, d_model
        self.memory_dim = d_model if memory_dim is None else memory_dim
        self.embed = nn.Embedding(vocab_size, d_model)
        self.embed_dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            DecoderLayer(d_model, num_heads, ffn_dim, dropout, self.memory_dim) for _ in range(num_layers)
        )
        self.final_norm = nn.LayerNorm(d_model)
        self.output = nn.Linear(d_model, vocab_size)

    def _embed(self, ys: torch.Tensor) -> torch.Tensor:
        # Scaled as in ESPnet so the embedding is not swamped by the unit-size positions.
        x = self.embed(ys) * math.sqrt(self.d_model)
        return self.embed_dropout(x + sinusoidal_positions(ys.shape[1], self.d_model, ys.device, x.dtype))

    def memory_kv(self, memory: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's cross-attention keys and values of ``memory`` ``(B, T, memory_dim)``, for :meth:`score_step`
        (index every tensor along dim 0 to pick or reorder rows)."""
        return [layer.cross_attn.project_kv(memory) for layer in self.layers]

    @staticmethod
    def _memory_mask(memory_lens: torch.Tensor, frames: int, device: torch.device) -> torch.Tensor:
        valid = sequence_mask(memory_lens.to(device), frames)
        # A memory with no frames would give NaN attention; let it attend everywhere instead.
        return (valid | ~valid.any(1, keepdim=True))[:, None, None, :]  # (B, 1, 1, T)

    def _layer_outputs(self, memory: torch.Tensor, memory_lens: torch.Tensor, ys: torch.Tensor) -> list[torch.Tensor]:
        """Every layer's output ``(B, U, d_model)`` at every position, causally."""
        U = ys.shape[1]
        causal = torch.ones(U, U, dtype=torch.bool, device=ys.device).tril()
        memory_mask = self._memory_mask(memory_lens, memory.shape[1], memory.device)
        x, outputs = self._embed(ys), []
        for layer in self.layers:
            x = layer(x, causal, memory, memory_mask)
            outputs.append(x)
        return outputs

    def forward(
        self,
        memory: torch.Tensor,
        memory_lens: torch.Tensor,
        ys_in: torch.Tensor,
        ys_in_lens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Teacher-forced logits ``(B, U, vocab)`` for ``ys_in`` ``(B, U)`` over ``memory`` ``(B, T, memory_dim)``.

        ``ys_in_lens`` is part of the interface but not needed: the causal mask already hides right
        padding from every real position, and the loss ignores the padded positions' logits.
        """
        return self.output(self.final_norm(self._layer_outputs(memory, memory_lens, ys_in)[-1]))

    def score_step(
        self,
        memory: torch.Tensor | None,
        memory_lens: torch.Tensor,
        ys: torch.Tensor,
        cache: list[torch.Tensor] | None = None,
        memory_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Log-probabilities ``(N, vocab)`` of the token after prefixes ``ys`` ``(N, u)``, and the new cache.

        ``cache`` is what the previous call returned for ``ys[:, :-1]``: per layer, that layer's
        outputs at the earlier positions, ``(N, u - 1, d_model)``; with it only the last position
        goes through the stack. ``None`` computes every position (the first step, or a forced
        prefix). ``memory_kv`` (:meth:`memory_kv` of each row's memory) saves projecting the memory
        again at every step; with it ``memory`` may be None. To reorder hypotheses, index every cache
        tensor along dim 0. Search under ``torch.inference_mode()``.
        """
        if memory_kv is None:
            if memory is None:
                raise ValueError("score_step needs the memory or its memory_kv")
            memory_kv = self.memory_kv(memory)
        frames, device = memory_kv[0][0].shape[2], ys.device
        memory_mask = self._memory_mask(memory_lens, frames, device)
        if cache is None:
            U = ys.shape[1]
            mask: torch.Tensor | None = torch.ones(U, U, dtype=torch.bool, device=device).tril()
            last_only = False
            layer_inputs = [None] * len(self.layers)
        else:
            if len(cache) != len(self.layers) or any(c.shape[1] != ys.shape[1] - 1 for c in cache):
                raise ValueError(
                    f"cache must hold {len(self.layers)} tensors of {ys.shape[1] - 1} positions for a prefix of "
                    f"{ys.shape[1]}, got {[tuple(c.shape) for c in cache]}"
                )
            mask, last_only = None, True  # the last query may attend to every position: no self-attention mask
            layer_inputs = cache
        x, new_cache = self._embed(ys), []
        for layer, past, kv in zip(self.layers, layer_inputs, memory_kv, strict=True):
            out = layer(x, mask, None, memory_mask, last_only=last_only, memory_kv=kv)
            x = out if past is None else torch.cat([past, out], 1)
            new_cache.append(x)
        return self.output(self.final_norm(new_cache[-1][:, -1])).log_softmax(-1), new_cache


class LabelSmoothingLoss(nn.Module):
    """KL divergence to a label-smoothed target, summed and divided by the batch size (or token count).

    The target distribution puts ``1 - smoothing`` on the true token and spreads ``smoothing``
    evenly over the other ``vocab_size - 1`` tokens (ESPnet's form); positions whose target is
    ``ignore_id`` count for nothing. With ``smoothing=0`` this is the cross entropy.
    """

    def __init__(
        self, vocab_size: int, smoothing: float = 0.1, ignore_id: int = IGNORE_ID, normalize_length: bool = False
    ) -> None:
        super().__init__()
        check_probability("smoothing", smoothing)
        self.vocab_size, self.smoothing = vocab_size, smoothing
        self.ignore_id, self.normalize_length = ignore_id, normalize_length

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """``logits`` ``(B, ..., vocab)`` and ``target`` ``(B, ...)``; returns the scalar loss."""
        if logits.shape[-1] != self.vocab_size or logits.shape[:-1] != target.shape:
            raise ValueError(
                f"logits {tuple(logits.shape)} and target {tuple(target.shape)} do not match vocab {self.vocab_size}"
            )
        keep = target != self.ignore_id
        logp = logits.float().log_softmax(-1)
        on, off = 1.0 - self.smoothing, self.smoothing / max(self.vocab_size - 1, 1)
        logp_target = logp.gather(-1, target.masked_fill(~keep, 0).unsqueeze(-1)).squeeze(-1)
        # KL(q || p) = sum_v q_v log q_v - sum_v q_v log p_v, with q's entropy term a constant;
        # written out, this never builds the (B, U, vocab) target distribution.
        neg_entropy = _xlogx(on) + (self.vocab_size - 1) * _xlogx(off)
        cross = -(on * logp_target + off * (logp.sum(-1) - logp_target))
        total = torch.where(keep, neg_entropy + cross, 0.0).sum()
        return total / (keep.sum().clamp(min=1) if self.normalize_length else target.shape[0])


def _xlogx(p: float) -> float:
    return p * math.log(p) if p > 0 else 0.0
