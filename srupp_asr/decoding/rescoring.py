"""Attention rescoring of CTC n-best lists (WeNet-style): every hypothesis of every utterance is scored by the
attention decoder in one teacher-forced forward pass (and, with an LM, by the LM in one more)."""

from __future__ import annotations

import math

import torch

from srupp_asr.decoder import IGNORE_ID, TransformerDecoder, add_sos_eos
from srupp_asr.decoding.beam_search import NEG_INF
from srupp_asr.lm import SRUppLM
from srupp_asr.model import SOS_EOS_ID


def attention_scores(
    decoder: TransformerDecoder, memory: torch.Tensor, memory_lens: torch.Tensor, hyps: list[list[list[int]]]
) -> list[list[float]]:
    """``log P_att(y + <sos/eos> | memory)`` of each hypothesis ``y`` in ``hyps[b]`` (utterance ``b`` of ``memory``)."""
    flat = [(b, y) for b, nbest in enumerate(hyps) for y in nbest]
    if not flat:
        return [[] for _ in hyps]
    device = memory.device
    utterances = torch.tensor([b for b, _ in flat], device=device)
    lens = torch.tensor([len(y) for _, y in flat], device=device)
    tokens = torch.full((len(flat), max(1, int(lens.max()))), IGNORE_ID, dtype=torch.long, device=device)
    for i, (_, y) in enumerate(flat):
        tokens[i, : len(y)] = torch.tensor(y, dtype=torch.long)
    ys_in, ys_out, ys_lens = add_sos_eos(tokens, lens, SOS_EOS_ID)
    logits = decoder(memory[utterances], memory_lens.to(device)[utterances], ys_in, ys_lens)
    log_probs = logits.float().log_softmax(-1)
    keep = ys_out != IGNORE_ID
    picked = log_probs.gather(-1, ys_out.clamp(min=0)[:, :, None]).squeeze(-1)
    totals = torch.where(keep, picked, 0.0).sum(1).tolist()
    out: list[list[float]] = [[] for _ in hyps]
    for (b, _), total in zip(flat, totals, strict=True):
        out[b].append(total)
    return out


def lm_scores(lm: SRUppLM, hyps: list[list[list[int]]]) -> list[list[float]]:
    """``log P_lm(y + <sos/eos>)`` of each hypothesis ``y`` in ``hyps[b]``, all in one batch."""
    flat = [y for nbest in hyps for y in nbest]
    totals = (-lm.sentence_nll(flat)).tolist() if flat else []
    out, i = [], 0
    for nbest in hyps:
        out.append(totals[i : i + len(nbest)])
        i += len(nbest)
    return out


def rescore(
    ctc_nbest: list[list[tuple[list[int], float]]],
    att_scores: list[list[float]],
    ctc_weight: float,
    length_penalty: float,
    lm: list[list[float]] | None = None,
    lm_weight: float = 0.0,
) -> list[list[tuple[list[int], float]]]:
    """Per utterance, its hypotheses by ``ctc_weight * ctc + (1 - ctc_weight) * att + lm_weight * lm +
    length_penalty * len``, best first (``ctc_nbest`` holds ``(tokens, log P_ctc)``; ``lm`` the LM scores, if any);
    a NaN score (a broken model) counts as -inf."""
    out = []
    for u, (nbest, att) in enumerate(zip(ctc_nbest, att_scores, strict=True)):
        lm_u = lm[u] if lm is not None else [0.0] * len(nbest)
        scored = [
            (y, _weighted(ctc_weight, ctc) + _weighted(1.0 - ctc_weight, a) + _weighted(lm_weight, s))
            for (y, ctc), a, s in zip(nbest, att, lm_u, strict=True)
        ]
        scored = [(y, score + length_penalty * len(y) if not math.isnan(score) else NEG_INF) for y, score in scored]
        out.append(sorted(scored, key=lambda h: -h[1]))
    return out


def _weighted(weight: float, score: float) -> float:
    """``weight * score``, 0 when the weight is (an impossible score of a part that does not count is no NaN)."""
    return weight * score if weight else 0.0
