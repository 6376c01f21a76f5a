"""Victim ranking: keep ``controller.kubernetes.io/pod-deletion-cost`` on a fleet's pods current from the
scraped load, so a scale-down removes the least busy pod (``--victim-ranking``, off by default).

The costs are ``keda_llm_scaler.victims``'; this module decides when to write them and writes them:

* only in the namespaces the operator enabled (the chart grants ``patch pods`` there and nowhere else);
* only while a scale-down is plausible (every trigger's composite asks for fewer replicas than are
  ready): at other times the ReplicaSet removes nothing, and writes would cost the API server for nothing;
* only pods whose cost differs from their annotation (as the pods informer last saw it, else as this
  process last wrote it), at most ``burst`` per pass and one pass per ``interval_s`` per fleet;
* in a task of its own: scoring never waits for the API server. A pass still writing when the next is
  due makes that one skip.

A 401/403 is an RBAC gap, not a fault of the fleet: it is counted, logged once per back-off with what to
grant, and the namespace is left alone for ``FORBIDDEN_BACKOFF_S``; scoring goes on.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import structlog
from prometheus_client import CollectorRegistry, Counter

from keda_llm_scaler.fleet import EXPIRED, ReplicaReport
from keda_llm_scaler.kube import PATCH_FORBIDDEN, PATCH_OK, KubeClient, PatchResult
from keda_llm_scaler.membership import READY, Member, Membership
from keda_llm_scaler.ranking_scope import RankingScope
from keda_llm_scaler.victims import (
    ANNOTATION,
    DEFAULT_BURST,
    DEFAULT_INTERVAL_S,
    CostChange,
    PodLoad,
    plan,
    scale_down_plausible,
)

__all__ = ["FORBIDDEN_BACKOFF_S", "VictimRanker"]

log = structlog.get_logger(__name__)

FORBIDDEN_BACKOFF_S: Final = 300.0
PATCH_CONCURRENCY: Final = 2  # patches share the API client's pool with discovery's GETs and lists
FORGET_AFTER_S: Final = 900.0  # a fleet not seen this long: its pass state and what was written go

# pass outcomes, the `outcome` label of llm_scaler_victim_ranking_passes_total
WRITTEN: Final = "written"
UNCHANGED: Final = "unchanged"
NOT_PLAUSIBLE: Final = "not_plausible"
NO_PODS: Final = "no_pods"  # the fleet's discovery names no pods (static endpoints, dnsName)
FORBIDDEN_BACKOFF: Final = "forbidden_backoff"
BUSY: Final = "busy"  # the previous pass is still writing


@dataclass
class _FleetRanking:
    last_pass: float = -math.inf
    seen: float = 0.0
    task: asyncio.Task[None] | None = None
    told_no_pods: bool = False


class VictimRanker:
    def __init__(
        self,
        kube: KubeClient,
        scope: RankingScope,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        burst: int = DEFAULT_BURST,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self.scope = scope
        self.interval_s = interval_s
        self.burst = burst
        self._clock = clock
        self._fleets: dict[str, _FleetRanking] = {}
        self._forbidden_until: dict[str, float] = {}
        # pod key -> (the cost this process wrote, when it last mattered): for pods whose annotation no
        # informer shows (a Service without a selector), so that an unchanged cost is not written again
        self._written: dict[str, tuple[int, float]] = {}
        self._swept_at = clock()
        self._limit: asyncio.Semaphore | None = None
        self.patches = Counter(
            "llm_scaler_deletion_cost_patches",
            "Pod-deletion-cost annotations written, by namespace and result: ok, forbidden (RBAC), not_found "
            "(the pod left), conflict (a new pod under the name), error",
            ["namespace", "result"],
            registry=registry,
        )
        self.passes = Counter(
            "llm_scaler_victim_ranking_passes",
            "Victim-ranking passes by outcome: written, unchanged, not_plausible (no scale-down in sight), "
            "no_pods (discovery names no pods), forbidden_backoff, busy (the last pass still writing)",
            ["namespace", "outcome"],
            registry=registry,
        )

    # -- the decision, once per scrape cycle ------------------------------------------------------
    def consider(
        self,
        fleet_id: str,
        namespace: str,
        label: str,
        membership: Membership,
        reports: Sequence[ReplicaReport],
        composites: Iterable[tuple[float | None, float]],
    ) -> asyncio.Task[None] | None:
        """Called by a fleet after each cycle, on its loop; returns the writing task when it starts one.

        ``composites``: (composite, targetValue) of every trigger scoring this fleet; ``namespace``: the
        ScaledObject's, the ``namespace`` label of the metrics (the pods' own must be in scope)."""
        ready = [m for m in membership.members if m.phase == READY]
        if namespace not in self.scope and not any(m.pod_namespace in self.scope for m in ready):
            return None  # nothing this scaler may write, nor report: no state, no metric
        now = self._clock()
        state = self._fleets.setdefault(fleet_id, _FleetRanking())
        state.seen = now
        self._forget_old(now)
        if now - state.last_pass < self.interval_s:
            return None
        state.last_pass = now
        # a Service in another namespace (allowCrossNamespace): only pods whose namespace is enabled
        named = [m for m in ready if m.pod_name and m.pod_namespace and m.pod_namespace in self.scope]
        for m in named:  # what this process wrote stays known while the fleet lives, plausible or not
            if (written := self._written.get(m.key)) is not None:
                self._written[m.key] = (written[0], now)
        if state.task is not None and not state.task.done():
            self.passes.labels(namespace, BUSY).inc()
            return None
        pairs = list(composites)
        if not scale_down_plausible([c for c, _ in pairs], [t for _, t in pairs], len(ready)):
            self.passes.labels(namespace, NOT_PLAUSIBLE).inc()
            return None
        if not named:
            self.passes.labels(namespace, NO_PODS).inc()
            if not state.told_no_pods:
                state.told_no_pods = True
                log.info(
                    "victim_ranking_unavailable",
                    target=label,
                    why="discovery names no pods: use `service` or zero-config discovery to rank victims",
                )
            return None
        by_url = {r.url: r for r in reports}
        pods = []
        for m in named:
            report = by_url.get(m.url or "")
            signals = report.signals if report is not None and report.state != EXPIRED else None
            current, observed = self._current(m, membership.error is not None)
            pods.append(
                PodLoad(
                    m.pod_namespace,
                    m.pod_name,
                    m.key if m.key != f"{m.pod_namespace}/{m.pod_name}" else "",  # a UID, or no precondition
                    current,
                    signals.running if signals else None,
                    signals.waiting if signals else None,
                    signals.kv_usage if signals else None,
                    observed,
                )
            )
        pods = [p for p in pods if self._forbidden_until.get(p.namespace, -math.inf) <= now]
        if not pods:
            self.passes.labels(namespace, FORBIDDEN_BACKOFF).inc()
            return None
        changes = plan(pods, self.burst)
        if not changes:
            self.passes.labels(namespace, UNCHANGED).inc()
            return None
        self.passes.labels(namespace, WRITTEN).inc()
        state.task = asyncio.get_running_loop().create_task(self._write(label, changes))
        return state.task

    def _current(self, m: Member, degraded: bool) -> tuple[int | None, bool]:
        """(the annotation the pod carries, whether that is known). The pods informer says, unless its watch
        is down (``degraded``: its copy may predate what this process wrote since); else what this process
        wrote; else nobody knows (a Service without a selector, after a restart): write it once."""
        written = self._written.get(m.key)
        if m.pod_seen and not (degraded and written is not None):
            return m.deletion_cost, True
        if written is not None:
            return written[0], True
        return None, False

    def forget(self, fleet_id: str) -> None:
        state = self._fleets.pop(fleet_id, None)
        if state is not None and state.task is not None:
            state.task.cancel()

    def _forget_old(self, now: float) -> None:
        if now - self._swept_at < 60.0:
            return
        self._swept_at = now
        for fleet_id in [f for f, s in self._fleets.items() if now - s.seen > FORGET_AFTER_S]:
            self.forget(fleet_id)
        for key in [k for k, (_, seen) in self._written.items() if now - seen > FORGET_AFTER_S]:
            del self._written[key]

    # -- the writes ----------------------------------------------------------------------------------
    async def _write(self, label: str, changes: list[CostChange]) -> None:
        if self._limit is None:
            self._limit = asyncio.Semaphore(PATCH_CONCURRENCY)
        limit = self._limit

        async def one(change: CostChange) -> bool:
            pod = change.pod
            async with limit:
                if self._forbidden_until.get(pod.namespace, -math.inf) > self._clock():
                    return False  # another patch of this pass was just refused: the rest would be too
                result = await self._kube.patch_pod_annotation(
                    pod.namespace, pod.name, pod.uid, ANNOTATION, str(change.cost)
                )
            self._record(label, change, result)
            return result.outcome == PATCH_OK

        done = await asyncio.gather(*(one(c) for c in changes))
        log.debug("victim_costs_written", target=label, written=sum(done), planned=len(changes))

    def _record(self, label: str, change: CostChange, result: PatchResult) -> None:
        pod = change.pod
        self.patches.labels(pod.namespace, result.outcome).inc()
        if result.outcome == PATCH_OK:
            self._written[pod.uid or f"{pod.namespace}/{pod.name}"] = (change.cost, self._clock())
            return
        if result.outcome == PATCH_FORBIDDEN:
            first = self._forbidden_until.get(pod.namespace, -math.inf) <= self._clock()
            self._forbidden_until[pod.namespace] = self._clock() + FORBIDDEN_BACKOFF_S
            if first:
                hint = (
                    "the API server rejected the scaler's credentials (token expired or not mounted)"
                    if result.status == 401
                    else f"grant `patch` on pods in {pod.namespace} (the chart's victimRanking.namespaces), "
                    "or leave it out of --victim-ranking; an admission webhook refusing the patch reads so too"
                )
                log.warning(
                    "deletion_cost_forbidden",
                    target=label,
                    namespace=pod.namespace,
                    status=result.status,
                    error=result.message,
                    hint=f"{hint}; retrying in {FORBIDDEN_BACKOFF_S:.0f} s",
                )
            return
        log.info(
            "deletion_cost_not_written",
            target=label,
            pod=f"{pod.namespace}/{pod.name}",
            result=result.outcome,
            status=result.status,
            error=result.message,
        )

    async def aclose(self) -> None:
        for fleet_id in list(self._fleets):
            self.forget(fleet_id)
