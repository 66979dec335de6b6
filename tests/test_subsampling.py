"""Conv2d subsampling: exact output lengths, independence from right padding, and CPU inference in blocks."""

from __future__ import annotations

import pytest
import torch

from srupp_asr import subsampling
from srupp_asr.subsampling import Conv2dSubsampling, receptive_field, subsampled_length

FACTORS = [4, 6, 8]


def test_subsampled_length_known_values():
    # x4: (99 // 2 - 1) // 2;  x6: 49 then (49 - 5) // 3 + 1;  x8: 49 -> 24 -> 11.
    assert [subsampled_length(100, f) for f in FACTORS] == [24, 15, 11]
    assert [subsampled_length(t, 4) for t in range(12)] == [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2]


@pytest.mark.parametrize("factor", FACTORS)
def test_length_formula_equals_actual_output_length(factor):
    torch.manual_seed(0)
    sub = Conv2dSubsampling(20, 8, factor=factor, channels=4).eval()
    for total in range(0, 130):
        y, new_lengths = sub(torch.randn(1, total, 20), torch.tensor([total]))
        assert y.shape == (1, subsampled_length(total, factor), 8), f"T={total}"
        assert new_lengths.tolist() == [subsampled_length(total, factor)]


@pytest.mark.parametrize("factor", FACTORS)
def test_tensor_lengths_follow_the_integer_formula(factor):
    lengths = torch.arange(0, 500)
    expected = [subsampled_length(int(t), factor) for t in lengths]
    assert subsampled_length(lengths, factor).tolist() == expected


@pytest.mark.parametrize("factor", FACTORS)
def test_right_padding_does_not_change_valid_frames(factor):
    # Unpadded convolutions: valid outputs read only valid inputs, whatever the padding holds.
    torch.manual_seed(0)
    sub = Conv2dSubsampling(80, 32, factor=factor).eval()
    lengths = [200, 137, 61, 30]
    utterances = [torch.randn(n, 80) for n in lengths]
    batch = torch.full((4, 200, 80), 50.0)
    for i, u in enumerate(utterances):
        batch[i, : u.size(0)] = u
    y, new_lengths = sub(batch, torch.tensor(lengths))
    assert new_lengths.tolist() == [subsampled_length(n, factor) for n in lengths]
    for i, u in enumerate(utterances):
        alone, alone_lengths = sub(u[None], torch.tensor([u.size(0)]))
        n = int(alone_lengths[0])
        torch.testing.assert_close(y[i, :n], alone[0], atol=1e-5, rtol=0)
        assert torch.count_nonzero(y[i, n:]) == 0, "padded output frames are zeroed"


@pytest.mark.parametrize("factor", FACTORS)
def test_receptive_field_is_what_an_output_frame_reads(factor):
    # Brute force: the input frames whose change moves output frame j are exactly [j * step, j * step + span).
    torch.manual_seed(0)
    sub = Conv2dSubsampling(20, 8, factor=factor, channels=4).eval()
    x = torch.randn(1, 60, 20)
    base, _ = sub(x, torch.tensor([60]))
    j = 2
    read = []
    for t in range(60):
        moved = x.clone()
        moved[0, t] += 10.0
        y, _ = sub(moved, torch.tensor([60]))
        if not torch.equal(y[0, j], base[0, j]):
            read.append(t)
    span, step = receptive_field(factor)
    assert read == list(range(j * step, j * step + span))


@pytest.mark.parametrize("factor", FACTORS)
def test_inference_in_blocks_gives_the_batched_frames(factor, monkeypatch):
    # CPU inference (no grad, eval) runs an utterance and a block at a time; training runs the padded batch whole.
    monkeypatch.setattr(subsampling, "INFERENCE_BLOCK_FRAMES", 5)  # blocks end inside every utterance
    torch.manual_seed(0)
    sub = Conv2dSubsampling(40, 16, factor=factor, channels=8).eval()
    lengths = torch.tensor([300, 151, 23, 3])
    x = torch.randn(4, 300, 40)
    whole, whole_lengths = sub(x, lengths)  # grad enabled: the batched path
    calls = []
    sub.conv.register_forward_hook(lambda _m, inputs, _o: calls.append(inputs[0].shape[0]))
    with torch.no_grad():
        blocks, block_lengths = sub(x, lengths)
    assert calls and set(calls) == {1}, "one utterance at a time"
    assert len(calls) == sum(-(-n // 5) for n in subsampled_length(lengths, factor).tolist())
    assert torch.equal(block_lengths, whole_lengths)
    torch.testing.assert_close(blocks, whole.detach(), atol=1e-5, rtol=0)
    sub.train()
    with torch.no_grad():  # dropout on: the batched path
        sub(x, lengths)
    assert calls[-1] == 4


def test_layers_follow_espnet_for_each_factor():
    convs = {f: [m for m in Conv2dSubsampling(80, 16, f).conv if isinstance(m, torch.nn.Conv2d)] for f in FACTORS}
    assert [(c.kernel_size[0], c.stride[0]) for c in convs[4]] == [(3, 2), (3, 2)]
    assert [(c.kernel_size[0], c.stride[0]) for c in convs[6]] == [(3, 2), (5, 3)]
    assert [(c.kernel_size[0], c.stride[0]) for c in convs[8]] == [(3, 2), (3, 2), (3, 2)]
    sub = Conv2dSubsampling(80, 16, factor=6)
    assert sub.factor == 6 and sub.out.in_features == 16 * subsampled_length(80, 6) == 16 * 12


def test_unsupported_factor_or_too_few_features_is_rejected():
    with pytest.raises(ValueError, match="one of \\[4, 6, 8\\]"):
        Conv2dSubsampling(80, 16, factor=2)
    with pytest.raises(ValueError, match="too few"):
        Conv2dSubsampling(5, 16, factor=8)
