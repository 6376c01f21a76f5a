"""Where a target's replicas are: a static list, a headless Service's DNS records, a Service's
EndpointSlices, or (zero-config) the pods of the ScaledObject's own scaleTargetRef.

Every resolver answers the ready replicas' scrape URLs, sorted, and how many replicas are starting
(exist but are not ready: capacity on the way). No ready replica means a fleet of zero (a legitimate
0); a failure raises DiscoveryError, and the caller keeps the last good answer rather than pretend the
fleet is gone.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from keda_llm_scaler.errors import BadMetadata, ScalerError
from keda_llm_scaler.kube import KubeClient, KubeError, label_selector
from keda_llm_scaler.metadata import Discovery, check_address

__all__ = ["DiscoveryError", "Replicas", "Resolver", "make_resolver"]

log = structlog.get_logger(__name__)


class DiscoveryError(ScalerError):
    """The replica set could not be determined this time."""


@dataclass(frozen=True, slots=True)
class Replicas:
    urls: list[str] = field(default_factory=list)  # ready replicas, sorted
    starting: int = 0  # not ready yet, not terminating


class Resolver(Protocol):
    async def resolve(self) -> Replicas: ...


def _url(scheme: str, host: str, port: int, path: str) -> str:
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}:{port}{path}"


def _refused(address: str) -> bool:
    try:
        check_address(address, "address")
    except BadMetadata:
        return True
    return False


class StaticResolver:
    def __init__(self, d: Discovery) -> None:
        self._urls = list(d.endpoints)

    async def resolve(self) -> Replicas:
        return Replicas(list(self._urls))


# getaddrinfo errors that mean "the name has no records": a headless Service with no ready pods.
_NO_RECORDS = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


class DnsResolver:
    """All A/AAAA records of a headless Service name, one replica per address."""

    def __init__(self, d: Discovery) -> None:
        self._d = d

    async def resolve(self) -> Replicas:
        d = self._d
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(d.dns_name, d.port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            if exc.errno in _NO_RECORDS:
                return Replicas()
            raise DiscoveryError(f"DNS lookup of {d.dns_name} failed: {exc.strerror}") from exc
        addresses = sorted({str(ipaddress.ip_address(str(info[4][0]).split("%")[0])) for info in infos})
        refused = [a for a in addresses if _refused(a)]
        if refused:
            log.warning("discovery_address_refused", name=d.dns_name, addresses=refused)
        return Replicas(sorted(_url(d.scheme, a, d.port, d.metrics_path) for a in addresses if a not in refused))


class KubernetesResolver:
    """Ready endpoints of a Service, from its EndpointSlices (discovery.k8s.io/v1)."""

    def __init__(self, d: Discovery, kube: KubeClient) -> None:
        self._d = d
        self._kube = kube

    async def resolve(self) -> Replicas:
        d = self._d
        try:
            slices = await self._kube.list_endpointslices(d.namespace, d.service)
            if not slices and not await self._kube.service_exists(d.namespace, d.service):
                raise DiscoveryError(f"Service {d.namespace}/{d.service} does not exist")
        except KubeError as exc:
            raise DiscoveryError(str(exc)) from exc
        urls: set[str] = set()
        starting = 0
        for item in slices:
            ports = [p.get("port") for p in item.get("ports") or [] if isinstance(p.get("port"), int)]
            port = d.port
            if d.port_from_slice and len(ports) == 1:
                port = ports[0]
            elif ports and d.port not in ports:
                continue  # this slice serves other ports of the Service
            for endpoint in item.get("endpoints") or []:
                conditions = endpoint.get("conditions") or {}
                # A missing `ready` condition means ready (EndpointSlice API contract).
                if conditions.get("ready") is False:
                    starting += 0 if conditions.get("terminating") else len(endpoint.get("addresses") or [1])
                    continue
                for address in endpoint.get("addresses") or []:
                    if _refused(address):
                        log.warning("discovery_address_refused", service=d.service, address=address)
                        continue
                    urls.add(_url(d.scheme, address, port, d.metrics_path))
        return Replicas(sorted(urls), starting)


def _container_port(pod_spec: dict[str, Any]) -> int | None:
    ports = [p for c in pod_spec.get("containers") or [] for p in c.get("ports") or [] if p.get("containerPort")]
    named = [p for p in ports if p.get("name") in ("http", "metrics")]
    chosen = (named or ports or [None])[0]
    return int(chosen["containerPort"]) if chosen else None


def _pod_ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


class WorkloadResolver:
    """Zero-config: the ScaledObject's scaleTargetRef (a Deployment or StatefulSet) -> its pods."""

    def __init__(self, d: Discovery, kube: KubeClient, scaled_object: str) -> None:
        self._d = d
        self._kube = kube
        self._scaled_object = scaled_object

    async def resolve(self) -> Replicas:
        d, ns = self._d, self._d.namespace
        try:
            so = await self._kube.get_scaledobject(ns, self._scaled_object)
            if so is None:
                raise DiscoveryError(
                    f"ScaledObject {ns}/{self._scaled_object} not found (zero-config discovery "
                    "reads its scaleTargetRef); set `service`, `dnsName` or `endpoints`"
                )
            ref = (so.get("spec") or {}).get("scaleTargetRef") or {}
            kind, api_version = ref.get("kind") or "Deployment", ref.get("apiVersion") or "apps/v1"
            workload = await self._kube.get_workload(ns, api_version, kind, str(ref.get("name", "")))
            if workload is None:
                raise DiscoveryError(
                    f"{kind} {ns}/{ref.get('name')} (scaleTargetRef of {self._scaled_object}) does not exist"
                )
            spec = workload.get("spec") or {}
            selector = label_selector(spec.get("selector") or {})
            pods = await self._kube.list_pods(ns, selector)
        except KubeError as exc:
            raise DiscoveryError(str(exc)) from exc
        default_port = d.port
        if d.port_from_slice:
            default_port = _container_port((spec.get("template") or {}).get("spec") or {}) or d.port
        urls: set[str] = set()
        starting = 0
        for pod in pods:
            meta, status = pod.get("metadata") or {}, pod.get("status") or {}
            if meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
                continue  # terminating or done: neither capacity nor on its way
            ip = status.get("podIP")
            if not _pod_ready(pod) or not ip:
                starting += 1
                continue
            if _refused(ip):
                log.warning("discovery_address_refused", scaledobject=self._scaled_object, address=ip)
                continue
            urls.add(_url(d.scheme, ip, default_port, d.metrics_path))
        return Replicas(sorted(urls), starting)


def make_resolver(d: Discovery, kube: KubeClient | None, scaled_object: str = "") -> Resolver:
    if d.kind == "static":
        return StaticResolver(d)
    if d.kind == "dns":
        return DnsResolver(d)
    if kube is None:
        if d.kind == "workload":
            raise BadMetadata(
                "endpoints | dnsName | service",
                "no discovery key given, and zero-config "
                "discovery needs Kubernetes access (in-cluster service account, --kubeconfig "
                "or --kube-api-url), which this scaler does not have",
                "endpoints=<URLs> | dnsName=<headless Service name> | service=<name>",
            )
        raise BadMetadata(
            "service",
            "Kubernetes discovery is not configured on this scaler "
            "(no in-cluster service account, --kubeconfig or --kube-api-url)",
            "endpoints or dnsName, or run the scaler in-cluster",
        )
    if d.kind == "workload":
        return WorkloadResolver(d, kube, scaled_object)
    return KubernetesResolver(d, kube)
