"""``keda-llm-scaler shadow --config FILE``: what the scaler would ask for, on a fleet it does not scale
(issue #33). Platform teams moving off a CPU HPA watch it beside the HPA they have before letting it act.

Each workload in the file carries the trigger metadata its ScaledObject would have. Shadow scrapes and
scores it exactly as ``serve`` does (the same registry, scrape loop, scoring and learned state), but
answers no KEDA: nothing acts on what it computes, and the workload's current autoscaler keeps control.
It exports ``llm_scaler_composite`` and the rest of ``serve``'s series, plus what the HPA would do with the
composite (``llm_scaler_shadow_desired_replicas``) beside the workload's own replicas
(``llm_scaler_shadow_actual_replicas``, ``llm_scaler_shadow_ready_replicas``) where it can read them.
``--record FILE`` appends one JSON line per workload per cycle; ``shadow-report`` turns it into a plot and
a report (``keda_llm_scaler/shadow_report.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

import structlog
import yaml
from prometheus_client import Gauge

from keda_llm_scaler.config import Settings
from keda_llm_scaler.errors import NoFreshData, ScalerError
from keda_llm_scaler.kube import KubeError
from keda_llm_scaler.membership import READY
from keda_llm_scaler.metadata import parse_trigger
from keda_llm_scaler.server import ScalerServer
from keda_llm_scaler.target import Target

__all__ = [
    "ShadowConfigError",
    "ShadowWorkload",
    "check_shadow_settings",
    "hpa_desired",
    "load_shadow_config",
    "run_shadow",
]

log = structlog.get_logger(__name__)

HPA_TOLERANCE: Final = 0.1  # kube-controller-manager's --horizontal-pod-autoscaler-tolerance default
_WORKLOAD_KEYS: Final = {"name", "namespace", "metadata", "scaleTargetRef", "minReplicaCount", "maxReplicaCount"}


class ShadowConfigError(ValueError):
    pass


@dataclass(frozen=True)
class ShadowWorkload:
    name: str  # the ScaledObject it would be (its name in every series and log)
    namespace: str
    metadata: dict[str, str]
    scale_target: dict[str, str] | None = None  # apiVersion, kind, name: the replicas it reads, and discovery
    min_replicas: int = 1
    max_replicas: int = 100  # KEDA's default maxReplicaCount

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.name}"


def load_shadow_config(path: Path) -> list[ShadowWorkload]:
    """The workloads of a shadow file; ShadowConfigError naming the workload and the key otherwise.

    The file is ``workloads:``, a list of ``{name, namespace, metadata, scaleTargetRef, minReplicaCount,
    maxReplicaCount}``. ``metadata`` is checked as a ScaledObject's trigger metadata is."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ShadowConfigError(f"{path}: {exc}") from None
    items = doc.get("workloads") if isinstance(doc, dict) else None
    if not isinstance(items, list) or not items:
        raise ShadowConfigError(f"{path}: expected `workloads:`, a list of workloads")
    out: list[ShadowWorkload] = []
    for i, raw in enumerate(items):
        where = f"{path}: workloads[{i}]"
        if not isinstance(raw, dict):
            raise ShadowConfigError(f"{where}: not a mapping")
        unknown = set(raw) - _WORKLOAD_KEYS
        if unknown:
            raise ShadowConfigError(f"{where}: unknown key {sorted(unknown)[0]!r}; accepted: {sorted(_WORKLOAD_KEYS)}")
        name, namespace = raw.get("name"), raw.get("namespace", "default")
        if not isinstance(name, str) or not name:
            raise ShadowConfigError(f"{where}: `name` is required (the ScaledObject it would be)")
        where = f"{path}: workload {namespace}/{name}"
        meta = raw.get("metadata") or {}
        if not isinstance(meta, dict) or not all(isinstance(k, str) for k in meta):
            raise ShadowConfigError(f"{where}: `metadata` is the trigger's metadata, a mapping of strings")
        metadata = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in meta.items()}
        try:
            parse_trigger(str(namespace), name, metadata)
        except ScalerError as exc:
            raise ShadowConfigError(f"{where}: metadata: {exc}") from None
        ref = raw.get("scaleTargetRef")
        target: dict[str, str] | None = None
        if ref is not None:
            if not isinstance(ref, dict) or not isinstance(ref.get("name"), str):
                raise ShadowConfigError(f"{where}: `scaleTargetRef` needs a `name` (and kind, apiVersion)")
            target = {
                "apiVersion": str(ref.get("apiVersion", "apps/v1")),
                "kind": str(ref.get("kind", "Deployment")),
                "name": ref["name"],
            }
        bounds = []
        for key, default in (("minReplicaCount", 1), ("maxReplicaCount", 100)):
            value = raw.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ShadowConfigError(f"{where}: `{key}` {value!r}: accepted: an integer >= 0")
            bounds.append(value)
        if bounds[0] > bounds[1]:
            raise ShadowConfigError(f"{where}: `minReplicaCount` {bounds[0]} is above `maxReplicaCount` {bounds[1]}")
        out.append(ShadowWorkload(name, str(namespace), metadata, target, bounds[0], bounds[1]))
    labels = [w.label for w in out]
    if len(set(labels)) != len(labels):
        raise ShadowConfigError(
            f"{path}: a workload is listed twice: {sorted({x for x in labels if labels.count(x) > 1})}"
        )
    return out


def check_shadow_settings(settings: Settings) -> None:
    """Shadow acts on nothing: the serve flags that write to the cluster are refused (ShadowConfigError)."""
    if settings.victim_ranking:
        raise ShadowConfigError(
            "--victim-ranking writes pod-deletion-cost on the workloads' pods, which changes what their own "
            "autoscaler removes: shadow acts on nothing"
        )
    if settings.state_configmap:
        raise ShadowConfigError(
            "--state-configmap writes to the cluster (and could replace serve's record of the same fleet): "
            "use --state-dir, or nothing"
        )


def hpa_desired(value: float, target: float, current: int, min_replicas: int, max_replicas: int) -> int:
    """What the HPA KEDA makes would set for an AverageValue external metric at ``value`` (the composite, in
    replica-equivalents) with ``target`` (targetValue): the ratio to the current replicas within the HPA's
    10 % tolerance keeps them, else ceil(value / target); within the bounds. Scaling behavior (stabilization
    windows, rate limits) is not applied: this is where it would head, not how fast."""
    if current > 0 and abs(value / (target * current) - 1.0) <= HPA_TOLERANCE:
        desired = current
    else:
        desired = math.ceil(value / target - 1e-9)
    return max(min_replicas, min(max_replicas, desired))


@dataclass
class _Shadowed:
    workload: ShadowWorkload
    target: Target
    actual: int | None = None  # the workload's spec.replicas (None: not read)
    ready: int | None = None
    error: str | None = None  # why the workload could not be read


@dataclass
class _ShadowGauges:
    desired: Gauge
    actual: Gauge
    ready: Gauge
    seen: set[tuple[str, str, str]] = field(default_factory=set)


def _gauges(server: ScalerServer) -> _ShadowGauges:
    registry = server.metrics.registry
    labels = ["namespace", "scaledobject"]
    return _ShadowGauges(
        Gauge(
            "llm_scaler_shadow_desired_replicas",
            "shadow: the replicas the HPA would set from the composite (targetValue, min/maxReplicaCount, the "
            "HPA's 10 % tolerance; no scaling behavior). Absent while the composite is unknown, never 0 for it",
            labels,
            registry=registry,
        ),
        Gauge(
            "llm_scaler_shadow_actual_replicas",
            "shadow: the workload's own replicas (spec.replicas of its scaleTargetRef), as its autoscaler sets them",
            labels,
            registry=registry,
        ),
        Gauge(
            "llm_scaler_shadow_ready_replicas",
            "shadow: the workload's ready replicas (status.readyReplicas of its scaleTargetRef)",
            labels,
            registry=registry,
        ),
    )


async def _read_replicas(server: ScalerServer, item: _Shadowed) -> None:
    ref, kube = item.workload.scale_target, server.kube
    if ref is None or kube is None:
        return

    async def read() -> dict[str, Any] | None:
        return await kube.get_workload(item.workload.namespace, ref["apiVersion"], ref["kind"], ref["name"])

    try:
        obj = await server.scrape_loop.run(read())  # the Kubernetes client's connections live on the scrape loop
    except KubeError as exc:
        if str(exc) != item.error:
            log.warning("shadow_workload_unread", workload=item.workload.label, error=str(exc))
        item.error, item.actual, item.ready = str(exc), None, None
        return
    if obj is None:
        item.error, item.actual, item.ready = f"{ref['kind']} {ref['name']} not found", None, None
        return
    item.error = None
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    item.actual = int(spec.get("replicas", 1))
    item.ready = int(status.get("readyReplicas", 0) or 0)


def _observe(item: _Shadowed, gauges: _ShadowGauges) -> dict[str, Any]:
    """This cycle's record of one workload; sets its gauges."""
    w, target = item.workload, item.target
    labels = (w.namespace, w.name)
    target.touch()  # as KEDA's polling would: a shadowed workload is never idle
    snap = target.snapshot
    record: dict[str, Any] = {"t": round(time.time(), 3), "namespace": w.namespace, "scaledobject": w.name}
    try:
        composite = target.current()[1]
    except NoFreshData as exc:
        composite = None
        record["error"] = str(exc)
    current = item.actual if item.actual is not None else (snap.membership.count(READY) if snap else 0)
    desired = None
    if composite is not None:
        desired = hpa_desired(composite.value, target.cfg.target_value, current, w.min_replicas, w.max_replicas)
        gauges.desired.labels(*labels).set(desired)
    else:
        # unknown is not zero: the series goes until there is a value again
        with contextlib.suppress(KeyError):
            gauges.desired.remove(*labels)
    for gauge, value in ((gauges.actual, item.actual), (gauges.ready, item.ready)):
        if value is not None:
            gauge.labels(*labels).set(value)
        else:  # not read this cycle: no series, rather than the last value read
            with contextlib.suppress(KeyError):
                gauge.remove(*labels)
    ev = snap.evaluation if snap is not None else None
    demand = composite.demand if composite is not None else None
    record.update(
        {
            "composite": None if composite is None else composite.value,
            "desired": desired,
            "actual": item.actual,
            "ready": item.ready,
            "members_ready": snap.membership.count(READY) if snap is not None else None,
            "ttft_p95_s": None if ev is None else ev.ttft_p95_s,
            "waiting": None if ev is None else ev.waiting,
            "kv_usage": None if ev is None else ev.kv_usage,
            "offered_rps": None if demand is None else demand.offered_rps,
            "capacity_rps": None if ev is None or ev.capacity is None else ev.capacity[0],
            "why": None if composite is None else composite.dominant,
        }
    )
    if item.error is not None:
        record["workload_error"] = item.error
    return record


async def run_shadow(
    settings: Settings,
    workloads: list[ShadowWorkload],
    record: IO[str] | None = None,
    stop: asyncio.Event | None = None,
    ready: asyncio.Event | None = None,
) -> ScalerServer:
    """Scrape and score ``workloads`` until ``stop`` (else SIGTERM / SIGINT); one record line per workload per
    cycle to ``record``. ``ready`` is set once /metrics is up (tests)."""
    check_shadow_settings(settings)
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    targets: Mapping[tuple[str, str], Mapping[str, str]] = {
        (w.namespace, w.name): w.scale_target for w in workloads if w.scale_target is not None
    }
    server = ScalerServer(settings, serve_grpc=False, scale_targets=targets)
    await server.start()
    try:
        gauges = _gauges(server)
        items = []
        for w in workloads:
            cfg = server.registry.config_for(w.namespace, w.name, w.metadata)
            items.append(_Shadowed(w, server.registry.ensure(cfg)))
        log.info("shadow_started", workloads=[w.label for w in workloads], metrics_port=server.metrics_port)
        if ready is not None:
            ready.set()
        interval = min(i.target.cfg.scrape_interval for i in items)
        while not stop.is_set():
            for item in items:
                await _read_replicas(server, item)
                line = _observe(item, gauges)
                if record is not None:
                    record.write(json.dumps(line, sort_keys=True) + "\n")
                    record.flush()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
    finally:
        await server.stop()
    return server
