"""The demand signal linear in load: requests offered to the fleet against a replica's capacity.

Pure: no I/O, the clock is passed in. ``FleetState`` feeds it every scrape; ``keda_llm_scaler.policy`` turns the
estimate into replica-equivalents.

Why requests offered and not KV or the queue: KV occupancy is convex in load (a 70B replica reaches its
knee with KV near 0.4, then fills within seconds), and the queue stays empty until the knee. Arrivals
are linear in load on both sides of the knee, and cost one counter and two gauges every engine has::

    arrived_total = finished_total + rejected_total + running + waiting

grows by exactly the requests that reached the replica (a request is in flight, finished or refused),
whatever the batch does. Counted as deltas: a restart is a counter going down (then all of it arrived
since); a request cancelled without being counted shrinks the batch and never makes arrivals negative;
a missing, negative or non-finite counter makes the bin unknown (no estimate), never low. A replica
whose scrape failed is made up by the ones that answered, per replica-second; a bin where no member
answered is unknown.

From the fleet's arrivals per bin of ``bin_s`` seconds (10 s at the default 5 s scrape interval):

    offered  = mean arrival rate over the calm window (300 s)
    spread   = the bins' spread over the calm window, as a robust standard deviation (1.4826 x the
               median absolute deviation): the everyday burstiness the SLO time scale sees — Poisson
               noise on a smooth day, second-scale clumps on chat traffic — which a rare burst of a
               few bins does not inflate
    growth   = the trend over the last 360 s (least squares), projected over one replica start-up,
               never negative and at most growth_cap (0.2) x offered, so noise cannot inflate it
    need     = offered + growth + headroom_sigmas (2) x spread                    (requests/s)
    recent   = mean over the burst window (30 s), reported; ``use_burst_window`` adds it as
               max(offered + growth, recent). Off by default: on the bursty hour it bought no
               attainment and cost 5-9 GPU-h, since a burst shorter than a start-up is over before the
               replicas it asks for are ready, and the HPA then holds them. Bursts are answered within
               one scrape by the pressure side of the composite (queue, KV, rejects).

A replica's capacity (requests/s it serves within the SLO), in order of precedence:

* configured (``replicaCapacity``);
* learned: a replica that keeps a queue while its KV pool is full or it preempts is past its knee, and
  the rate at which it takes requests into its batch then (finished + growth of the running batch) is
  what it can serve — on the engines' step model the knee is a cliff, and throughput past it is within
  3 % of the rate at the SLO. The median of the last CAPACITY_SAMPLES such readings with requests
  finishing (a stuck engine teaches nothing), none older than SAMPLE_MAX_AGE_S; spread needs 3 bins of
  the calm window and growth 6 of the trend window;
* provisional, before any replica has been past its knee: the offered rate over the replicas' KV-read
  utilization (``kv_utilization``), on the calm window;
* unknown (an idle fleet): no rate term, the pressure side alone.

Start-up time is configured (``startupSeconds``) or learned from the fleet: each replica that appears in
the scrape set is matched with the oldest pending not-ready endpoint (FIFO), and the median of those
delays is the horizon (DEFAULT_STARTUP_S until one is seen).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

__all__ = [
    "CAPACITY_SAMPLES",
    "DEFAULT_STARTUP_S",
    "DemandConfig",
    "DemandEstimate",
    "DemandTracker",
    "ReplicaCounters",
    "is_saturated",
]

BIN_S: Final = 10.0
CAPACITY_SAMPLES: Final = 32
MIN_CAPACITY_SAMPLES: Final = 3
STARTUP_SAMPLES: Final = 16
KV_KNEE_SHAPE: Final = 0.07  # b in u = kv (1 + b) / (kv + b): see kv_utilization
MIN_PROVISIONAL_UTILIZATION: Final = 0.2
DEFAULT_STARTUP_S: Final = 180.0  # until one start-up is seen: a 70B start on a warm node is 3-5 min
SATURATED_KV: Final = 0.9


@dataclass(frozen=True, slots=True)
class DemandConfig:
    """The estimator's windows and headroom (one set for every workload; docs/replay.md shows the sweeps)."""

    calm_window_s: float = 300.0
    burst_window_s: float = 30.0
    trend_window_s: float = 360.0
    headroom_sigmas: float = 2.0
    growth_cap: float = 0.2
    use_burst_window: bool = False  # measured: chasing bursts shorter than a start-up only costs
    robust_spread: bool = True

    @property
    def history_s(self) -> float:
        return max(self.calm_window_s, self.burst_window_s, self.trend_window_s)


@dataclass(frozen=True, slots=True)
class ReplicaCounters:
    """One replica's scrape, as the demand tracker needs it. None: the engine does not export it."""

    url: str
    finished_total: float | None
    rejected_total: float | None
    waiting: float
    running: float
    kv_usage_max: float
    preemptions_total: float | None = None


@dataclass(frozen=True, slots=True)
class DemandEstimate:
    offered_rps: float
    recent_rps: float
    spread_rps: float
    growth_rps: float
    need_rps: float
    capacity_rps: float | None
    capacity_source: str  # "configured" | "learned" | "provisional" | "unknown"
    capacity_samples: int
    startup_s: float
    startup_source: str  # "configured" | "learned" | "default"

    def replicas(self, target_utilization: float) -> float | None:
        """Replica-equivalents the need asks for, each replica planned at ``target_utilization``; None
        when there is no usable capacity (never a division by zero or an infinite answer)."""
        if self.capacity_rps is None:
            return None
        per_replica = self.capacity_rps * target_utilization
        if not (math.isfinite(per_replica) and per_replica > 0):
            return None
        value = self.need_rps / per_replica
        return value if math.isfinite(value) else None


def kv_utilization(kv: float) -> float:
    """The share of its capacity a replica serves, read from its KV occupancy before any capacity is known.

    In an engine whose decode step slows with the batch, the batch a rate needs grows like
    1 / (1 - rate/capacity), so KV occupancy follows ``a·u / (1 - (1 - a)·u)`` in the utilization u (full
    at u = 1), whose inverse is ``u = kv (1 + b) / (kv + b)`` with b = a / (1 - a). Fitted on the perf
    model's replicas
    (single-replica Poisson runs at 0.3-1.0 of capacity), b is 0.04-0.22 across token mixes and
    hardware; with b = 0.07 the capacity read from it is within 6 % on the 70B chat mix and 17 % low to
    5 % high on the others (3x outputs, 3x prompts, 8B, H200). Low is safe (a few more replicas); high
    runs replicas into their knee, where the capacity is then measured and replaces this reading.
    """
    kv = min(1.0, max(0.0, kv))
    return kv * (1 + KV_KNEE_SHAPE) / (kv + KV_KNEE_SHAPE)


def is_saturated(waiting: float, prev_waiting: float, running: float, kv_usage_max: float, preempted: bool) -> bool:
    """Past the knee: a queue kept across two scrapes while the KV pool is full or the engine preempts.

    A queue alone is not enough: below the knee a chunked-prefill budget makes requests wait a step or
    two, and a replica filling up after a burst finishes fewer requests than it will serve.
    """
    queued = waiting >= max(1.0, 0.05 * running) and prev_waiting >= 1.0
    return queued and (kv_usage_max >= SATURATED_KV or preempted)


@dataclass
class _Last:
    t: float
    finished: float
    rejected: float
    in_flight: float
    waiting: float
    running: float
    preemptions: float | None


@dataclass
class _Bin:
    end: float
    span: float
    arrivals: float  # scaled to the whole fleet (see _add_arrivals)
    counted: float  # arrivals at the replicas counted, unscaled
    util_s: float  # sum over the counted replicas of kv_utilization x seconds
    replica_s: float  # counted replica-seconds
    complete: bool

    @property
    def rate(self) -> float:
        return self.arrivals / self.span


def _count(x: float | None) -> float | None:
    """A counter's value, or None when it is missing, negative or not a number (never a 0 reading)."""
    return x if x is not None and math.isfinite(x) and x >= 0 else None


def nonneg(x: float | None) -> float:
    """A gauge's value, 0 when it is missing, negative or not a number (a gauge, not a counter)."""
    return x if x is not None and math.isfinite(x) and x > 0 else 0.0


def bin_seconds(scrape_interval: float) -> float:
    """The arrival bin at this scrape interval: 10 s at the default 5 s scrape; never shorter than a scrape,
    and a sub-second scrape (tests, demos) gets bins of four scrapes rather than a 10 s wait."""
    return max(scrape_interval, min(BIN_S, 4 * scrape_interval))


SAMPLE_MAX_AGE_S: Final = 3600.0  # a capacity reading older than this no longer describes the mix


class DemandTracker:
    def __init__(
        self, scrape_interval: float = 5.0, config: DemandConfig | None = None, retain_s: float | None = None
    ) -> None:
        self.config = config or DemandConfig()
        # bins are kept for the longest window any reader asks for (triggers sharing one fleet)
        self.retain_s = max(retain_s or 0.0, self.config.history_s)
        self._measured_startups = False
        self.bin_s = bin_seconds(scrape_interval)
        self._last: dict[str, _Last] = {}
        self._bins: deque[_Bin] = deque()
        self._capacity: deque[tuple[float, str, float]] = deque(maxlen=CAPACITY_SAMPLES)  # (t, url, req/s)
        self._startups: deque[float] = deque(maxlen=STARTUP_SAMPLES)
        self._pending_starts: deque[float] = deque()
        self._starting: int | None = None
        self._members: set[str] | None = None
        self._prev_t: float | None = None
        self._open_t: float | None = None
        self._open = _Bin(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, True)
        self._open_member_s = 0.0

    # -- input -----------------------------------------------------------------------------------
    def observe(
        self, now: float, members: Iterable[str], replicas: Iterable[ReplicaCounters], starting: int = 0
    ) -> None:
        """``members``: every replica of the fleet this cycle (scraped or not); ``replicas``: the ones
        scraped successfully; ``starting``: replicas not ready yet."""
        members = set(members)
        appeared = 0 if self._members is None else len(members - self._members)
        self._members = members
        if self._prev_t is not None and now <= self._prev_t:
            return  # the clock did not move: nothing to count over
        arrivals = util = covered_s = 0.0
        seen: set[str] = set()
        for r in replicas:
            seen.add(r.url)
            finished, rejected = _count(r.finished_total), _count(r.rejected_total)
            if finished is None:
                # without a finished counter its arrivals cannot be told from its batch changing: the
                # fleet's offered load is unknown (not low) until the window holds no such bin
                self._open.complete = False
                continue
            rejected = rejected or 0.0
            waiting, running = nonneg(r.waiting), nonneg(r.running)
            in_flight = waiting + running
            last = self._last.get(r.url)
            self._last[r.url] = _Last(now, finished, rejected, in_flight, waiting, running, r.preemptions_total)
            if last is None:
                continue
            dt = now - last.t
            if finished < last.finished or rejected < last.rejected:
                came = finished + rejected + in_flight  # the engine restarted: all of it arrived since
            else:
                # a request cancelled without being counted shrinks the batch: never below zero
                came = max(0.0, finished - last.finished + rejected - last.rejected + in_flight - last.in_flight)
            arrivals += came
            covered_s += dt
            kv = r.kv_usage_max
            if kv is not None and math.isfinite(kv):
                util += kv_utilization(kv) * dt
            preempted = (
                r.preemptions_total is not None
                and last.preemptions is not None
                and r.preemptions_total > last.preemptions
            )
            took = finished - last.finished + running - last.running  # finished + growth of the batch
            if finished > last.finished and is_saturated(waiting, last.waiting, running, nonneg(kv), preempted):
                self._capacity.append((now, r.url, max(0.0, took) / dt))
        for gone in set(self._last) - seen:
            # gone, or this scrape failed: the next good one starts a new interval rather than dumping
            # the gap's arrivals into one bin (the bin's coverage scales for the replicas not counted)
            del self._last[gone]
        self._track_startups(now, starting, appeared)
        self._add_arrivals(now, arrivals, util, covered_s, len(members))

    def add_startup(self, seconds: float) -> None:
        """A start-up measured where discovery sees it (a pod's creation to Ready). Once one arrives, the
        scrape-side estimate (new replicas matched with pending endpoints) stops adding its own."""
        if math.isfinite(seconds) and seconds >= 0:
            self._measured_startups = True
            self._startups.append(seconds)

    def _track_startups(self, now: float, starting: int, appeared: int) -> None:
        if self._measured_startups:
            return
        if self._starting is None:  # first cycle: those already starting began at an unknown time
            self._starting = starting
            return
        for _ in range(max(0, starting - self._starting)):
            self._pending_starts.append(now)
        for _ in range(appeared):
            if self._pending_starts:
                self._startups.append(now - self._pending_starts.popleft())
        # endpoints that vanished without becoming ready (scaled away while starting) are forgotten
        while len(self._pending_starts) > starting:
            self._pending_starts.pop()
        self._starting = starting

    def _add_arrivals(self, now: float, arrivals: float, util_s: float, covered_s: float, members: int) -> None:
        if self._open_t is None or self._prev_t is None:
            self._open_t = self._prev_t = now
            return  # the first scrape has no interval behind it
        dt, self._prev_t = now - self._prev_t, now
        b = self._open
        b.arrivals += arrivals
        b.counted += arrivals
        b.util_s += util_s
        b.replica_s += covered_s
        self._open_member_s += members * dt
        span = now - self._open_t
        if span < self.bin_s - 1e-9:
            return
        b.end, b.span = now, span
        if self._open_member_s > 0:
            if b.replica_s <= 0:
                b.complete = False  # members and not one counted interval: unknown, not idle
            else:
                # replicas whose scrape failed (or first seen) carry the load the counted ones show per
                # replica-second: a failing, overloaded replica must not read as no arrivals
                b.arrivals *= self._open_member_s / b.replica_s
        self._bins.append(b)
        self._open_t, self._open, self._open_member_s = now, _Bin(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, True), 0.0
        while self._bins and self._bins[0].end <= now - self.retain_s:
            self._bins.popleft()

    def provisional_capacity(self, now: float, config: DemandConfig | None = None) -> float | None:
        """Offered requests over the replicas' KV-read utilization-seconds (``kv_utilization``), on the
        calm window; None while the fleet is too idle for KV to say anything."""
        calm_s = (config or self.config).calm_window_s
        window = [b for b in self._bins if b.end > now - calm_s and b.complete]
        util_s = math.fsum(b.util_s for b in window)
        replica_s = math.fsum(b.replica_s for b in window)
        if replica_s <= 0 or util_s / replica_s < MIN_PROVISIONAL_UTILIZATION:
            return None
        counted = math.fsum(b.counted for b in window)
        if counted <= 0:
            return None  # KV in use and nothing arriving (a stuck engine): no reading, not a capacity of 0
        return counted / util_s

    # -- output ----------------------------------------------------------------------------------
    def capacity(
        self, configured: float | None, now: float | None = None, config: DemandConfig | None = None
    ) -> tuple[float | None, str]:
        if configured is not None:
            return configured, "configured"
        fresh = [c for t, _, c in self._capacity if now is None or t > now - SAMPLE_MAX_AGE_S]
        if len(fresh) >= MIN_CAPACITY_SAMPLES and (learned := statistics.median(fresh)) > 0:
            return learned, "learned"
        if now is not None and (prior := self.provisional_capacity(now, config)) is not None:
            return prior, "provisional"
        return None, "unknown"

    def startup(self, configured: float | None) -> tuple[float, str]:
        if configured is not None:
            return configured, "configured"
        if self._startups:
            return statistics.median(self._startups), "learned"
        return DEFAULT_STARTUP_S, "default"

    def estimate(
        self,
        now: float,
        capacity_rps: float | None = None,
        startup_s: float | None = None,
        config: DemandConfig | None = None,
    ) -> DemandEstimate | None:
        """None until two bins of arrivals are known (a rate needs an interval), and while the window holds
        a bin where some replica exported no finished counter. ``config``: this reader's windows (within
        ``retain_s``), else the tracker's own."""
        c = config or self.config
        window = [b for b in self._bins if b.end > now - c.history_s]
        if len(window) < 2 or not all(b.complete for b in window):
            return None
        rates = [(b.end, b.rate) for b in window]
        calm = [r for t, r in rates if t > now - c.calm_window_s] or [rates[-1][1]]
        burst = [r for t, r in rates if t > now - c.burst_window_s] or [rates[-1][1]]
        offered = math.fsum(calm) / len(calm)
        recent = math.fsum(burst) / len(burst)
        if len(calm) < 3:
            spread = 0.0
        elif c.robust_spread:
            # median absolute deviation, scaled to a standard deviation on normal noise: a burst of a
            # few bins does not read as the fleet's everyday spread
            mid = statistics.median(calm)
            spread = 1.4826 * statistics.median(abs(r - mid) for r in calm)
        else:
            spread = statistics.pstdev(calm)
        horizon, horizon_source = self.startup(startup_s)
        trend = [(t, r) for t, r in rates if t > now - c.trend_window_s]
        growth = 0.0
        if len(trend) >= 6:
            mt = math.fsum(t for t, _ in trend) / len(trend)
            mr = math.fsum(r for _, r in trend) / len(trend)
            var = math.fsum((t - mt) ** 2 for t, _ in trend)
            slope = math.fsum((t - mt) * (r - mr) for t, r in trend) / var if var > 0 else 0.0
            growth = min(c.growth_cap * offered, max(0.0, slope * horizon))
        cap, cap_source = self.capacity(capacity_rps, now, c)
        base = max(offered + growth, recent) if c.use_burst_window else offered + growth
        need = base + c.headroom_sigmas * spread
        return DemandEstimate(
            offered_rps=offered,
            recent_rps=recent,
            spread_rps=spread,
            growth_rps=growth,
            need_rps=need,
            capacity_rps=cap,
            capacity_source=cap_source,
            capacity_samples=len(self._capacity),
            startup_s=horizon,
            startup_source=horizon_source,
        )
