"""Lazily reordered key/value caches: the same caches as gathering the rows each step and concatenating."""

from __future__ import annotations

import pytest
import torch

from srupp_asr import kv_cache
from srupp_asr.sru import LayerState, SRUppLayer


def test_extend_and_reorder_give_what_eager_gathering_gives():
    # Random steps: each keeps some rows (repeats and drops included, the batch shrinking as utterances finish).
    torch.manual_seed(0)
    eager = lazy = None
    order = None
    rows_in_batch = 12
    for step in range(15):
        new = torch.randn(rows_in_batch, 2, 1, 4)
        eager = new if eager is None else torch.cat([eager, new], 2)
        with torch.no_grad():
            lazy = kv_cache.extend(lazy, order, new)
        torch.testing.assert_close(lazy, eager, rtol=0, atol=0)
        kept = max(1, rows_in_batch - (step % 3 == 2))  # sometimes one row fewer
        rows = torch.randint(0, rows_in_batch, (kept,))
        eager = eager.index_select(0, rows)
        order = kv_cache.reorder(None, rows)
        if step % 4 == 1:  # a second selection before the next step (the search dropping an utterance)
            again = torch.randint(0, kept, (kept,))
            eager, order = eager.index_select(0, again), kv_cache.reorder(order, again)
        rows_in_batch = kept


def test_extend_records_a_gradient_where_asked():
    past, new = torch.randn(3, 2, 5, 4, requires_grad=True), torch.randn(2, 2, 1, 4)
    out = kv_cache.extend(past, torch.tensor([2, 0]), new)
    out.sum().backward()
    assert past.grad[[0, 2]].eq(1).all() and past.grad[1].eq(0).all()


@pytest.mark.parametrize("attention", [True, False])
def test_a_causal_layer_steps_through_reordered_rows_as_if_it_had_run_them(attention):
    # Step a layer over 3 rows, reorder them (row 1 twice), step on: each row's output equals running its own history.
    torch.manual_seed(0)
    layer = SRUppLayer(16, attn_dim=8, num_heads=2, attention=attention, bidirectional=False, causal=True).eval()
    if attention:
        with torch.no_grad():
            layer.alpha.fill_(1.0)  # (0 at initialisation: the attention would not show)
    xs = torch.randn(4, 3, 16)
    with torch.no_grad():
        state = None
        for t in range(2):
            _, state = layer.step(xs[t], state)
        rows = torch.tensor([1, 1, 0])
        state = state.select(rows)
        assert isinstance(state, LayerState)
        outs = []
        for t in range(2, 4):
            h, state = layer.step(xs[t], state)
            outs.append(h)
        for i, r in enumerate(rows.tolist()):
            history = torch.cat([xs[:2, r], xs[2:, i]])[:, None]  # this row's inputs: its parent's, then its own
            full, _ = layer(history)
            torch.testing.assert_close(torch.stack(outs)[:, i], full[2:, 0], rtol=1e-5, atol=1e-5)
