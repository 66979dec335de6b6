"""Each decoding mode's search behind one call: :func:`decode` (audio in) and :func:`decode_encoded` (encoder
output in).

Scores per mode (log domain; a length penalty, when set, adds ``length_penalty * len(tokens)``):

- ``ctc_greedy``: the best path's log-probability (the sum over frames of the largest CTC log-probability);
- ``ctc_prefix_beam``: ``log P_ctc(tokens)``, summed over the paths that emit the tokens and that the beam kept
  (every such path when the beam holds every prefix; a narrow beam can only leave some out);
- ``joint``: ``(1 - ctc_weight) * log P_att(tokens + <eos>) + ctc_weight * log P_ctc(tokens)``;
- ``rescoring``: the same sum, over the n-best list of the CTC prefix beam search.

With an LM and ``lm_weight > 0`` (shallow fusion), every beam mode adds ``lm_weight * log P_lm(tokens + <eos>)``;
``ctc_prefix_beam`` then runs the label-synchronous beam search with the CTC prefix scorer and the LM (the
frame-synchronous prefix beam search has no place for a token-level LM).

A NaN score (a broken checkpoint, an overflow) counts as an impossible one (-inf) in every mode: the search still
ends, the other utterances of the batch are untouched, and an utterance left with no possible hypothesis gets the
empty one with score -inf (its words, if any, evenly spread times and confidence 0).
"""

from __future__ import annotations

import contextlib

import torch

from srupp_asr.decoding.alignment import align_hypothesis
from srupp_asr.decoding.beam_search import NEG_INF, beam_search
from srupp_asr.decoding.options import DecodingOptions, Hypothesis, unmet_needs
from srupp_asr.decoding.prefix_beam import ctc_prefix_beam_search
from srupp_asr.decoding.rescoring import attention_scores, lm_scores, rescore
from srupp_asr.decoding.scorers import CTCPrefixScorer, DecoderScorer, LMScorer, Scorer, WordListScorer
from srupp_asr.lm import SRUppLM
from srupp_asr.model import ASRModel, collapse_ctc_paths
from srupp_asr.threads import one_thread
from srupp_asr.tokenizer import Tokenizer


def decode(
    model: ASRModel,
    tokenizer: Tokenizer,
    audio: torch.Tensor,
    audio_lens: torch.Tensor,
    options: DecodingOptions | None = None,
    lm: SRUppLM | None = None,
) -> list[Hypothesis]:
    """The best hypothesis of each utterance of ``audio`` ``(B, S)`` (16 kHz, valid up to ``audio_lens`` ``(B,)``),
    decoded on the model's device. Put the model (and ``lm``, used when ``options.lm_weight`` is above 0) in eval
    mode first (``load_model`` and ``load_lm`` do)."""
    options = options or DecodingOptions()
    _check_model(model, options, lm)  # before the encoder runs
    device = next(model.parameters()).device
    with torch.inference_mode():
        enc, enc_lens = model.encode(audio.to(device), audio_lens.to(device))
        return [nbest[0] for nbest in decode_encoded(model, tokenizer, enc, enc_lens, options, lm)]


def decode_encoded(
    model: ASRModel,
    tokenizer: Tokenizer,
    enc: torch.Tensor,
    enc_lens: torch.Tensor,
    options: DecodingOptions | None = None,
    lm: SRUppLM | None = None,
) -> list[list[Hypothesis]]:
    """Per utterance of an :meth:`~srupp_asr.model.ASRModel.encode` output, its n-best hypotheses, best first."""
    options = options or DecodingOptions()
    _check_model(model, options, lm)
    with torch.inference_mode():
        enc_lens = enc_lens.to(enc.device)
        log_probs = model.ctc_log_probs(enc) if model.ctc is not None else None
        if log_probs is not None:  # a NaN (a broken model or input) is an impossible label, as in beam_search
            log_probs = log_probs.nan_to_num(nan=NEG_INF, neginf=NEG_INF)
        results = _search(model, enc, enc_lens, log_probs, options, lm if options.fusion_weight > 0 else None)
        cpu_log_probs = log_probs.float().cpu().numpy() if log_probs is not None else None
        shift = model.frame_shift
        out = []
        for b, nbest in enumerate(results):
            frames = int(enc_lens[b])
            hyps = []
            for tokens, score in nbest:
                times, words = align_hypothesis(
                    None if cpu_log_probs is None else cpu_log_probs[b], tokens, tokenizer, shift, frames
                )
                hyps.append(Hypothesis(tokens, tokenizer.decode(tokens), score, times, words))
            out.append(hyps)
        return out


def _check_model(model: ASRModel, options: DecodingOptions, lm: SRUppLM | None = None) -> None:
    """A ValueError when ``model`` lacks the CTC head or the decoder that ``options`` need, or the LM is missing or
    has another vocabulary."""
    lm_vocab_size = lm.vocab_size if lm is not None else None
    problem = unmet_needs(options, model.vocab_size, model.ctc is not None, model.decoder is not None, lm_vocab_size)
    if problem:
        raise ValueError(problem)


def _search(
    model: ASRModel,
    enc: torch.Tensor,
    enc_lens: torch.Tensor,
    log_probs: torch.Tensor | None,
    options: DecodingOptions,
    lm: SRUppLM | None = None,
) -> list[list[tuple[list[int], float]]]:
    """``(tokens, score)`` n-best lists per utterance by the mode of ``options`` (``lm``: fused with
    ``options.lm_weight``)."""
    if options.mode == "ctc_greedy":
        best, path = log_probs.max(-1)  # the CTC head ran once, in decode_encoded
        valid = torch.arange(best.shape[1], device=best.device)[None, :] < enc_lens[:, None]
        scores = torch.where(valid, best, 0.0).sum(1).tolist()
        return [[(tokens, score)] for tokens, score in zip(collapse_ctc_paths(path, enc_lens), scores, strict=True)]
    if options.mode == "ctc_prefix_beam" and lm is None:
        nbest = ctc_prefix_beam_search(log_probs, enc_lens, options.beam, options.token_bonus)
        return [[(y, s + options.token_bonus * len(y)) for y, s in hyps[: options.nbest]] for hyps in nbest]
    if options.mode == "rescoring":
        nbest = ctc_prefix_beam_search(log_probs, enc_lens, options.beam, options.token_bonus)
        if options.ctc_weight < 1.0:
            att = attention_scores(model.decoder, enc, enc_lens, [[y for y, _ in hyps] for hyps in nbest])
        else:  # the attention score has no weight (and the model may have no decoder)
            att = [[0.0] * len(hyps) for hyps in nbest]
        lm_nbest = lm_scores(lm, [[y for y, _ in hyps] for hyps in nbest]) if lm is not None else None
        ranked = rescore(nbest, att, options.ctc_weight, options.token_bonus, lm_nbest, options.fusion_weight)
        return [hyps[: options.nbest] for hyps in ranked]
    ctc_weight = 1.0 if options.mode == "ctc_prefix_beam" else options.ctc_weight  # (with an LM)
    scorers: list[tuple[Scorer, float]] = []
    if ctc_weight < 1.0:
        scorers.append((DecoderScorer(model.decoder, enc, enc_lens), 1.0 - ctc_weight))
    if ctc_weight > 0.0:
        scorers.append((CTCPrefixScorer(log_probs, enc_lens), ctc_weight))
    if lm is not None:
        scorers.append((LMScorer(lm), options.fusion_weight))
        if lm.word_list is not None and options.word_penalty > 0:
            scorers.append((WordListScorer(lm.word_list.table()), options.word_penalty))
    if options.maxlen_ratio > 0:
        max_lengths = (options.maxlen_ratio * enc_lens.float()).long().clamp(min=1)
    else:
        max_lengths = enc_lens
    with one_thread() if enc.device.type == "cpu" else contextlib.nullcontext():
        return beam_search(
            scorers,
            enc.shape[0],
            max_lengths,
            model.vocab_size,
            options.beam,
            options.nbest,
            options.token_bonus,
            enc.device,
        )
