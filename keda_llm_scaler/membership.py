"""Who is in a fleet, and in which phase: the pods behind a Service's EndpointSlices or a workload's
selector, as typed members. Pure: the objects (as keda_llm_scaler.kube lists them) and the clock are passed in.

Members are keyed by pod (UID, else namespace/name from the endpoint's ``targetRef``), never by address,
so the IPv4 and IPv6 slices of a dual-stack Service, or a pod listed in two slices, count once. Phases:

* ``ready``: scrapeable; the only phase that serves.
* ``starting``: not ready, younger than the start-up budget: capacity on the way (the policy holds it).
* ``pending``: not scheduled (no node fits, e.g. no free GPU); will not serve until a node appears.
* ``failed_to_start``: not ready past the budget, or in a back-off (CrashLoopBackOff, image pull).

Only ``starting`` counts as incoming capacity: the HPA already counts every pod in its current replicas,
so a stuck pod counted as "on its way" would cancel exactly the demand that should replace it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Final

from keda_llm_scaler.kube import object_key
from keda_llm_scaler.victims import ANNOTATION, parse_cost

__all__ = [
    "BACKOFF_REASONS",
    "FAILED_TO_START",
    "PENDING",
    "PHASES",
    "READY",
    "STARTING",
    "Member",
    "Membership",
    "from_endpointslices",
    "from_pods",
    "pod_phase",
    "scrape_url",
]

READY: Final = "ready"
STARTING: Final = "starting"
PENDING: Final = "pending"
FAILED_TO_START: Final = "failed_to_start"
PHASES: Final = (READY, STARTING, PENDING, FAILED_TO_START)

# Container waiting reasons that mean "this will not become ready by waiting".
BACKOFF_REASONS: Final = frozenset(
    {
        "CrashLoopBackOff",
        "ImagePullBackOff",
        "ErrImagePull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
_FAMILY_PREFERENCE: Final = {"IPv4": 0, "IPv6": 1, "FQDN": 2}


@dataclass(frozen=True, slots=True)
class Member:
    key: str  # pod UID, else namespace/name, else the address (static lists, slices without targetRef)
    phase: str
    url: str | None = None  # scrape URL (ready members)
    reason: str = ""  # why a member is not ready, in words an operator can act on
    created_at: float | None = None  # epoch seconds
    ready_at: float | None = None
    startup_s: float | None = None  # created -> ready, when it was measured cleanly (no restarts)
    # the pod behind the member, when discovery knows it (Kubernetes discovery): where its
    # pod-deletion-cost annotation is written (``keda_llm_scaler.deletion_cost``)
    pod_namespace: str = ""
    pod_name: str = ""
    deletion_cost: int | None = None  # the annotation now (None: absent or not an int32)
    pod_seen: bool = False  # the Pod object was read (so ``deletion_cost`` is what the pod carries)


@dataclass(frozen=True, slots=True)
class Membership:
    members: tuple[Member, ...] = ()
    refused: tuple[str, ...] = field(default=())  # addresses dropped by the address policy
    # set when the members come from a cache the API server is not refreshing right now
    error: str | None = None

    @property
    def urls(self) -> list[str]:
        return sorted(m.url for m in self.members if m.phase == READY and m.url)

    @property
    def starting(self) -> int:
        return sum(1 for m in self.members if m.phase == STARTING)

    def count(self, phase: str) -> int:
        return sum(1 for m in self.members if m.phase == phase)

    def startups(self) -> dict[str, float]:
        return {m.key: m.startup_s for m in self.members if m.startup_s is not None}


def parse_time(value: object) -> float | None:
    """An RFC 3339 timestamp from the API (``2026-12-01T14:00:00Z``) as epoch seconds."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for c in status.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == kind:
            return c
    return None


def _container_statuses(status: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [
        c
        for key in ("initContainerStatuses", "containerStatuses")
        for c in status.get(key) or []
        if isinstance(c, Mapping)
    ]


def is_gone(pod: Mapping[str, Any]) -> bool:
    """Terminating or finished: neither capacity nor on its way."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    return bool(meta.get("deletionTimestamp")) or status.get("phase") in ("Succeeded", "Failed")


def pod_phase(pod: Mapping[str, Any], now: float, budget_s: float) -> tuple[str, str]:
    """(phase, reason) of a pod that is not gone."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    ready = _condition(status, "Ready")
    if ready is not None and ready.get("status") == "True" and status.get("podIP"):
        return READY, ""
    scheduled = _condition(status, "PodScheduled")
    if scheduled is not None and scheduled.get("status") == "False":
        why = scheduled.get("reason") or "Unschedulable"
        return PENDING, f"{why}: {scheduled.get('message') or 'not scheduled'}"
    for c in _container_statuses(status):
        waiting = (c.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in BACKOFF_REASONS:
            return FAILED_TO_START, f"container {c.get('name')}: {waiting['reason']}"
    created = parse_time(meta.get("creationTimestamp"))
    if created is not None and now - created > budget_s:
        return FAILED_TO_START, f"not ready {now - created:.0f} s after creation (start-up budget {budget_s:.0f} s)"
    if status.get("phase") == "Pending" and scheduled is None:
        return STARTING, "waiting to be scheduled"
    return STARTING, "not ready yet"


def clean_startup(pod: Mapping[str, Any]) -> float | None:
    """Seconds from creation to Ready, for a pod that became ready once without a container restart
    (a restart moves the Ready transition and would read as a slow start)."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    ready = _condition(status, "Ready")
    if ready is None or ready.get("status") != "True":
        return None
    if any(int(c.get("restartCount") or 0) > 0 for c in _container_statuses(status)):
        return None
    created, ready_at = parse_time(meta.get("creationTimestamp")), parse_time(ready.get("lastTransitionTime"))
    if created is None or ready_at is None or ready_at < created:
        return None
    return ready_at - created


def scrape_url(scheme: str, host: str, port: int, path: str) -> str:
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}:{port}{path}"


def _family(address: str) -> str:
    try:
        return "IPv6" if isinstance(ipaddress.ip_address(address), ipaddress.IPv6Address) else "IPv4"
    except ValueError:
        return "FQDN"


@dataclass(frozen=True, slots=True)
class Scrape:
    """How a member's address becomes its scrape URL."""

    scheme: str
    port: int
    path: str
    port_from_slice: bool = False


class NotReadyClock:
    """When each member was first seen not ready, for members whose pod (and so its creation time) is
    not visible: the start-up budget then runs from that moment. Kept by the resolver across calls."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}

    def age(self, key: str, now: float) -> float:
        return now - self._since.setdefault(key, now)

    def keep(self, keys: Iterable[str]) -> None:
        keep = set(keys)
        for key in [k for k in self._since if k not in keep]:
            del self._since[key]


def _deletion_cost(meta: Mapping[str, Any]) -> int | None:
    annotations = meta.get("annotations")
    return parse_cost(annotations.get(ANNOTATION)) if isinstance(annotations, Mapping) else None


def _member_from_pod(pod: Mapping[str, Any], key: str, now: float, budget_s: float, url: str | None) -> Member:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    phase, reason = pod_phase(pod, now, budget_s)
    ready = _condition(status, "Ready")
    ready_at = parse_time(ready.get("lastTransitionTime")) if ready and ready.get("status") == "True" else None
    if phase == READY and url is None:
        phase, reason = STARTING, "ready, but not yet an endpoint of the Service"
    return Member(
        key=key,
        phase=phase,
        url=url if phase == READY else None,
        reason=reason,
        created_at=parse_time(meta.get("creationTimestamp")),
        ready_at=ready_at,
        startup_s=clean_startup(pod),
        pod_namespace=str(meta.get("namespace") or ""),
        pod_name=str(meta.get("name") or ""),
        deletion_cost=_deletion_cost(meta),
        pod_seen=True,
    )


def from_endpointslices(
    slices: Iterable[Mapping[str, Any]],
    pods: Mapping[str, Mapping[str, Any]],
    scrape: Scrape,
    *,
    now: float,
    budget_s: float,
    not_ready: NotReadyClock,
    refuse: Any = None,
) -> Membership:
    """Members of a Service from its EndpointSlices, phases from its pods (``pods``: by pod key; may be
    empty when the Service has no selector). ``refuse(address) -> bool`` applies the address policy."""
    chosen: dict[str, tuple[int, str, int, Mapping[str, Any]]] = {}  # key -> (family rank, address, port, ep)
    refs: dict[str, tuple[str, str]] = {}  # key -> the pod's (namespace, name), from the targetRef
    order: list[str] = []
    for item in slices:
        family = str(item.get("addressType") or "")
        rank = _FAMILY_PREFERENCE.get(family, 9)
        ports = [p.get("port") for p in item.get("ports") or [] if isinstance(p.get("port"), int)]
        port = scrape.port
        if scrape.port_from_slice and len(ports) == 1:
            port = ports[0]
        elif ports and scrape.port not in ports:
            continue  # this slice serves other ports of the Service
        for endpoint in item.get("endpoints") or []:
            conditions = endpoint.get("conditions") or {}
            if conditions.get("terminating"):
                continue  # on its way out: neither capacity nor coming
            addresses = [a for a in endpoint.get("addresses") or [] if isinstance(a, str)]
            ref = endpoint.get("targetRef") or {}
            is_pod = ref.get("kind", "Pod") == "Pod"
            key = object_key(ref, str(ref.get("namespace") or "")) if is_pod else None
            if key is not None and ref.get("name"):
                refs[key] = (str(ref.get("namespace") or ""), str(ref["name"]))
            key = key or (addresses[0] if addresses else None)
            if key is None or not addresses:
                continue
            address = addresses[0]
            previous = chosen.get(key)
            if previous is None:
                order.append(key)
            if previous is None or rank < previous[0]:
                chosen[key] = (rank, address, port, endpoint)
    members: list[Member] = []
    refused: list[str] = []
    seen: set[str] = set()
    for key in order:
        _, address, port, endpoint = chosen[key]
        seen.add(key)
        # A missing `ready` condition means ready (EndpointSlice API contract).
        is_ready = (endpoint.get("conditions") or {}).get("ready") is not False
        url = None
        if is_ready:
            if refuse is not None and refuse(address):
                refused.append(address)
                continue
            url = scrape_url(scrape.scheme, address, port, scrape.path)
        pod = pods.get(key)
        if pod is not None and not is_gone(pod):
            member = _member_from_pod(pod, key, now, budget_s, url)
            if url is not None and member.phase != READY:
                # the endpoint controller says ready (it is the authority on serving): trust it
                member = replace(member, phase=READY, url=url, reason="")
            members.append(member)
        elif url is not None:
            namespace, name = refs.get(key, ("", ""))
            members.append(Member(key, READY, url, pod_namespace=namespace, pod_name=name))
        else:
            age = not_ready.age(key, now)
            phase = FAILED_TO_START if age > budget_s else STARTING
            reason = f"not ready for {age:.0f} s" + (f" (start-up budget {budget_s:.0f} s)" if age > budget_s else "")
            members.append(Member(key, phase, None, reason))
    # pods of the Service's selector that are in no slice yet (no IP: Pending, or just created)
    for key, pod in pods.items():
        if key not in seen and not is_gone(pod):
            members.append(_member_from_pod(pod, key, now, budget_s, None))
            seen.add(key)
    not_ready.keep(seen)
    return Membership(tuple(sorted(members, key=lambda m: m.key)), tuple(refused))


def from_pods(
    pods: Iterable[Mapping[str, Any]],
    scrape: Scrape,
    *,
    now: float,
    budget_s: float,
    refuse: Any = None,
) -> Membership:
    """Members of a workload from its pods (zero-config discovery: the pod IP is the scrape address)."""
    members: list[Member] = []
    refused: list[str] = []
    for pod in pods:
        if is_gone(pod):
            continue
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        key = object_key(meta)
        if key is None:
            continue
        ip = status.get("podIP")
        url = None
        if isinstance(ip, str) and ip and pod_phase(pod, now, budget_s)[0] == READY:
            if refuse is not None and refuse(ip):
                refused.append(ip)
                continue
            url = scrape_url(scrape.scheme, ip, scrape.port, scrape.path)
        members.append(_member_from_pod(pod, key, now, budget_s, url))
    return Membership(tuple(sorted(members, key=lambda m: m.key)), tuple(refused))
