"""The rate a replica serves within a wait, from the rate it serves flat out: a many-server queue.

Pure: no I/O. ``keda_llm_scaler.demand`` learns a replica's throughput where it keeps a queue (the rate it takes
requests into its batch past its knee), but the capacity the composite sizes with is the rate it serves
*within the SLO*. The two differ by queueing: requests arrive at random, and a replica with few batch slots,
each held for seconds, queues long before it is busy all the time. On a vLLM CPU engine capped at 16
sequences of 50-token answers (issue #30) the capacity at a 1 s TTFT SLO was 0.57-0.81 of the saturated
throughput; a GPU replica holding a batch of hundreds serves within a few percent of its throughput.

The model is M/M/c: ``slots`` servers (the batch the replica held while it kept a queue), each serving
``throughput / slots`` requests/s, Poisson arrivals. A request waits longer than ``t`` with probability

    P(W > t) = C(c, a) * exp(-(c mu - lambda) t)          a = lambda / mu   (Erlang C)

and the capacity within the wait is the largest ``lambda`` for which that is at most ``1 - quantile``.
Exponential service is the pessimistic end for a fixed answer length and about right for a chat mix's
spread of answer lengths; the model ignores that a batch's step time grows with its size (a smaller batch
serves each request faster), which errs on the same side. It is a correction of a measured throughput, not a
prediction of one.
"""

from __future__ import annotations

import math
from typing import Final

__all__ = ["erlang_c", "rate_within_wait"]

_BISECTIONS: Final = 50


def erlang_c(servers: int, offered: float) -> float:
    """The probability that an arrival waits at all, in an M/M/c queue with ``offered`` erlangs (< servers).

    Through Erlang B's recursion, stable for any number of servers (a^c / c! overflows from c ~ 170)."""
    if servers < 1:
        raise ValueError(f"servers must be at least 1: {servers}")
    if offered <= 0:
        return 0.0
    if offered >= servers:
        return 1.0
    blocking = 1.0
    for k in range(1, servers + 1):
        blocking = offered * blocking / (k + offered * blocking)
    return servers * blocking / (servers - offered * (1.0 - blocking))


def rate_within_wait(throughput: float, slots: float, wait_s: float, quantile: float) -> float:
    """The arrival rate at which at most ``1 - quantile`` of requests wait longer than ``wait_s``, on a replica
    that serves ``throughput`` requests/s with ``slots`` requests in its batch (rounded, at least 1)."""
    if not (throughput > 0 and math.isfinite(throughput)):
        return 0.0
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"quantile must be in (0, 1): {quantile}")
    servers = max(1, round(slots)) if math.isfinite(slots) else 1
    per_slot = throughput / servers
    allowed = 1.0 - quantile

    def late(rate: float) -> float:
        return erlang_c(servers, rate / per_slot) * math.exp(-(throughput - rate) * max(0.0, wait_s))

    lo, hi = 0.0, throughput
    for _ in range(_BISECTIONS):
        mid = (lo + hi) / 2
        if late(mid) <= allowed:
            lo = mid
        else:
            hi = mid
    return lo
