"""Fleets and targets: one background scrape loop per fleet, and the snapshot every RPC reads.

A ``FleetWorker`` is what is scraped (discovery, engine, model, interval, timeout): it resolves the
members, scrapes every ready replica concurrently and folds the results into per-replica state (last
good signals, counter windows, arrivals). A ``Target`` is one trigger's view of a fleet: after every
cycle the worker scores its observations with each view's own parameters and publishes a frozen
Snapshot to it. Two triggers (or two ScaledObjects) on the same fleet cost one scrape per interval.
RPCs never touch a replica: they read the latest Snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from keda_llm_scaler.addresses import redact
from keda_llm_scaler.demand import DemandConfig
from keda_llm_scaler.discovery import DiscoveryError, Resolver
from keda_llm_scaler.errors import NoFreshData
from keda_llm_scaler.fleet import (
    EXPIRED,
    FRESH,
    REPLICA_STATES,
    STALE,
    Evaluation,
    FleetState,
    Observation,
    ReplicaReport,
)
from keda_llm_scaler.gateway import GATEWAY_ENGINE
from keda_llm_scaler.kube import KubeClient, KubeError
from keda_llm_scaler.learned import FleetRecord, aged
from keda_llm_scaler.loops import ScrapeLoop, Spawned
from keda_llm_scaler.membership import FAILED_TO_START, PENDING, READY, STARTING, Membership
from keda_llm_scaler.metadata import MAX_DEMAND_WINDOW_S, TriggerConfig
from keda_llm_scaler.policy import Composite
from keda_llm_scaler.pools import PoolReading, PoolShare, PoolSpec, pool_reading
from keda_llm_scaler.pools import split as split_fleet
from keda_llm_scaler.scrape import Scraper, ScrapeResult

__all__ = [
    "REPLICA_STATES",
    "FleetGroup",
    "FleetWorker",
    "ScrapeObserver",
    "Snapshot",
    "Target",
    "cycle_phase",
    "next_tick",
]

log = structlog.get_logger(__name__)

# a lasting discovery error (a 403, an API outage) is logged again after this long, not every cycle
DISCOVERY_LOG_EVERY_S = 60.0
# KEDA's default spec.maxReplicaCount (a ScaledObject that does not set it)
KEDA_DEFAULT_MAX_REPLICAS = 100


class ScrapeObserver(Protocol):
    def scrape_done(self, cfg: TriggerConfig, result: ScrapeResult) -> None: ...


class CycleObserver(Protocol):
    """Told of every scored cycle (victim ranking, ``keda_llm_scaler.deletion_cost``); must not block."""

    def consider(
        self,
        fleet_id: str,
        namespace: str,
        label: str,
        membership: Membership,
        reports: Sequence[ReplicaReport],
        composites: Iterable[tuple[float | None, float]],
    ) -> object: ...

    def forget(self, fleet_id: str) -> None: ...


# Arrival history kept per fleet: the longest demandWindow with its trend window.
DEMAND_RETAIN_S = DemandConfig(calm_window_s=MAX_DEMAND_WINDOW_S).history_s


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What every RPC reads: one cycle's evaluation of the fleet, stamped."""

    taken_at: float  # time.monotonic()
    wall_time: float
    cycle: int
    evaluation: Evaluation
    discovery_error: str | None = None
    cycle_s: float = 0.0  # how long discovery + all scrapes of this cycle took
    starting: int = 0  # replicas not ready yet (counted as capacity on the way)
    membership: Membership = field(
        default_factory=Membership
    )  # every member with its phase (ready, starting, pending, ...)
    resolved: bool = True  # False: discovery never succeeded, so the counts above are unknown, not 0
    # a pool of a fleet without poolSize: its ScaledObject's spec.maxReplicaCount, read on this cycle
    # (None: not read, no Kubernetes access, or not a pool)
    pool_size: int | None = None

    @property
    def composite(self) -> Composite | None:
        return self.evaluation.composite

    @property
    def error(self) -> str | None:
        return self.evaluation.error

    def count(self, state: str) -> int:
        return self.evaluation.count(state)


class Target:
    """One trigger's view of a fleet: its parameters, its latest Snapshot, its users."""

    def __init__(self, cfg: TriggerConfig, worker: FleetWorker, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.id = cfg.target_id
        self.worker = worker
        self._clock = clock
        self.snapshot: Snapshot | None = None
        self.last_used = self.registered_at = clock()
        self.prev_used = -math.inf
        self._poll_started = self.registered_at
        self.holders = 0  # open streams keep a target from eviction
        self._updated = asyncio.Event()
        self._first_wait_taken = False  # see wait_first
        self.group: FleetGroup | None = None  # the fleet of pools this view is a pool of (set by the registry)
        # a pool's last unit (requests/s a replica serves at targetUtilization): configured, else read
        configured = cfg.scoring.replica_capacity
        self._known_unit_rps: float | None = None if configured is None else configured * cfg.scoring.target_utilization
        self._pool_replicas: int | None = None  # ceil of the last share, to log pool_split on a change
        self.state_view: str | None = None  # whose answer stood last after a restart (logged on a change)
        self._unanswered: str | None = None  # why the last call got no answer (None: it got one)
        # the loop RPCs run on: snapshots published from the scrape loop's thread are handed over to it
        try:
            self._owner: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._owner = None

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        self.worker.attach(self)

    async def stop(self) -> None:
        await self.worker.detach(self)

    def touch(self) -> None:
        """Record a call. Calls within a second of a poll's first call are that poll (KEDA asks every
        trigger of a ScaledObject together); ``prev_used`` is the last call before the current poll. A
        caller that never pauses (a dashboard, a load test) still starts a new poll every second: measured
        from the previous gap instead, its calls were all one poll, and the targets it replaced were never
        seen as superseded (the soak kept six per ScaledObject for the whole idle TTL)."""
        now = self._clock()
        if now - self._poll_started > 1.0:
            self.prev_used = self.last_used
            self._poll_started = now
        self.last_used = now

    # -- reading ---------------------------------------------------------------------------------
    def max_snapshot_age(self) -> float:
        """A snapshot older than this means the loop itself is stuck, whatever the replicas say."""
        return 3 * self.cfg.scrape_interval + self.cfg.scrape_timeout + 5.0

    def own(self) -> tuple[Snapshot, Composite]:
        """The latest snapshot and this view's own composite (for a pool of a fleet: before the split), or
        NoFreshData (-> UNAVAILABLE) when there is none to give."""
        snap = self.snapshot
        if snap is None:
            raise NoFreshData(f"target {self.cfg.label}: first scrape still in progress")
        age = self._clock() - snap.taken_at
        if age > self.max_snapshot_age():
            raise NoFreshData(f"target {self.cfg.label}: last scrape cycle finished {age:.0f}s ago")
        if snap.composite is None:
            raise NoFreshData(f"target {self.cfg.label}: {snap.error}")
        return snap, snap.composite

    def current(self) -> tuple[Snapshot, Composite]:
        """The latest answer, or NoFreshData (-> UNAVAILABLE) when there is none to give. A pool of a fleet
        answers its share of the fleet's demand (``keda_llm_scaler.pools``), split at call time from the
        latest snapshots of all the fleet's pools: the same answers whatever order KEDA asks them in."""
        snap, composite = self.own()
        share = self.pool_share()
        if share is None:
            return snap, composite
        return snap, dataclasses.replace(composite, value=share.value)

    # -- a pool of a fleet -----------------------------------------------------------------------
    def pool_spec(self) -> PoolSpec | None:
        """The pool as the split sees it: its size is poolSize, else the ScaledObject's maxReplicaCount as
        the last cycle read it, else unbounded."""
        spec = self.cfg.pool
        if spec is None or spec.size is not None:
            return spec
        snap = self.snapshot
        size = snap.pool_size if snap is not None else None
        return spec if size is None else dataclasses.replace(spec, size=size)

    def pool_reading(self) -> PoolReading | None:
        """What the split reads of this pool (``pools.pool_reading``): the demand its own composite stands
        for (None without a fresh one: it then counts its members at target), its unit (requests/s one
        replica serves at targetUtilization, when a capacity is known) and its members (ready + starting)."""
        spec = self.pool_spec()
        if spec is None:
            return None
        snap = self.snapshot
        members = 0 if snap is None else snap.membership.count(READY) + snap.membership.count(STARTING)
        try:
            composite: Composite | None = self.own()[1]
        except NoFreshData:
            composite = None
        utilization = self.cfg.scoring.target_utilization
        reading = pool_reading(spec, composite, utilization, members, self._known_unit_rps)
        if composite is not None and composite.demand is not None and composite.demand.capacity_rps is not None:
            self._known_unit_rps = reading.unit_rps  # kept for when the pool is at zero and reads none
        return reading

    def pool_share(self, log_change: bool = True) -> PoolShare | None:
        """This pool's share of its fleet's demand now (None: not a pool of a fleet). Logs ``pool_split``
        when the replicas it asks for (the share rounded up) change."""
        group = self.group
        if group is None:
            return None
        shares = group.split(self)
        assert self.cfg.pool is not None  # a member of a group is a pool
        share = shares.get(self.cfg.pool.pool)
        if share is None:
            return None
        wanted = math.ceil(share.value)
        if log_change and wanted != self._pool_replicas:
            self._pool_replicas = wanted
            log.info(
                "pool_split",
                target=self.cfg.label,
                fleet=self.cfg.pool.fleet,
                pool=share.pool,
                tier=self.cfg.pool.tier_name,
                share=share.value,
                own=share.own,
                fleet_demand_rps=None if share.unsized else round(share.fleet_work_rps, 3),
                pool_demand_rps=round(share.work_rps, 3),
                unit_rps=round(share.unit_rps, 3),
                unit_assumed=share.unit_assumed,
                fresh=share.fresh,
                why=share.explain(),
            )
        return share

    def note_answer(self, unavailable: str | None) -> None:
        """Log when this target's calls stop getting an answer (UNAVAILABLE: KEDA neither scales it to zero
        nor, without a fallback, acts on it) and when they get one again: once per change, not per call."""
        if (unavailable is None) == (self._unanswered is None):
            return
        if unavailable is not None:
            log.warning("answers_unavailable", target=self.cfg.label, error=unavailable)
        else:
            log.info("answers_recovered", target=self.cfg.label, after=self._unanswered)
        self._unanswered = unavailable

    def is_fresh(self) -> bool:
        try:
            self.current()
        except NoFreshData:
            return False
        return True

    async def wait_first(self, timeout: float) -> None:
        """Wait for the first snapshot, at most ``timeout``, in the first call of this target only: every
        other call, during that wait or after it, answers at once (UNAVAILABLE "first scrape still in
        progress" until the first scrape is in). KEDA calls several times a second at start, the operator
        and the HPA side by side; each waiting, even a shared wait, would make every one of them slow."""
        if self.snapshot is not None or timeout <= 0 or self._first_wait_taken:
            return
        self._first_wait_taken = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._updated.wait(), timeout)

    def update_event(self) -> asyncio.Event:
        """The event the next publish sets (take it before reading ``snapshot`` to miss none)."""
        return self._updated

    def publish(self, snap: Snapshot) -> Snapshot:
        """Make ``snap`` the current answer, from any thread (see ``publish_together``)."""
        publish_together([(self, snap)])
        return snap

    def _apply(self, snap: Snapshot) -> None:
        self.snapshot = snap
        event, self._updated = self._updated, asyncio.Event()
        event.set()
        log.debug(
            "snapshot_updated",
            target=self.cfg.label,
            cycle=snap.cycle,
            composite=snap.composite.value if snap.composite else None,
            error=snap.error,
            fresh=snap.count(FRESH),
            stale=snap.count(STALE),
            expired=snap.count(EXPIRED),
        )


class FleetGroup:
    """The pools of one fleet: the ScaledObjects of one namespace with the same ``fleet`` trigger key, each
    a Target, by pool name. Two Targets claiming one pool name: the most recently registered is the
    pool (the other comes back if that one is evicted first)."""

    def __init__(self, namespace: str, fleet: str) -> None:
        self.namespace = namespace
        self.fleet = fleet
        self._claims: dict[str, list[Target]] = {}  # pool -> its claimants, in registration order

    def join(self, target: Target) -> Target | None:
        """Add ``target`` as its pool; returns the Target it displaces as that pool, if any."""
        assert target.cfg.pool is not None
        claims = self._claims.setdefault(target.cfg.pool.pool, [])
        displaced = claims[-1] if claims else None
        claims.append(target)
        target.group = self
        return displaced

    def leave(self, target: Target) -> None:
        assert target.cfg.pool is not None
        claims = self._claims.get(target.cfg.pool.pool, [])
        if target in claims:
            claims.remove(target)
        if not claims:
            self._claims.pop(target.cfg.pool.pool, None)
        target.group = None

    @property
    def empty(self) -> bool:
        return not self._claims

    def claims(self) -> list[list[Target]]:
        """Every pool's claimants (copies), in registration order."""
        return [list(c) for c in list(self._claims.values())]

    def members(self) -> dict[str, Target]:
        """Each pool's Target (its most recently registered claimant), by pool name. Read from a copy: the
        /metrics collector reads it from its own thread while registrations change it."""
        return {pool: claims[-1] for pool, claims in list(self._claims.items()) if claims}

    def readings(self, asking: Target | None = None) -> list[PoolReading]:
        """Every pool's reading; ``asking`` stands for its own pool (a displaced claimant answers as if it
        were the pool)."""
        members = self.members()
        if asking is not None and asking.cfg.pool is not None:
            members[asking.cfg.pool.pool] = asking
        return [r for r in (t.pool_reading() for _, t in sorted(members.items())) if r is not None]

    def split(self, asking: Target | None = None) -> dict[str, PoolShare]:
        return split_fleet(self.readings(asking))


def _max_replicas(scaled_object: dict[str, object] | None) -> int | None:
    """A ScaledObject's spec.maxReplicaCount (KEDA's default when it sets none); None: no ScaledObject."""
    if scaled_object is None:
        return None
    spec = scaled_object.get("spec")
    raw = spec.get("maxReplicaCount") if isinstance(spec, dict) else None
    if raw is None:
        return KEDA_DEFAULT_MAX_REPLICAS
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        return None
    return raw


def publish_together(pairs: list[tuple[Target, Snapshot]]) -> None:
    """Make each snapshot its target's current answer, all in one step on the RPC loop: applied at once
    on that loop's thread, handed over in a single callback from the scrape loop's (asyncio events are not
    thread-safe, and one callback per view would let an RPC see views of one fleet a cycle apart)."""
    if not pairs:
        return
    owner = pairs[0][0]._owner  # every target is created on the RPC loop

    def apply() -> None:
        for target, snap in pairs:
            target._apply(snap)

    if owner is None or owner.is_closed() or _running_loop() is owner:
        apply()
    else:
        owner.call_soon_threadsafe(apply)


def fleet_id(cfg: TriggerConfig) -> str:
    """The scraped fleet's id in logs and series: short, stable across processes."""
    return hashlib.sha256(repr(cfg.fleet_key).encode()).hexdigest()[:8]


def fleet_state_key(cfg: TriggerConfig) -> str:
    """The key of the scraped fleet's learned state: 64 bits, so that no two fleets of a release share it."""
    return hashlib.sha256(repr(cfg.fleet_key).encode()).hexdigest()[:16]


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def cycle_phase(fleet_id: str, interval: float) -> float:
    """Where in each interval a fleet scrapes, from its id: fleets registered together (a scaler restart,
    a rollout of many ScaledObjects) spread over the interval instead of scraping in one burst, as
    Prometheus spreads its targets."""
    return int(fleet_id[:8], 16) / 16**8 * interval


def next_tick(now: float, interval: float, phase: float) -> float:
    """The next point of the fleet's grid after ``now`` (at most one interval away). A cycle that overran
    waits for the next point rather than bursting to catch up."""
    return now + interval - ((now - phase) % interval)


class FleetWorker:
    """One fleet's scrape loop, shared by every Target whose trigger scrapes it the same way."""

    def __init__(
        self,
        cfg: TriggerConfig,
        resolver: Resolver,
        scraper: Scraper,
        observer: ScrapeObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
        scrape_loop: ScrapeLoop | None = None,
        ranker: CycleObserver | None = None,
        kube: KubeClient | None = None,
        learned: FleetRecord | None = None,
    ) -> None:
        """``learned``: what a previous process learned about this fleet (``keda_llm_scaler.learned``),
        taken before the first cycle when it was learned on the same basis."""
        self.cfg = cfg  # the first trigger's: discovery, engine, model, interval and timeout are shared
        self.key = cfg.fleet_key
        self.id = fleet_id(cfg)
        self.state_key = fleet_state_key(cfg)  # its learned state's key, shared by every scaler pod
        self._resolver = resolver
        self._scraper = scraper
        self._observer = observer
        self._clock = clock
        self._fleet = FleetState(cfg.scoring, cfg.stale_after, cfg.scrape_interval, retain_s=DEMAND_RETAIN_S)
        self.views: dict[tuple[object, ...], Target] = {}
        self._membership: Membership | None = None
        self._startups_seen: set[str] = set()
        self._phases: dict[str, str] = {}
        self._discovery_logged: tuple[str, float] | None = None  # (error text, when), see _resolve
        self._cycle = 0
        # this fleet's share of the scrape slots, then its namespace's (per tenant)
        self._limits = (scraper.fleet_limit(), scraper.namespace_limit(cfg.namespace))
        self.scrapes = 0  # replica scrapes made (one per ready replica per cycle, whatever the views)
        self._scrape_loop = scrape_loop or ScrapeLoop(threaded=False)
        self._task: Spawned[asyncio.Task[None]] | None = None
        self._ranker = ranker
        self._gateway_failing = False
        # pools of a fleet without poolSize: their ScaledObjects' maxReplicaCount (on the scrape loop)
        self._kube = kube
        self._pool_sizes: dict[tuple[str, str], int | None] = {}  # the last read, kept through API errors
        self._pool_size_errors: dict[tuple[str, str], str] = {}  # logged once per distinct error
        if learned is not None:
            self._adopt(learned)

    # -- learned state kept across restarts --------------------------------------------------------
    def _adopt(self, record: FleetRecord) -> None:
        tracker = self._fleet.demand
        if record.basis != tracker.basis():
            # a capacity is a rate within the SLO it was read against: another SLO's readings do not apply
            log.warning(
                "state_ignored",
                target=self.cfg.label,
                fleet_id=self.id,
                why=f"learned on {dict(record.basis)}; this fleet is scored on {dict(tracker.basis())}",
            )
            return
        age = time.time() - record.written_at
        try:
            tracker.adopt(aged(record.state, age), self._clock())
        except Exception as exc:  # a record that passed the checks and still cannot be taken: start cold
            log.warning("state_ignored", target=self.cfg.label, fleet_id=self.id, why=f"{type(exc).__name__}: {exc}")
            self._fleet = FleetState(
                self.cfg.scoring, self.cfg.stale_after, self.cfg.scrape_interval, retain_s=DEMAND_RETAIN_S
            )
            return
        s = record.state
        log.info(
            "state_restored",
            target=self.cfg.label,
            fleet_id=self.id,
            age_s=round(max(0.0, age), 1),
            capacity_readings=len(s.capacity),
            served_readings=len(s.served),
            startups=len(s.startups),
            bins=len(s.bins),
        )

    def learned(self, wall: float) -> FleetRecord:
        """What this fleet has learned, as a record written at ``wall`` (call on the scrape loop)."""
        tracker = self._fleet.demand
        return FleetRecord(self.cfg.label, tracker.basis(), wall, tracker.learned(self._clock()))

    # -- lifecycle -------------------------------------------------------------------------------
    def attach(self, view: Target) -> None:
        self.views[view.cfg.key] = view
        if self._task is None:
            self._task = self._scrape_loop.spawn(self._run(), name=f"fleet-{self.cfg.label}-{self.id}")

    async def detach(self, view: Target) -> None:
        self.views.pop(view.cfg.key, None)
        if not self.views:
            await self.stop()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await self._scrape_loop.cancel(task)
        if self._ranker is not None:
            ranker, fleet_id = self._ranker, self.id

            async def forget() -> None:  # on the scrape loop, where the ranking tasks live
                ranker.forget(fleet_id)

            await self._scrape_loop.run(forget())

    # -- the loop --------------------------------------------------------------------------------
    async def _run(self) -> None:
        interval = self.cfg.scrape_interval
        phase = cycle_phase(self.id, interval)
        while True:
            try:
                await self.run_cycle()  # the first at once: a new target's first call is waiting for it
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not kill the fleet: log, keep the last snapshots, retry
                log.exception("scrape_cycle_crashed", target=self.cfg.label, fleet_id=self.id)
            now = self._clock()
            await asyncio.sleep(next_tick(now, interval, phase) - now)

    async def _resolve(self) -> str | None:
        try:
            found = await self._resolver.resolve()
        except DiscoveryError as exc:
            # once per distinct error and then once a minute: the client retries (and backs off) every
            # cycle, and a lasting 403 must not write a line a second
            now, text = self._clock(), str(exc)
            last = self._discovery_logged
            if last is None or last[0] != text or now - last[1] >= DISCOVERY_LOG_EVERY_S:
                log.warning("discovery_failed", target=self.cfg.label, error=text)
                self._discovery_logged = (text, now)
            return text
        self._discovery_logged = None
        if self._membership is not None and found.urls != self._membership.urls:
            before, after = set(self._membership.urls), set(found.urls)
            log.info(
                "replicas_changed",
                target=self.cfg.label,
                added=sorted(redact(u) for u in after - before),
                removed=sorted(redact(u) for u in before - after),
            )
        for m in found.members:
            if m.phase in (PENDING, FAILED_TO_START) and self._phases.get(m.key) != m.phase:
                log.warning("member_not_starting", target=self.cfg.label, member=m.key, phase=m.phase, reason=m.reason)
        self._phases = {m.key: m.phase for m in found.members}
        self._membership = found
        if found.error:
            log.warning("discovery_degraded", target=self.cfg.label, error=found.error)
        return found.error

    async def run_cycle(self) -> None:
        started = self._clock()
        discovery_error = await self._resolve()
        cfg = self.cfg
        membership = self._membership
        if membership is None:  # never resolved: the fleet is unknown, which is not zero
            error = Evaluation((), None, f"discovery failed: {discovery_error}")
            self._publish(
                lambda view: Snapshot(self._clock(), time.time(), self._cycle, error, discovery_error, resolved=False)
            )
            return
        urls = membership.urls
        self.scrapes += len(urls)
        replica_scrapes = asyncio.gather(
            *(
                self._scraper.scrape(
                    url, timeout=cfg.scrape_timeout, engine=cfg.engine, model=cfg.model, limits=self._limits
                )
                for url in urls
            )
        )
        gateway_result: ScrapeResult | None = None
        if cfg.gateway is None:
            results, pool_sizes = await asyncio.gather(replica_scrapes, self._read_pool_sizes())
        else:  # the pool's gateway, in the same cycle and under the same slots and deadline
            gateway_scrape = self._scraper.scrape(
                cfg.gateway.url,
                timeout=cfg.scrape_timeout,
                engine=GATEWAY_ENGINE,
                model=cfg.gateway.channel,
                limits=self._limits,
            )
            results, gateway_result, pool_sizes = await asyncio.gather(
                replica_scrapes, gateway_scrape, self._read_pool_sizes()
            )
        gateway = self._gateway_reading(gateway_result)
        now = self._clock()
        by_url = {r.url: r for r in results}
        startups = membership.startups()
        fresh = [s for key, s in startups.items() if key not in self._startups_seen]
        self._startups_seen = set(startups) | (self._startups_seen & {m.key for m in membership.members})
        changes = self._fleet.update(
            now,
            (Observation(r.url, r.signals, r.reason, r.detail) for r in results),
            membership.starting,
            fresh,
        )
        if self._observer is not None:
            # under each ScaledObject that reads this fleet now, not the one that created the worker: that
            # one may be gone, and its series must go with it (registry.evict_idle)
            for view_cfg in [v.cfg for v in list(self.views.values())]:
                for res in (*results, *([gateway_result] if gateway_result is not None else [])):
                    self._observer.scrape_done(view_cfg, res)
        for url, failing in changes:
            res = by_url[url]
            if failing:
                log.warning(
                    "replica_scrape_failed",
                    target=cfg.label,
                    url=redact(url),
                    reason=res.reason,
                    detail=res.detail[:300].replace(url, redact(url)),
                )
            else:
                log.info("replica_scrape_recovered", target=cfg.label, url=redact(url))
        cycle_s = now - started
        starting = membership.starting

        def snapshot(view: Target) -> Snapshot:
            v = view.cfg
            evaluation = self._fleet.evaluate(now, starting, v.scoring, v.stale_after, gateway)
            if evaluation.state_view is not None and evaluation.state_view != view.state_view:
                # once per change: whether the restored state or a cold start's reading answers (FleetState)
                view.state_view = evaluation.state_view
                log.info("state_view", target=v.label, stands=evaluation.state_view)
            pool_size = pool_sizes.get((v.namespace, v.name))
            return Snapshot(
                now,
                time.time(),
                self._cycle,
                evaluation,
                discovery_error,
                cycle_s,
                starting,
                membership,
                pool_size=pool_size,
            )

        pairs = self._publish(snapshot)
        if self._ranker is not None and pairs:
            try:
                self._ranker.consider(
                    self.id,
                    cfg.namespace,
                    cfg.label,
                    membership,
                    pairs[0][1].evaluation.replicas,  # the same replicas in every view; the composites differ
                    [(s.composite.value if s.composite else None, view.cfg.target_value) for view, s in pairs],
                )
            except Exception:  # ranking is an extra: a bug in it must not cost the fleet its scoring
                log.exception("victim_ranking_crashed", target=cfg.label, fleet_id=self.id)

    async def _read_pool_sizes(self) -> dict[tuple[str, str], int | None]:
        """The maxReplicaCount of each view's ScaledObject that is a pool of a fleet without poolSize, read
        through the Kubernetes client's cache (a slow TTL: one API call per ScaledObject every few
        minutes). An API error keeps the last size read (logged once per distinct error)."""
        kube = self._kube
        if kube is None:
            return {}
        wanted = sorted(
            {(v.cfg.namespace, v.cfg.name) for v in list(self.views.values()) if v.cfg.pool and v.cfg.pool.size is None}
        )
        for so in wanted:
            error: str | None = None
            try:
                obj = await kube.get_scaledobject(*so)
            except KubeError as exc:
                error = str(exc)
            else:
                self._pool_sizes[so] = size = _max_replicas(obj)
                if size is None:
                    error = "ScaledObject not found" if obj is None else "spec.maxReplicaCount is not a count"
            if error is None:
                self._pool_size_errors.pop(so, None)
            elif self._pool_size_errors.get(so) != error:
                self._pool_size_errors[so] = error
                so_label, kept = f"{so[0]}/{so[1]}", self._pool_sizes.get(so)
                log.warning("pool_size_unread", scaledobject=so_label, error=error, kept=kept)
        for so in set(self._pool_sizes) - set(wanted):
            del self._pool_sizes[so]
            self._pool_size_errors.pop(so, None)
        return dict(self._pool_sizes)

    def _gateway_reading(self, result: ScrapeResult | None) -> tuple[float | None, str | None] | None:
        """(requests held, None) or (None, why not); logged when it starts or stops failing."""
        if result is None:
            return None
        failing = result.held is None
        if failing != self._gateway_failing:
            self._gateway_failing = failing
            url = redact(result.url)
            if failing:
                log.warning("gateway_scrape_failed", target=self.cfg.label, url=url, reason=result.reason,
                            detail=result.detail[:300].replace(result.url, url))  # fmt: skip
            else:
                log.info("gateway_scrape_recovered", target=self.cfg.label, url=url)
        return (result.held, None) if result.held is not None else (None, result.reason or "no reading")

    def _publish(self, snapshot: Callable[[Target], Snapshot]) -> list[tuple[Target, Snapshot]]:
        pairs = [(view, snapshot(view)) for view in list(self.views.values())]
        publish_together(pairs)
        self._cycle += 1
        return pairs
