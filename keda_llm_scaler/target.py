"""One target (a ScaledObject's fleet): its background scrape loop and the snapshot every RPC reads.

The loop resolves the replica set, scrapes every replica concurrently, folds the results into
per-replica state (last good signals, counter windows) and publishes a frozen Snapshot. RPCs never
touch a replica: they read the latest Snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import structlog

from keda_llm_scaler.discovery import DiscoveryError, Resolver
from keda_llm_scaler.errors import NoFreshData
from keda_llm_scaler.fleet import EXPIRED, FRESH, REPLICA_STATES, STALE, Evaluation, FleetState, Observation
from keda_llm_scaler.metadata import TriggerConfig
from keda_llm_scaler.policy import Composite
from keda_llm_scaler.scrape import Scraper, ScrapeResult

__all__ = ["REPLICA_STATES", "ScrapeObserver", "Snapshot", "Target"]

log = structlog.get_logger(__name__)


class ScrapeObserver(Protocol):
    def scrape_done(self, cfg: TriggerConfig, result: ScrapeResult) -> None: ...


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

    @property
    def composite(self) -> Composite | None:
        return self.evaluation.composite

    @property
    def error(self) -> str | None:
        return self.evaluation.error

    def count(self, state: str) -> int:
        return self.evaluation.count(state)


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
        self._fleet = FleetState(cfg.scoring, cfg.stale_after, cfg.scrape_interval)
        self._urls: list[str] | None = None
        self._starting = 0
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
            found = await self._resolver.resolve()
        except DiscoveryError as exc:
            log.warning("discovery_failed", target=self.cfg.label, error=str(exc))
            return str(exc)
        urls, self._starting = found.urls, found.starting
        if self._urls is not None and urls != self._urls:
            log.info(
                "replicas_changed",
                target=self.cfg.label,
                added=sorted(set(urls) - set(self._urls)),
                removed=sorted(set(self._urls) - set(urls)),
            )
        self._urls = urls
        return None

    async def run_cycle(self) -> Snapshot:
        started = self._clock()
        discovery_error = await self._resolve()
        cfg = self.cfg
        if self._urls is None:  # never resolved: the fleet is unknown, which is not zero
            error = Evaluation((), None, f"discovery failed: {discovery_error}")
            return self._publish(Snapshot(self._clock(), time.time(), self._cycle, error, discovery_error))
        results = await asyncio.gather(
            *(
                self._scraper.scrape(url, timeout=cfg.scrape_timeout, engine=cfg.engine, model=cfg.model)
                for url in self._urls
            )
        )
        now = self._clock()
        by_url = {r.url: r for r in results}
        changes = self._fleet.update(
            now, (Observation(r.url, r.signals, r.reason, r.detail) for r in results), self._starting
        )
        for res in results:
            if self._observer is not None:
                self._observer.scrape_done(cfg, res)
        for url, failing in changes:
            res = by_url[url]
            if failing:
                log.warning(
                    "replica_scrape_failed", target=cfg.label, url=url, reason=res.reason, detail=res.detail[:300]
                )
            else:
                log.info("replica_scrape_recovered", target=cfg.label, url=url)
        evaluation = self._fleet.evaluate(now, self._starting)
        return self._publish(
            Snapshot(now, time.time(), self._cycle, evaluation, discovery_error, now - started, self._starting)
        )

    def _publish(self, snap: Snapshot) -> Snapshot:
        self._cycle += 1
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
        return snap
