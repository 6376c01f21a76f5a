"""A fleet's scoring state across scrapes: last good signals, counter windows, the composite.

Pure (the clock is passed in, no I/O): the server's scrape loop feeds it real scrapes, the fleet
simulator feeds it simulated replicas, and both get the same numbers from the same code.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from keda_llm_scaler.demand import DemandConfig, DemandEstimate, DemandTracker, ReplicaCounters
from keda_llm_scaler.errors import NoFreshData
from keda_llm_scaler.policy import Composite, ReplicaInput, ScoringParams, composite
from keda_llm_scaler.queueing import service_scv
from keda_llm_scaler.rates import DEFAULT_WINDOW_S, CounterWindow, HistogramWindow, SeriesCounter, SeriesHistogram
from keda_llm_scaler.signals import DEDUCTED, Histogram, ReplicaSignals, histogram_quantile

__all__ = [
    "EXPIRED",
    "FRESH",
    "REPLICA_STATES",
    "RESTORED",
    "STALE",
    "STATE_VIEWS",
    "Evaluation",
    "FleetState",
    "Observation",
    "ReplicaReport",
    "demand_config",
]

FRESH: Final = "fresh"
STALE: Final = "stale"  # this scrape failed; last good data is still inside staleAfter
EXPIRED: Final = "expired"  # no good data inside staleAfter (or never): counted as at least at target
REPLICA_STATES: Final = (FRESH, STALE, EXPIRED)
# after a restart on kept state, whose answer stands (Evaluation.state_view)
RESTORED: Final = "restored"  # what was kept asks for a whole replica more than a cold start would
COLD: Final = "cold"  # what a start without the state reads
STATE_VIEWS: Final = (RESTORED, COLD)
# first tokens over the window before their time outside the queue is read (a mean of a few is one prompt)
FIRST_TOKEN_MIN_OBSERVATIONS: Final = 10


@dataclass(frozen=True, slots=True)
class Observation:
    """One replica's scrape outcome: signals, or the reason there are none."""

    url: str
    signals: ReplicaSignals | None
    reason: str | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    url: str
    state: str
    reason: str | None
    detail: str
    last_ok_age_s: float | None
    signals: ReplicaSignals | None
    reject_rate: float | None
    admitted_rate: float | None
    preemption_rate: float | None
    fault_rate: float | None = None


@dataclass(frozen=True, slots=True)
class Evaluation:
    replicas: tuple[ReplicaReport, ...]
    composite: Composite | None
    error: str | None  # why composite is None
    # Fleet signals over the replicas with good data (fresh, or stale inside staleAfter); None when no
    # replica has any: a fleet that never answered has no queue reading, which is not an empty queue.
    waiting: float | None = None
    # held back by the engines for reasons more replicas do not remove (vLLM's "deferred"): not in waiting;
    # None while no replica with data splits its waiting
    deferred: float | None = None
    running: float | None = None
    kv_usage: float | None = None
    reject_rate: float | None = None
    preemption_rate: float | None = None
    fault_rate: float | None = None  # answers the engines failed, per second: shown, not scored
    ttft_p95_s: float | None = None
    itl_p95_s: float | None = None  # the gap between two tokens of a stream, over the rate window
    held: float | None = None  # requests the pool's gateway holds for it (gatewayMetricsUrl), this cycle
    queue_time_p95_s: float | None = None
    # the capacity one replica serves (value, source), known even while the load is not (a restarted scaler's
    # first cycles, before its demand window has two bins): what /metrics shows. After a restart that kept
    # its state, what was kept (with what was read since), whichever answer stands (``state_view``)
    capacity: tuple[float, str] | None = None
    # after a restart that kept its state: whose answer stands, "restored" (what was kept asks for a whole
    # replica more) or "cold" (what a start without the state reads); None when nothing was restored
    state_view: str | None = None

    def count(self, state: str) -> int:
        return sum(1 for r in self.replicas if r.state == state)


@dataclass
class _ReplicaState:
    url: str
    window_s: float
    signals: ReplicaSignals | None = None
    last_ok: float | None = None
    reason: str | None = None
    detail: str = ""
    rejects: CounterWindow = field(init=False)
    admitted: CounterWindow = field(init=False)
    faults: CounterWindow = field(init=False)
    preemptions: CounterWindow = field(init=False)
    ttft: HistogramWindow = field(init=False)
    queue_time: HistogramWindow = field(init=False)
    hold_time: HistogramWindow = field(init=False)
    itl: HistogramWindow = field(init=False)
    counters: dict[str, SeriesCounter] = field(default_factory=dict)
    histograms: dict[str, SeriesHistogram] = field(default_factory=dict)
    totals: dict[str, float | None] = field(default_factory=dict)  # this scrape's, resets per series
    absent: set[str] = field(default_factory=set)  # counters a good scrape did not have

    def __post_init__(self) -> None:
        self.rejects = CounterWindow(self.window_s)
        self.admitted = CounterWindow(self.window_s)
        self.faults = CounterWindow(self.window_s)
        self.preemptions = CounterWindow(self.window_s)
        self.ttft = HistogramWindow(self.window_s)
        self.queue_time = HistogramWindow(self.window_s)
        self.hold_time = HistogramWindow(self.window_s)
        self.itl = HistogramWindow(self.window_s)

    def absorb(self, obs: Observation, now: float) -> None:
        self.reason, self.detail = obs.reason, obs.detail
        s = obs.signals
        if s is None:
            return
        earlier_ok, self.signals, self.last_ok = self.last_ok, s, now
        for name, window, value in (
            ("rejects", self.rejects, s.rejects_total),
            ("admitted", self.admitted, s.admitted_total),
            ("finished", None, s.finished_total),
            ("faults", self.faults, s.faults_total),
            ("preemptions", self.preemptions, s.preemptions_total),
            ("prompt_tokens", None, s.prompt_tokens_total),
            ("generation_tokens", None, s.generation_tokens_total),
        ):
            previous, self.totals[name] = self.totals.get(name), None
            if value is None:
                self.absent.add(name)
                continue
            if name in self.absent and earlier_ok is not None and name not in self.counters:
                # absent from an earlier good scrape, here now: created since, at its first event, so it
                # counted from zero (vLLM labels its refusals by reason at the first one; Ray never exports a
                # counter still at 0). Without this its first sighting gives no rate, and a burst of first
                # rejects would be missed.
                self.counters[name] = SeriesCounter()
                self.counters[name].observe({})
                if window is not None:
                    window.observe(earlier_ok, 0.0)
            self.absent.discard(name)
            series = {key: v for counter, key, v in s.counter_series if counter == name}
            # resets per series: the total only moves up (rates.SeriesCounter). A counter already kept by
            # series stays so when none is in this scrape (its lazily made series not there yet after a
            # restart): its raw value would be mixed with the running total, a drop then a jump.
            if series or name in self.counters:
                value = self.counters.setdefault(name, SeriesCounter()).observe(series)
                deducted = {key: v for counter, key, v in s.counter_series if counter == DEDUCTED + name}
                if deducted or DEDUCTED + name in self.counters:  # (parts gone since: still taken out)
                    value -= self.counters.setdefault(DEDUCTED + name, SeriesCounter()).observe(deducted)
                    # the parts are counted at different moments (SGLang counts a refused request finished
                    # before its 503 is counted): a difference that dips would read as a reset, and a reset
                    # as the whole count arriving at once. Held at its high mark, it only lags by the few.
                    value = max(value, previous if previous is not None else 0.0)
            self.totals[name] = value
            if window is not None:
                window.observe(now, value)
        for key in ("queue_count", "queue_sum", "ttft_count", "ttft_sum"):
            self.totals[key] = None
        # (histogram, its window, this scrape's, per series, the totals' prefix: None where only the
        # window is read, as the hold times' spread is: hold_time_scv)
        for name, hwindow, hist, hseries, totals in (
            ("ttft", self.ttft, s.ttft, s.ttft_series, "ttft"),
            ("queue_time", self.queue_time, s.queue_time, s.queue_time_series, "queue"),
            ("hold_time", self.hold_time, s.hold_time, s.hold_time_series, None),
            ("itl", self.itl, s.itl, s.itl_series, None),
        ):
            if hseries:  # resets per series: one engine restarting keeps the pod's reading
                hist = self.histograms.setdefault(name, SeriesHistogram()).observe(dict(hseries))
            if hist is not None:
                hwindow.observe(now, hist)
                if totals is not None:
                    self.totals[f"{totals}_count"], self.totals[f"{totals}_sum"] = hist.count, hist.sum

    def hold_time_scv(self) -> float | None:
        """The spread of how long this replica's requests held a batch slot over the window (None: not
        exported, or too few finished to tell)."""
        delta = self.hold_time.delta()
        return None if delta is None else service_scv(delta.buckets)

    def first_token_s(self, min_observations: float = FIRST_TOKEN_MIN_OBSERVATIONS) -> float | None:
        """How long this replica's requests took to a first token outside the queue over the window: the
        mean TTFT less the mean queue wait (None: either not exported, or too few to tell)."""
        ttft, queued = self.ttft.delta(), self.queue_time.delta()
        if ttft is None or queued is None or min(ttft.count, queued.count) < min_observations:
            return None
        return max(0.0, ttft.sum / ttft.count - queued.sum / queued.count)

    def report(self, now: float, stale_after: float) -> ReplicaReport:
        if self.reason is None and self.last_ok == now:
            state = FRESH
        elif self.last_ok is not None and now - self.last_ok <= stale_after:
            state = STALE
        else:
            state = EXPIRED
        return ReplicaReport(
            url=self.url,
            state=state,
            reason=self.reason,
            detail=self.detail,
            last_ok_age_s=None if self.last_ok is None else now - self.last_ok,
            signals=self.signals,
            # an expired replica keeps its last rates, rejects included: a replica that stopped answering
            # never counts for less than it did (property f); it leaves the sum when it leaves the fleet
            reject_rate=self.rejects.rate(),
            admitted_rate=self.admitted.rate(),
            preemption_rate=self.preemptions.rate(),
            fault_rate=self.faults.rate(),
        )


def _policy_input(r: ReplicaReport) -> ReplicaInput:
    s = r.signals
    return ReplicaInput(
        waiting=s.waiting if s else None,
        running=s.running if s else None,
        kv_usage=s.kv_usage if s else None,
        reject_rate=r.reject_rate,
        admitted_rate=r.admitted_rate,
        expired=r.state == EXPIRED,
        kv_usage_max=s.kv_usage_max if s else None,
        engines=tuple((e.waiting, e.running) for e in s.engines) if s and len(s.engines) > 1 else (),
        asleep=bool(s and s.sleep_level),
    )


def _first_known(totals: dict[str, float | None], *names: str) -> float | None:
    return next((v for n in names if (v := totals.get(n)) is not None), None)


def _sum_known(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return math.fsum(known) if known else None


def _quantile(q: float, merged: Histogram | None) -> float | None:
    return histogram_quantile(q, merged) if merged is not None else None


def demand_config(params: ScoringParams) -> DemandConfig:
    """The trigger's demand window (the trend, served and settle windows keep their proportions to it: DemandConfig)."""
    return DemandConfig(calm_window_s=params.demand_window_s)


class FleetState:
    """Per-replica state of one fleet; ``update`` with each cycle's observations, then ``evaluate``."""

    def __init__(
        self,
        params: ScoringParams,
        stale_after: float,
        scrape_interval: float,
        demand: DemandConfig | None = None,
        retain_s: float | None = None,
    ) -> None:
        """``params``/``stale_after``: the defaults ``evaluate`` scores with; ``retain_s``: keep arrival
        history this long, so triggers sharing the fleet can each read their own demand window."""
        self.params = params
        self.stale_after = stale_after
        self.window_s = max(DEFAULT_WINDOW_S, 3 * scrape_interval)
        self._replicas: dict[str, _ReplicaState] = {}
        self._urls: list[str] = []
        self.demand = DemandTracker(
            scrape_interval, demand or demand_config(params), retain_s, params.ttft_slo_s, params.ttft_slo_quantile
        )

    def update(
        self, now: float, observations: Iterable[Observation], starting: int = 0, startups: Iterable[float] = ()
    ) -> list[tuple[str, bool]]:
        """Replace the fleet with these replicas' outcomes (``starting``: replicas not ready yet).
        Returns (url, failing) for replicas whose failing/ok state changed (new replicas count as
        changed only when they fail)."""
        obs = sorted(observations, key=lambda o: o.url)
        urls = [o.url for o in obs]
        for gone in set(self._replicas) - set(urls):
            del self._replicas[gone]  # left the fleet: forget its series (no stranded values)
        changes = []
        for o in obs:
            state = self._replicas.get(o.url)
            was_failing = state is not None and state.reason is not None
            if state is None:
                state = self._replicas[o.url] = _ReplicaState(o.url, self.window_s)
            state.absorb(o, now)
            if (o.reason is not None) != was_failing:
                changes.append((o.url, o.reason is not None))
        self._urls = urls
        for seconds in startups:
            self.demand.add_startup(seconds)
        self.demand.observe(
            now,
            urls,
            (
                ReplicaCounters(
                    o.url,
                    # arrivals are what left the engine (served, aborted, errored) plus the refused and
                    # the in-flight: admitted alone would miss every request its client gave up on
                    _first_known(self._replicas[o.url].totals, "finished", "admitted"),
                    self._replicas[o.url].totals.get("rejects"),
                    o.signals.waiting,
                    o.signals.running,
                    o.signals.kv_usage_max,
                    self._replicas[o.url].totals.get("preemptions"),
                    queue_count=self._replicas[o.url].totals.get("queue_count"),
                    queue_sum_s=self._replicas[o.url].totals.get("queue_sum"),
                    ttft_count=self._replicas[o.url].totals.get("ttft_count"),
                    ttft_sum_s=self._replicas[o.url].totals.get("ttft_sum"),
                    prompt_tokens_total=self._replicas[o.url].totals.get("prompt_tokens"),
                    generation_tokens_total=self._replicas[o.url].totals.get("generation_tokens"),
                    hold_time_scv=self._replicas[o.url].hold_time_scv(),
                    first_token_s=self._replicas[o.url].first_token_s(),
                )
                for o in obs
                if o.signals is not None
            ),
            starting,
        )
        return changes

    def evaluate(
        self,
        now: float,
        incoming: int = 0,
        params: ScoringParams | None = None,
        stale_after: float | None = None,
        gateway: tuple[float | None, str | None] | None = None,
    ) -> Evaluation:
        """``incoming``: replicas starting (not ready yet), counted as capacity on the way. ``params`` and
        ``stale_after``: one trigger's own, when several score this fleet (else the fleet's defaults).
        ``gateway``: this cycle's reading of the pool's gateway, (requests held, None) or (None, why it
        failed); None when the trigger names no gateway."""
        stale_after = self.stale_after if stale_after is None else stale_after
        reports = tuple(self._replicas[u].report(now, stale_after) for u in self._urls)
        live = [r for r in reports if r.state != EXPIRED and r.signals is not None]
        ttft = [d for r in live if (d := self._replicas[r.url].ttft.delta()) is not None]
        queue = [d for r in live if (d := self._replicas[r.url].queue_time.delta()) is not None]
        itl = [d for r in live if (d := self._replicas[r.url].itl.delta()) is not None]
        p = params or self.params
        windows = None if params is None else demand_config(params)
        ttft_merged = Histogram.merge(ttft)
        slo_q = _quantile(p.ttft_slo_quantile, ttft_merged) if p.ttft_slo_s is not None else None
        itl_merged = Histogram.merge(itl)
        itl_q = _quantile(p.itl_slo_quantile, itl_merged) if p.itl_slo_s is not None else None
        held, gateway_error = gateway if gateway is not None else (None, None)
        kept: DemandEstimate | None = None  # on what this tracker knows (after a restart, what it kept too)
        state_view: str | None = None
        try:
            if not reports and gateway_error is not None:
                # no replica to read and the gateway unread: the pool's demand is unknown, which is not 0
                raise NoFreshData(f"no replica, and the pool's gateway failed ({gateway_error})")
            inputs = [_policy_input(r) for r in reports]

            def score(tracker: DemandTracker) -> tuple[Composite, DemandEstimate | None]:
                d = tracker.estimate(now, p.replica_capacity, p.startup_s, windows)
                pending = tracker.rate_pending()
                return composite(inputs, p, incoming, d, slo_q, itl_q, held, pending), d

            comp, kept = score(self.demand)
            cold = self.demand.cold_view
            if cold is not None:
                # a restarted scaler answers as one that started without its state would, unless what it kept
                # asks for a whole replica more: kept knowledge is a reason to add replicas, never to remove
                # them, and below a whole replica it would only make the two fleets' runs drift apart. On a
                # KV-bound replica a cold scaler plans on its KV reading (3.8 req/s a replica) for hours; a
                # kept one on what the fleet served before the restart (4.6-4.8), and missed a ramp the cold
                # one's extra replicas served (docs/state.md)
                cold_comp, _ = score(cold)
                if comp.value >= cold_comp.value + 1.0:
                    state_view = RESTORED
                else:
                    comp, state_view = cold_comp, COLD
            error = None
        except NoFreshData as exc:
            # counts by reason, never addresses: the gRPC port is unauthenticated, and per-URL reasons
            # would make it a port-scanning oracle (details are in the scaler's log)
            reasons = Counter(r.reason or r.state for r in reports)
            counts = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
            comp, error = None, f"{exc}: {counts}" if counts else str(exc)
        # what the scaler knows of a replica, whichever answer stands: after a restart what it kept (with
        # what it read since), the knowledge the restart carried over, also before the load is known (the
        # first cycles) and where a cold start's answer stands
        if kept is not None and kept.capacity_rps is not None:
            known: tuple[float, str] | None = (kept.capacity_rps, kept.capacity_source)
        else:
            cap, source = self.demand.capacity(p.replica_capacity, now, windows)
            known = None if cap is None else (cap, source)
        return Evaluation(
            replicas=reports,
            composite=comp,
            error=error,
            waiting=math.fsum(r.signals.waiting for r in live if r.signals) if live else None,
            deferred=_sum_known(r.signals.deferred for r in live if r.signals),
            running=math.fsum(r.signals.running for r in live if r.signals) if live else None,
            kv_usage=(math.fsum(r.signals.kv_usage for r in live if r.signals) / len(live)) if live else None,
            reject_rate=_sum_known(r.reject_rate for r in live),
            preemption_rate=_sum_known(r.preemption_rate for r in live),
            fault_rate=_sum_known(r.fault_rate for r in live),
            ttft_p95_s=_quantile(0.95, ttft_merged),
            queue_time_p95_s=_quantile(0.95, Histogram.merge(queue)),
            itl_p95_s=_quantile(0.95, itl_merged),
            held=held,
            capacity=known,
            state_view=state_view,
        )
