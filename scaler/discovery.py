"""Where a target's replicas are: a static list, a headless Service's DNS records, or EndpointSlices.

Every resolver answers the full list of scrape URLs, sorted. An empty list means the fleet has zero
replicas (a legitimate 0); a failure raises DiscoveryError, and the caller keeps the last good list
rather than pretend the fleet is gone.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Protocol

import structlog

from scaler.errors import BadMetadata, ScalerError
from scaler.kube import KubeClient, KubeError
from scaler.metadata import Discovery, check_address

__all__ = ["DiscoveryError", "Resolver", "make_resolver"]

log = structlog.get_logger(__name__)


class DiscoveryError(ScalerError):
    """The replica set could not be determined this time."""


class Resolver(Protocol):
    async def resolve(self) -> list[str]: ...


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

    async def resolve(self) -> list[str]:
        return list(self._urls)


# getaddrinfo errors that mean "the name has no records": a headless Service with no ready pods.
_NO_RECORDS = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


class DnsResolver:
    """All A/AAAA records of a headless Service name, one replica per address."""

    def __init__(self, d: Discovery) -> None:
        self._d = d

    async def resolve(self) -> list[str]:
        d = self._d
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(d.dns_name, d.port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            if exc.errno in _NO_RECORDS:
                return []
            raise DiscoveryError(f"DNS lookup of {d.dns_name} failed: {exc.strerror}") from exc
        addresses = sorted({str(ipaddress.ip_address(str(info[4][0]).split("%")[0])) for info in infos})
        refused = [a for a in addresses if _refused(a)]
        if refused:
            log.warning("discovery_address_refused", name=d.dns_name, addresses=refused)
        return sorted(_url(d.scheme, a, d.port, d.metrics_path) for a in addresses if a not in refused)


class KubernetesResolver:
    """Ready endpoints of a Service, from its EndpointSlices (discovery.k8s.io/v1)."""

    def __init__(self, d: Discovery, kube: KubeClient) -> None:
        self._d = d
        self._kube = kube

    async def resolve(self) -> list[str]:
        d = self._d
        try:
            slices = await self._kube.list_endpointslices(d.namespace, d.service)
            if not slices and not await self._kube.service_exists(d.namespace, d.service):
                raise DiscoveryError(f"Service {d.namespace}/{d.service} does not exist")
        except KubeError as exc:
            raise DiscoveryError(str(exc)) from exc
        urls = set()
        for item in slices:
            ports = [p.get("port") for p in item.get("ports") or [] if isinstance(p.get("port"), int)]
            port = d.port
            if d.port_from_slice and len(ports) == 1:
                port = ports[0]
            elif ports and d.port not in ports:
                continue  # this slice serves other ports of the Service
            for endpoint in item.get("endpoints") or []:
                # A missing `ready` condition means ready (EndpointSlice API contract).
                if (endpoint.get("conditions") or {}).get("ready") is False:
                    continue
                for address in endpoint.get("addresses") or []:
                    if _refused(address):
                        log.warning("discovery_address_refused", service=d.service, address=address)
                        continue
                    urls.add(_url(d.scheme, address, port, d.metrics_path))
        return sorted(urls)


def make_resolver(d: Discovery, kube: KubeClient | None) -> Resolver:
    if d.kind == "static":
        return StaticResolver(d)
    if d.kind == "dns":
        return DnsResolver(d)
    if kube is None:
        raise BadMetadata("service", "Kubernetes discovery is not configured on this scaler "
                          "(no in-cluster service account and no --kube-api-url)",
                          "endpoints or dnsName, or run the scaler in-cluster")
    return KubernetesResolver(d, kube)
