"""The scaler's own metrics (its logs: keda_llm_scaler.logs).

Metrics: a private CollectorRegistry. Per-target values are read from the latest snapshots at
scrape time by a custom collector, so an evicted target or a replica that left leaves no stale series.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from keda_llm_scaler import __version__
from keda_llm_scaler.activity import target_active
from keda_llm_scaler.errors import NoFreshData
from keda_llm_scaler.fleet import REPLICA_STATES, STATE_VIEWS
from keda_llm_scaler.membership import PHASES
from keda_llm_scaler.metadata import TriggerConfig
from keda_llm_scaler.pools import cost_per_million_tokens, pool_cost_per_hour
from keda_llm_scaler.scrape import ScrapeResult
from keda_llm_scaler.target import FleetGroup, Target

if TYPE_CHECKING:
    from keda_llm_scaler.workers import ScrapeWorkers

__all__ = ["ScalerMetrics"]

VERSION: Final = __version__
_TARGET_LABELS: Final = ("namespace", "scaledobject", "target")
_POOL_LABELS: Final = ("fleet", "pool", "tier")


def _pool_cost(t: Target) -> float | None:
    """What the pool costs per hour now (``pools.pool_cost_per_hour``), its members billed from creation
    (pending and starting ones included, as the replay bills them). None: no price, or no membership known."""
    spec, snap = t.pool_spec(), t.snapshot
    if spec is None or snap is None or not snap.resolved:
        return None
    # every member, pending ones too: a pod waiting for its node is the node being provisioned, billed
    return pool_cost_per_hour(spec, sum(snap.membership.count(phase) for phase in PHASES))


def _fleet_costs(group: FleetGroup) -> tuple[float | None, float | None]:
    """The fleet's cost per hour (its pools that have a price) and per million tokens served (over the
    tokens its pools serve; None while unknown, never 0 for unknown)."""
    members = group.members().values()
    costs = [c for c in (_pool_cost(t) for t in members) if c is not None]
    per_hour = sum(costs) if costs else None
    tokens = [
        t.snapshot.composite.demand.tokens_rps
        for t in members
        if t.snapshot is not None
        and t.snapshot.composite is not None
        and t.snapshot.composite.demand is not None
        and t.snapshot.composite.demand.tokens_rps is not None
    ]
    return per_hour, cost_per_million_tokens(per_hour, sum(tokens) if tokens else None)


class _TargetCollector(Collector):
    def __init__(self, targets: Callable[[], Iterable[Target]], clock: Callable[[], float]) -> None:
        self._targets = targets
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        def family(name: str, doc: str, extra: tuple[str, ...] = ()) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"llm_scaler_{name}", doc, labels=[*_TARGET_LABELS, *extra])

        composite = family("composite", "Composite demand served to KEDA, in replica-equivalents")
        term = family(
            "composite_term",
            "Composite broken into its terms: load, queue, reject, assumed (the "
            "pressure side, summed as pressure), rate (offered load over capacity), slo_floor, hold (the "
            "replicas held while a fleet's rate is not known yet)",
            ("term",),
        )
        reason = family("decision_reason", "1 for the term that dominates the composite", ("reason",))
        state_view = family(
            "state_view",
            "After a restart on kept state, 1 for the view whose answer stands: restored (what was kept asks "
            "for a whole replica more) or cold (a cold start's reading), 0 for the other; absent for a fleet "
            "the scaler has known only since it started",
            ("view",),
        )
        up = family("target_up", "1 when GetMetrics answers with a value, 0 when it answers UNAVAILABLE")
        active = family(
            "active",
            "IsActive's answer: 1 active, 0 inactive, absent while it is UNAVAILABLE. interactive (the default "
            "workloadClass): 1 while the fleet has members in any phase; batch, or no member: composite > "
            "activationThreshold",
        )
        # fleet signals: absent while no replica has data (never answered, or expired), never a 0 for it;
        # llm_scaler_replicas{state} and llm_scaler_scrape_errors_total{reason} say why
        waiting = family("waiting_requests", "Requests waiting, summed over replicas with data")
        deferred = family(
            "deferred_requests",
            "Requests the engines hold back for reasons more replicas do not remove (vLLM: LoRA budget, KV "
            "transfer, blocked status), summed over replicas that split their waiting; not in waiting_requests",
        )
        running = family("running_requests", "Requests running, summed over replicas with data")
        kv = family("kv_usage_ratio", "Mean KV-cache usage (0-1) over replicas with data")
        rejects = family("rejects_per_second", "Admission rejects per second, fleet total")
        preempt = family("preemptions_per_second", "Preemptions per second, fleet total")
        faults = family(
            "engine_faults_per_second",
            "Answers the engines failed per second (5xx other than admission refusals, requests finished in "
            "error), fleet total; not in the composite",
        )
        ttft = family("ttft_p95_seconds", "p95 time to first token over the rate window")
        qtime = family("queue_time_p95_seconds", "p95 time spent waiting over the rate window")
        held = family(
            "gateway_held_requests",
            "Requests the pool's gateway holds for it (gatewayMetricsUrl); the demand while no replica is ready",
        )
        asleep = family("asleep_replicas", "Replicas asleep (vLLM sleep mode): members that serve nothing until woken")
        wake = family(
            "wake_replicas",
            "Of the replicas asleep, how many the need asks to wake: new replicas are asked for only beyond them",
        )
        itl = family(
            "itl_p95_seconds", "p95 gap between two tokens of a stream (inter-token latency) over the rate window"
        )
        replicas = family(
            "replicas", "Replicas by state: fresh, stale, expired (scraped), starting (not ready)", ("state",)
        )
        members = family(
            "members",
            "Fleet members by discovery phase: ready, starting (capacity on its way), pending (not scheduled), "
            "failed_to_start (not ready past startupBudgetSeconds, or in a back-off)",
            ("phase",),
        )
        age = family("snapshot_age_seconds", "Seconds since the target's last scrape cycle finished")
        cycle = family("scrape_cycle_seconds", "Duration of the target's last cycle (discovery and all scrapes)")
        offered = family(
            "offered_requests_per_second",
            "Requests offered to the fleet (finished + refused + in flight, per second), mean over the calm window",
        )
        planned = family(
            "planned_requests_per_second",
            "The demand the rate term plans for: offered + growth over one start-up + headroom for the spread",
        )
        spread = family(
            "demand_spread_requests_per_second",
            "Robust standard deviation of the arrival bins' rates (10 s bins at a 5 s scrape)",
        )
        growth = family("demand_growth_requests_per_second", "Offered-load growth projected over one start-up")
        capacity = family(
            "replica_capacity_requests_per_second",
            "Requests/s one replica serves within the SLO (configured, learned past the knee, or provisional from KV)",
            ("source",),
        )
        startup = family("startup_seconds", "Replica start-up time used as the growth horizon", ("source",))
        # a pool of a fleet (the `fleet` trigger key): what its share was split from, and what it costs
        own_composite = family(
            "pool_own_composite",
            "A pool's own composite before the fleet's split (llm_scaler_composite is its share, what is served)",
            _POOL_LABELS,
        )
        share_rps = family(
            "pool_share_requests_per_second",
            "The fleet's demand placed on this pool by the split (reserved first, up to its size; then burst)",
            _POOL_LABELS,
        )
        fleet_rps = family(
            "fleet_demand_requests_per_second",
            "The fleet's demand, put back together from every pool's own composite, in requests/s",
            _POOL_LABELS,
        )
        pool_cost = family(
            "pool_cost_per_hour",
            "What the pool costs per hour (replicaCostPerHour): a reserved pool its size whether used or not, "
            "a burst pool the replicas it runs, starting ones included",
            _POOL_LABELS,
        )
        fleet_cost = GaugeMetricFamily(
            "llm_scaler_fleet_cost_per_hour",
            "What the fleet costs per hour: the sum over its pools that have a replicaCostPerHour",
            labels=["namespace", "fleet"],
        )
        fleet_cost_tokens = GaugeMetricFamily(
            "llm_scaler_fleet_cost_per_million_tokens",
            "The fleet's cost per million tokens served (prompt + generated); absent while unknown",
            labels=["namespace", "fleet"],
        )
        count = GaugeMetricFamily("llm_scaler_targets", "Targets (ScaledObject fleets) being scraped")
        now = self._clock()
        targets = list(self._targets())
        count.add_metric([], len(targets))
        for t in targets:
            labels = [t.cfg.namespace, t.cfg.name, t.id]
            snap = t.snapshot
            up.add_metric(labels, 1.0 if t.is_fresh() else 0.0)
            with contextlib.suppress(NoFreshData):  # no answer: no sample, never a 0
                active.add_metric(labels, 1.0 if target_active(t) else 0.0)
            if snap is None:
                continue
            age.add_metric(labels, now - snap.taken_at)
            cycle.add_metric(labels, snap.cycle_s)
            if snap.resolved:  # never discovered: the fleet's size is unknown, which is not 0 replicas
                for state in REPLICA_STATES:
                    replicas.add_metric([*labels, state], snap.count(state))
                replicas.add_metric([*labels, "starting"], snap.starting)
                for phase in PHASES:
                    members.add_metric([*labels, phase], snap.membership.count(phase))
            spec = t.pool_spec()
            share = t.pool_share(log_change=False)  # a scrape of /metrics is not a decision
            if spec is not None and t.group is not None:
                pool_labels = [*labels, spec.fleet, spec.pool, spec.tier_name]
                if snap.composite is not None:
                    own_composite.add_metric(pool_labels, snap.composite.value)
                if share is not None and not share.unsized:  # no split while a pool's size is unknown
                    share_rps.add_metric(pool_labels, share.work_rps)
                    fleet_rps.add_metric(pool_labels, share.fleet_work_rps)
                cost = _pool_cost(t)
                if cost is not None:
                    pool_cost.add_metric(pool_labels, cost)
            if snap.composite is not None:
                c = snap.composite
                composite.add_metric(labels, c.value if share is None else share.value)  # served: the share
                for name, maybe_term in (
                    ("load", c.load),
                    ("queue", c.queue),
                    ("reject", c.reject),
                    ("assumed", c.assumed),
                    ("pressure", c.pressure),
                    ("rate", c.rate),
                    ("slo_floor", c.slo_floor),
                    ("hold", c.hold),
                ):
                    if maybe_term is not None:
                        term.add_metric([*labels, name], maybe_term)
                reason.add_metric([*labels, c.dominant], 1.0)
                asleep.add_metric(labels, c.asleep)
                wake.add_metric(labels, c.wake)
                d = c.demand
                if d is not None:
                    offered.add_metric(labels, d.offered_rps)
                    planned.add_metric(labels, d.need_rps)
                    spread.add_metric(labels, d.spread_rps)
                    growth.add_metric(labels, d.growth_rps)
                    startup.add_metric([*labels, d.startup_source], d.startup_s)
            ev = snap.evaluation
            if ev.capacity is not None:  # with or without a composite: known before the load is
                capacity.add_metric([*labels, ev.capacity[1]], ev.capacity[0])
            if ev.state_view is not None:  # after a restart on kept state: whose answer stands
                for view in STATE_VIEWS:
                    state_view.add_metric([*labels, view], 1.0 if view == ev.state_view else 0.0)
            optional: list[tuple[GaugeMetricFamily, float | None]] = [
                (waiting, ev.waiting),
                (deferred, ev.deferred),
                (running, ev.running),
                (kv, ev.kv_usage),
                (rejects, ev.reject_rate),
                (preempt, ev.preemption_rate),
                (faults, ev.fault_rate),
                (ttft, ev.ttft_p95_s),
                (qtime, ev.queue_time_p95_s),
                (itl, ev.itl_p95_s),
                (held, ev.held),
            ]
            for fam, maybe in optional:
                if maybe is not None:
                    fam.add_metric(labels, maybe)
        groups = {id(t.group): t.group for t in targets if t.group is not None}
        for group in groups.values():
            per_hour, per_million = _fleet_costs(group)
            if per_hour is not None:
                fleet_cost.add_metric([group.namespace, group.fleet], per_hour)
            if per_million is not None:
                fleet_cost_tokens.add_metric([group.namespace, group.fleet], per_million)
        yield from (
            composite,
            own_composite,
            share_rps,
            fleet_rps,
            pool_cost,
            fleet_cost,
            fleet_cost_tokens,
            term,
            reason,
            state_view,
            up,
            active,
            waiting,
            deferred,
            running,
            kv,
            rejects,
            preempt,
            faults,
            ttft,
            qtime,
            itl,
            held,
            asleep,
            wake,
            offered,
            planned,
            spread,
            growth,
            capacity,
            startup,
            replicas,
            members,
            age,
            cycle,
            count,
        )


class _WorkerCollector(Collector):
    def __init__(self, workers: ScrapeWorkers) -> None:
        self._workers = workers

    def collect(self) -> Iterator[Metric]:
        count = GaugeMetricFamily("llm_scaler_scrape_workers", "Scrape worker processes running")
        count.add_metric([], len(self._workers.pids()))
        restarts = CounterMetricFamily(
            "llm_scaler_scrape_worker_restarts", "Scrape workers started again after dying or stopping to answer"
        )
        restarts.add_metric([], self._workers.restarts)
        yield count
        yield restarts


class ScalerMetrics:
    """Owns the registry; also the ScrapeObserver handed to every target."""

    def __init__(
        self,
        targets: Callable[[], Iterable[Target]],
        clock: Callable[[], float] = time.monotonic,
        workers: ScrapeWorkers | None = None,
    ):
        self.registry = CollectorRegistry()
        self.scrape_duration = Histogram(
            "llm_scaler_scrape_duration_seconds",
            "Duration of one replica scrape (connect, request, body, parse), without the wait for a slot",
            ["namespace", "scaledobject"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
        )
        # apart from the scrape: queueing behind the concurrency limits is a capacity signal, not a slow replica
        self.scrape_wait = Histogram(
            "llm_scaler_scrape_wait_seconds",
            "Time one replica scrape waited for its fleet's, namespace's and the process's scrape slots",
            ["namespace", "scaledobject"],
            registry=self.registry,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
        )
        self._reasons: dict[tuple[str, str], set[str]] = {}  # which error series exist, to remove them
        self.scrape_errors = Counter(
            "llm_scaler_scrape_errors",
            "Failed replica scrapes by reason",
            ["namespace", "scaledobject", "reason"],
            registry=self.registry,
        )
        self.rpc_duration = Histogram(
            "llm_scaler_rpc_duration_seconds",
            "gRPC handling time by method and status code",
            ["method", "code"],
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 3.0),
        )
        self.rpc_no_request = Counter(
            "llm_scaler_rpc_no_request",
            "ExternalScaler calls that ended before their request reached the scaler: refused by gRPC as larger "
            "than the 1 MiB receive limit, cancelled or cut off while sending, or sent without a request",
            ["method"],
            registry=self.registry,
        )
        self.state_writes = Counter(
            "llm_scaler_state_writes",
            "Writes of the learned state (--state-dir, --state-configmap) by outcome: ok | error",
            ["outcome"],
            registry=self.registry,
        )
        self.state_last_write = Gauge(
            "llm_scaler_state_last_write_timestamp_seconds",
            "When the learned state was last written successfully (Unix time)",
            registry=self.registry,
        )
        build = GaugeMetricFamily("llm_scaler_build_info", "Build information", labels=["version"])
        build.add_metric([VERSION], 1.0)

        class _Build(Collector):
            def collect(self) -> Iterator[Metric]:
                yield build

        self.registry.register(_Build())
        if workers is not None:
            self.registry.register(_WorkerCollector(workers))
        self.registry.register(_TargetCollector(targets, clock))

    def state_written(self, outcome: str) -> None:
        self.state_writes.labels(outcome).inc()
        if outcome == "ok":
            self.state_last_write.set_to_current_time()

    def no_request(self, method: str) -> None:
        self.rpc_no_request.labels(method).inc()

    def forget(self, namespace: str, scaledobject: str) -> None:
        """Remove the per-scrape series of a ScaledObject no longer served (bounded /metrics under churn)."""
        with contextlib.suppress(KeyError):
            self.scrape_duration.remove(namespace, scaledobject)
        with contextlib.suppress(KeyError):
            self.scrape_wait.remove(namespace, scaledobject)
        for reason in list(self._reasons.pop((namespace, scaledobject), ())):
            with contextlib.suppress(KeyError):
                self.scrape_errors.remove(namespace, scaledobject, reason)

    def scrape_done(self, cfg: TriggerConfig, result: ScrapeResult) -> None:
        self.scrape_duration.labels(cfg.namespace, cfg.name).observe(result.duration_s)
        self.scrape_wait.labels(cfg.namespace, cfg.name).observe(result.wait_s)
        if result.reason is not None:
            self.scrape_errors.labels(cfg.namespace, cfg.name, result.reason).inc()
            self._reasons.setdefault((cfg.namespace, cfg.name), set()).add(result.reason)
