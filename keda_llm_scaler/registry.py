"""All targets of this process: created on first use, evicted after disuse."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping

import structlog

from keda_llm_scaler.discovery import make_resolver
from keda_llm_scaler.errors import BadMetadata, ScalerError
from keda_llm_scaler.kube import KubeClient
from keda_llm_scaler.learned import FleetRecord
from keda_llm_scaler.loops import ScrapeLoop
from keda_llm_scaler.metadata import TriggerConfig, metadata_hints, parse_trigger
from keda_llm_scaler.scrape import Scraper
from keda_llm_scaler.target import CycleObserver, FleetGroup, FleetWorker, ScrapeObserver, Target, fleet_state_key

__all__ = ["TargetRegistry", "TooManyTargets"]

log = structlog.get_logger(__name__)

_PARSE_CACHE_SIZE = 1024
# The parsed configs' metadata size in all: 1,024 distinct 256 KiB endpoint lists would otherwise hold
# ~250 MB of parsed URLs. Past it the least recently used configs go (a miss only costs a parse).
PARSE_CACHE_BYTES = 16 * 1024 * 1024
MAX_METADATA_BYTES = 256 * 1024  # 1,000 endpoint URLs are ~50 KB; beyond this is not a trigger
# A ScaledObject whose trigger metadata changed (a new endpoint list, a new threshold) gets a new target;
# KEDA stops calling the old one, which then retires this long after its last call, not after the full
# idle TTL. The newer one must also have been called twice since (see _idle), so a KEDA still asking the
# old one (two operator replicas mid-rollout) keeps it. Short: until it retires, the old target scrapes
# its whole fleet every interval for nobody (the soak's churn kept 40-60 fleets alive for 20 at 30 s).
SUPERSEDED_TTL_S = 10.0


class TooManyTargets(ScalerError):
    pass


class TargetRegistry:
    def __init__(
        self,
        scraper: Scraper,
        *,
        kube: KubeClient | None = None,
        observer: ScrapeObserver | None = None,
        idle_ttl_s: float = 600.0,
        max_targets: int = 1000,
        allow_cross_namespace: bool = False,
        clock: Callable[[], float] = time.monotonic,
        scrape_loop: ScrapeLoop | None = None,
        ranker: CycleObserver | None = None,
        learned: Callable[[str], FleetRecord | None] | None = None,
        scale_targets: Mapping[tuple[str, str], Mapping[str, str]] | None = None,
    ) -> None:
        """``learned``: a fleet's record kept across restarts, by fleet id (``--state-dir``, a ConfigMap)."""
        self._scraper = scraper
        self._learned = learned
        self._scale_targets = scale_targets or {}
        self._ranker = ranker  # victim ranking (--victim-ranking), told of every fleet's cycles
        # where fleets scrape (a thread of its own in `serve`); the scraper and the Kubernetes client live there
        self._scrape_loop = scrape_loop or ScrapeLoop(threaded=False)
        self._kube = kube
        self._observer = observer
        self.idle_ttl_s = idle_ttl_s
        self.max_targets = max_targets
        self.allow_cross_namespace = allow_cross_namespace
        self._clock = clock
        self._targets: dict[tuple[object, ...], Target] = {}
        self._fleets: dict[tuple[object, ...], FleetWorker] = {}
        # fleets of pools (the `fleet` trigger key), by (namespace, fleet): their pools' targets
        self._groups: dict[tuple[str, str], FleetGroup] = {}
        # metadata -> config; also remembers which metadata we already logged hints for
        self._parsed: OrderedDict[bytes, tuple[TriggerConfig, int]] = OrderedDict()
        self._parsed_bytes = 0

    def config_for(self, namespace: str, name: str, metadata: Mapping[str, str]) -> TriggerConfig:
        """Parse (cached) trigger metadata; raises BadMetadata. The size is checked before anything is
        parsed, and the cache holds digests of the metadata, not the metadata itself."""
        size = sum(len(k) + len(v) for k, v in metadata.items())
        if size > MAX_METADATA_BYTES:
            biggest = max(metadata, key=lambda k: len(metadata[k]))
            raise BadMetadata(biggest, f"trigger metadata is {size} characters", f"at most {MAX_METADATA_BYTES} in all")
        digest = hashlib.sha256(
            "\0".join([namespace, name, *(f"{k}\0{v}" for k, v in sorted(metadata.items()))]).encode()
        ).digest()
        cached = self._parsed.get(digest)
        if cached is not None:
            self._parsed.move_to_end(digest)
            return cached[0]
        cfg = parse_trigger(namespace, name, metadata, allow_cross_namespace=self.allow_cross_namespace)
        make_resolver(cfg.discovery, self._kube, name)  # refuses Kubernetes discovery when not configured
        if cfg.pool is not None and cfg.pool.reserved and cfg.pool.size is None and self._kube is None:
            # a reserved pool fills up to its size: without poolSize it is the ScaledObject's
            # maxReplicaCount, which only a scaler with Kubernetes access can read
            raise BadMetadata(
                "poolSize",
                "a reserved pool needs its size, and this scaler has no Kubernetes access to read the "
                "ScaledObject's maxReplicaCount (no in-cluster service account, --kubeconfig or --kube-api-url)",
                "an integer >= 0: the reserved pool's size",
            )
        for hint in metadata_hints(metadata):
            log.warning("metadata_hint", scaledobject=f"{namespace}/{name}", hint=hint)
        self._parsed[digest] = (cfg, size)
        self._parsed_bytes += size
        while len(self._parsed) > _PARSE_CACHE_SIZE or self._parsed_bytes > PARSE_CACHE_BYTES:
            _, (_, dropped) = self._parsed.popitem(last=False)
            self._parsed_bytes -= dropped
        return cfg

    def ensure(self, cfg: TriggerConfig) -> Target:
        """The running target for this config, created and started on first use; targets that scrape
        the same fleet share one worker (one scrape loop)."""
        target = self._targets.get(cfg.key)
        if target is None:
            if len(self._targets) >= self.max_targets:
                raise TooManyTargets(f"this scaler already serves {self.max_targets} targets (--max-targets)")
            worker = self._fleets.get(cfg.fleet_key)
            if worker is None:
                resolver = make_resolver(
                    cfg.discovery, self._kube, cfg.name, self._scale_targets.get((cfg.namespace, cfg.name))
                )
                worker = FleetWorker(
                    cfg,
                    resolver,
                    self._scraper,
                    self._observer,
                    clock=self._clock,
                    scrape_loop=self._scrape_loop,
                    ranker=self._ranker,
                    kube=self._kube,
                    learned=None if self._learned is None else self._learned(fleet_state_key(cfg)),
                )
                self._fleets[cfg.fleet_key] = worker
            target = Target(cfg, worker, clock=self._clock)
            self._targets[cfg.key] = target
            if cfg.pool is not None:
                self._join_group(target, cfg.pool.fleet, cfg.pool.pool)
            target.start()
            log.info(
                "target_registered",
                target=cfg.label,
                target_id=target.id,
                fleet_id=worker.id,
                shared_with=len(worker.views) - 1,
                discovery=cfg.discovery.kind,
                engine=cfg.engine,
                interval_s=cfg.scrape_interval,
            )
        target.touch()
        return target

    def _join_group(self, target: Target, fleet: str, pool: str) -> None:
        group = self._groups.get((target.cfg.namespace, fleet))
        if group is None:
            group = self._groups[(target.cfg.namespace, fleet)] = FleetGroup(target.cfg.namespace, fleet)
        # a ScaledObject is one pool: its older targets (metadata changed, the pool renamed) leave the
        # group now, or the fleet would count its replicas twice until they are evicted
        for pool_targets in group.claims():
            for older in pool_targets:
                if older is not target and (older.cfg.namespace, older.cfg.name) == (
                    target.cfg.namespace,
                    target.cfg.name,
                ):
                    group.leave(older)
        displaced = group.join(target)
        if displaced is not None and displaced.cfg.name != target.cfg.name:
            # a ScaledObject whose metadata changed replaces its own old target: only another one is a conflict
            log.warning(
                "pool_claimed_twice",
                fleet=f"{target.cfg.namespace}/{fleet}",
                pool=pool,
                scaledobject=target.cfg.label,
                displaced=displaced.cfg.label,
                hint="two ScaledObjects of one fleet name the same pool; the most recently registered is the pool",
            )

    def groups(self) -> list[FleetGroup]:
        return list(self._groups.values())

    def targets(self) -> list[Target]:
        return list(self._targets.values())

    def fleets(self) -> list[FleetWorker]:
        return list(self._fleets.values())

    def _idle(self, now: float) -> list[tuple[object, ...]]:
        by_so: dict[tuple[str, str], list[Target]] = {}
        for t in self._targets.values():
            by_so.setdefault((t.cfg.namespace, t.cfg.name), []).append(t)
        idle = []
        for key, t in self._targets.items():
            if t.holders:
                continue
            unused = now - t.last_used
            # superseded: a newer target of the same ScaledObject has been called twice since this one
            # last was (KEDA asks every trigger of a ScaledObject on each poll, so this one was dropped)
            superseded = any(
                o.registered_at > t.registered_at and o.prev_used > t.last_used
                for o in by_so[(t.cfg.namespace, t.cfg.name)]
            )
            if unused > self.idle_ttl_s or (superseded and unused > min(SUPERSEDED_TTL_S, self.idle_ttl_s)):
                idle.append(key)
        return idle

    async def evict_idle(self) -> int:
        now = self._clock()
        gone = [self._targets.pop(key) for key in self._idle(now)]
        await asyncio.gather(*(t.stop() for t in gone))  # all at once: a thousand idle targets, one wait
        for target in gone:
            group = target.group
            if group is not None:
                group.leave(target)
                if group.empty:
                    self._groups.pop((group.namespace, group.fleet), None)
            if not target.worker.views:  # its last view: the fleet's loop stops and its series go
                self._fleets.pop(target.worker.key, None)
            log.info(
                "target_evicted", target=target.cfg.label, target_id=target.id, idle_s=round(now - target.last_used)
            )
        left = {(t.cfg.namespace, t.cfg.name) for t in self._targets.values()}
        for so in {(t.cfg.namespace, t.cfg.name) for t in gone} - left:
            forget = getattr(self._observer, "forget", None)
            if forget is not None:
                forget(*so)  # the ScaledObject's per-scrape series leave /metrics with it
        return len(gone)

    async def run_evictor(self, every_s: float = 30.0) -> None:
        while True:
            await asyncio.sleep(min(every_s, self.idle_ttl_s, SUPERSEDED_TTL_S / 3))
            await self.evict_idle()

    async def aclose(self) -> None:
        for target in list(self._targets.values()):
            await target.stop()
        self._targets.clear()
        self._fleets.clear()
        self._groups.clear()
        with contextlib.suppress(Exception):
            await self._scrape_loop.run(self._scraper.aclose())
        if self._kube is not None:
            await self._scrape_loop.run(self._kube.aclose())
