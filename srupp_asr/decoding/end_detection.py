"""When a label-synchronous beam search may stop searching an utterance: the rule the torch search
(:mod:`srupp_asr.decoding.beam_search`) and the numpy one (:mod:`srupp_asr.runtime.search`) share. Pure Python.

Every scorer's log score is <= 0 (the CTC prefix probability too: it falls as the prefix grows), so without a
length bonus a running hypothesis' score only falls: once the ``nbest``-th ended hypothesis scores at least the best
running one, nothing running can overtake it, and stopping is exact.

A length bonus (a positive length penalty) adds to every token, so a running hypothesis may climb again, and no
bound short of the maximum length holds: searching on to it costs twice the time on read speech. The search then
stops once the best running hypothesis is :data:`END_MARGIN` below the ``nbest``-th ended one (ESPnet's end
detection stops on the same 10 nats, ``D_end``, between the ended hypotheses of the last lengths and the best). With
the built-in model's bonus of 1 it finds every transcript on the real dev sets that a search run to the maximum
length finds, in 0.81x the time (benchmarks/RESULTS.md).
"""

from __future__ import annotations

from collections.abc import Sequence

NEG_INF = float("-inf")
# How far (nats) the best running hypothesis must fall below the nbest-th ended one before a search with a length
# bonus stops (ESPnet's D_end = log(exp(-10)))
END_MARGIN = 10.0


def finished(
    best_running: Sequence[float],
    ended: Sequence[Sequence[tuple[list[int], float]]],
    nbest: int,
    length_penalty: float,
    end_margin: float = END_MARGIN,
) -> list[bool]:
    """Which utterances need no more steps, given each one's best running score (-inf: none running) and its ended
    hypotheses (tokens, score): nothing running, or the best running one at or below the ``nbest``-th ended one
    (``end_margin`` below it with a length bonus, ``length_penalty > 0``; ``end_margin`` inf: never, the search runs
    to the maximum length)."""
    margin = end_margin if length_penalty > 0.0 else 0.0
    done = []
    for best, hyps in zip(best_running, ended, strict=True):
        kth = sorted((s for _, s in hyps), reverse=True)
        done.append(best == NEG_INF or (len(kth) >= nbest and best <= kth[nbest - 1] - margin))
    return done
