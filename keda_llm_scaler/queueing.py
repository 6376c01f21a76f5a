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

Service is not exponential: a slot is held for one whole answer, and how long depends on the answer's
length. Where the spread of those hold times is known (``service_scv``: their squared coefficient of
variation, from vLLM's ``request_inference_time_seconds`` histogram), the wait is scaled as the
Allen-Cunneen approximation scales an M/G/c queue's, by ``(1 + scv) / 2``: answers of one length (scv near
0) wait about half as long as exponential ones, a chat mix's spread (scv near 1) about as long, a heavier
tail longer. The probability of waiting at all is left at Erlang C's, which errs on the safe side for
scv < 1. The model ignores that a batch's step time grows with its size (a smaller batch serves each
request faster), which errs on the same side. It is a correction of a measured throughput, not a
prediction of one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

__all__ = ["MAX_SERVICE_SCV", "erlang_c", "rate_within_wait", "service_scv"]

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


MAX_SERVICE_SCV: Final = 4.0  # beyond this the bucket layout, not the answers, sets the spread read


def rate_within_wait(
    throughput: float, slots: float, wait_s: float, quantile: float, service_scv: float | None = None
) -> float:
    """The arrival rate at which at most ``1 - quantile`` of requests wait longer than ``wait_s``, on a replica
    that serves ``throughput`` requests/s with ``slots`` requests in its batch (rounded, at least 1).
    ``service_scv``: the hold times' squared coefficient of variation (None: unknown, read as exponential,
    1; clamped to [0, MAX_SERVICE_SCV])."""
    if not (throughput > 0 and math.isfinite(throughput)):
        return 0.0
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"quantile must be in (0, 1): {quantile}")
    servers = max(1, round(slots)) if math.isfinite(slots) else 1
    per_slot = throughput / servers
    allowed = 1.0 - quantile
    scv = 1.0 if service_scv is None or not math.isfinite(service_scv) else min(max(service_scv, 0.0), MAX_SERVICE_SCV)
    # Allen-Cunneen: an M/G/c queue's waits are an M/M/c queue's times (1 + scv) / 2
    decay = 2.0 / (1.0 + scv)

    def late(rate: float) -> float:
        return erlang_c(servers, rate / per_slot) * math.exp(-(throughput - rate) * decay * max(0.0, wait_s))

    lo, hi = 0.0, throughput
    for _ in range(_BISECTIONS):
        mid = (lo + hi) / 2
        if late(mid) <= allowed:
            lo = mid
        else:
            hi = mid
    return lo


def service_scv(buckets: Sequence[tuple[float, float]], min_observations: float = 20.0) -> float | None:
    """The squared coefficient of variation of what a cumulative histogram observed (``(upper bound,
    cumulative count)`` pairs sorted by bound, the last +Inf): its variance over its mean squared, each
    observation taken as spread evenly over its bucket (the +Inf bucket's at the largest finite bound).
    None with fewer than ``min_observations`` or no finite bound: too few to tell a spread."""
    finite = [(le, c) for le, c in buckets if math.isfinite(le)]
    total = buckets[-1][1] if buckets else 0.0
    if not finite or not total >= min_observations:
        return None
    first = second = 0.0
    lower, below = 0.0, 0.0
    for le, cumulative in finite:
        n = cumulative - below
        if n > 0:
            # uniform on (lower, le]: mean (l + u) / 2, second moment (l^2 + l u + u^2) / 3
            first += n * (lower + le) / 2.0
            second += n * (lower * lower + lower * le + le * le) / 3.0
        lower, below = le, cumulative
    tail = total - below
    if tail > 0:
        first += tail * lower
        second += tail * lower * lower
    mean = first / total
    if mean <= 0:
        return None
    return max(0.0, second / total - mean * mean) / (mean * mean)
