"""srupp_asr.runtime.ops: the step cache against the plain one (a reordered copy of the whole cache every step),
and the numpy building blocks against torch's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from srupp_asr.runtime import ops
from srupp_asr.runtime.ops import StepCache, Weights, WeightsError, attention, layer_norm, linear, log_softmax


def test_the_step_cache_holds_what_reordering_a_copy_every_step_holds():
    rng = np.random.default_rng(0)
    rows = 12
    entry = rng.standard_normal((rows, 2, 3)).astype(np.float32)
    cache, plain = StepCache.start(entry), entry[None]
    for step in range(1, 40):  # past two blocks
        if step % 7 == 0:  # rows dropped (an utterance done)
            rows -= 2
        order = rng.integers(0, plain.shape[1], rows)  # reordered, with repeats
        cache, plain = cache.select(order), plain[:, order]
        entry = rng.standard_normal((rows, 2, 3)).astype(np.float32)
        cache, plain = cache.append(entry), np.concatenate([plain, entry[None]])
        np.testing.assert_array_equal(cache.gather(), plain)
        assert cache.steps == step + 1


def test_the_step_cache_keeps_only_the_entries_its_rows_still_reach():
    rows, dims = 10, (2, 4)
    cache = StepCache.start(np.zeros((rows, *dims), np.float32))
    plain = cache.gather()
    for step in range(1, 3 * StepCache.BLOCK + 1):
        order = np.zeros(rows, np.int64) if step <= 2 * StepCache.BLOCK else np.arange(rows)  # all from row 0
        entry = np.full((rows, *dims), step, np.float32) + np.arange(rows, dtype=np.float32)[:, None, None]
        cache, plain = cache.select(order).append(entry), np.concatenate([plain[:, order], entry[None]])
        np.testing.assert_array_equal(cache.gather(), plain)
    # the first two blocks: one reachable row a step (all rows descend from row 0), the last ones whole
    assert cache.entries == 2 * StepCache.BLOCK + 2 * StepCache.BLOCK * rows


@pytest.mark.parametrize("chunk_bytes", [StepCache.CHUNK_BYTES, 7000, 1])  # one gather; 2 blocks; 1
def test_attending_over_the_step_cache_is_attention_over_its_gathered_keys_and_values(monkeypatch, chunk_bytes):
    monkeypatch.setattr(StepCache, "CHUNK_BYTES", chunk_bytes)
    rng = np.random.default_rng(2)
    rows, heads, d_head = 6, 2, 4
    cache = StepCache.start(rng.standard_normal((rows, 2, heads, d_head)).astype(np.float32))
    for step in range(1, 3 * StepCache.BLOCK + 5):
        cache = cache.select(rng.integers(0, rows, rows)).append(
            rng.standard_normal((rows, 2, heads, d_head)).astype(np.float32)
        )
        q = rng.standard_normal((rows, heads, 1, d_head)).astype(np.float32)
        kv = cache.gather()
        want = attention(q, kv[:, :, 0].transpose(1, 2, 0, 3), kv[:, :, 1].transpose(1, 2, 0, 3))
        np.testing.assert_allclose(cache.attend(q), want, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(cache.gather(step // 2, None, 1), kv[step // 2 :, :, 1])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_in_blocks_of_queries_is_attention_at_once(monkeypatch, causal, threads):
    monkeypatch.setattr(ops, "cpu_threads", lambda: threads)  # blocks one after the other, or on two threads
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 3, 11, 4)).astype(np.float32) for _ in range(3))
    if causal:
        bias = np.where(np.tril(np.ones((11, 11), bool)), np.float32(0), np.float32(-np.inf))
    else:
        bias = np.where(np.arange(11) < np.array([[11], [6]]), np.float32(0), np.float32(-np.inf))[:, None, None]
    whole = attention(q, k, v, bias)
    monkeypatch.setattr(ops, "ATTENTION_SCORE_BYTES", 2 * 3 * 11 * 4 * 3)  # three queries' scores at a time
    np.testing.assert_allclose(attention(q, k, v, bias), whole, rtol=1e-6, atol=1e-7)


def test_a_second_extension_of_one_cache_branches_and_leaves_the_first_intact():
    first = StepCache.start(np.zeros((2, 1), np.float32)).append(np.ones((2, 1), np.float32))
    a = first.append(np.full((2, 1), 2.0, np.float32))
    b = first.append(np.full((2, 1), 3.0, np.float32))  # same slot: b must not overwrite a
    np.testing.assert_array_equal(a.gather()[:, :, 0], [[0, 0], [1, 1], [2, 2]])
    np.testing.assert_array_equal(b.gather()[:, :, 0], [[0, 0], [1, 1], [3, 3]])
    np.testing.assert_array_equal(a.append(np.full((2, 1), 4.0, np.float32)).gather()[-2:, 0, 0], [2, 4])


def test_the_building_blocks_compute_what_torch_does():
    rng = np.random.default_rng(1)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((2, 5, 8), (4, 8), (4,)))
    ref = torch.nn.functional.linear(*map(torch.from_numpy, (x, w, b))).numpy()
    np.testing.assert_allclose(linear(x, w, b), ref, atol=1e-5)
    g, beta = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    ref = torch.nn.functional.layer_norm(torch.from_numpy(x), (8,), torch.from_numpy(g), torch.from_numpy(beta))
    np.testing.assert_allclose(layer_norm(x, g, beta), ref.numpy(), atol=1e-5)
    np.testing.assert_allclose(log_softmax(x), torch.log_softmax(torch.from_numpy(x), -1).numpy(), atol=1e-6)
    q, k, v = (rng.standard_normal((2, 3, n, 4)).astype(np.float32) for n in (5, 6, 6))
    allowed = rng.random((2, 1, 1, 6)) > 0.3
    allowed[..., 0] = True
    bias = np.where(allowed, 0.0, -np.inf).astype(np.float32)
    ref = torch.nn.functional.scaled_dot_product_attention(*map(torch.from_numpy, (q, k, v)), torch.from_numpy(allowed))
    np.testing.assert_allclose(attention(q, k, v, bias), ref.numpy(), atol=1e-5)


def test_weights_are_taken_once_checked_for_shape_and_type():
    weights = Weights({"a.w": np.zeros((2, 3), np.float16), "a.n": np.zeros(2, np.int16), "b": np.zeros(1)})
    assert weights.sub("a").take("w", (2, None)).dtype == np.float32
    with pytest.raises(WeightsError, match=r"^weight a.w has shape 2x3, the config needs 3x2$"):
        weights.sub("a").take("w", (3, 2))
    with pytest.raises(WeightsError, match=r"^weight a.n is stored as int16"):
        weights.sub("a").take("n")
    with pytest.raises(WeightsError, match=r"^weight a.x is missing$"):
        weights.sub("a").take("x")
    with pytest.raises(WeightsError, match=r"^weights the config has no place for: a.n, b$"):
        weights.check_all_taken()
