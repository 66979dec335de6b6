"""The Transformer attention decoder, incremental scoring, sos/eos targets and the label-smoothing loss."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from srupp_asr.decoder import IGNORE_ID, LabelSmoothingLoss, TransformerDecoder, add_sos_eos

VOCAB, SOS_EOS = 11, 10


def _decoder(memory_dim: int | None = None) -> TransformerDecoder:
    torch.manual_seed(0)
    return TransformerDecoder(VOCAB, d_model=16, num_layers=2, num_heads=2, ffn_dim=32, memory_dim=memory_dim).eval()


def test_add_sos_eos_builds_shifted_inputs_and_outputs():
    tokens = torch.tensor([[3, 4, 5], [6, IGNORE_ID, IGNORE_ID], [IGNORE_ID, IGNORE_ID, IGNORE_ID]])
    ys_in, ys_out, ys_lens = add_sos_eos(tokens, torch.tensor([3, 1, 0]), SOS_EOS)
    assert ys_in.tolist() == [[10, 3, 4, 5], [10, 6, 10, 10], [10, 10, 10, 10]]
    assert ys_out.tolist() == [[3, 4, 5, 10], [6, 10, -1, -1], [10, -1, -1, -1]]
    assert ys_lens.tolist() == [4, 2, 1]


def test_forward_gives_logits_per_position():
    decoder = _decoder(memory_dim=24)
    logits = decoder(
        torch.randn(3, 7, 24), torch.tensor([7, 5, 2]), torch.randint(0, VOCAB, (3, 4)), torch.tensor([4, 2, 1])
    )
    assert logits.shape == (3, 4, VOCAB) and torch.isfinite(logits).all()


def test_position_does_not_see_later_tokens():
    decoder = _decoder()
    memory, lens = torch.randn(1, 6, 16), torch.tensor([6])
    ys = torch.tensor([[SOS_EOS, 1, 2, 3]])
    changed = ys.clone()
    changed[0, 3] = 7
    a = decoder(memory, lens, ys, torch.tensor([4]))
    b = decoder(memory, lens, changed, torch.tensor([4]))
    torch.testing.assert_close(a[:, :3], b[:, :3])
    assert (a[:, 3] - b[:, 3]).abs().max() > 1e-3


def test_padded_memory_frames_are_ignored():
    decoder = _decoder()
    memory = torch.randn(1, 9, 16)
    ys = torch.tensor([[SOS_EOS, 4, 5]])
    alone = decoder(memory[:, :5], torch.tensor([5]), ys, torch.tensor([3]))
    padded = decoder(memory, torch.tensor([5]), ys, torch.tensor([3]))
    torch.testing.assert_close(padded, alone, rtol=0, atol=1e-5)


def test_score_step_without_cache_equals_last_position_of_forward():
    decoder = _decoder(memory_dim=24)
    memory, lens = torch.randn(2, 8, 24), torch.tensor([8, 3])
    ys = torch.tensor([[SOS_EOS, 1, 2], [SOS_EOS, 5, 5]])
    log_probs, cache = decoder.score_step(memory, lens, ys)
    expected = decoder(memory, lens, ys, torch.tensor([3, 3]))[:, -1].log_softmax(-1)
    torch.testing.assert_close(log_probs, expected, rtol=0, atol=1e-5)
    assert [c.shape for c in cache] == [(2, 3, 16), (2, 3, 16)]


def test_cached_steps_equal_full_forward_at_every_position():
    decoder = _decoder(memory_dim=24)
    memory, lens = torch.randn(2, 8, 24), torch.tensor([8, 3])
    ys = torch.tensor([[SOS_EOS, 1, 2, 9, 4], [SOS_EOS, 5, 5, 0, 3]])
    full = decoder(memory, lens, ys, torch.tensor([5, 5])).log_softmax(-1)
    cache = None
    with torch.inference_mode():
        for u in range(1, 6):
            log_probs, cache = decoder.score_step(memory, lens, ys[:, :u], cache)
            torch.testing.assert_close(log_probs, full[:, u - 1], rtol=0, atol=1e-5)
            assert all(c.shape[1] == u for c in cache)
    assert math.isclose(log_probs.exp().sum(-1)[0].item(), 1.0, rel_tol=1e-5)


def test_precomputed_memory_keys_and_values_give_the_same_steps():
    decoder = _decoder(memory_dim=24)
    memory, lens = torch.randn(2, 8, 24), torch.tensor([8, 3])
    ys = torch.tensor([[SOS_EOS, 1, 2, 9], [SOS_EOS, 5, 5, 0]])
    with torch.inference_mode():
        kv = decoder.memory_kv(memory)
        cache = kv_cache = None
        for u in range(1, 5):
            expected, cache = decoder.score_step(memory, lens, ys[:, :u], cache)
            log_probs, kv_cache = decoder.score_step(None, lens, ys[:, :u], kv_cache, memory_kv=kv)
            torch.testing.assert_close(log_probs, expected, rtol=0, atol=1e-6)
        with pytest.raises(ValueError, match="needs the memory or its memory_kv"):
            decoder.score_step(None, lens, ys[:, :1])


def test_cache_of_the_wrong_length_is_refused():
    decoder = _decoder()
    memory, lens = torch.randn(1, 4, 16), torch.tensor([4])
    _, cache = decoder.score_step(memory, lens, torch.tensor([[SOS_EOS]]))
    with pytest.raises(ValueError, match="cache must hold 2 tensors of 2 positions"):
        decoder.score_step(memory, lens, torch.tensor([[SOS_EOS, 1, 2]]), cache)


def test_empty_memory_gives_finite_scores():
    decoder = _decoder()
    log_probs, _ = decoder.score_step(torch.randn(2, 4, 16), torch.tensor([4, 0]), torch.tensor([[SOS_EOS]] * 2))
    assert torch.isfinite(log_probs).all()


def test_decoder_trains_and_every_parameter_gets_a_gradient():
    decoder = _decoder(memory_dim=24).train()
    tokens, lens = torch.tensor([[1, 2, 3], [4, IGNORE_ID, IGNORE_ID]]), torch.tensor([3, 1])
    ys_in, ys_out, ys_lens = add_sos_eos(tokens, lens, SOS_EOS)
    logits = decoder(torch.randn(2, 6, 24), torch.tensor([6, 4]), ys_in, ys_lens)
    LabelSmoothingLoss(VOCAB)(logits, ys_out).backward()
    missing = [n for n, p in decoder.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert not missing


def test_label_smoothing_loss_matches_hand_computation():
    # One utterance, vocab 3, smoothing 0.3: q = (0.7, 0.15, 0.15) around the target.
    logits = torch.tensor([[[0.0, math.log(2.0), math.log(3.0)], [1.0, 1.0, 1.0]]])  # p1 = (1/6, 2/6, 3/6)
    target = torch.tensor([[2, IGNORE_ID]])
    q = [0.15, 0.15, 0.7]
    p = [1 / 6, 2 / 6, 3 / 6]
    kl = sum(qi * math.log(qi / pi) for qi, pi in zip(q, p, strict=True))
    loss = LabelSmoothingLoss(3, smoothing=0.3)(logits, target)
    assert math.isclose(loss.item(), kl, rel_tol=1e-6)
    assert math.isclose(kl, 0.09995, abs_tol=1e-5)  # 0.15 ln 0.9 + 0.15 ln 0.45 + 0.7 ln 1.4


def test_label_smoothing_loss_divides_by_batch_or_by_tokens():
    torch.manual_seed(0)
    logits = torch.randn(4, 5, VOCAB)
    target = torch.randint(0, VOCAB, (4, 5))
    target[1, 2:] = IGNORE_ID
    by_batch = LabelSmoothingLoss(VOCAB)(logits, target)
    by_tokens = LabelSmoothingLoss(VOCAB, normalize_length=True)(logits, target)
    assert math.isclose(by_batch.item() * 4, by_tokens.item() * 17, rel_tol=1e-6)


def test_label_smoothing_loss_without_smoothing_is_cross_entropy():
    torch.manual_seed(0)
    logits = torch.randn(3, 6, VOCAB)
    target = torch.randint(0, VOCAB, (3, 6))
    target[2, 4:] = IGNORE_ID
    loss = LabelSmoothingLoss(VOCAB, smoothing=0.0)(logits, target)
    ce = F.cross_entropy(logits.transpose(1, 2), target, ignore_index=IGNORE_ID, reduction="sum") / 3
    torch.testing.assert_close(loss, ce)
    mean = LabelSmoothingLoss(VOCAB, smoothing=0.0, normalize_length=True)(logits, target)
    torch.testing.assert_close(mean, F.cross_entropy(logits.transpose(1, 2), target, ignore_index=IGNORE_ID))
