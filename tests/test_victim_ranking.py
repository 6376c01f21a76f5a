"""Victim ranking (``--victim-ranking``): pod-deletion-cost annotations from scraped load, written through
the fake Kubernetes API (real HTTP, real-shaped PATCH answers: merge patch, UID precondition, 403 Status)
by the real scaler scraping real loopback replicas. Budgets in ``eventually`` are generous: the machine
is shared."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import structlog
from prometheus_client import CollectorRegistry

from keda_llm_scaler.deletion_cost import VictimRanker
from keda_llm_scaler.fleet import FRESH, ReplicaReport
from keda_llm_scaler.kube import KubeClient, KubeConfig
from keda_llm_scaler.membership import READY, Member, Membership
from keda_llm_scaler.ranking_scope import RankingScope, parse_scope
from keda_llm_scaler.server import ScalerServer
from keda_llm_scaler.signals import EngineSignals, ReplicaSignals
from keda_llm_scaler.sim.keda import KedaEmulator
from keda_llm_scaler.sim.kubeapi import Endpoint, FakeKube, FakeKubeServer
from keda_llm_scaler.testing.payloads import EngineLoad, vllm_v1
from keda_llm_scaler.testing.replicas import Replica, unused_port
from keda_llm_scaler.testing.scalerproc import channel_to, running_scaler
from keda_llm_scaler.victims import (
    ANNOTATION,
    IDLE_COST,
    UNKNOWN_COST,
    PodLoad,
    deletion_cost,
    fleet_costs,
    level,
    needs_write,
    parse_cost,
    plan,
    scale_down_plausible,
)
from tests.test_server_keda import eventually

FAST = {"scrapeInterval": "0.5", "scrapeTimeout": "0.4", "staleAfter": "1.5"}
SELECTOR = {"app": "vllm"}


# -- the costs (pure) ------------------------------------------------------------------------------------
def test_cost_orders_pods_by_requests_held_then_kv() -> None:
    idle, few, busy, busier = (deletion_cost(r, 0, 0.2) for r in (0, 4, 30, 60))
    assert idle < few < busy < busier
    # waiting requests are held too: they are lost or must finish if the pod goes
    assert deletion_cost(10, 10, 0.2) > deletion_cost(10, 0, 0.2)
    # about as many requests: less KV in use (less context in flight) goes first
    assert deletion_cost(30, 0, 0.2) < deletion_cost(30, 0, 0.7)
    assert deletion_cost(30, 0, 1.0) < deletion_cost(60, 0, 0.0)  # KV only breaks ties inside a level
    assert [level(n) for n in (0, 1, 2, 3, 4, 6, 7)] == [0, 0, 1, 1, 2, 2, 3]  # coarse at the bottom
    assert all(level(n) <= level(n + 1) for n in range(0, 2000))
    assert level(30) == level(31)  # a request more or less: the same level, no rewrite
    assert level(1000 * 1.25**2) - level(1000) == 2  # 25 % steps once pods hold many requests


def test_missing_data_is_never_the_first_victim() -> None:
    assert deletion_cost(None, None, None) == UNKNOWN_COST
    assert deletion_cost(None, 3, 0.5) == UNKNOWN_COST
    assert deletion_cost(100_000, 100_000, 1.0) < UNKNOWN_COST < 2**31


def test_annotation_values_are_read_as_the_replicaset_reads_them() -> None:
    assert parse_cost("1605") == 1605 and parse_cost(" -3 ") == -3
    assert parse_cost("abc") is None and parse_cost("99999999999") is None and parse_cost(None) is None


def _fleet(loads: list[tuple[float, float]], current: list[int | None] | None = None) -> list[PodLoad]:
    return [
        PodLoad("ns", f"p{i}", current=None if current is None else current[i], running=r, waiting=0, kv_usage=kv)
        for i, (r, kv) in enumerate(loads)
    ]


def test_costs_place_each_pod_among_the_others() -> None:
    costs = fleet_costs(_fleet([(1, 0.0), (30, 0.5), (31, 0.5), (40, 0.6), (12, 0.3)]))
    assert costs[0] == IDLE_COST  # at most one request: first, whatever the others hold
    order = sorted(range(5), key=lambda i: costs[i])
    assert order == [0, 4, 1, 2, 3]  # then the fewest requests held; about as many: less KV first
    no_reading = fleet_costs([PodLoad("ns", "x"), *_fleet([(30, 0.5)])])
    assert no_reading[0] == UNKNOWN_COST > no_reading[1]


def test_plan_writes_only_pods_whose_place_in_the_fleet_moved() -> None:
    before = [(0, 0.0), (36, 0.5), (38, 0.5), (50, 0.6), (14, 0.3)]
    written = {c.pod.name: c.cost for c in plan(_fleet(before), 16)}
    median = level(36)
    assert written == {  # the two pods near the median read 0 unmarked: nothing to write there
        "p0": IDLE_COST,
        "p4": 100 * (level(14) - median) + 3,
        "p3": 100 * (level(50) - median) + 6,
    }
    current = [written.get(f"p{i}") for i in range(5)]  # None where nothing needed writing (reads 0)
    # a burst doubles (or halves) every pod's load behind the gateway: nobody's place moved
    for factor in (2.0, 1.5, 0.6):
        assert plan(_fleet([(round(r * factor), kv) for r, kv in before], current), 16) == []
    # a wobble of a request or two, or of a KV tenth: nothing either; the idle pod taking one: nothing
    assert plan(_fleet([(1, 0.1), (39, 0.7), (35, 0.4), (53, 0.8), (15, 0.2)], current), 16) == []
    # one pod fills up while the others hold: only it is rewritten; one goes idle: it is too
    moved = plan(_fleet([(0, 0.0), (36, 0.5), (38, 0.5), (50, 0.6), (60, 0.6)], current), 16)
    assert [c.pod.name for c in moved] == ["p4"]
    idle = plan(_fleet([(0, 0.0), (0, 0.0), (38, 0.5), (50, 0.6), (14, 0.3)], current), 16)
    assert [(c.pod.name, c.cost) for c in idle] == [("p1", IDLE_COST)]
    # the idle pod keeps its mark with 2-3 requests, and loses it at 4 (two levels)
    assert plan(_fleet([(3, 0.0), *before[1:]], current), 16) == []
    assert [c.pod.name for c in plan(_fleet([(4, 0.0), *before[1:]], current), 16)] == ["p0"]


def test_a_pod_whose_annotation_nobody_can_see_is_written_once() -> None:
    # a Service without a selector (no pods informer) after a scaler restart: what the pod carries is
    # unknown, so even a cost that reads like the default is written, never assumed to be there
    pods = [PodLoad("ns", "p0", current=None, running=30, waiting=0, kv_usage=0.5, observed=False)]
    assert [c.pod.name for c in plan(pods, 16)] == ["p0"]


def test_over_the_burst_the_next_victims_are_written_first() -> None:
    pods = [
        PodLoad("ns", "busy-marked-idle", current=IDLE_COST, running=40, waiting=0, kv_usage=0.6),
        PodLoad("ns", "idle-marked-busy", current=900, running=0, waiting=0, kv_usage=0.0),
        PodLoad("ns", "grew", current=-900, running=45, waiting=0, kv_usage=0.6),
        PodLoad("ns", "steady", current=None, running=30, waiting=0, kv_usage=0.5),
    ]
    assert [c.pod.name for c in plan(pods, limit=2)] == ["busy-marked-idle", "idle-marked-busy"]
    assert [c.pod.name for c in plan(pods, limit=16)] == ["busy-marked-idle", "idle-marked-busy", "grew"]
    assert plan(pods, limit=0) == []


def test_a_pod_is_rewritten_only_when_its_level_moved_two_steps_or_it_went_idle_or_unknown() -> None:
    assert not needs_write(500, 600) and not needs_write(500, 409)  # one level
    assert needs_write(500, 700) and needs_write(500, 300)  # two levels: ~1.5x or ~0.65x the requests
    assert needs_write(500, UNKNOWN_COST) and needs_write(UNKNOWN_COST, 500)
    assert needs_write(500, IDLE_COST)  # into idle: at once
    assert not needs_write(IDLE_COST, 500, held_level=1) and needs_write(IDLE_COST, 500, held_level=2)
    assert not needs_write(None, 0) and not needs_write(None, 105) and needs_write(None, IDLE_COST)
    assert not needs_write(IDLE_COST, IDLE_COST)


def test_scale_down_is_plausible_only_below_the_ready_replicas_for_every_trigger() -> None:
    assert scale_down_plausible([2.4], [1.0], 4) and scale_down_plausible([3.0], [1.0], 4)
    assert not scale_down_plausible([4.0], [1.0], 4)  # at the ready count: nothing to remove
    assert not scale_down_plausible([3.2], [1.0], 4)  # asks for ceil(3.2) = 4: the HPA removes none
    assert not scale_down_plausible([2.4, 5.0], [1.0, 1.0], 4)  # the HPA takes the largest metric
    assert scale_down_plausible([6.0], [2.0], 4)  # in replicas at the trigger's targetValue
    assert not scale_down_plausible([None], [1.0], 4)  # no reading: no decision
    assert not scale_down_plausible([0.0], [1.0], 0)
    assert not scale_down_plausible([0.0], [1.0], 1)  # one pod: the HPA keeps it, nothing to choose


def test_scope_flag_values() -> None:
    assert not parse_scope("").enabled
    assert "anything" in parse_scope("*")
    scope = parse_scope("serving, batch")
    assert "serving" in scope and "batch" in scope and "other" not in scope
    with pytest.raises(ValueError, match="not a namespace name"):
        parse_scope("Serving_Prod")


# -- against the fake API server -------------------------------------------------------------------------
def _ts(seconds_ago: float) -> str:
    return (datetime.now(UTC) - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod(name: str, ip: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": SELECTOR, "creationTimestamp": _ts(900)},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": _ts(800)}],
        },
    }


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[FakeKube, FakeKubeServer, Path]]:
    state = FakeKube()
    server = FakeKubeServer(state)
    token = tmp_path / "token"
    token.write_text(state.token)
    yield state, server, token
    server.close()


LOADS = {  # pod -> (running, kv)
    "p2": EngineLoad(0, 30, 0.5),  # busy: dozens of live streams
    "p3": EngineLoad(0, 0, 0.0),  # idle: the one to remove
    "p4": EngineLoad(0, 4, 0.1),
}


@pytest.fixture
async def fleet(
    api: tuple[FakeKube, FakeKubeServer, Path],
) -> AsyncIterator[tuple[FakeKube, dict[str, Replica], ScalerServer, KedaEmulator]]:
    state, server_api, token = api
    port = unused_port()
    reps = {name: Replica(vllm_v1([load]), host=f"127.0.0.{name[1]}", port=port) for name, load in LOADS.items()}
    try:
        state.port = port
        state.selectors[("serving", "vllm")] = SELECTOR
        state.pods["serving"] = [_pod(n, f"127.0.0.{n[1]}") for n in LOADS]
        state.services[("serving", "vllm")] = [Endpoint(f"127.0.0.{n[1]}", pod=n) for n in LOADS]
        async with (
            running_scaler(
                kube_api_url=server_api.url,
                kube_token_file=token,
                victim_ranking="serving",
                victim_ranking_interval=1.0,
            ) as scaler,
            channel_to(scaler) as ch,
        ):
            keda = KedaEmulator(ch, "llm", "serving", {"service": "vllm", "port": str(port), **FAST})
            yield state, reps, scaler, keda
    finally:
        for r in reps.values():
            r.close()


async def past_the_hold(keda: KedaEmulator) -> float:
    """The composite once the fleet's first seconds are over: they hold its three replicas while its rate
    is not known yet (policy.composite: two 2-s bins at this scrape interval), and no scale-down is in
    sight meanwhile."""
    for _ in range(100):  # 20 s at most
        value = (await keda.poll()).value
        if value < 3:
            return value
        await asyncio.sleep(0.2)
    return value


def annotations(state: FakeKube) -> dict[str, str | None]:
    return {
        str(p["metadata"]["name"]): (p["metadata"].get("annotations") or {}).get(ANNOTATION)
        for p in state.pods["serving"]
    }


def passes(scaler: ScalerServer, outcome: str) -> float:
    labels = {"namespace": "serving", "outcome": outcome}
    return scaler.metrics.registry.get_sample_value("llm_scaler_victim_ranking_passes_total", labels) or 0.0


def patches(scaler: ScalerServer, result: str) -> float:
    labels = {"namespace": "serving", "result": result}
    return scaler.metrics.registry.get_sample_value("llm_scaler_deletion_cost_patches_total", labels) or 0.0


async def test_costs_are_written_ranked_and_not_rewritten_when_unchanged(
    fleet: tuple[FakeKube, dict[str, Replica], ScalerServer, KedaEmulator],
) -> None:
    state, reps, scaler, keda = fleet
    assert await past_the_hold(keda) < 3  # three ready replicas, well under one replica's work in all

    async def written() -> bool:
        return annotations(state)["p2"] is not None and annotations(state)["p3"] is not None

    await eventually(written, timeout=15.0)
    costs = {name: int(value or 0) for name, value in annotations(state).items()}
    # the ReplicaSet removes the lowest cost first: the idle pod, then the lightly loaded one
    assert costs["p3"] < costs["p4"] < costs["p2"]
    # p4, the median of the pods holding requests, reads 0 unmarked: nothing to write there
    assert costs == {"p2": 100 * (level(30) - level(4)) + 5, "p3": IDLE_COST, "p4": 0}
    assert {name for _, name, _ in state.patches} == {"p2", "p3"}
    patched = len(state.patches)
    assert patched == 2

    unchanged = passes(scaler, "unchanged")

    async def passes_without_writes() -> bool:
        done = passes(scaler, "unchanged")
        return done >= unchanged + 3

    await eventually(passes_without_writes, timeout=20.0)
    assert len(state.patches) == patched  # the informer shows the annotations: nothing rewritten
    assert patches(scaler, "ok") == 2

    reps["p4"].set(payload=vllm_v1([EngineLoad(0, 0, 0.0)]))  # its streams finished: now idle too

    async def p4_idle() -> bool:
        return annotations(state)["p4"] == str(IDLE_COST)

    await eventually(p4_idle, timeout=15.0)
    # p2 is now the only pod holding requests, and its own median: its place moved, it is rewritten too
    assert sorted(name for _, name, _ in state.patches[2:]) == ["p2", "p4"]
    assert annotations(state)["p2"] == "5"


async def test_nothing_is_written_while_no_scale_down_is_in_sight(
    fleet: tuple[FakeKube, dict[str, Replica], ScalerServer, KedaEmulator],
) -> None:
    state, reps, scaler, keda = fleet
    for r in reps.values():  # every replica over its KV target and queueing: the fleet wants more, not fewer
        r.set(payload=vllm_v1([EngineLoad(20, 30, 0.95)]))

    async def busy() -> bool:
        return (await keda.poll()).value > 3

    await eventually(busy, timeout=15.0)

    async def judged() -> bool:
        return passes(scaler, "not_plausible") >= 3

    await eventually(judged, timeout=20.0)
    assert state.patches == []


async def test_a_forbidden_patch_is_reported_and_scoring_goes_on(
    fleet: tuple[FakeKube, dict[str, Replica], ScalerServer, KedaEmulator],
) -> None:
    state, _, scaler, keda = fleet
    state.patch_status = 403  # the chart did not grant `patch pods` in this namespace
    with structlog.testing.capture_logs() as logs:
        assert await past_the_hold(keda) < 3

        async def refused() -> bool:
            return patches(scaler, "forbidden") >= 1

        await eventually(refused, timeout=15.0)
        target = scaler.registry.targets()[0]
        assert target.snapshot is not None
        cycle = target.snapshot.cycle

        async def scoring_goes_on() -> bool:
            snap = target.snapshot
            return snap is not None and snap.cycle >= cycle + 6 and target.is_fresh()

        await eventually(scoring_goes_on, timeout=20.0)
        assert (await keda.poll()).value < 3
    forbidden = [e for e in logs if e["event"] == "deletion_cost_forbidden"]
    assert len(forbidden) == 1  # once per back-off, not once per pod and pass
    assert forbidden[0]["namespace"] == "serving" and "patch" in forbidden[0]["hint"]
    # after the first refusal the namespace is left alone for the back-off: at most the pass's other pod
    assert patches(scaler, "forbidden") <= 2
    assert passes(scaler, "forbidden_backoff") >= 1
    assert state.patches == []


async def test_a_hung_api_server_does_not_stall_scoring(
    fleet: tuple[FakeKube, dict[str, Replica], ScalerServer, KedaEmulator],
) -> None:
    state, _, scaler, keda = fleet
    state.patch_delay_s = 4.0  # every patch hangs for seconds (the client times out at 5 s)
    assert await past_the_hold(keda) < 3
    target = scaler.registry.targets()[0]

    async def patching() -> bool:
        return any(r.startswith("PATCH ") for r in state.requests)

    await eventually(patching, timeout=15.0)
    assert target.snapshot is not None
    cycle = target.snapshot.cycle

    async def cycles_go_on() -> bool:  # 0.5 s cycles while the patch waits 4 s
        snap = target.snapshot
        return snap is not None and snap.cycle >= cycle + 4

    await eventually(cycles_go_on, timeout=15.0)
    assert not state.patches or len(state.patches) <= 2  # still writing, or just done
    busy = passes(scaler, "busy")
    assert busy >= 1  # passes that came due while the last was writing skipped rather than piled up


# -- the rate limits, on a clock of the test's own -------------------------------------------------------
def _signals(running: float) -> ReplicaSignals:
    return ReplicaSignals.from_engines("vllm", [EngineSignals("0", 0.0, running, 0.3)])


@contextlib.asynccontextmanager
async def ranker_on(
    api: tuple[FakeKube, FakeKubeServer, Path], scope: RankingScope, **options: Any
) -> AsyncIterator[VictimRanker]:
    """A ranker writing through a real client to the fake API server, on a registry of its own."""
    _, server_api, token = api
    kube = KubeClient(KubeConfig(server_api.url, token))
    ranker = VictimRanker(kube, scope, registry=CollectorRegistry(), **options)
    try:
        yield ranker
    finally:
        await ranker.aclose()
        await kube.aclose()


async def test_passes_are_rate_limited_per_fleet(api: tuple[FakeKube, FakeKubeServer, Path]) -> None:
    state = api[0]
    names = [f"p{i}" for i in range(20)]
    state.pods["serving"] = [_pod(n, f"10.0.1.{i}") for i, n in enumerate(names)]
    now = [1000.0]
    scope = RankingScope(frozenset({"serving"}))
    async with ranker_on(api, scope, interval_s=10.0, burst=16, clock=lambda: now[0]) as ranker:
        members = tuple(
            Member(f"uid-serving-{n}", READY, f"http://10.0.1.{i}:8000/metrics", pod_namespace="serving", pod_name=n)
            for i, n in enumerate(names)
        )
        reports = [  # 20 idle pods: each one to mark
            ReplicaReport(m.url or "", FRESH, None, "", 0.0, _signals(0), None, None, None) for m in members
        ]

        async def cycle(fleet: str = "fleet-a") -> None:
            task = ranker.consider(fleet, "serving", "serving/llm", Membership(members), reports, [(2.0, 1.0)])
            if task is not None:
                await task

        await cycle()
        assert len(state.patches) == 16  # the burst: 20 pods changed, 16 written in this pass
        for step in (1.0, 5.0, 9.9):  # later cycles inside the interval: no pass at all
            now[0] = 1000.0 + step
            await cycle()
        assert len(state.patches) == 16
        now[0] = 1010.0
        await cycle()
        assert len(state.patches) == 20  # the next pass writes the rest
        assert len({name for _, name, _ in state.patches}) == 20  # each pod once: what was written is known
        await cycle("fleet-b")  # another fleet has its own interval; these pods need nothing more
        now[0] = 1020.0
        await cycle()
        assert len(state.patches) == 20  # nothing changed: nothing rewritten, even without the informer


async def test_ranking_is_off_outside_the_enabled_namespaces(api: tuple[FakeKube, FakeKubeServer, Path]) -> None:
    state = api[0]
    state.pods["serving"] = [_pod("p0", "10.0.1.1")]
    async with ranker_on(api, parse_scope("other"), interval_s=1.0) as ranker:
        member = Member("uid-serving-p0", READY, "http://10.0.1.1:8000/metrics", pod_namespace="serving", pod_name="p0")
        report = ReplicaReport(member.url or "", FRESH, None, "", 0.0, _signals(40), None, None, None)
        # the ScaledObject's namespace is not enabled; nor, for a cross-namespace Service, is the pods'
        for namespace in ("serving", "other"):
            assert ranker.consider("f", namespace, "x/llm", Membership((member,)), [report], [(0.5, 1.0)]) is None
        assert state.patches == [] and not [r for r in state.requests if r.startswith("PATCH")]


async def test_a_replaced_pod_is_not_given_its_predecessors_cost(api: tuple[FakeKube, FakeKubeServer, Path]) -> None:
    state = api[0]
    state.pods["serving"] = [_pod("web-0", "10.0.1.1"), _pod("web-1", "10.0.1.2")]
    state.pods["serving"][0]["metadata"]["uid"] = "uid-new"  # a StatefulSet recreated web-0 meanwhile
    async with ranker_on(api, RankingScope(all_namespaces=True)) as ranker:
        members = (
            Member("uid-old", READY, "http://10.0.1.1:8000/metrics", pod_namespace="serving", pod_name="web-0"),
            Member(
                "uid-serving-web-1", READY, "http://10.0.1.2:8000/metrics", pod_namespace="serving", pod_name="web-1"
            ),
        )
        reports = [ReplicaReport(m.url or "", FRESH, None, "", 0.0, _signals(0), None, None, None) for m in members]
        task = ranker.consider("f", "serving", "serving/llm", Membership(members), reports, [(0.0, 1.0)])
        assert task is not None
        await task
        # the UID in the patch is not the new web-0's: refused as a change of an immutable field (422)
        assert [name for _, name, _ in state.patches] == ["web-1"]
        assert ranker.patches.labels("serving", "conflict")._value.get() == 1
        assert ranker.patches.labels("serving", "ok")._value.get() == 1


async def test_a_refused_pass_stops_after_the_patches_already_in_flight(
    api: tuple[FakeKube, FakeKubeServer, Path],
) -> None:
    state = api[0]
    state.patch_status = 403
    async with ranker_on(api, RankingScope(frozenset({"serving"}))) as ranker:
        members = tuple(
            Member(f"uid-{i}", READY, f"http://10.0.1.{i}:8000/metrics", pod_namespace="serving", pod_name=f"p{i}")
            for i in range(8)
        )
        reports = [ReplicaReport(m.url or "", FRESH, None, "", 0.0, _signals(0), None, None, None) for m in members]
        task = ranker.consider("f", "serving", "serving/llm", Membership(members), reports, [(1.0, 1.0)])
        assert task is not None
        await task
        sent = [r for r in state.requests if r.startswith("PATCH ")]
        assert 1 <= len(sent) <= 2  # the two already in flight (PATCH_CONCURRENCY), not all eight
        assert ranker.patches.labels("serving", "forbidden")._value.get() == len(sent)


def test_while_the_pods_watch_is_down_what_was_written_wins_over_the_cached_pod() -> None:
    ranker = VictimRanker(None, RankingScope(all_namespaces=True), registry=CollectorRegistry())  # type: ignore[arg-type]
    ranker._written["uid-1"] = (-297, 0.0)
    cached = Member(
        "uid-1", READY, "http://x/metrics", pod_namespace="ns", pod_name="p1", deletion_cost=0, pod_seen=True
    )
    assert ranker._current(cached, degraded=False) == (0, True)  # the informer is the authority
    assert ranker._current(cached, degraded=True) == (-297, True)  # its copy may predate the write
    unseen = Member("uid-2", READY, "http://y/metrics", pod_namespace="ns", pod_name="p2")
    assert ranker._current(unseen, degraded=False) == (None, False)  # nobody knows: written once
