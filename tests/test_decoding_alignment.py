"""srupp_asr.decoding.alignment's numpy forced alignment against ``torchaudio.functional.forced_align``: the same
path on random log-probabilities of many shapes (the fewest frames the tokens need, repeated tokens, ties,
impossible cells), the same token spans; and that the module loads without torch."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
import torchaudio.functional as taf

from srupp_asr.decoding import alignment


def torchaudio_path(log_probs: np.ndarray, tokens: list[int]) -> np.ndarray:
    path, _ = taf.forced_align(torch.from_numpy(log_probs)[None], torch.tensor([tokens], dtype=torch.int32), blank=0)
    return path[0].numpy()


def random_case(rng: np.random.Generator, vocab: int, num_tokens: int, spare: int) -> tuple[np.ndarray, list[int]]:
    """Random tokens, repeats likely in a small vocabulary, and log-probabilities for ``spare`` frames beyond the
    fewest they need."""
    tokens = [int(t) for t in rng.integers(1, vocab, num_tokens)]
    repeats = int(np.count_nonzero(np.diff(tokens) == 0))
    logits = rng.normal(0, 2, (num_tokens + repeats + spare, vocab)).astype(np.float32)
    return (logits - np.log(np.exp(logits).sum(-1, keepdims=True))).astype(np.float32), tokens


@pytest.mark.parametrize("vocab", [2, 3, 6, 40])
@pytest.mark.parametrize("num_tokens", [1, 2, 5, 17, 60])
@pytest.mark.parametrize("spare", [0, 1, 4, 100])
def test_forced_align_gives_torchaudios_path(vocab: int, num_tokens: int, spare: int) -> None:
    rng = np.random.default_rng([vocab, num_tokens, spare])
    for trial in range(5):
        log_probs, tokens = random_case(rng, vocab, num_tokens, spare)
        if trial == 1:  # many ties: torchaudio stays where two moves tie, which a different order would not
            log_probs = np.round(log_probs * 0.5)
        if trial == 2:  # cells token_spans floors to IMPOSSIBLE
            log_probs[rng.random(log_probs.shape) < 0.2] = alignment.IMPOSSIBLE
        np.testing.assert_array_equal(alignment.forced_align(log_probs, tokens), torchaudio_path(log_probs, tokens))


def test_token_spans_are_torchaudios_merged_tokens() -> None:
    rng = np.random.default_rng(7)
    for spare in (0, 3, 50):
        log_probs, tokens = random_case(rng, 5, 12, spare)
        path, scores = taf.forced_align(
            torch.from_numpy(log_probs)[None], torch.tensor([tokens], dtype=torch.int32), blank=0
        )
        spans = taf.merge_tokens(path[0], scores[0].exp())
        starts, ends, peaks = alignment.token_spans(log_probs, tokens)
        assert (starts, ends) == ([s.start for s in spans], [s.end for s in spans])
        assert peaks == pytest.approx([float(scores[0, s.start : s.end].exp().max()) for s in spans], rel=1e-6)


def test_forced_align_refuses_tokens_the_frames_cannot_hold() -> None:
    with pytest.raises(ValueError, match="cannot emit"):
        alignment.forced_align(np.zeros((3, 4), np.float32), [1, 1, 2])
    with pytest.raises(ValueError, match="cannot emit"):
        alignment.forced_align(np.zeros((3, 4), np.float32), [])


def test_the_module_loads_without_torch() -> None:
    code = "import sys, srupp_asr.decoding.alignment; print(sorted(m for m in sys.modules if m.startswith('torch')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
