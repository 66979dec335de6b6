"""The SRU++ layer and encoder in numpy (float32): what :mod:`srupp_asr.sru` and :mod:`srupp_asr.recurrence`
compute, without torch. One layer, ``x`` the ``(L, B, D)`` input (the derivation: :mod:`srupp_asr.sru`)::

    Q = Wq x;  A = MultiHead-softmax(Q (Wk Q)^T / sqrt(d_head)) (Wv Q)  (padded keys masked, or causal)
    U = Wo layernorm(Q + alpha * A)                                     (Q alone in a layer without attention)
    f[t] = sigmoid(U[t,0] + v  * c[t-1] + b)
    r[t] = sigmoid(U[t,1] + v' * c[t-1] + b')
    c[t] = f[t] * c[t-1] + (1 - f[t]) * U[t,2]
    h[t] = r[t] * c[t]   + (1 - r[t]) * x[t]

A bidirectional layer runs the first half of the columns forward in time and the second half backward; a padded
step (mask False) keeps ``c`` and emits ``h = 0``.

The recurrence is a Python loop over time, so each step is kept to a few whole-array operations: the gates' input
parts of every step are computed before the loop, in a layout where step ``t`` of both directions (the backward
half at ``L-1-t``) is one contiguous block; ``sigmoid(a) = (1 + tanh(a / 2)) / 2`` with the halving folded into
the weights; a padded step is made a no-op in the precomputed gates (``f = 1``, candidate 0). The outputs ``h`` are
computed :data:`HIGHWAY_STEPS` steps at a time, while those steps' ``c`` and ``r`` are in the cache; a padded step's
is zeroed at the end.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from srupp_asr.checks import (
    ConfigValueError,
    check_divides,
    check_even_size,
    check_int,
    check_keywords,
    check_number,
    check_probability,
    check_size,
)
from srupp_asr.runtime.ops import StepCache, Weights, attention, layer_norm, linear, mask_bias

_GATE_SCALE = (np.float32(0.5), np.float32(0.5), np.float32(1.0))  # Wo's gates f and r halved (see SRUppLayer)
HIGHWAY_STEPS = 16  # steps of the recurrence between computing their outputs h (a chunk that stays in the cache)
# The torch encoder's options that only training reads: dropout, and highway_bias (a bias's initial value).
TRAINING_OPTIONS = frozenset({"dropout", "attn_dropout", "highway_bias"})


class LayerState(NamedTuple):
    """What a causal layer carries between steps, as :class:`srupp_asr.sru.LayerState`: ``c`` ``(B, D)`` and, in
    an attention layer, the keys and values so far (a :class:`~srupp_asr.runtime.ops.StepCache` of ``(B, 2, heads,
    d_head)`` entries)."""

    c: np.ndarray
    cache: StepCache | None

    def select(self, rows: np.ndarray) -> LayerState:
        """The states of batch rows ``rows``, in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        return LayerState(self.c[rows], None if self.cache is None else self.cache.select(rows))


class SRUppLayer:
    """One SRU++ layer over time-major input ``(L, B, D)`` (:class:`srupp_asr.sru.SRUppLayer` in eval mode)."""

    def __init__(
        self,
        weights: Weights,
        d_model: int,
        attn_dim: int,
        num_heads: int = 1,
        attention: bool = True,
        bidirectional: bool = True,
        causal: bool = False,
    ) -> None:
        D = d_model
        self.d_model, self.attn_dim, self.num_heads = d_model, attn_dim, num_heads
        self.attention, self.bidirectional, self.causal = attention, bidirectional, causal
        self.dirs = 2 if bidirectional else 1
        nd, hd = self.dirs, D // self.dirs
        # A layer run over whole sequences (the encoder's) keeps its two large matrices as stored (float16 in the
        # built-in model: 17 MB less) and casts them at each call, a fraction of a millisecond beside the layer's
        # work; a layer run a step at a time (the LM's) casts them once here.
        at_rest = not causal
        self.wq = weights.take("wq.weight", (attn_dim, D), keep_float16=at_rest)
        if attention:
            self.wk = weights.take("wk.weight", (attn_dim, attn_dim))
            self.wv = weights.take("wv.weight", (attn_dim, attn_dim))
            self.alpha = weights.take("alpha", (1,))[0]
        self.norm = weights.take("norm.weight", (attn_dim,)), weights.take("norm.bias", (attn_dim,))
        # Wo's rows are (column d, gate k) = 3d + k: split by gate and direction, the f and r parts halved (exact: a
        # power of two, done as they are cast to float32), as are their biases and recurrent weights.
        wo = weights.take("wo.weight", (3 * D, attn_dim), keep_float16=at_rest)
        wo = wo.reshape(nd, hd, 3, attn_dim).transpose(2, 0, 3, 1)
        self._wo = [[np.ascontiguousarray(w) for w in gate] for gate in wo]  # [gate][direction]: (d', hd)
        self._wo32 = None
        if not at_rest:
            self._wo32 = self._gate_weights()
        self.wc = (0.5 * weights.take("weight_c", (2, D))).reshape(2, 1, nd, hd)
        self.bias = (0.5 * weights.take("bias", (2, D))).reshape(2, 1, nd, hd)

    def _gate_weights(self) -> list[list[np.ndarray]]:
        """Wo as float32 ``[gate][direction]`` ``(d', hd)`` matrices, the f and r gates' halved."""
        if self._wo32 is not None:
            return self._wo32
        return [[np.multiply(w, _GATE_SCALE[k], dtype=np.float32) for w in gate] for k, gate in enumerate(self._wo)]

    def forward(self, x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """``x`` ``(L, B, D)``; ``mask`` ``(L, B)`` bool, True on real steps (None: none padded) -> ``h``."""
        q = linear(x, self.wq.astype(np.float32, copy=False))
        if self.attention:
            q = q + self.alpha * self._attend(q, self._attention_bias(mask, x.shape[0]))
        return self._recurrence(layer_norm(q, *self.norm), x, mask, None)[0]

    def _attention_bias(self, mask: np.ndarray | None, L: int) -> np.ndarray | None:
        if self.causal:  # padding is on the right: the causal mask suffices
            return mask_bias(np.tril(np.ones((L, L), bool)))
        if mask is None:
            return None
        keys = mask | ~mask.any(0, keepdims=True)  # a sequence with no real step attends everywhere
        return mask_bias(keys.T)[:, None, None, :]

    def _attend(self, q: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
        L, B, _ = q.shape
        heads, dh = self.num_heads, self.attn_dim // self.num_heads

        def split(t: np.ndarray) -> np.ndarray:  # (L, B, d') -> (B, heads, L, dh)
            return t.reshape(L, B, heads, dh).transpose(1, 2, 0, 3)

        a = attention(split(q), split(linear(q, self.wk)), split(linear(q, self.wv)), bias)
        return a.transpose(2, 0, 1, 3).reshape(L, B, self.attn_dim)

    def _recurrence(
        self, y: np.ndarray, x: np.ndarray, mask: np.ndarray | None, c: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(h, c_last)`` of the recurrence over ``U = Wo y`` with highway input ``x``, from state ``c`` (None:
        zeros)."""
        L, B, D = x.shape
        nd, hd = self.dirs, D // self.dirs
        # u[gate, t, b, direction]: step t of the backward direction is time L-1-t.
        u = np.empty((3, L, B, nd, hd), np.float32)
        rows = [y.reshape(L * B, -1)] + ([y[::-1].reshape(L * B, -1)] if nd == 2 else [])  # in each direction's order
        wo = self._gate_weights()
        for k in range(3):
            for s in range(nd):
                np.matmul(rows[s], wo[k][s], out=u[k, :, :, s].reshape(L * B, hd))
        if mask is not None:
            padded = ~np.stack([mask, mask[::-1]][:nd], -1)  # (L, B, nd)
            u[0][padded] = np.inf  # f = 1 (tanh(inf) = 1 exactly) and candidate 0: c[t] = c[t-1] exactly
            u[2][padded] = 0.0
        c = np.zeros((B, nd, hd), np.float32) if c is None else c.reshape(B, nd, hd)
        product = np.empty((2, B, nd, hd), np.float32)
        tmp = np.empty((B, nd, hd), np.float32)
        h = np.empty_like(x)
        for t in range(L):  # in place: u[0, t], u[1, t] become f and r, u[2, t] becomes c[t]
            gates, c_new = u[:2, t], u[2, t]
            np.multiply(self.wc, c, out=product)
            gates += product
            gates += self.bias
            np.tanh(gates, out=gates)
            gates *= 0.5
            gates += 0.5
            np.subtract(c, c_new, out=tmp)
            tmp *= gates[0]
            c_new += tmp
            c = c_new
            if (t + 1) % HIGHWAY_STEPS == 0 or t == L - 1:  # while the chunk's c and r are in the cache
                _highway(u, x, h, t - t % HIGHWAY_STEPS, t + 1)
        if mask is not None:
            h[~mask] = 0.0
        return h, c.reshape(B, D)

    def step(self, x: np.ndarray, state: LayerState | None = None) -> tuple[np.ndarray, LayerState]:
        """One time step of a causal layer: ``x`` ``(B, D)`` and the state after the previous steps (None before the
        first) -> ``(h (B, D), new state)``, the ``h`` :meth:`forward` gives at that step."""
        if not self.causal:
            raise RuntimeError("step() needs a causal layer (causal=True)")
        B, _ = x.shape
        q = linear(x, self.wq)  # (float32: a causal layer casts its weights once)
        cache = None
        if self.attention:
            heads, dh = self.num_heads, self.attn_dim // self.num_heads
            entry = np.stack([linear(q, self.wk), linear(q, self.wv)], 1).reshape(B, 2, heads, dh)
            cache = StepCache.start(entry) if state is None or state.cache is None else state.cache.append(entry)
            q = q + self.alpha * cache.attend(q.reshape(B, heads, 1, dh)).reshape(B, self.attn_dim)
        h, c = self._recurrence(layer_norm(q, *self.norm)[None], x[None], None, None if state is None else state.c)
        return h[0], LayerState(c, cache)


def _highway(u: np.ndarray, x: np.ndarray, h: np.ndarray, start: int, stop: int) -> None:
    """``h = x + r * (c - x)`` of steps ``[start, stop)`` from :meth:`SRUppLayer._recurrence`'s ``u`` (r in ``u[1]``,
    c in ``u[2]``; the backward direction's step t is time L-1-t)."""
    L, nd, hd = x.shape[0], u.shape[3], u.shape[4]
    for s in range(nd):
        cols = slice(s * hd, (s + 1) * hd)
        times = slice(start, stop) if s == 0 else slice(L - 1 - start, L - 1 - stop if stop < L else None, -1)
        xs, hs = x[times, :, cols], h[times, :, cols]
        np.subtract(u[2, start:stop, :, s], xs, out=hs)
        hs *= u[1, start:stop, :, s]
        hs += xs


def attention_layers(num_layers: int, attn_every: int) -> list[int]:
    """1-based indices of the layers with attention: every ``attn_every``-th, counted from the top.

    ``attn_every=1`` puts attention in every layer, ``0`` in none. With 10 layers and
    ``attn_every=5`` the attention layers are 5 and 10.
    """
    if attn_every <= 0:
        return []
    return [i for i in range(1, num_layers + 1) if (num_layers - i) % attn_every == 0]


def check_layer_options(
    d_model: int,
    attn_dim: int,
    num_heads: int,
    attention: bool,
    bidirectional: bool,
    dropout: float,
    attn_dropout: float,
    highway_bias: float,
    causal: bool,
) -> None:
    """A ConfigValueError naming the first of an SRU++ layer's arguments out of range (both engines' layers;
    the numpy one passes the training-only ones at their defaults)."""
    if causal and bidirectional:
        raise ConfigValueError("causal", "needs bidirectional: false (a causal layer is unidirectional)")
    if bidirectional:
        check_even_size("d_model", d_model, "a bidirectional layer has half of it per direction")
    else:
        check_size("d_model", d_model)
    check_size("attn_dim", attn_dim)
    if attention:
        check_divides("num_heads", num_heads, "attn_dim", attn_dim)
    check_probability("dropout", dropout)
    check_probability("attn_dropout", attn_dropout)
    check_number("highway_bias", highway_bias)


class SRUppEncoder:
    """A stack of SRU++ layers over batch-first ``(B, T, input_size)`` with lengths
    (:class:`srupp_asr.sru.SRUppEncoder` in eval mode); an option out of range is a ConfigValueError naming it."""

    def __init__(
        self,
        weights: Weights,
        input_size: int,
        d_model: int = 512,
        num_layers: int = 10,
        attn_dim: int = 128,
        num_heads: int = 1,
        attn_every: int = 1,
        bidirectional: bool = True,
        causal: bool = False,
    ) -> None:
        check_size("num_layers", num_layers)
        check_int("attn_every", attn_every, minimum=0)
        with_attention = set(attention_layers(num_layers, attn_every))
        # As the torch encoder checks them (dropout and highway_bias: training's, at their defaults).
        check_layer_options(d_model, attn_dim, num_heads, bool(with_attention), bidirectional, 0.0, 0.0, -2.0, causal)
        self.input_size, self.d_model, self.output_size = input_size, d_model, d_model
        self.input_proj = None
        if input_size != d_model:
            self.input_proj = (
                weights.take("input_proj.weight", (d_model, input_size)),
                weights.take("input_proj.bias", (d_model,)),
            )
        self.layers = [
            SRUppLayer(
                weights.sub(f"layers.{i - 1}"),
                d_model,
                attn_dim,
                num_heads,
                attention=i in with_attention,
                bidirectional=bidirectional,
                causal=causal,
            )
            for i in range(1, num_layers + 1)
        ]

    @classmethod
    def from_config(cls, weights: Weights, input_size: int, options: Mapping[str, Any]) -> SRUppEncoder:
        """The encoder :class:`srupp_asr.sru.SRUppEncoder` builds from keyword arguments ``options`` (the
        :data:`TRAINING_OPTIONS` ignored); an option it does not take is a ConfigValueError naming it."""
        options = {k: v for k, v in options.items() if k not in TRAINING_OPTIONS}
        check_keywords(cls, options, internal=("weights", "input_size"))
        return cls(weights, input_size, **options)

    def _project(self, x: np.ndarray) -> np.ndarray:
        return x if self.input_proj is None else linear(x, *self.input_proj)

    def forward(self, x: np.ndarray, lengths: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``x`` ``(B, T, input_size)``, ``lengths`` ``(B,)`` valid frames -> ``(out (B, T, d_model), lengths)``,
        zeros on padded frames."""
        B, T, _ = x.shape
        h = self._project(np.ascontiguousarray(x.transpose(1, 0, 2), dtype=np.float32))
        mask = None
        if lengths is None:
            lengths = np.full(B, T, np.int64)
        elif (np.asarray(lengths) < T).any():
            mask = np.arange(T)[:, None] < np.asarray(lengths)[None, :]
            h = h * mask[..., None]
        for layer in self.layers:
            h = layer.forward(h, mask)
        return np.ascontiguousarray(h.transpose(1, 0, 2)), np.asarray(lengths, dtype=np.int64)

    def step(self, x: np.ndarray, states: list[LayerState] | None = None) -> tuple[np.ndarray, list[LayerState]]:
        """One time step of a causal encoder: ``x`` ``(B, input_size)`` and the layers' states (None before the
        first step) -> ``(out (B, d_model), new states)``."""
        h = self._project(np.asarray(x, dtype=np.float32))
        new_states = []
        for i, layer in enumerate(self.layers):
            h, state = layer.step(h, None if states is None else states[i])
            new_states.append(state)
        return h, new_states
