"""Where a target's replicas are: a static list, a headless Service's DNS records, a Service's
EndpointSlices, or (zero-config) the pods of the ScaledObject's own scaleTargetRef.

Every resolver answers a ``Membership``: typed members with a phase (``keda_llm_scaler.membership``),
the ready ones with their scrape URLs. No ready replica means a fleet of zero (a legitimate 0); a
failure raises DiscoveryError, and the caller keeps the last good answer rather than pretend the fleet
is gone. Kubernetes discovery reads shared informers (list + watch), never a LIST per cycle.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Final, Protocol

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.resolver
import structlog

from keda_llm_scaler.addresses import refusal
from keda_llm_scaler.errors import BadMetadata, ScalerError
from keda_llm_scaler.kube import Informer, KubeClient, KubeError, label_selector
from keda_llm_scaler.membership import (
    READY,
    Member,
    Membership,
    NotReadyClock,
    Scrape,
    from_endpointslices,
    from_pods,
    scrape_url,
)
from keda_llm_scaler.metadata import Discovery

__all__ = ["DNS_TIMEOUT_S", "DiscoveryError", "Membership", "Resolver", "make_resolver"]

log = structlog.get_logger(__name__)

DNS_TIMEOUT_S: Final = 5.0  # a lookup's whole budget, retries included: a hung resolver must not hang the cycle
# (address, port) of the DNS servers for dnsName lookups; empty: /etc/resolv.conf's (tests use loopback ones)
DNS_NAMESERVERS: list[tuple[str, int]] = []
SYNC_WAIT_S: Final = 5.0  # the first resolve waits this long for an informer's first list
STALE_WATCH_S: Final = 300.0  # a watch broken this long: the cached members are reported as an error


class DiscoveryError(ScalerError):
    """The replica set could not be determined this time."""


class Resolver(Protocol):
    async def resolve(self) -> Membership: ...


def _refused(address: str) -> bool:
    return refusal(address) is not None


def _ready(urls: list[str]) -> Membership:
    return Membership(tuple(Member(u, READY, u) for u in sorted(urls)))


class StaticResolver:
    def __init__(self, d: Discovery) -> None:
        self._urls = list(d.endpoints)

    async def resolve(self) -> Membership:
        return _ready(self._urls)


class DnsResolver:
    """All A/AAAA records of a headless Service name, one replica per address.

    A name without records (NOERROR, no answer) is a fleet of zero. A name that does not exist
    (NXDOMAIN) is an error — a typo in ``dnsName`` must never read as an idle fleet — unless it has
    resolved before: cluster DNS answers NXDOMAIN for a headless Service with no ready pods (the
    Kubernetes DNS specification), so a name that had records and lost them is a fleet scaled to zero.
    """

    def __init__(
        self, d: Discovery, timeout_s: float | None = None, nameservers: list[tuple[str, int]] | None = None
    ) -> None:
        self._d = d
        self._timeout_s = timeout_s
        self._nameservers = nameservers if nameservers is not None else DNS_NAMESERVERS
        self._resolver: dns.asyncresolver.Resolver | None = None
        self._has_resolved = False  # an answer with records was seen: NXDOMAIN now means "no ready pods"

    def _client(self) -> dns.asyncresolver.Resolver:
        if self._resolver is None:
            try:
                resolver = dns.asyncresolver.Resolver(configure=not self._nameservers)
            except dns.resolver.NoResolverConfiguration as exc:
                raise DiscoveryError(f"DNS lookup of {self._d.dns_name}: no resolver configured ({exc})") from None
            if self._nameservers:
                resolver.nameservers = [dns.nameserver.Do53Nameserver(a, port) for a, port in self._nameservers]
            self._resolver = resolver
        return self._resolver

    async def resolve(self) -> Membership:
        d = self._d
        timeout_s = DNS_TIMEOUT_S if self._timeout_s is None else self._timeout_s
        if _is_ip(d.dns_name):
            addresses = [d.dns_name]
        else:
            try:
                answers = await self._client().resolve_name(d.dns_name, search=True, lifetime=timeout_s)
            except dns.resolver.NXDOMAIN:
                if self._has_resolved:
                    return Membership()
                raise DiscoveryError(
                    f"dnsName {d.dns_name} does not exist (NXDOMAIN) and has not resolved since this target "
                    "started; a headless Service with no ready pods also reads so: use `service` discovery "
                    "to tell a missing Service from an empty one"
                ) from None
            except dns.resolver.NoAnswer:
                self._has_resolved = True
                return Membership()
            except dns.resolver.LifetimeTimeout:
                raise DiscoveryError(f"DNS lookup of {d.dns_name} timed out after {timeout_s:g} s") from None
            except dns.exception.DNSException as exc:  # SERVFAIL from every server, no servers, bad answers
                raise DiscoveryError(f"DNS lookup of {d.dns_name} failed: {exc}") from None
            self._has_resolved = True
            addresses = sorted({str(ipaddress.ip_address(a)) for a in answers.addresses()})
        refused = [a for a in addresses if _refused(a)]
        if refused:
            log.warning("discovery_address_refused", name=d.dns_name, addresses=refused)
        return _ready([scrape_url(d.scheme, a, d.port, d.metrics_path) for a in addresses if a not in refused])


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


async def _synced(informer: Informer, errors: list[str]) -> dict[str, dict[str, Any]]:
    """The informer's objects by key, once it has listed; DiscoveryError before that or when its watch
    has been broken long enough that the cache can no longer be trusted. A shorter outage is appended
    to ``errors``: the members are still the last known ones, and the operator should know."""
    if not await informer.wait_synced(SYNC_WAIT_S):
        raise DiscoveryError(informer.error or f"{informer.what}: no list within {SYNC_WAIT_S:g} s")
    since = informer.error_since
    if since is not None and time.monotonic() - since > STALE_WATCH_S:
        raise DiscoveryError(f"{informer.what}: watch broken for {time.monotonic() - since:.0f} s: {informer.error}")
    if informer.error is not None:
        errors.append(f"{informer.error} (serving the last known members)")
    return dict(informer.objects)


def _log_refused(where: str, membership: Membership, errors: list[str]) -> Membership:
    for address in membership.refused:
        log.warning("discovery_address_refused", where=where, address=address)
    return replace(membership, error="; ".join(errors)) if errors else membership


class KubernetesResolver:
    """The pods behind a Service: its EndpointSlices (discovery.k8s.io/v1) for addresses and readiness,
    the pods of its selector for phases and start-up times."""

    def __init__(self, d: Discovery, kube: KubeClient) -> None:
        self._d = d
        self._kube = kube
        self._not_ready = NotReadyClock()

    async def resolve(self) -> Membership:
        d = self._d
        errors: list[str] = []
        try:
            service = await self._kube.get_service(d.namespace, d.service)
            if service is None:
                raise DiscoveryError(f"Service {d.namespace}/{d.service} does not exist")
            slices = await _synced(self._kube.endpointslices(d.namespace, d.service), errors)
            selector = (service.get("spec") or {}).get("selector") or {}
            pods: dict[str, dict[str, Any]] = {}
            if selector:  # a Service without a selector has hand-made slices: no pods to follow
                pods = await _synced(self._kube.pods(d.namespace, label_selector({"matchLabels": selector})), errors)
        except KubeError as exc:
            raise DiscoveryError(str(exc)) from exc
        scrape = Scrape(d.scheme, d.port, d.metrics_path, d.port_from_slice)
        membership = from_endpointslices(
            slices.values(),
            pods,
            scrape,
            now=time.time(),
            budget_s=d.startup_budget_s,
            not_ready=self._not_ready,
            refuse=_refused,
        )
        return _log_refused(f"Service {d.namespace}/{d.service}", membership, errors)


def _container_port(pod_spec: dict[str, Any]) -> int | None:
    ports = [p for c in pod_spec.get("containers") or [] for p in c.get("ports") or [] if p.get("containerPort")]
    named = [p for p in ports if p.get("name") in ("http", "metrics")]
    chosen = (named or ports or [None])[0]
    return int(chosen["containerPort"]) if chosen else None


class WorkloadResolver:
    """Zero-config: the ScaledObject's scaleTargetRef (a Deployment or StatefulSet) -> its pods."""

    def __init__(
        self, d: Discovery, kube: KubeClient, scaled_object: str, scale_target: Mapping[str, str] | None = None
    ) -> None:
        """``scale_target``: the scaleTargetRef itself, where there is no ScaledObject to read it from (shadow)."""
        self._d = d
        self._kube = kube
        self._scaled_object = scaled_object
        self._scale_target = scale_target

    async def resolve(self) -> Membership:
        d, ns = self._d, self._d.namespace
        errors: list[str] = []
        try:
            ref: Mapping[str, Any]
            if self._scale_target is not None:
                ref = self._scale_target
            else:
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
            pods = await _synced(self._kube.pods(ns, selector), errors)
        except KubeError as exc:
            raise DiscoveryError(str(exc)) from exc
        port = d.port
        if d.port_from_slice:
            port = _container_port((spec.get("template") or {}).get("spec") or {}) or d.port
        scrape = Scrape(d.scheme, port, d.metrics_path)
        membership = from_pods(pods.values(), scrape, now=time.time(), budget_s=d.startup_budget_s, refuse=_refused)
        return _log_refused(f"ScaledObject {ns}/{self._scaled_object}", membership, errors)


def make_resolver(
    d: Discovery, kube: KubeClient | None, scaled_object: str = "", scale_target: Mapping[str, str] | None = None
) -> Resolver:
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
        return WorkloadResolver(d, kube, scaled_object, scale_target)
    return KubernetesResolver(d, kube)
