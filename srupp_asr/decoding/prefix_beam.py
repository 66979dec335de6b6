"""CTC prefix beam search, frame-synchronous and batched over utterances (no Python loop over tokens or beams).

Each hypothesis is a distinct label prefix ``l`` with two log-probabilities over the frames seen so far: ``pb``,
that of the paths emitting ``l`` and ending in a blank, and ``pnb``, those ending in ``l``'s last token. At frame
``t`` with CTC log-probabilities ``x``::

    l stays           pb'(l)   = logaddexp(pb, pnb)(l) + x[blank]
    l repeats last    pnb'(l)  = pnb(l) + x[last(l)]
    l extended by c   pnb'(l+c) = x[c] + (pb(l) if c == last(l) else logaddexp(pb, pnb)(l))

An extension that equals a prefix already in the beam is merged into it. To find those, each prefix carries a
hash of its tokens and the hash of its parent (itself without the last token); an entry whose parent hash equals
another entry's hash is checked token by token, so the merging is exact, at a cost linear in the beam per frame.
Extensions consider the ``beam`` most likely non-blank tokens of each frame only (a hypothesis' own last token is
always scored). The ``beam`` best prefixes by ``logaddexp(pb, pnb) + length_penalty * len`` survive each frame.
"""

from __future__ import annotations

import torch

from srupp_asr.model import BLANK_ID

NEG_INF = float("-inf")
# Polynomial hashes of the prefixes, two of them modulo a 31-bit prime, packed in one int64 key.
_HASH_MOD = 2**31 - 1
_HASH_BASES = (1_000_003, 998_244_353)


def ctc_prefix_beam_search(
    log_probs: torch.Tensor, lengths: torch.Tensor, beam: int, length_penalty: float = 0.0
) -> list[list[tuple[list[int], float]]]:
    """Per utterance of ``log_probs`` ``(B, T, V)`` (valid up to ``lengths``), the surviving prefixes, best first,
    as ``(tokens, log P_ctc(tokens))`` (the total CTC probability of the prefix over the paths the beam kept, without
    the length penalty); ``([], -inf)`` alone when no labelling is possible."""
    B, T, V = log_probs.shape
    device = log_probs.device
    lengths = lengths.to(device)
    W, K = beam, min(beam, V - 1)
    lp = log_probs.float()
    prefix = torch.full((B, W, T + 1), -1, dtype=torch.long, device=device)  # -1 past each prefix's end
    length = torch.zeros(B, W, dtype=torch.long, device=device)
    last = torch.full((B, W), -1, dtype=torch.long, device=device)  # -1: the empty prefix
    hashes = torch.zeros(B, W, 2, dtype=torch.long, device=device)
    parent_key = torch.full((B, W), -1, dtype=torch.long, device=device)  # the empty prefix has no parent
    pb = torch.full((B, W), NEG_INF, device=device)
    pb[:, 0] = 0.0  # one hypothesis, the empty prefix; the other slots are unused (-inf)
    pnb = torch.full((B, W), NEG_INF, device=device)
    bases = torch.tensor(_HASH_BASES, device=device)
    for t in range(T):
        x = lp[:, t]
        tot = torch.logaddexp(pb, pnb)
        valid = tot > NEG_INF
        span = int(length.max()) + 1
        parent, has_parent = _parents(prefix[:, :, :span], length, _key(hashes), parent_key, valid)
        x_last = x.gather(1, last.clamp(min=0))
        new_pb = tot + x[:, BLANK_ID, None]
        new_pnb = torch.where(last >= 0, pnb + x_last, NEG_INF)
        # A beam entry l+c whose parent l is in the beam also receives l's extension by c.
        from_parent = torch.where(last == last.gather(1, parent), pb.gather(1, parent), tot.gather(1, parent))
        new_pnb = torch.logaddexp(new_pnb, torch.where(has_parent, x_last + from_parent, NEG_INF))
        # Extensions by the frame's most likely tokens, except those already in the beam (merged above).
        top_x, top_tok = x[:, BLANK_ID + 1 :].topk(K, dim=1)
        top_tok = top_tok + BLANK_ID + 1
        same = top_tok[:, None, :] == last[:, :, None]  # (B, W, K)
        ext = top_x[:, None, :] + torch.where(same, pb[:, :, None], tot[:, :, None])
        ext = ext.flatten(1).masked_fill(_in_beam(parent, has_parent, last, top_tok), NEG_INF)
        ext = ext.masked_fill(~valid.repeat_interleave(K, dim=1), NEG_INF)
        keys = torch.cat(
            [
                torch.logaddexp(new_pb, new_pnb) + length_penalty * length,
                ext + length_penalty * (length + 1).repeat_interleave(K, dim=1),
            ],
            dim=1,
        )
        sel = keys.topk(W, dim=1).indices
        is_ext = sel >= W
        ext_sel = (sel - W).clamp(min=0)
        src = torch.where(is_ext, ext_sel // K, sel)
        tok = top_tok.gather(1, ext_sel % K)
        new_length = length.gather(1, src)
        span = min(span + 1, T + 1)
        new_prefix = prefix[:, :, :span].gather(1, src[:, :, None].expand(-1, -1, span))
        new_prefix.scatter_(2, new_length[:, :, None].clamp(max=span - 1), torch.where(is_ext, tok, -1)[:, :, None])
        src_hashes = hashes.gather(1, src[:, :, None].expand(-1, -1, 2))
        ext_hashes = (src_hashes * bases + tok[:, :, None] + 1) % _HASH_MOD
        active = (t < lengths)[:, None]  # frames past an utterance's end leave its beam as it is
        pb = torch.where(active, torch.where(is_ext, NEG_INF, new_pb.gather(1, src)), pb)
        pnb = torch.where(active, torch.where(is_ext, ext.gather(1, ext_sel), new_pnb.gather(1, src)), pnb)
        prefix[:, :, :span] = torch.where(active[:, :, None], new_prefix, prefix[:, :, :span])
        length = torch.where(active, new_length + is_ext.long(), length)
        last = torch.where(active, torch.where(is_ext, tok, last.gather(1, src)), last)
        new_parent_key = torch.where(is_ext, _key(src_hashes), parent_key.gather(1, src))
        parent_key = torch.where(active, new_parent_key, parent_key)
        hashes = torch.where(active[:, :, None], torch.where(is_ext[:, :, None], ext_hashes, src_hashes), hashes)
    return _ranked(prefix, length, torch.logaddexp(pb, pnb), length_penalty)


def _key(hashes: torch.Tensor) -> torch.Tensor:
    """One int64 per prefix from its two 31-bit hashes ``(..., 2)``."""
    return hashes[..., 0] * _HASH_MOD + hashes[..., 1]


def _parents(
    prefix: torch.Tensor, length: torch.Tensor, key: torch.Tensor, parent_key: torch.Tensor, valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """For each beam entry ``(B, W)``, the index of the entry that is its prefix one token shorter, and whether
    there is one: found by hash, then checked on the tokens of ``prefix`` ``(B, W, S)`` (padded with -1)."""
    candidate = (parent_key[:, None, :] == key[:, :, None]) & valid[:, :, None] & valid[:, None, :]  # (B, p, child)
    parent = candidate.int().argmax(1)
    # An entry without its last token equals its parent, padding included.
    truncated = prefix.scatter(2, (length - 1).clamp(min=0)[:, :, None], -1)
    same = (prefix.gather(1, parent[:, :, None].expand_as(prefix)) == truncated).all(-1)
    return parent, candidate.any(1) & same & (length > 0)


def _in_beam(parent: torch.Tensor, has_parent: torch.Tensor, last: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``(B, W * K)``: whether beam entry ``w`` extended by ``tokens[:, k]`` (at ``w * K + k``) is in the beam."""
    K = tokens.shape[1]
    match = (last[:, :, None] == tokens[:, None, :]) & has_parent[:, :, None]  # (B, child, K)
    where = parent[:, :, None] * K + torch.arange(K, device=tokens.device)
    hits = torch.zeros(parent.shape[0], parent.shape[1] * K, dtype=torch.long, device=tokens.device)
    return hits.scatter_add_(1, where.flatten(1), match.flatten(1).long()) > 0


def _ranked(
    prefix: torch.Tensor, length: torch.Tensor, log_prob: torch.Tensor, length_penalty: float
) -> list[list[tuple[list[int], float]]]:
    """The valid beam entries of each utterance, best first by ``log_prob + length_penalty * length`` (the empty
    prefix with ``-inf`` when none is valid)."""
    order = (log_prob + length_penalty * length).argsort(dim=1, descending=True, stable=True)
    prefix, length, log_prob = (
        prefix.gather(1, order[:, :, None].expand_as(prefix)),
        length.gather(1, order),
        log_prob.gather(1, order),
    )
    results = []
    for p, n, s in zip(prefix.tolist(), length.tolist(), log_prob.tolist(), strict=True):
        # Every prefix is impossible only when some frame gives every label -inf (a NaN model output): the empty one.
        results.append([(p[w][: n[w]], s[w]) for w in range(len(s)) if s[w] > NEG_INF] or [([], NEG_INF)])
    return results
