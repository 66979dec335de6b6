"""Label-synchronous beam search over weighted :class:`~srupp_asr.decoding.scorers.Scorer` s, batched over
utterances and beams (ESPnet's joint CTC/attention decoding when the scorers are the decoder and CTC).

All ``B * beam`` hypotheses are rows of one batch: each output step calls every scorer once for all of them. A
step scores, for each row, the ``pre_beam`` best tokens by the weighted full scorers (every token when no full
scorer has weight, as ESPnet does with ``ctc_weight=1``) plus ``<sos/eos>``; the partial scorers score those
candidates; each utterance keeps its ``beam`` best extensions of all its rows::

    score(y + c) = score(y) + sum_s weight_s * score_s(c | y) + length_penalty * [c is not <sos/eos>]

An extension by ``<sos/eos>`` ends the hypothesis (its row is then free for the next step). An utterance is done
when no row is running, when it reaches its maximum length (every running row is ended there), or when no running
row can still overtake its ``nbest`` ended ones (:mod:`srupp_asr.decoding.end_detection`: exact without a length
bonus, a margin with one). Done utterances leave the batch. A NaN score
counts as -inf, so that the step after the maximum length, when every row has ended or is impossible, is the last.
The host learns which rows ended and each utterance's best running score in one transfer a step (a second on the
steps where some row ends: the ended prefixes), so that on a GPU the search waits for the device once a step.
"""

from __future__ import annotations

import torch

from srupp_asr.decoding.end_detection import END_MARGIN, finished
from srupp_asr.decoding.scorers import Scorer
from srupp_asr.model import BLANK_ID, SOS_EOS_ID

NEG_INF = float("-inf")
PRE_BEAM_RATIO = 1.5  # ESPnet's: candidates scored by the partial scorers per hypothesis, relative to the beam


def beam_search(
    scorers: list[tuple[Scorer, float]],
    batch_size: int,
    max_lengths: torch.Tensor,
    vocab_size: int,
    beam: int,
    nbest: int = 1,
    length_penalty: float = 0.0,
    device: torch.device | str = "cpu",
    end_margin: float = END_MARGIN,
) -> list[list[tuple[list[int], float]]]:
    """Per utterance, its ``nbest`` ended hypotheses (tokens without ``<sos/eos>``, score), best first.

    ``scorers`` pairs each scorer with its weight (those of weight 0 are not run); ``max_lengths`` ``(B,)`` is the
    most tokens per utterance; ``end_margin`` when an utterance is done with a length bonus
    (:func:`srupp_asr.decoding.end_detection.finished`)."""
    scorers = [(s, w) for s, w in scorers if w > 0.0]
    if not scorers:
        raise ValueError("beam search needs at least one scorer with a positive weight")
    W = beam
    has_full = any(s.full for s, _ in scorers)
    eos = SOS_EOS_ID
    # Candidate tokens: never the blank, and <sos/eos> always (appended as the last column).
    excluded = torch.zeros(vocab_size, dtype=torch.bool, device=device)
    excluded[[BLANK_ID, eos]] = True
    pre_beam = min(int(PRE_BEAM_RATIO * W), vocab_size - 2) if has_full else vocab_size - 2
    all_tokens = torch.nonzero(~excluded).squeeze(1)

    alive = torch.arange(batch_size, device=device)  # original index of each utterance still searched
    alive_ids = list(range(batch_size))  # the same on the host
    utterances = alive.repeat_interleave(W)
    states = [s.init_state(utterances) for s, _ in scorers]
    ys = torch.full((batch_size * W, 1), eos, dtype=torch.long, device=device)
    score = torch.full((batch_size, W), NEG_INF, device=device)
    score[:, 0] = 0.0  # one running hypothesis per utterance at first
    max_lengths = max_lengths.to(device)
    max_lengths_host = max_lengths.tolist()
    ended: list[list[tuple[list[int], float]]] = [[] for _ in range(batch_size)]
    step = 0
    while alive.numel():
        n = alive.numel()
        full_scores = torch.zeros(n * W, vocab_size, device=device)
        pending = [None] * len(scorers)
        for k, (scorer, weight) in enumerate(scorers):
            if scorer.full:
                scores, pending[k] = scorer.score(states[k], ys, None)
                full_scores += weight * scores
        if has_full:
            top = full_scores.masked_fill(excluded, NEG_INF).topk(pre_beam, dim=1).indices
        else:
            top = all_tokens.expand(n * W, -1)
        candidates = torch.cat([top, top.new_full((n * W, 1), eos)], 1)  # (N, K + 1)
        total = score.view(-1, 1) + full_scores.gather(1, candidates)
        for k, (scorer, weight) in enumerate(scorers):
            if not scorer.full:
                scores, pending[k] = scorer.score(states[k], ys, candidates)
                total += weight * scores
        total[:, :-1] += length_penalty
        total = total.nan_to_num(nan=NEG_INF, neginf=NEG_INF)  # a NaN score (a broken model): never chosen
        at_max = (max_lengths[alive] <= step).repeat_interleave(W)
        total[:, :-1] = total[:, :-1].masked_fill(at_max[:, None], NEG_INF)  # only <sos/eos> is left
        C = candidates.shape[1]
        new_score, sel = total.view(n, W * C).topk(W, dim=1)
        rows = (torch.arange(n, device=device)[:, None] * W + sel // C).flatten()
        tokens = candidates.view(-1)[rows * C + (sel % C).flatten()]
        ys = torch.cat([ys.index_select(0, rows), tokens[:, None]], 1)
        states = [s.select(st, rows, tokens, p) for (s, _), st, p in zip(scorers, states, pending, strict=True)]
        is_end = (tokens == eos).view(n, W) & (new_score > NEG_INF)
        score = new_score.masked_fill(is_end, NEG_INF)
        # One host sync a step: which rows ended, with their scores, and each utterance's best running score.
        host = torch.cat([is_end.flatten().to(new_score.dtype), new_score.flatten(), score.max(1).values]).tolist()
        ends = [i for i in range(n * W) if host[i]]
        if ends:  # (a second sync, on the steps where some hypothesis ends)
            prefixes = ys[:, 1:-1].tolist()
            for i in ends:
                ended[alive_ids[i // W]].append((prefixes[i], host[n * W + i]))
        step += 1
        done = finished(host[2 * n * W :], [ended[u] for u in alive_ids], nbest, length_penalty, end_margin)
        done = [d or max_lengths_host[u] < step for d, u in zip(done, alive_ids, strict=True)]
        if any(done):
            kept = [u for u in range(n) if not done[u]]
            alive_ids = [alive_ids[u] for u in kept]
            keep = torch.tensor(kept, dtype=torch.long, device=device)
            rows = (keep[:, None] * W + torch.arange(W, device=device)).flatten()
            alive, score, ys = alive[keep], score[keep], ys.index_select(0, rows)
            states = [s.select(st, rows, None, None) for (s, _), st in zip(scorers, states, strict=True)]
    return [sorted(hyps, key=lambda h: -h[1])[:nbest] or [([], NEG_INF)] for hyps in ended]
