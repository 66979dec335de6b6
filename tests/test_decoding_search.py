"""The search algorithms of srupp_asr.decoding on given log-probabilities, against independent references: exact
enumeration through torch's CTC loss, and flashlight-text's lexicon-free CTC beam search (through torchaudio)."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from srupp_asr.decoding import DecodingOptions
from srupp_asr.decoding.options import DEFAULT_BEAM
from srupp_asr.decoding.prefix_beam import ctc_prefix_beam_search
from srupp_asr.decoding.scorers import CTCPrefixScorer
from srupp_asr.model import BLANK_ID, SOS_EOS_ID


def ctc_log_prob(log_probs: torch.Tensor, tokens: list[int]) -> float:
    """``log P_ctc(tokens)`` under ``log_probs`` ``(T, V)`` by torch's CTC loss (the reference)."""
    T = log_probs.shape[0]
    loss = F.ctc_loss(
        log_probs[:, None], torch.tensor([tokens or [1]]), torch.tensor([T]), torch.tensor([len(tokens)]),
        blank=BLANK_ID, reduction="sum",
    )  # fmt: skip
    return -loss.item()


def all_labellings(T: int, V: int) -> dict[tuple[int, ...], float]:
    """Every label sequence (no blank) CTC can emit in ``T`` frames over a ``V``-symbol vocabulary, unscored."""
    return {seq: 0.0 for n in range(T + 1) for seq in itertools.product(range(1, V), repeat=n)}


def random_log_probs(*shape: int, scale: float, seed: int) -> torch.Tensor:
    """CTC-like log-probabilities: softmax of Gaussian logits times ``scale`` (larger: peakier, as trained models)."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=generator) * scale).log_softmax(-1)


@pytest.mark.parametrize("seed", range(5))
def test_prefix_beam_search_with_a_wide_beam_is_exact(seed: int) -> None:
    """With a beam that holds every prefix, the best hypothesis is the labelling of highest total CTC probability
    (enumerated), and every returned score is that labelling's exact log-probability."""
    T, V = 5, 4
    log_probs = random_log_probs(T, V, scale=2.0, seed=seed)
    exact = {seq: ctc_log_prob(log_probs, list(seq)) for seq in all_labellings(T, V)}
    exact = {seq: s for seq, s in exact.items() if s > float("-inf")}
    found = ctc_prefix_beam_search(log_probs[None], torch.tensor([T]), beam=len(exact) + 1)[0]
    assert tuple(found[0][0]) == max(exact, key=exact.get)
    assert len(found) == len(exact)
    for tokens, score in found:
        assert score == pytest.approx(exact[tuple(tokens)], abs=1e-4)


def test_prefix_beam_search_agrees_with_flashlight_on_random_log_probs() -> None:
    """torchaudio's flashlight-text decoder (lexicon-free, no LM, same beam) finds the same best labelling for at
    least 97% of 200 random utterances; where they differ, ours has the higher total CTC probability.

    flashlight keeps a prefix ending in a blank and the same prefix ending in its last token as two hypotheses and
    returns the best single one, while prefix beam search ranks prefixes by their summed probability, so the two
    may rank near-ties differently. Its silence token is an extra symbol that the emissions make impossible."""
    from torchaudio.models.decoder import ctc_decoder

    B, T, V, beam = 200, 30, 6, 50
    log_probs = random_log_probs(B, T, V, scale=6.0, seed=0)
    tokens = ["<blank>"] + [f"t{i}" for i in range(1, V)] + ["|"]
    flashlight = ctc_decoder(
        lexicon=None, tokens=tokens, lm=None, beam_size=beam, beam_size_token=V, beam_threshold=1e9, log_add=True,
        blank_token="<blank>", sil_token="|",
    )  # fmt: skip
    emissions = torch.cat([log_probs, torch.full((B, T, 1), -1e10)], -1)
    theirs = [[t for t in hyps[0].tokens.tolist() if t != V] for hyps in flashlight(emissions)]
    ours = [hyps[0][0] for hyps in ctc_prefix_beam_search(log_probs, torch.full((B,), T), beam=beam)]
    differ = [b for b in range(B) if ours[b] != theirs[b]]
    assert len(differ) <= 0.03 * B, f"{len(differ)} of {B} differ"
    for b in differ:
        assert ctc_log_prob(log_probs[b], ours[b]) >= ctc_log_prob(log_probs[b], theirs[b]), b


def test_prefix_beam_search_of_a_batch_equals_one_utterance_at_a_time() -> None:
    """Utterances of different lengths padded into one batch get the same n-best lists and scores as alone."""
    lengths = [17, 3, 25, 0, 11]
    log_probs = random_log_probs(len(lengths), max(lengths), 12, scale=3.0, seed=1)
    batched = ctc_prefix_beam_search(log_probs, torch.tensor(lengths), beam=6, length_penalty=0.5)
    for b, n in enumerate(lengths):
        alone = ctc_prefix_beam_search(log_probs[b : b + 1, :n], torch.tensor([n]), beam=6, length_penalty=0.5)[0]
        assert [y for y, _ in batched[b]] == [y for y, _ in alone]
        assert [s for _, s in batched[b]] == pytest.approx([s for _, s in alone], abs=1e-5)
    assert batched[3] == [([], 0.0)]  # no frames: the empty labelling, with probability 1


def test_ctc_prefix_scorer_gives_prefix_and_sequence_probabilities() -> None:
    """Fed a prefix ``g`` token by token, the scorer's ``psi(g + c)`` is the total probability of every labelling
    that starts with ``g + c`` (enumerated), and ``psi(g + <eos>)`` that of ``g`` itself."""
    T, V = 4, 5
    lengths = [4, 3]  # the second utterance is padded by a frame
    log_probs = random_log_probs(2, T, V, scale=1.5, seed=2)
    scorer = CTCPrefixScorer(log_probs, torch.tensor(lengths))
    tokens = [1, 3, 4]
    candidates = torch.tensor([[*tokens, SOS_EOS_ID]])
    for b, n in enumerate(lengths):
        exact = {seq: ctc_log_prob(log_probs[b, :n], list(seq)) for seq in all_labellings(n, V)}
        for g in ([], [3], [3, 3], [4, 1]):
            state, ys = scorer.init_state(torch.tensor([b])), torch.tensor([[SOS_EOS_ID]])
            for token in g:
                _, pending = scorer.score(state, ys, candidates)
                state = scorer.select(state, torch.tensor([0]), torch.tensor([token]), pending)
                ys = torch.cat([ys, torch.tensor([[token]])], 1)
            delta, _ = scorer.score(state, ys, candidates)
            psi = (delta[0].double() + prefix_total(exact, g)).tolist()
            expected = [prefix_total(exact, [*g, c]) for c in tokens] + [exact[tuple(g)]]
            assert psi == pytest.approx(expected, abs=1e-4), (b, g)


def prefix_total(exact: dict[tuple[int, ...], float], prefix: list[int]) -> float:
    """log of the summed probability of the labellings in ``exact`` that start with ``prefix``."""
    scores = [s for seq, s in exact.items() if list(seq[: len(prefix)]) == prefix]
    return torch.tensor(scores, dtype=torch.float64).logsumexp(0).item()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("mode", "attention"),
        ("beam", 0),
        ("beam", 2.5),
        ("ctc_weight", -0.1),
        ("ctc_weight", 1.5),
        ("length_penalty", float("nan")),
        ("maxlen_ratio", -1.0),
        ("nbest", 0),
        ("nbest", DEFAULT_BEAM + 1),  # more than the beam
        ("lexicon_weight", -1.0),
    ],
)
def test_bad_options_raise_a_value_error_naming_the_field(field: str, value: object) -> None:
    """Each bad value is refused when the options are made, and the message names the field."""
    with pytest.raises(ValueError, match=field):
        DecodingOptions(**{field: value})


def _spiky_log_probs(tokens: list[int], frames_per_token: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """CTC log-probabilities where each token spikes once, blanks in between (with random noise)."""
    gen = torch.Generator().manual_seed(seed)
    T = frames_per_token * len(tokens) + 5
    logits = torch.randn(T, vocab, generator=gen)
    logits[:, 0] += 6.0
    for i, tok in enumerate(tokens):
        logits[3 + i * frames_per_token, tok] += 12.0
    return logits.log_softmax(-1)


def test_long_alignments_are_cut_into_windows_with_the_same_spans(monkeypatch) -> None:
    from srupp_asr.decoding import alignment

    gen = torch.Generator().manual_seed(1)
    tokens = [3 + int(t) for t in torch.randint(0, 20, (300,), generator=gen)]
    log_probs = _spiky_log_probs(tokens, 5, 24).numpy()
    whole = alignment.token_spans(log_probs, tokens)
    monkeypatch.setattr(alignment, "MAX_CELLS", 20_000)  # forces about 30 windows
    windowed = alignment.token_spans(log_probs, tokens)
    assert windowed[0] == whole[0] and windowed[1] == whole[1]
    assert windowed[2] == pytest.approx(whole[2])
    # A hypothesis that differs from the best path (a token substituted, one inserted) still gets one ordered
    # span per token, inside the utterance.
    changed = [*tokens[:100], 23, *tokens[101:200], 22, *tokens[200:]]
    starts, ends, peaks = alignment.token_spans(log_probs, changed)
    assert len(starts) == len(ends) == len(peaks) == len(changed)
    assert starts == sorted(starts) and all(s < e <= log_probs.shape[0] for s, e in zip(starts, ends, strict=True))
