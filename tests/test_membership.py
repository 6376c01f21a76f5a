"""Members and phases from real-shaped EndpointSlice and Pod objects (pure: no API server)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from keda_llm_scaler.membership import (
    FAILED_TO_START,
    PENDING,
    READY,
    STARTING,
    NotReadyClock,
    Scrape,
    from_endpointslices,
    from_pods,
    pod_phase,
)

NOW = 1_796_000_000.0
SCRAPE = Scrape("http", 8000, "/metrics")


def ts(seconds_ago: float) -> str:
    return datetime.fromtimestamp(NOW - seconds_ago, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(
    name: str,
    *,
    ip: str | None = "10.0.0.1",
    ready: bool = True,
    age_s: float = 600.0,
    ready_after_s: float = 200.0,
    waiting: str | None = None,
    unschedulable: bool = False,
    restarts: int = 0,
) -> dict[str, Any]:
    conditions: list[dict[str, Any]] = []
    if unschedulable:
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
            }
        )
    else:
        conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": ts(age_s)})
        conditions.append(
            {
                "type": "Ready",
                "status": "True" if ready else "False",
                "lastTransitionTime": ts(age_s - ready_after_s) if ready else ts(age_s),
            }
        )
    status: dict[str, Any] = {"phase": "Pending" if unschedulable else "Running", "conditions": conditions}
    if ip and not unschedulable:
        status["podIP"] = ip
    state = {"waiting": {"reason": waiting}} if waiting else {"running": {}}
    status["containerStatuses"] = [{"name": "vllm", "restartCount": restarts, "ready": ready, "state": state}]
    return {
        "metadata": {"name": name, "namespace": "serving", "uid": f"uid-{name}", "creationTimestamp": ts(age_s)},
        "status": status,
    }


def endpoint(address: str, name: str, ready: bool | None = True) -> dict[str, Any]:
    conditions: dict[str, Any] = {"serving": True, "terminating": False}
    if ready is not None:
        conditions["ready"] = ready
    return {
        "addresses": [address],
        "conditions": conditions,
        "targetRef": {"kind": "Pod", "namespace": "serving", "name": name, "uid": f"uid-{name}"},
    }


def slice_(family: str, *endpoints: dict[str, Any], port: int = 8000) -> dict[str, Any]:
    return {"addressType": family, "endpoints": list(endpoints), "ports": [{"port": port}]}


def test_pod_phases_cover_what_a_cluster_shows() -> None:
    budget = 900.0
    assert pod_phase(pod("a"), NOW, budget) == (READY, "")
    assert pod_phase(pod("b", ready=False, age_s=60), NOW, budget)[0] == STARTING
    phase, reason = pod_phase(pod("c", ready=False, age_s=1200), NOW, budget)
    assert phase == FAILED_TO_START and "1200 s after creation" in reason and "900 s" in reason
    phase, reason = pod_phase(pod("d", ready=False, age_s=60, waiting="CrashLoopBackOff", restarts=3), NOW, budget)
    assert phase == FAILED_TO_START and "CrashLoopBackOff" in reason  # young, but it will not come up by waiting
    phase, reason = pod_phase(pod("e", ready=False, unschedulable=True, age_s=3000), NOW, budget)
    assert phase == PENDING and "Insufficient nvidia.com/gpu" in reason  # pending is its own phase, at any age
    # ready but no IP yet cannot be scraped: not ready
    assert pod_phase(pod("f", ip=None), NOW, budget)[0] == STARTING


def test_a_dual_stack_service_counts_each_pod_once_and_scrapes_ipv4() -> None:
    v4 = slice_("IPv4", endpoint("10.0.0.1", "p1"), endpoint("10.0.0.2", "p2"))
    v6 = slice_("IPv6", endpoint("fd00::1", "p1"), endpoint("fd00::2", "p2"))
    for order in ([v4, v6], [v6, v4]):
        m = from_endpointslices(order, {}, SCRAPE, now=NOW, budget_s=900, not_ready=NotReadyClock())
        assert len(m.members) == 2 and m.count(READY) == 2
        assert m.urls == ["http://10.0.0.1:8000/metrics", "http://10.0.0.2:8000/metrics"]


def test_an_ipv6_only_service_scrapes_bracketed_addresses() -> None:
    m = from_endpointslices(
        [slice_("IPv6", endpoint("fd00::1", "p1"))], {}, SCRAPE, now=NOW, budget_s=900, not_ready=NotReadyClock()
    )
    assert m.urls == ["http://[fd00::1]:8000/metrics"]


def test_stuck_pods_are_not_capacity_on_the_way() -> None:
    # the review's case: 2 ready pods, 3 not ready that will not serve, 1 genuinely starting
    pods = {
        f"uid-{p['metadata']['name']}": p
        for p in (
            pod("r1", ip="10.0.0.1"),
            pod("r2", ip="10.0.0.2"),
            pod("old", ip="10.0.0.3", ready=False, age_s=3600),
            pod("crash", ip="10.0.0.4", ready=False, age_s=120, waiting="CrashLoopBackOff", restarts=4),
            pod("nogpu", ready=False, unschedulable=True),
            pod("new", ip="10.0.0.6", ready=False, age_s=30),
        )
    }
    slices = [
        slice_(
            "IPv4",
            endpoint("10.0.0.1", "r1"),
            endpoint("10.0.0.2", "r2"),
            endpoint("10.0.0.3", "old", ready=False),
            endpoint("10.0.0.4", "crash", ready=False),
            endpoint("10.0.0.6", "new", ready=False),
        )
    ]
    m = from_endpointslices(slices, pods, SCRAPE, now=NOW, budget_s=900, not_ready=NotReadyClock())
    phases = {mem.key: mem.phase for mem in m.members}
    assert phases == {
        "uid-r1": READY,
        "uid-r2": READY,
        "uid-old": FAILED_TO_START,
        "uid-crash": FAILED_TO_START,
        "uid-nogpu": PENDING,  # no IP, so in no slice: found through the Service's selector
        "uid-new": STARTING,
    }
    assert m.starting == 1 and len(m.urls) == 2
    # clean start-ups are measured (created -> Ready, no restarts): the ready pods took 200 s
    assert m.startups() == {"uid-r1": 200.0, "uid-r2": 200.0}


def test_without_pods_the_budget_runs_from_first_sight() -> None:
    clock = NotReadyClock()
    slices = [slice_("IPv4", endpoint("10.0.0.9", "x", ready=False))]
    first = from_endpointslices(slices, {}, SCRAPE, now=NOW, budget_s=300, not_ready=clock)
    assert first.members[0].phase == STARTING
    later = from_endpointslices(slices, {}, SCRAPE, now=NOW + 301, budget_s=300, not_ready=clock)
    assert later.members[0].phase == FAILED_TO_START and "301 s" in later.members[0].reason
    # it became ready, then not ready again: the budget starts over
    from_endpointslices([slice_("IPv4", endpoint("10.0.0.9", "x"))], {}, SCRAPE, now=NOW + 400, budget_s=300,
                        not_ready=clock)  # fmt: skip
    again = from_endpointslices(slices, {}, SCRAPE, now=NOW + 500, budget_s=300, not_ready=clock)
    assert again.members[0].phase == FAILED_TO_START  # a member that keeps flapping stays suspect...
    assert from_endpointslices([], {}, SCRAPE, now=NOW + 600, budget_s=300, not_ready=clock).members == ()
    fresh = from_endpointslices(slices, {}, SCRAPE, now=NOW + 700, budget_s=300, not_ready=clock)
    assert fresh.members[0].phase == STARTING  # ...until it leaves the fleet: then it is forgotten


def test_terminating_endpoints_and_refused_addresses_are_left_out() -> None:
    gone = endpoint("10.0.0.5", "leaving")
    gone["conditions"] = {"ready": False, "serving": True, "terminating": True}
    slices = [slice_("IPv4", endpoint("169.254.169.254", "meta"), gone, endpoint("10.0.0.1", "ok"))]
    m = from_endpointslices(
        slices, {}, SCRAPE, now=NOW, budget_s=900, not_ready=NotReadyClock(), refuse=lambda a: a.startswith("169.254.")
    )
    assert m.urls == ["http://10.0.0.1:8000/metrics"] and m.refused == ("169.254.169.254",)
    assert len(m.members) == 1


def test_zero_config_members_from_pods() -> None:
    pods = [
        pod("a", ip="10.0.0.1"),
        pod("b", ip="10.0.0.2", ready=False, age_s=20),
        pod("c", ready=False, unschedulable=True),
        {**pod("d", ip="10.0.0.4"), "metadata": {**pod("d")["metadata"], "deletionTimestamp": ts(1)}},
    ]
    m = from_pods(pods, SCRAPE, now=NOW, budget_s=900)
    assert m.urls == ["http://10.0.0.1:8000/metrics"]
    assert (m.count(READY), m.count(STARTING), m.count(PENDING), len(m.members)) == (1, 1, 1, 3)
