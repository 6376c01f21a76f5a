"""One target (a ScaledObject's fleet): its background scrape loop and the snapshot every RPC reads.

The loop resolves the replica set, scrapes every replica concurrently, folds the results into
per-replica state (last good signals, counter windows) and publishes a frozen Snapshot. RPCs never
touch a replica: they read the latest Snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Protocol

import structlog

from scaler.discovery import DiscoveryError, Resolver
from scaler.errors import NoFreshData
from scaler.metadata import TriggerConfig
from scaler.policy import Composite, ReplicaInput, composite
from scaler.rates import DEFAULT_WINDOW_S, CounterWindow, HistogramWindow
from scaler.scrape import Scraper, ScrapeResult
from scaler.signals import Histogram, ReplicaSignals, histogram_quantile

__all__ = ["ReplicaReport", "ScrapeObserver", "Snapshot", "Target"]

log = structlog.get_logger(__name__)

FRESH: Final = "fresh"
STALE: Final = "stale"  # this scrape failed; last good data is still inside staleAfter
EXPIRED: Final = "expired"  # no good data inside staleAfter (or never): counted as at least at target
REPLICA_STATES: Final = (FRESH, STALE, EXPIRED)


class ScrapeObserver(Protocol):
    def scrape_done(self, cfg: TriggerConfig, result: ScrapeResult) -> None: ...


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


@dataclass(frozen=True, slots=True)
class Snapshot:
    taken_at: float  # time.monotonic()
    wall_time: float
    cycle: int
    composite: Composite | None
    error: str | None  # set when composite is None: why there is no answer
    replicas: tuple[ReplicaReport, ...]
    discovery_error: str | None = None
    cycle_s: float = 0.0  # how long discovery + all scrapes of this cycle took
    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float | None = None
    reject_rate: float | None = None
    preemption_rate: float | None = None
    ttft_p95_s: float | None = None
    queue_time_p95_s: float | None = None

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
    preemptions: CounterWindow = field(init=False)
    ttft: HistogramWindow = field(init=False)
    queue_time: HistogramWindow = field(init=False)

    def __post_init__(self) -> None:
        self.rejects = CounterWindow(self.window_s)
        self.admitted = CounterWindow(self.window_s)
        self.preemptions = CounterWindow(self.window_s)
        self.ttft = HistogramWindow(self.window_s)
        self.queue_time = HistogramWindow(self.window_s)

    def absorb(self, result: ScrapeResult, now: float) -> None:
        self.reason, self.detail = result.reason, result.detail
        s = result.signals
        if s is None:
            return
        self.signals, self.last_ok = s, now
        for window, value in ((self.rejects, s.rejects_total), (self.admitted, s.admitted_total),
                              (self.preemptions, s.preemptions_total)):
            if value is not None:
                window.observe(now, value)
        for hwindow, hist in ((self.ttft, s.ttft), (self.queue_time, s.queue_time)):
            if hist is not None:
                hwindow.observe(now, hist)

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
            reject_rate=self.rejects.rate(),
            admitted_rate=self.admitted.rate(),
            preemption_rate=self.preemptions.rate(),
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
    )


def _sum_known(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return math.fsum(known) if known else None


class Target:
    def __init__(
        self,
        cfg: TriggerConfig,
        resolver: Resolver,
        scraper: Scraper,
        observer: ScrapeObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        # Stable across processes (unlike hash()): the `target` label on the scaler's own metrics.
        self.id = hashlib.sha256(repr(cfg.key).encode()).hexdigest()[:8]
        self._resolver = resolver
        self._scraper = scraper
        self._observer = observer
        self._clock = clock
        self._window_s = max(DEFAULT_WINDOW_S, 3 * cfg.scrape_interval)
        self._replicas: dict[str, _ReplicaState] = {}
        self._urls: list[str] | None = None
        self._cycle = 0
        self.snapshot: Snapshot | None = None
        self.last_used = clock()
        self.holders = 0  # open streams keep a target from eviction
        self._updated = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"target-{self.cfg.label}-{self.id}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def touch(self) -> None:
        self.last_used = self._clock()

    # -- reading ---------------------------------------------------------------------------------
    def max_snapshot_age(self) -> float:
        """A snapshot older than this means the loop itself is stuck, whatever the replicas say."""
        return 3 * self.cfg.scrape_interval + self.cfg.scrape_timeout + 5.0

    def current(self) -> tuple[Snapshot, Composite]:
        """The latest answer, or NoFreshData (-> UNAVAILABLE) when there is none to give."""
        snap = self.snapshot
        if snap is None:
            raise NoFreshData(f"target {self.cfg.label}: first scrape still in progress")
        age = self._clock() - snap.taken_at
        if age > self.max_snapshot_age():
            raise NoFreshData(f"target {self.cfg.label}: last scrape cycle finished {age:.0f}s ago")
        if snap.composite is None:
            raise NoFreshData(f"target {self.cfg.label}: {snap.error}")
        return snap, snap.composite

    def is_fresh(self) -> bool:
        try:
            self.current()
        except NoFreshData:
            return False
        return True

    async def wait_first(self, timeout: float) -> None:
        if self.snapshot is None and timeout > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._updated.wait(), timeout)

    async def wait_update(self) -> None:
        await self._updated.wait()

    # -- the loop --------------------------------------------------------------------------------
    async def _run(self) -> None:
        next_tick = self._clock()
        while True:
            try:
                await self.run_cycle()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not kill the target: log, keep the last snapshot, retry
                log.exception("scrape_cycle_crashed", target=self.cfg.label, target_id=self.id)
            next_tick += self.cfg.scrape_interval
            now = self._clock()
            if next_tick < now:  # overran: start again now instead of bursting to catch up
                next_tick = now
            await asyncio.sleep(next_tick - now)

    async def _resolve(self) -> str | None:
        try:
            urls = await self._resolver.resolve()
        except DiscoveryError as exc:
            log.warning("discovery_failed", target=self.cfg.label, error=str(exc))
            return str(exc)
        if self._urls is not None and urls != self._urls:
            log.info("replicas_changed", target=self.cfg.label, added=sorted(set(urls) - set(self._urls)),
                     removed=sorted(set(self._urls) - set(urls)))
        self._urls = urls
        return None

    async def run_cycle(self) -> Snapshot:
        started = self._clock()
        discovery_error = await self._resolve()
        cfg = self.cfg
        if self._urls is None:  # never resolved: the fleet is unknown, which is not zero
            return self._publish(Snapshot(self._clock(), time.time(), self._cycle, None,
                                          f"discovery failed: {discovery_error}", (), discovery_error))
        urls = self._urls
        results = await asyncio.gather(*(
            self._scraper.scrape(url, timeout=cfg.scrape_timeout, engine=cfg.engine, model=cfg.model)
            for url in urls
        ))
        now = self._clock()
        for gone in set(self._replicas) - set(urls):
            del self._replicas[gone]  # left the fleet: forget its series (no stranded values)
        for res in results:
            state = self._replicas.get(res.url)
            if state is None:
                state = self._replicas[res.url] = _ReplicaState(res.url, self._window_s)
            was_failing = state.reason is not None
            state.absorb(res, now)
            if self._observer is not None:
                self._observer.scrape_done(cfg, res)
            if res.reason is not None and not was_failing:
                log.warning("replica_scrape_failed", target=cfg.label, url=res.url, reason=res.reason,
                            detail=res.detail[:300])
            elif res.reason is None and was_failing:
                log.info("replica_scrape_recovered", target=cfg.label, url=res.url)
        reports = tuple(self._replicas[u].report(now, cfg.stale_after) for u in urls)
        return self._publish(self._build(now, reports, discovery_error, now - started))

    def _build(self, now: float, reports: tuple[ReplicaReport, ...], discovery_error: str | None,
               cycle_s: float) -> Snapshot:
        try:
            comp: Composite | None = composite([_policy_input(r) for r in reports], self.cfg.scoring)
            error = None
        except NoFreshData as exc:
            comp, error = None, f"{exc}: " + "; ".join(f"{r.url} {r.reason}" for r in reports[:5])
        live = [r for r in reports if r.state != EXPIRED and r.signals is not None]
        ttft = [d for u in (r.url for r in live) if (d := self._replicas[u].ttft.delta()) is not None]
        queue = [d for u in (r.url for r in live) if (d := self._replicas[u].queue_time.delta()) is not None]
        return Snapshot(
            taken_at=now,
            wall_time=time.time(),
            cycle=self._cycle,
            composite=comp,
            error=error,
            replicas=reports,
            discovery_error=discovery_error,
            cycle_s=cycle_s,
            waiting=math.fsum(r.signals.waiting for r in live if r.signals),
            running=math.fsum(r.signals.running for r in live if r.signals),
            kv_usage=(math.fsum(r.signals.kv_usage for r in live if r.signals) / len(live)) if live else None,
            reject_rate=_sum_known([r.reject_rate for r in live]),
            preemption_rate=_sum_known([r.preemption_rate for r in live]),
            ttft_p95_s=_p95(ttft),
            queue_time_p95_s=_p95(queue),
        )

    def _publish(self, snap: Snapshot) -> Snapshot:
        self._cycle += 1
        self.snapshot = snap
        event, self._updated = self._updated, asyncio.Event()
        event.set()
        log.debug("snapshot_updated", target=self.cfg.label, cycle=snap.cycle,
                  composite=snap.composite.value if snap.composite else None, error=snap.error,
                  fresh=snap.count(FRESH), stale=snap.count(STALE), expired=snap.count(EXPIRED))
        return snap


def _p95(deltas: list[Histogram]) -> float | None:
    merged = Histogram.merge(deltas)
    return histogram_quantile(0.95, merged) if merged is not None else None
