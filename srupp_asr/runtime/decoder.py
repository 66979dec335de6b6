"""The attention decoder in numpy, without torch: :class:`TransformerDecoder` computes in float32 what
:class:`srupp_asr.decoder.TransformerDecoder` computes in a beam search, one output position at a time over a
key-value cache (as :class:`srupp_asr.decoding.scorers.DecoderScorer` drives it), so that ``transcribe`` on the CPU
runs without importing torch.

The self-attention cache of a layer is one array ``(t, N, 2, H, d_head)``: time first, so that gathering the rows a
search kept writes one contiguous block, and keys beside values, so that one gather moves both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from srupp_asr.checks import check_divides, check_keywords, check_probability, check_size
from srupp_asr.runtime.ops import StepCache, Weights, attention, layer_norm, linear, log_softmax


def sinusoidal_positions(length: int, dim: int, first: int = 0) -> np.ndarray:
    """Rows ``first .. length - 1`` ``(length - first, dim)`` of the sinusoidal position table of
    :func:`srupp_asr.encoders.sinusoidal_positions` (sines in even, cosines in odd columns), from the same float32
    frequencies and arguments; the exponential and the sines are rounded from float64, within an ulp of torch's."""
    steps = np.arange(0, dim, 2, dtype=np.float32) * np.float32(-math.log(10000.0) / dim)
    inv_freq = np.exp(steps.astype(np.float64)).astype(np.float32)
    angles = (np.arange(first, length, dtype=np.float32)[:, None] * inv_freq).astype(np.float64)
    table = np.empty((angles.shape[0], dim), dtype=np.float32)
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles[:, : dim // 2])
    return table


def _fortran(weight: np.ndarray) -> np.ndarray:
    """A linear layer's ``(out, in)`` weight stored transposed, so that :func:`~srupp_asr.runtime.ops.linear`'s
    ``x @ weight.T`` multiplies by a C-contiguous matrix (OpenBLAS: about 15% faster at these sizes)."""
    return np.asfortranarray(weight)


def _sizes(
    d_model: int = 256, num_layers: int = 6, num_heads: int = 4, ffn_dim: int = 2048, dropout: float = 0.1
) -> tuple[int, int, int, int]:
    """A ``decoder_conf``'s sizes, with the torch decoder's defaults and checks (dropout plays no part here)."""
    check_size("num_layers", num_layers)
    check_divides("num_heads", num_heads, "d_model", check_size("d_model", d_model))
    check_size("ffn_dim", ffn_dim)
    check_probability("dropout", dropout)
    return d_model, num_layers, num_heads, ffn_dim


@dataclass
class _Layer:
    """One pre-LayerNorm decoder layer's weights; the self-attention's query, key and value projections stacked into
    one ``(3 d, d)`` matrix (one product)."""

    norm_self: tuple[np.ndarray, np.ndarray]
    qkv: tuple[np.ndarray, np.ndarray]
    self_out: tuple[np.ndarray, np.ndarray]
    norm_cross: tuple[np.ndarray, np.ndarray]
    cross_q: tuple[np.ndarray, np.ndarray]
    cross_k: tuple[np.ndarray, np.ndarray]
    cross_v: tuple[np.ndarray, np.ndarray]
    cross_out: tuple[np.ndarray, np.ndarray]
    norm_ffn: tuple[np.ndarray, np.ndarray]
    ffn_in: tuple[np.ndarray, np.ndarray]
    ffn_out: tuple[np.ndarray, np.ndarray]

    @classmethod
    def take(cls, w: Weights, d: int, ffn_dim: int, memory_dim: int) -> _Layer:
        def lin(name: str, out: int, inp: int) -> tuple[np.ndarray, np.ndarray]:
            return _fortran(w.take(f"{name}.weight", (out, inp))), w.take(f"{name}.bias", (out,))

        def norm(name: str) -> tuple[np.ndarray, np.ndarray]:
            return w.take(f"{name}.weight", (d,)), w.take(f"{name}.bias", (d,))

        q, k, v = (lin(f"self_attn.w{p}", d, d) for p in "qkv")
        return cls(
            norm_self=norm("norm_self"),
            qkv=(_fortran(np.concatenate([q[0], k[0], v[0]])), np.concatenate([q[1], k[1], v[1]])),
            self_out=lin("self_attn.wo", d, d),
            norm_cross=norm("norm_cross"),
            cross_q=lin("cross_attn.wq", d, d),
            cross_k=lin("cross_attn.wk", d, memory_dim),
            cross_v=lin("cross_attn.wv", d, memory_dim),
            cross_out=lin("cross_attn.wo", d, d),
            norm_ffn=norm("norm_ffn"),
            ffn_in=lin("ffn.0", ffn_dim, d),
            ffn_out=lin("ffn.3", d, ffn_dim),
        )


class TransformerDecoder:
    """The attention decoder's inference: :meth:`memory_kv` once per utterance, then :meth:`step` per output
    position for all hypotheses at once."""

    def __init__(
        self,
        embed: np.ndarray,
        layers: list[_Layer],
        final_norm: tuple[np.ndarray, np.ndarray],
        output: tuple[np.ndarray, np.ndarray],
        num_heads: int,
    ) -> None:
        self.embed, self.layers, self.final_norm, self.output = embed, layers, final_norm, output
        self.vocab_size, self.d_model = embed.shape
        self.num_heads = num_heads
        self._embed_scale = np.float32(math.sqrt(self.d_model))

    @classmethod
    def from_config(
        cls, conf: dict[str, Any], vocab_size: int, memory_dim: int, weights: Weights
    ) -> TransformerDecoder:
        """The decoder a model's ``decoder_conf`` describes, from its weights (``weights.sub("decoder")``: every one
        taken and checked for its shape)."""
        check_keywords(_sizes, conf)
        d, num_layers, num_heads, ffn_dim = _sizes(**conf)
        embed = weights.take("embed.weight", (vocab_size, d))
        layers = [_Layer.take(weights.sub(f"layers.{i}"), d, ffn_dim, memory_dim) for i in range(num_layers)]
        final_norm = weights.take("final_norm.weight", (d,)), weights.take("final_norm.bias", (d,))
        output = _fortran(weights.take("output.weight", (vocab_size, d))), weights.take("output.bias", (vocab_size,))
        weights.check_all_taken()
        return cls(embed, layers, final_norm, output, num_heads)

    def _heads(self, x: np.ndarray, rows: int) -> np.ndarray:
        """``(rows * W, d)`` or ``(rows, W, d)`` -> ``(rows, heads, W, d_head)``."""
        return x.reshape(rows, -1, self.num_heads, self.d_model // self.num_heads).transpose(0, 2, 1, 3)

    def memory_kv(self, memory: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each layer's cross-attention keys and values of ``memory`` ``(B, T, memory_dim)``, each
        ``(B, heads, T, d_head)`` (index them along axis 0 to pick or reorder utterances)."""
        B = memory.shape[0]
        memory = np.asarray(memory, dtype=np.float32)
        return [
            (
                np.ascontiguousarray(self._heads(linear(memory, *layer.cross_k), B)),
                np.ascontiguousarray(self._heads(linear(memory, *layer.cross_v), B)),
            )
            for layer in self.layers
        ]

    def step(
        self,
        tokens: np.ndarray,
        position: int,
        memory_kv: list[tuple[np.ndarray, np.ndarray]],
        memory_bias: np.ndarray,
        cache: list[StepCache] | None,
        order: np.ndarray | None,
    ) -> tuple[np.ndarray, list[StepCache]]:
        """Log-probabilities ``(N, vocab)`` of the token after prefixes whose last token ``tokens`` ``(N,)`` stands
        at ``position``, and the cache with that position added.

        ``memory_kv`` (:meth:`memory_kv`, per layer ``(n, heads, T, d_head)``) and ``memory_bias``
        ``(n, 1, 1, T)`` (0 for a frame attended to, -inf not) are those of ``n`` groups of ``N / n``
        consecutive rows that share one memory. ``cache`` is what the previous step returned (None at the first
        position): per layer the self-attention keys and values of the earlier positions (a
        :class:`~srupp_asr.runtime.ops.StepCache` of ``(N', 2, heads, d_head)`` entries), whose rows ``order``
        ``(N,)`` are these rows' (None: all, in order)."""
        N, d, H = tokens.shape[0], self.d_model, self.num_heads
        n = memory_bias.shape[0]
        x = self.embed[tokens] * self._embed_scale
        x += sinusoidal_positions(position + 1, d, position)
        new_cache = []
        for i, layer in enumerate(self.layers):
            qkv = linear(layer_norm(x, *layer.norm_self), *layer.qkv)
            entry = qkv[:, d:].reshape(N, 2, H, d // H)
            if cache is None:
                layer_cache = StepCache.start(entry)
            else:
                layer_cache = (cache[i] if order is None else cache[i].select(order)).append(entry)
            new_cache.append(layer_cache)
            a = layer_cache.attend(qkv[:, :d].reshape(N, H, 1, d // H))
            h = x + linear(a.reshape(N, d), *layer.self_out)
            q = self._heads(linear(layer_norm(h, *layer.norm_cross), *layer.cross_q), n)  # (n, H, N / n, d_head)
            a = attention(q, *memory_kv[i], memory_bias).transpose(0, 2, 1, 3)
            h += linear(a.reshape(N, d), *layer.cross_out)
            inner = linear(layer_norm(h, *layer.norm_ffn), *layer.ffn_in)
            np.maximum(inner, 0.0, out=inner)
            x = h + linear(inner, *layer.ffn_out)
        return log_softmax(linear(layer_norm(x, *self.final_norm), *self.output)), new_cache
