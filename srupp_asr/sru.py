"""The SRU++ layer and the SRU++ encoder (a stack of layers, attention in some of them).

One layer, with x the ``(L, B, D)`` input, ``d'`` the attention dimension (docs/design.md, "The SRU++ encoder")::

    Q = Wq x                                    (D -> d')
    K = Wk Q,  V = Wv Q                         (d' -> d'; keys and values come from Q)
    A = MultiHead-softmax(Q K^T / sqrt(d_head)) V, padded keys masked
    U = Wo layernorm(Q + alpha * A)             (d' -> 3D; alpha a learned scalar, starts at 0)
    h, c = recurrence(U, x)                     (srupp_asr.recurrence)

A layer without attention computes ``U = Wo layernorm(Wq x)``. Bidirectional layers run half
of the D columns forward and half backward in time, sharing the attention. There are no
positional encodings: the recurrence provides order. A *causal* layer (unidirectional only: the SRU++
language model of the seeds) lets step t attend to steps <= t, and :meth:`SRUppLayer.step` then runs it one
step at a time with a cache of its keys and values, giving the same outputs as the whole-sequence forward.

Parameters of one layer (no biases in Wq, Wk, Wv, Wo)::

    D*d' (Wq) + 2*d' (layernorm) + 3*D*d' (Wo) + 4*D (v, v', b, b')
    + 2*d'^2 + 1 (Wk, Wv, alpha)                 in attention layers only
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from srupp_asr import kv_cache
from srupp_asr.checks import (
    check_int,
    check_size,
)
from srupp_asr.recurrence import sru_recurrence
from srupp_asr.runtime.sru import attention_layers, check_layer_options  # torch-free, shared with the numpy twin


class SRUppLayer(nn.Module):
    """One SRU++ layer over time-major input ``(L, B, D)``."""

    def __init__(
        self,
        d_model: int,
        attn_dim: int,
        num_heads: int = 1,
        attention: bool = True,
        bidirectional: bool = True,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        highway_bias: float = -2.0,
        causal: bool = False,
    ) -> None:
        super().__init__()
        check_layer_options(
            d_model, attn_dim, num_heads, attention, bidirectional, dropout, attn_dropout, highway_bias, causal
        )
        self.d_model, self.attn_dim, self.num_heads = d_model, attn_dim, num_heads
        self.attention, self.bidirectional, self.causal = attention, bidirectional, causal
        self.highway_bias = highway_bias
        self.attn_dropout = attn_dropout
        self.wq = nn.Linear(d_model, attn_dim, bias=False)
        if attention:
            self.wk = nn.Linear(attn_dim, attn_dim, bias=False)
            self.wv = nn.Linear(attn_dim, attn_dim, bias=False)
            self.alpha = nn.Parameter(torch.zeros(1))
        self.norm = nn.LayerNorm(attn_dim)
        self.wo = nn.Linear(attn_dim, 3 * d_model, bias=False)
        self.weight_c = nn.Parameter(torch.empty(2, d_model))
        self.bias = nn.Parameter(torch.empty(2, d_model))
        self.dropout = nn.Dropout(dropout)
        self.reset_recurrence_parameters()

    def reset_recurrence_parameters(self) -> None:
        """Small recurrent weights; forget bias 0; highway (reset) bias negative, so that a new
        layer starts close to passing its input through."""
        nn.init.uniform_(self.weight_c, -0.5, 0.5)
        with torch.no_grad():
            self.bias[0].zero_()
            self.bias[1].fill_(self.highway_bias)

    @staticmethod
    def num_params(d_model: int, attn_dim: int, attention: bool) -> int:
        """Parameter count of one layer by the formula in the module docstring."""
        n = d_model * attn_dim + 2 * attn_dim + 3 * d_model * attn_dim + 4 * d_model
        return n + (2 * attn_dim * attn_dim + 1 if attention else 0)

    def extra_repr(self) -> str:
        n = self.num_params(self.d_model, self.attn_dim, self.attention)
        kind = "causal" if self.causal else f"bidirectional={self.bidirectional}"
        return f"attention={self.attention}, heads={self.num_heads}, {kind}, params={n:,}"

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
        c0: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x``: ``(L, B, D)``; ``mask``: ``(L, B)`` bool, True on real steps. Returns ``(h, c_last)``.
        ``key_mask``: :func:`attention_key_mask` of ``mask``, when the caller made it once for several layers."""
        L, B, D = x.shape
        q = self.wq(x)
        z = q + self.alpha * self._attend(q, mask, key_mask) if self.attention else q
        u = self.wo(self.norm(z)).view(L, B, D, 3)
        # Under torch.compile the recurrence (a custom autograd Function launching its own kernels) runs eagerly,
        # between the compiled graphs.
        recurrence = _eager_recurrence if torch.compiler.is_compiling() else sru_recurrence
        h, c = recurrence(u, x, self.weight_c, self.bias, c0, mask, self.bidirectional)
        return self.dropout(h), c

    def _attend(self, q: torch.Tensor, mask: torch.Tensor | None, key_mask: torch.Tensor | None) -> torch.Tensor:
        L, B, _ = q.shape
        heads, dh = self.num_heads, self.attn_dim // self.num_heads

        def split(t: torch.Tensor) -> torch.Tensor:  # (L, B, d') -> (B, heads, L, dh)
            return t.view(L, B, heads, dh).permute(1, 2, 0, 3)

        k, v = self.wk(q), self.wv(q)
        if self.causal:
            # Padding is on the right: a real step never sees a padded key before it, so the causal mask suffices.
            a = F.scaled_dot_product_attention(
                split(q), split(k), split(v), is_causal=True, dropout_p=self.attn_dropout if self.training else 0.0
            )
            return a.permute(2, 0, 1, 3).reshape(L, B, self.attn_dim)
        if key_mask is None and mask is not None:
            key_mask = attention_key_mask(mask)
        a = F.scaled_dot_product_attention(
            split(q), split(k), split(v), attn_mask=key_mask, dropout_p=self.attn_dropout if self.training else 0.0
        )
        return a.permute(2, 0, 1, 3).reshape(L, B, self.attn_dim)

    def step(self, x: torch.Tensor, state: LayerState | None = None) -> tuple[torch.Tensor, LayerState]:
        """One time step of a causal layer: ``x`` ``(B, D)`` and the state after the previous steps (None before the
        first) -> ``(h (B, D), new state)``; the same ``h`` as :meth:`forward` gives at that step."""
        if not self.causal:
            raise RuntimeError("step() needs a causal layer (causal=True)")
        B, D = x.shape
        q = self.wq(x)  # (B, d')
        keys = values = None
        if self.attention:
            heads, dh = self.num_heads, self.attn_dim // self.num_heads
            k, v = self.wk(q).view(B, heads, 1, dh), self.wv(q).view(B, heads, 1, dh)
            past_k, past_v, order = (None, None, None) if state is None else (state.keys, state.values, state.order)
            keys, values = kv_cache.extend(past_k, order, k), kv_cache.extend(past_v, order, v)
            a = F.scaled_dot_product_attention(q.view(B, heads, 1, dh), keys, values)
            q = q + self.alpha * a.reshape(B, self.attn_dim)
        u = self.wo(self.norm(q)).view(1, B, D, 3)
        h, c = sru_recurrence(u, x[None], self.weight_c, self.bias, None if state is None else state.c)
        return h[0], LayerState(c, keys, values)


# torch.compiler.disable would import torch._dynamo (1.5 s, sympy and triton) when this module is imported, for
# inference too; torch's own lazy form imports it at the first call, which only a compiled graph makes.
_eager_recurrence = torch._disable_dynamo(sru_recurrence)


def attention_key_mask(mask: torch.Tensor) -> torch.Tensor:
    """The ``(B, 1, 1, L)`` key mask of a non-causal attention layer from the ``(L, B)`` step mask (True = real).

    A sequence with no real step attends everywhere instead of producing NaN; its outputs are discarded by the
    recurrence anyway. Contiguous: the fused (memory-efficient, cuDNN) attention kernels need the mask's last
    dimension to have stride 1; a transposed view of the ``(L, B)`` mask sends SDPA to its math fallback."""
    return (mask | ~mask.any(0, keepdim=True)).t().contiguous()[:, None, None, :]


class LayerState(NamedTuple):
    """What a causal :class:`SRUppLayer` carries between steps: the recurrent state ``c`` ``(B, D)`` and, in an
    attention layer, the keys and values of every step so far ``(B', heads, t, d_head)`` (None otherwise), whose
    rows ``order`` ``(B,)`` are the batch's (None: all of them, in order; see :mod:`srupp_asr.kv_cache`)."""

    c: torch.Tensor
    keys: torch.Tensor | None
    values: torch.Tensor | None
    order: torch.Tensor | None = None

    def select(self, rows: torch.Tensor) -> LayerState:
        """The states of batch rows ``rows``, in that order (the keys and values gathered at the next step)."""
        c = self.c.index_select(0, rows)
        if self.keys is None:
            return LayerState(c, None, None)
        return LayerState(c, self.keys, self.values, kv_cache.reorder(self.order, rows))


class SRUppEncoder(nn.Module):
    """A stack of SRU++ layers over batch-first features ``(B, T, input_size)`` with lengths."""

    def __init__(
        self,
        input_size: int,
        d_model: int = 512,
        num_layers: int = 10,
        attn_dim: int = 128,
        num_heads: int = 1,
        attn_every: int = 1,
        bidirectional: bool = True,
        dropout: float = 0.1,
        attn_dropout: float = 0.1,
        highway_bias: float = -2.0,
        causal: bool = False,
    ) -> None:
        super().__init__()
        check_size("num_layers", num_layers)
        check_int("attn_every", attn_every, minimum=0)
        with_attention = set(attention_layers(num_layers, attn_every))
        # Before anything is built (each layer checks its own again).
        options = (dropout, attn_dropout, highway_bias, causal)
        check_layer_options(d_model, attn_dim, num_heads, bool(with_attention), bidirectional, *options)
        self.input_size, self.d_model = input_size, d_model
        self.output_size = d_model
        self.input_proj = nn.Linear(input_size, d_model) if input_size != d_model else nn.Identity()
        self.layers = nn.ModuleList(
            SRUppLayer(
                d_model,
                attn_dim,
                num_heads,
                attention=i in with_attention,
                bidirectional=bidirectional,
                dropout=dropout,
                attn_dropout=attn_dropout,
                highway_bias=highway_bias,
                causal=causal,
            )
            for i in range(1, num_layers + 1)
        )

    @staticmethod
    def num_params(input_size: int, d_model: int, num_layers: int, attn_dim: int, attn_every: int) -> int:
        """Parameter count of the encoder: input projection (if any) plus every layer's formula."""
        with_attention = set(attention_layers(num_layers, attn_every))
        proj = 0 if input_size == d_model else input_size * d_model + d_model
        return proj + sum(
            SRUppLayer.num_params(d_model, attn_dim, i in with_attention) for i in range(1, num_layers + 1)
        )

    def extra_repr(self) -> str:
        n = sum(p.numel() for p in self.parameters())
        return f"input_size={self.input_size}, d_model={self.d_model}, layers={len(self.layers)}, params={n:,}"

    def forward(
        self, x: torch.Tensor, lengths: torch.Tensor | None = None, padded: bool | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x``: ``(B, T, input_size)``; ``lengths``: ``(B,)`` valid frames. Returns ``(out, lengths)``,
        ``out`` of shape ``(B, T, d_model)`` with zeros on padded frames. ``padded``: whether some length is below
        ``T``, when the caller knows (True is always correct; the masks then cost a little where none is needed);
        None reads the lengths to learn it."""
        B, T, _ = x.shape
        h = self.input_proj(x).transpose(0, 1)
        if lengths is None:
            padded = False
        elif padded is None:
            # Read on the host: free for host lengths (a training batch's, see ASRModel.encode, or a CPU run);
            # lengths on an accelerator make the host wait for this one value.
            padded = bool((lengths < T).any())
        host = lengths is not None and lengths.device.type == "cpu"
        mask = key_mask = None  # nothing padded: the kernels skip the mask
        if padded:
            # Built once per batch and shared by every layer (a host tensor is copied without blocking).
            mask = torch.arange(T, device=x.device)[:, None] < lengths.to(x.device, non_blocking=host)[None, :]
            h = h * mask[..., None]
            if any(layer.attention and not layer.causal for layer in self.layers):
                key_mask = attention_key_mask(mask)
        for layer in self.layers:
            h, _ = layer(h, mask, key_mask=key_mask)
        if lengths is None:
            lengths = torch.full((B,), T, dtype=torch.long, device=x.device)
        return h.transpose(0, 1), lengths

    def step(self, x: torch.Tensor, states: list[LayerState] | None = None) -> tuple[torch.Tensor, list[LayerState]]:
        """One time step of a causal encoder: ``x`` ``(B, input_size)`` and the layers' states (None before the
        first step) -> ``(out (B, d_model), new states)``."""
        h = self.input_proj(x)
        new_states = []
        for i, layer in enumerate(self.layers):
            h, state = layer.step(h, None if states is None else states[i])
            new_states.append(state)
        return h, new_states
