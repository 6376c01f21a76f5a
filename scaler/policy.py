"""The composite demand metric, in replica-equivalents. Pure: no I/O, no clock, no logging.

With KEDA's default ``AverageValue`` target of 1.0 the HPA asks for ``ceil(composite)`` replicas, so
the composite answers one question: how many replicas' worth of work does the fleet hold right now?

Per replica i (``kvT`` = targetKvUsage, ``qT`` = targetQueueDepth)::

    load_i    = kv_i / kvT                    KV in use, in replicas at target (1.0 = exactly at target)
    queue_i   = waiting_i / max(qT, running_i)  work not yet admitted, in batches of what the replica
                                              runs at once (never smaller than qT requests)
    reject_i  = min(1, rejects_i / admitted_i)  demand turned away, relative to what the replica serves
    if the replica is rejecting: load_i = max(load_i, 1)   (admission control fired: it is full)
    d_i       = load_i + queue_i + reject_i
    if the replica has work in flight (running + waiting > 0): d_i = max(d_i, 0.01)

    composite = sum(d_i)                      replicas summed in a fixed (URL) order
    if any replica is rejecting: composite = max(composite, N + sum(reject_i))
    composite is rounded to 0.001 (KEDA's and the HPA's resolution)

A replica counts as rejecting when rejects are at least 1 % of the requests it finished or rejected
in the rate window (so a stray HTTP 500 does not buy a replica). The fleet floor ``N + sum(reject_i)``
means rejects anywhere add capacity even when the load balancer left other replicas idle.

Missing data is never zero load. A replica whose scrape fails keeps its last good score until
``ttl`` (the caller decides freshness); after that, or if it never answered, it counts as
``max(last score, 1.0)``, at least at target. With no replica inside its TTL the fleet has no
fresh data at all and ``composite`` raises NoFreshData, so KEDA's fallback applies. A fleet of zero
replicas scores 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from scaler.errors import NoFreshData

__all__ = [
    "IN_FLIGHT_FLOOR",
    "REJECT_SHARE_THRESHOLD",
    "Composite",
    "ReplicaInput",
    "ReplicaScore",
    "ScoringParams",
    "composite",
    "score_replica",
    "with_incoming",
]

IN_FLIGHT_FLOOR: Final = 0.01  # 10x KEDA's milli resolution: work in flight is never "inactive"
REJECT_SHARE_THRESHOLD: Final = 0.01
MAX_REJECT_TERM: Final = 1.0  # per replica and decision; the HPA doubles at most per 15 s anyway


@dataclass(frozen=True, slots=True)
class ScoringParams:
    target_kv_usage: float = 0.85
    target_queue_depth: float = 5.0


@dataclass(frozen=True, slots=True)
class ReplicaInput:
    """What the policy sees of one replica.

    ``expired`` is True when the replica has no good data inside its TTL (or never had any); its
    last good values, if any, are still passed in so that it never counts for less than it did.
    Rates are per second over the caller's window; None means unknown (first sighting, or the
    engine exports no such counter), which adds nothing.
    """

    waiting: float | None = None
    running: float | None = None
    kv_usage: float | None = None
    reject_rate: float | None = None
    admitted_rate: float | None = None
    expired: bool = False


@dataclass(frozen=True, slots=True)
class ReplicaScore:
    demand: float
    load: float
    queue: float
    reject: float
    rejecting: bool
    assumed_at_target: bool


@dataclass(frozen=True, slots=True)
class Composite:
    value: float
    replicas: int
    expired: int
    load: float
    queue: float
    reject: float
    assumed: float  # demand added by replicas counted as at-target for lack of data
    dominant: str  # why: reject (any replica rejecting), else the largest of load | queue | assumed; idle

    def active(self, activation_threshold: float) -> bool:
        return self.value > activation_threshold


def _nonneg(x: float | None) -> float:
    return x if x is not None and math.isfinite(x) and x > 0 else 0.0


def _score_signals(r: ReplicaInput, p: ScoringParams) -> ReplicaScore:
    load = _nonneg(r.kv_usage) / p.target_kv_usage
    # A replica that runs 200 requests at once drains a queue of 20 in a step or two; one that runs 3
    # does not. Counting the queue in units of the running batch keeps DP and large-batch pods sane.
    queue = _nonneg(r.waiting) / max(p.target_queue_depth, _nonneg(r.running))
    rejects, admitted = _nonneg(r.reject_rate), _nonneg(r.admitted_rate)
    rejecting = rejects > 0 and rejects >= REJECT_SHARE_THRESHOLD * (rejects + admitted)
    reject = 0.0
    if rejecting:
        reject = MAX_REJECT_TERM if admitted == 0 else min(MAX_REJECT_TERM, rejects / admitted)
        load = max(load, 1.0)
    demand = load + queue + reject
    if _nonneg(r.running) + _nonneg(r.waiting) > 0:
        demand = max(demand, IN_FLIGHT_FLOOR)
    return ReplicaScore(demand, load, queue, reject, rejecting, assumed_at_target=False)


def score_replica(r: ReplicaInput, p: ScoringParams) -> ReplicaScore:
    score = _score_signals(r, p)
    if r.expired and score.demand < 1.0:
        return ReplicaScore(1.0, score.load, score.queue, score.reject, score.rejecting, True)
    return score


def with_incoming(excess: float, incoming: int) -> float:
    """Demand beyond the ready replicas, once ``incoming`` starting replicas count as capacity on the way.

    Each starting replica will take up to one replica-equivalent of that excess, so the excess asks for
    more only beyond them — but never for less than what is starting while it is larger (the HPA keeps
    what it started). When no more is starting than the excess needs, nothing changes. Monotone in
    ``excess``; unchanged when nothing is starting.
    """
    if incoming <= 0 or excess <= incoming:
        return excess
    return max(excess - incoming, float(incoming))


def composite(replicas: Sequence[ReplicaInput], p: ScoringParams, incoming: int = 0) -> Composite:
    """Score a fleet. The caller passes replicas in a fixed order (by URL) for determinism.

    ``incoming``: replicas that exist but are not ready yet (not-ready EndpointSlice endpoints).
    """
    if not replicas:
        # Nothing ready: zero, unless replicas are starting (then hold them: no data says otherwise).
        value = float(incoming)
        return Composite(value, 0, 0, 0.0, 0.0, 0.0, value, "assumed" if incoming else "idle")
    expired = sum(1 for r in replicas if r.expired)
    if expired == len(replicas):
        raise NoFreshData(f"no fresh data from any of {len(replicas)} replicas")
    scores = [score_replica(r, p) for r in replicas]
    total = math.fsum(s.demand for s in scores)
    reject = math.fsum(s.reject for s in scores)
    if any(s.rejecting for s in scores):
        total = max(total, len(scores) + reject)
    if total > len(scores):
        # what exceeds the ready replicas is what the starting ones are coming for
        total = len(scores) + with_incoming(total - len(scores), incoming)
    assumed = math.fsum(s.demand - (s.load + s.queue + s.reject) for s in scores if s.assumed_at_target)
    terms = {
        "load": math.fsum(s.load for s in scores),
        "queue": math.fsum(s.queue for s in scores),
        "reject": reject,
        "assumed": assumed,
    }
    if total <= 0:
        dominant = "idle"
    elif any(s.rejecting for s in scores):
        dominant = "reject"  # rejects also lift load to 1: they are the reason either way
    else:
        dominant = max(terms, key=lambda k: terms[k])
    return Composite(
        value=round(total, 3),
        replicas=len(scores),
        expired=expired,
        load=terms["load"],
        queue=terms["queue"],
        reject=reject,
        assumed=assumed,
        dominant=dominant,
    )
