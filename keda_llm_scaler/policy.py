"""The composite demand metric, in replica-equivalents. Pure: no I/O, no clock, no logging.

With KEDA's default ``AverageValue`` target of 1.0 the HPA asks for ``ceil(composite)`` replicas, so
the composite answers one question: how many replicas' worth of work does the fleet hold right now?

Per replica i (``kvT`` = targetKvUsage, ``qT`` = targetQueueDepth)::

    load_i    = kv_i / kvT                    KV in use, in replicas at target (1.0 = exactly at target)
    queue_i   = min(1, waiting_i / (C x H))  once a capacity C is known (any source), H the start-up
                                              horizon: the backlog as work (``drain_requests``)
    queue_i   = min(1, waiting_i / max(qT, running_i))  while none is: work not yet admitted, in batches
                                              of what the replica runs at once (never smaller than qT
                                              requests), at most one replica beside it either way
    reject_i  = min(1, rejects_i / admitted_i)  demand turned away, relative to what the replica serves
    if the replica is rejecting: load_i = max(load_i, 1)   (admission control fired: it is full)
    d_i       = load_i + queue_i + reject_i
    if the replica has work in flight (running + waiting > 0): d_i = max(d_i, 0.01)

    pressure  = sum(d_i)                      replicas summed in a fixed (URL) order
    if any replica is rejecting: pressure = max(pressure, N + sum(reject_i))
    rate      = need / (capacity x targetUtilization)     (``keda_llm_scaler.demand``; absent while no capacity
                + sum(queue_i)                is configured, learned or read from KV) plus the backlog
    composite = max(pressure, rate)          (pressure alone when it is 0 and no arrival was counted over
                                              the served window, demandWindow / 10: the fleet is idle)
    with ttftSloSeconds: fleet TTFT quantile > SLO and composite >= 0.8 N -> composite >= max(N + 1, 1.25 N)
                         fleet TTFT quantile > 0.8 x SLO -> composite >= N   (no scale-down near the SLO)
    with itlSloSeconds:  the same on the fleet's inter-token latency at itlSloQuantile; the larger floor holds
    composite is rounded to 0.001 (KEDA's and the HPA's resolution)

The rate term is the demand: requests offered to the fleet (with headroom for their spread and their
growth over one replica start-up) in replicas planned at ``targetUtilization`` of their capacity. It is
linear in load, and once the capacity is configured or learned it does not depend on how many replicas
there are, so it cannot feed back on itself (a capacity read from KV is a reading of the replicas).
The pressure terms are the guard for when the capacity is unknown or wrong: KV, queue and rejects.

On data-parallel pods (several engines behind one endpoint) the fullest engine's KV counts, and the
queue is each engine's waiting over its own running batch, the worst engine counting: a pod-wide mean
hides one full engine behind idle ones.

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

from keda_llm_scaler.demand import (
    DEFAULT_SLO_QUANTILE,
    DEMAND_WINDOW_S,
    SERVED_WINDOW_PARTS,
    DemandEstimate,
    nonneg,
)
from keda_llm_scaler.errors import NoFreshData

__all__ = [
    "IN_FLIGHT_FLOOR",
    "MAX_BACKLOG_TERM",
    "MAX_COMPOSITE",
    "REJECT_SHARE_THRESHOLD",
    "SLO_BREACH_FACTOR",
    "SLO_HOLD_SHARE",
    "Composite",
    "ReplicaInput",
    "ReplicaScore",
    "ScoringParams",
    "backlog_replicas",
    "composite",
    "drain_requests",
    "score_replica",
    "slo_floor",
    "with_incoming",
]

IN_FLIGHT_FLOOR: Final = 0.01  # 10x KEDA's milli resolution: work in flight is never "inactive"
REJECT_SHARE_THRESHOLD: Final = 0.01
MAX_REJECT_TERM: Final = 1.0  # per replica and decision; the HPA doubles at most per 15 s anyway
SLO_HOLD_SHARE: Final = 0.8  # TTFT above this share of the SLO: no scale-down
SLO_BREACH_FACTOR: Final = 1.25  # TTFT above the SLO: at least a quarter more (and one more) replicas
MAX_BACKLOG_TERM: Final = 1.0  # per replica, with or without a capacity: see ``backlog_replicas``
# a need this far past the awake replicas asks to wake none: rounding, not a replica's worth of work
WAKE_TOLERANCE: Final = 0.05
MAX_COMPOSITE: Final = 100_000.0  # replica-equivalents; past any fleet, and inside KEDA's int64 metricValue


@dataclass(frozen=True, slots=True)
class ScoringParams:
    """A trigger's scoring parameters; the field defaults are the metadata's (``metadata.DEFAULTS`` reads them)."""

    target_kv_usage: float = 0.85
    target_queue_depth: float = 5.0
    target_utilization: float = 0.9
    replica_capacity: float | None = None  # requests/s one replica serves within the SLO; None: learn it
    startup_s: float | None = None  # seconds from created to ready; None: learn it
    ttft_slo_s: float | None = None
    ttft_slo_quantile: float = DEFAULT_SLO_QUANTILE
    # the decode SLO: the gap between two tokens of a stream, at itl_slo_quantile of the gaps (a decode-heavy
    # fleet meets its TTFT and misses this as its batches grow: each step serves more streams, slower)
    itl_slo_s: float | None = None
    itl_slo_quantile: float = DEFAULT_SLO_QUANTILE
    demand_window_s: float = DEMAND_WINDOW_S  # the demand's calm window (the others follow: DemandConfig)


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
    kv_usage_max: float | None = None  # the fullest data-parallel engine (None: one engine)
    engines: tuple[tuple[float, float], ...] = ()  # (waiting, running) per engine, when more than one
    # asleep (vLLM's sleep mode, weights offloaded or discarded): a member that serves nothing until it is
    # woken; neither capacity nor an idle replica (see ``composite``)
    asleep: bool = False


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
    dominant: str  # why: reject | slo | hold | rate | load | queue | assumed | gateway | idle (see ``composite``)
    pressure: float = 0.0  # the KV + queue + reject side, before the rate term
    rate: float | None = None  # replicas the offered load asks for (None: no usable capacity or load)
    slo_floor: float | None = None  # the TTFT guardrail's floor, when it applies
    hold: float | None = None  # replicas held while the fleet's rate is not known yet (``rate_pending``)
    demand: DemandEstimate | None = None
    asleep: int = 0  # members asleep, not in ``replicas``
    wake: int = 0  # of them, how many the need asks to wake (before it asks for new replicas)

    def active(self, activation_threshold: float) -> bool:
        return self.value > activation_threshold


def _score_signals(r: ReplicaInput, p: ScoringParams, drain_requests: float | None) -> ReplicaScore:
    kv = max(nonneg(r.kv_usage), nonneg(r.kv_usage_max))
    load = kv / p.target_kv_usage
    if drain_requests is not None:
        # With a capacity known the backlog is work, not batches: what one replica drains in a start-up.
        queue = nonneg(r.waiting) / drain_requests
    # Without one: a replica that runs 200 requests at once drains a queue of 20 in a step or two; one
    # that runs 3 does not. Counting the queue in units of the running batch keeps large-batch pods sane;
    # on a data-parallel pod each engine drains its own queue with its own batch.
    elif len(r.engines) > 1:
        queue = max(nonneg(w) / max(p.target_queue_depth, nonneg(n)) for w, n in r.engines)
    else:
        queue = nonneg(r.waiting) / max(p.target_queue_depth, nonneg(r.running))
    # Either way a replica's backlog asks for at most one replica beside it (``backlog_replicas``). Without
    # the bound a queue counted in batches grows with the backlog's age for as long as no capacity is known:
    # on two real engines overloaded 1.5x, 12.2 replicas within 25 s for a need of 3.8, before the capacity
    # was learned at 30 s (it was 43.7 in 150 s at 0.2.0, which knew none).
    queue = min(MAX_BACKLOG_TERM, queue)
    rejects, admitted = nonneg(r.reject_rate), nonneg(r.admitted_rate)
    rejecting = rejects > 0 and rejects >= REJECT_SHARE_THRESHOLD * (rejects + admitted)
    reject = 0.0
    if rejecting:
        reject = MAX_REJECT_TERM if admitted == 0 else min(MAX_REJECT_TERM, rejects / admitted)
        load = max(load, 1.0)
    demand = load + queue + reject
    if _in_flight(r):
        demand = max(demand, IN_FLIGHT_FLOOR)
    return ReplicaScore(demand, load, queue, reject, rejecting, assumed_at_target=False)


def score_replica(r: ReplicaInput, p: ScoringParams, drain_requests: float | None = None) -> ReplicaScore:
    """One replica's pressure. ``drain_requests``: the requests one replica serves in one start-up (see
    ``drain_requests``); None while no capacity is known, and the queue counts in running batches."""
    score = _score_signals(r, p, drain_requests)
    if r.expired and score.demand < 1.0:
        return ReplicaScore(1.0, score.load, score.queue, score.reject, score.rejecting, True)
    return score


def drain_requests(demand: DemandEstimate | None) -> float | None:
    """Requests one replica serves within one start-up: the unit a backlog is counted in once a capacity is
    known (configured, learned, served or read from KV). None without one.

    Why a start-up: a replica asked for now serves nothing before it, so what the fleet holds is drained by
    the replicas there are plus the ones that arrive after one start-up; a backlog that one replica clears
    within that horizon needs no replica of its own. Counting it in running batches instead (what the
    pressure side does without a capacity) treats each batch of waiting requests as a replica's worth: on a
    real vLLM whose batch of 16 short requests drains in under 2 s, a queue growing at 10 req/s behind a
    fleet that could not grow read 43.7 replicas within 150 s for a need of 3.3.
    """
    if demand is None or demand.capacity_rps is None:
        return None
    per_replica = demand.capacity_rps * demand.startup_s
    return per_replica if math.isfinite(per_replica) and per_replica > 0 else None


def backlog_replicas(scores: Sequence[ReplicaScore], drain: float | None) -> float | None:
    """Replicas that drain what already waits within one start-up, on top of what the arrivals need.

    Each replica's backlog asks for at most ``MAX_BACKLOG_TERM`` (one) replica beside it: a queue that
    outgrew it keeps growing only while capacity cannot arrive (``maxReplicaCount`` reached, pods Pending),
    and asking for more then buys nothing but the overshoot once the capacity comes (the fleet scales
    down only after the calm window). So under any sustained overload the composite stays within
    ``rate + N`` and never grows with the backlog's age.
    """
    if drain is None:
        return None
    return math.fsum(s.queue for s in scores)


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


def slo_floor(
    ttft_quantile_s: float | None,
    replicas: int,
    p: ScoringParams,
    signals: float = math.inf,
    itl_quantile_s: float | None = None,
) -> float | None:
    """The SLO guardrails, TTFT's and the inter-token latency's: the larger floor of the two."""
    floors = [
        f
        for f in (
            _guardrail(ttft_quantile_s, p.ttft_slo_s, replicas, signals),
            _guardrail(itl_quantile_s, p.itl_slo_s, replicas, signals),
        )
        if f is not None
    ]
    return max(floors) if floors else None


def _guardrail(quantile_s: float | None, slo_s: float | None, replicas: int, signals: float) -> float | None:
    """None fewer replicas when the fleet is near or above its SLO, and more when it breaches it while the
    other signals say it is nearly full (``signals`` >= 0.8 N: the breach is about capacity). A breach they
    do not corroborate (long prompts, a slow node, a model slow at any batch) holds the fleet rather than
    ratcheting it up with every replica that becomes ready."""
    if slo_s is None or quantile_s is None or not math.isfinite(quantile_s) or replicas <= 0:
        return None
    if quantile_s > slo_s and signals >= SLO_HOLD_SHARE * replicas:
        return max(replicas + 1.0, SLO_BREACH_FACTOR * replicas)
    if quantile_s > SLO_HOLD_SHARE * slo_s:
        return float(replicas)
    return None


def _in_flight(r: ReplicaInput) -> bool:
    """The replica holds work: requests running or waiting."""
    return nonneg(r.running) + nonneg(r.waiting) > 0


def _idle_asleep(r: ReplicaInput) -> bool:
    return r.asleep and not r.expired and not _in_flight(r) and not nonneg(r.reject_rate) > 0


def _arriving(demand: DemandEstimate | None, p: ScoringParams) -> bool:
    """A scrape counted an arrival within the served window (``demandWindow`` / 10: 30 s by default)."""
    if demand is None or demand.since_arrival_s is None:
        return False
    return demand.since_arrival_s < p.demand_window_s / SERVED_WINDOW_PARTS


def composite(
    replicas: Sequence[ReplicaInput],
    p: ScoringParams,
    incoming: int = 0,
    demand: DemandEstimate | None = None,
    ttft_quantile_s: float | None = None,
    itl_quantile_s: float | None = None,
    held: float | None = None,
    rate_pending: bool = False,
) -> Composite:
    """Score a fleet. The caller passes replicas in a fixed order (by URL) for determinism.

    ``incoming``: replicas that exist but are not ready yet (not-ready EndpointSlice endpoints).
    ``demand``: the fleet's offered load (``keda_llm_scaler.demand``); ``ttft_quantile_s``: the fleet's TTFT at
    ``p.ttft_slo_quantile`` over the rate window, for the SLO guardrail. ``held``: the requests the pool's
    gateway holds for it; while no replica is ready they are its demand (a pool at zero has nothing else to
    read): one replica per targetQueueDepth of them, at least one. ``rate_pending``: no rate of the
    scaler's own yet (``DemandTracker.rate_pending``): neither a missing ``demand`` nor a restored one is a
    reason to read fewer replicas than serve work.
    """
    # A replica asleep (and idle: one showing work is read as it shows) serves nothing and says nothing about
    # the load: it is left out of the scores, so the fleet's readings (its size for the reject floor, the SLO
    # floor and the rate's cap) are the awake replicas'. It is still a member the HPA counts, so a need
    # beyond the awake replicas is first theirs to cover once woken: the composite asks for new replicas
    # only beyond them, and says how many to wake.
    asleep = sum(1 for r in replicas if _idle_asleep(r))
    replicas = [r for r in replicas if not _idle_asleep(r)]
    gateway_need = max(1.0, held / p.target_queue_depth) if held is not None and held > 0 else 0.0
    if not replicas:
        # Nothing awake: zero, unless replicas are starting (then hold them: no data says otherwise), the
        # gateway holds requests for the pool (then wake it), or, with every member asleep, the arrivals
        # still counted ask for them.
        asleep_need = 0.0
        if asleep and demand is not None and _arriving(demand, p):
            asleep_need = demand.replicas(p.target_utilization) or 0.0
        value = min(MAX_COMPOSITE, max(float(incoming), gateway_need, asleep_need))
        reason = (
            "gateway" if gateway_need > max(incoming, asleep_need) else "rate" if asleep_need > incoming else "assumed"
        )
        reason = reason if value > 0 else "idle"
        wake = min(asleep, max(0, math.ceil(value - incoming - WAKE_TOLERANCE)))
        return Composite(round(value, 3), 0, 0, 0.0, 0.0, 0.0, value, reason, pressure=value, asleep=asleep, wake=wake)
    expired = sum(1 for r in replicas if r.expired)
    if expired == len(replicas) and not asleep:  # (a replica asleep that answers is data)
        raise NoFreshData(f"no fresh data from any of {len(replicas)} replicas")
    drain = drain_requests(demand)
    scores = [score_replica(r, p, drain) for r in replicas]
    total = math.fsum(s.demand for s in scores)
    reject = math.fsum(s.reject for s in scores)
    if any(s.rejecting for s in scores):
        total = max(total, len(scores) + reject)
    if total > len(scores):
        # what exceeds the awake replicas is first the asleep ones' to cover once woken, then what the
        # starting ones are coming for
        excess = total - len(scores)
        woken = min(float(asleep), excess)
        total = len(scores) + woken + with_incoming(excess - woken, incoming)
    assumed = math.fsum(s.demand - (s.load + s.queue + s.reject) for s in scores if s.assumed_at_target)
    terms = {
        "load": math.fsum(s.load for s in scores),
        "queue": math.fsum(s.queue for s in scores),
        "reject": reject,
        "assumed": assumed,
    }
    pressure = total
    utilization = p.target_utilization
    rate = demand.replicas(utilization) if demand is not None else None
    backlog = backlog_replicas(scores, drain)
    if rate is not None and demand is not None and not demand.knee_known:
        # Before any replica was seen past its knee the capacity is a prior (read from KV, whose knee
        # depends on the mix and the hardware: 0.1 on long prompts, 1.0 on a small pool) or the rate a
        # replica served healthily (a lower bound). Either may hold a fleet or shrink it; it grows only
        # as far as the need exceeds what replicas were seen to serve, so a fleet holding a steady load
        # is not grown (property d) while a load rising past it is answered before anything saturates.
        rate = min(rate, max(float(len(scores)), demand.beyond_served(utilization) or 0.0))
    if rate is not None and backlog is not None:
        # the arrivals' replicas plus the ones that drain what already waits within one start-up
        rate += backlog
    if rate is not None and (pressure > 0 or _arriving(demand, p)):
        # sizing for the load there is: a fleet that had no arrival over the served window and holds
        # nothing in flight reads idle (IsActive false, property h's converse), not busy for as long as
        # the last 5 minutes' mean lasts. Nothing in flight at one scrape is not idle: at light load most
        # scrapes fall between requests, and a composite flickering to 0 would let KEDA scale a serving
        # pool to zero once enough polls in a row land in the gaps.
        total = max(total, rate)
    # the SLO guardrail is judged on what the signals say, before any hold: a hold is no evidence of load
    floor = slo_floor(ttft_quantile_s, len(scores), p, total, itl_quantile_s)
    holding = 0.0
    if rate_pending and any(_in_flight(r) for r in replicas):
        # The first seconds after the scaler meets a fleet (a start without state, a failover to a pod
        # that never scraped it) have no rate: the pressure side alone reads KV and queues, a few hundredths
        # of a replica for a fleet whose replicas are busy but whose KV is light. Nothing says the replicas
        # there are too many, so a fleet serving work holds them all until its rate is known (not only the
        # ones busy at this scrape: at light load that count flickers). A cold standby answered 0.1 for
        # five busy replicas, and the real HPA took the fleet from 5 to 1 before the rate came
        # (tests/e2e/test_failover.py with the state not shared). A restored window does not end it: it may
        # be seconds to minutes old, and during a ramp it reads the load before the rise (a standby read
        # 2.7 from an 11-s-old record where the pod it replaced read 4.1); it may ask for more, not fewer.
        holding = float(len(scores))
        total = max(total, holding)
    if floor is not None:
        total = max(total, floor)
    if total <= 0:
        dominant = "idle"
    elif any(s.rejecting for s in scores):
        dominant = "reject"  # rejects also lift load to 1: they are the reason either way
    elif floor is not None and floor > max(pressure, rate or 0.0, holding):
        dominant = "slo"
    elif holding > 0 and holding >= max(pressure, rate or 0.0):
        dominant = "hold"
    elif rate is not None and rate >= pressure:
        dominant = "rate"
    else:
        dominant = max(terms, key=lambda k: terms[k])
    value = round(min(total, MAX_COMPOSITE), 3)
    return Composite(
        value=value,
        replicas=len(scores),
        expired=expired,
        load=terms["load"],
        queue=terms["queue"],
        reject=reject,
        assumed=assumed,
        dominant=dominant,
        pressure=pressure,
        rate=rate,
        slo_floor=floor,
        hold=holding or None,
        demand=demand,
        asleep=asleep,
        wake=min(asleep, max(0, math.ceil(value - len(scores) - WAKE_TOLERANCE))),
    )
