"""Membership by watch against the fake API server (real HTTP, real-shaped watch streams): what the API
server sees (requests counted), how discovery recovers, and what one fleet costs however many triggers
read it. Budgets in ``eventually`` are generous: the machine is shared."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import re
import urllib.request
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest

from keda_llm_scaler.kube import Informer, KubeClient, KubeConfig
from keda_llm_scaler.membership import FAILED_TO_START, PENDING, READY, STARTING
from keda_llm_scaler.sim.keda import KedaEmulator
from keda_llm_scaler.sim.kubeapi import Endpoint, FakeKube, FakeKubeServer
from keda_llm_scaler.target import cycle_phase, next_tick
from keda_llm_scaler.testing.dnsserver import DnsServer, Zone
from keda_llm_scaler.testing.payloads import EngineLoad, vllm_v1
from keda_llm_scaler.testing.replicas import Replica, replicas, unused_port
from keda_llm_scaler.testing.scalerproc import channel_to, running_scaler
from tests.test_server_keda import eventually

FAST = {"scrapeInterval": "0.5", "scrapeTimeout": "0.4", "staleAfter": "1.5"}
AT_TARGET = vllm_v1([EngineLoad(0, 30, 0.85)])
SELECTOR = {"app": "vllm"}


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[FakeKube, FakeKubeServer, Path]]:
    state = FakeKube(port=8000)
    state.services[("serving", "vllm")] = [Endpoint("10.0.0.1", pod="p1"), Endpoint("10.0.0.2", pod="p2")]
    server = FakeKubeServer(state)
    token = tmp_path / "token"
    token.write_text(state.token)
    yield state, server, token
    server.close()


@pytest.fixture
async def client(api: tuple[FakeKube, FakeKubeServer, Path]) -> AsyncIterator[KubeClient]:
    _, server, token = api
    c = KubeClient(KubeConfig(server.url, token))
    yield c
    await c.aclose()


def lists_and_watches(state: FakeKube, collection: str) -> tuple[int, int]:
    hits = [r for r in state.requests if r.split("?")[0].endswith(f"/{collection}")]
    watches = sum(1 for r in hits if "watch=true" in r)
    return len(hits) - watches, watches


async def synced(informer: Informer) -> None:
    assert await informer.wait_synced(10.0), informer.error


def addresses(informer: Informer) -> set[str]:
    return {a for s in informer.items() for e in s.get("endpoints") or [] for a in e.get("addresses") or []}


async def test_a_dropped_watch_resumes_without_a_relist(
    api: tuple[FakeKube, FakeKubeServer, Path], client: KubeClient
) -> None:
    state, _, _ = api
    informer = client.endpointslices("serving", "vllm")
    await synced(informer)
    assert addresses(informer) == {"10.0.0.1", "10.0.0.2"}
    for n in range(3, 6):

        async def watching(k: int = n - 2) -> bool:  # the k-th stream is open: there is one to cut
            return lists_and_watches(state, "endpointslices")[1] >= k

        await eventually(watching, timeout=15.0)
        state.drop_watches()  # cut mid-stream, as an API server restart or a load balancer does
        state.services[("serving", "vllm")].append(Endpoint(f"10.0.0.{n}", pod=f"p{n}"))

        async def seen(n: int = n) -> bool:
            return f"10.0.0.{n}" in addresses(informer)

        await eventually(seen, timeout=15.0)
    lists, watches = lists_and_watches(state, "endpointslices")
    assert lists == 1  # every reconnect resumed from the last resourceVersion: no relist storm
    assert 3 <= watches <= 5  # one per stream: the first and its reconnects (a spare for a slow machine)
    assert informer.lists == 1 and informer.error is None


async def test_410_gone_relists_once(api: tuple[FakeKube, FakeKubeServer, Path], client: KubeClient) -> None:
    state, _, _ = api
    informer = client.endpointslices("serving", "vllm")
    await synced(informer)

    async def watching() -> bool:
        return lists_and_watches(state, "endpointslices")[1] >= 1

    await eventually(watching, timeout=15.0)
    state.fail_status = 500  # the watch cannot come back while the cluster moves on
    state.drop_watches()
    state.services[("serving", "vllm")] = [Endpoint("10.0.0.7", pod="p7")]
    state.compact()  # and the history it missed is compacted away: its resourceVersion is too old
    state.fail_status = 0

    async def relisted() -> bool:
        return addresses(informer) == {"10.0.0.7"}

    await eventually(relisted, timeout=15.0)
    assert lists_and_watches(state, "endpointslices")[0] == 2 and informer.lists == 2


async def test_api_errors_back_off(api: tuple[FakeKube, FakeKubeServer, Path], client: KubeClient) -> None:
    state, _, _ = api
    informer = client.endpointslices("serving", "vllm")
    await synced(informer)
    state.fail_status = 500
    state.drop_watches()
    start = len(state.requests)
    # a target asking every 0.1 s for the Service (what 5 targets at 0.5 s would do) during the outage
    service_calls = 0
    for _ in range(40):
        try:
            await client.get_service("serving", "vllm")
        except Exception:
            service_calls += 1
        await asyncio.sleep(0.1)
    during = state.requests[start:]
    watch_attempts = sum(1 for r in during if "watch=true" in r)
    service_gets = sum(1 for r in during if r.startswith("/api/v1/namespaces/serving/services/vllm"))
    # back-off 0.5 s doubling (jittered 0.5-1x): at most ~5 attempts in 4 s, never one per call
    assert 2 <= watch_attempts <= 6, during
    assert service_calls == 40 and 2 <= service_gets <= 6, during
    assert informer.error is not None and "HTTP 500" in informer.error
    assert addresses(informer) == {"10.0.0.1", "10.0.0.2"}  # the cache is kept meanwhile
    state.fail_status = 0
    state.services[("serving", "vllm")] = [Endpoint("10.0.0.8", pod="p8")]

    async def recovered() -> bool:
        return informer.error is None and addresses(informer) == {"10.0.0.8"}

    await eventually(recovered, timeout=45.0)  # the next attempt may be up to ~16 s away
    assert informer.lists == 1  # recovery resumed the watch


async def test_bookmarks_advance_the_resource_version(
    api: tuple[FakeKube, FakeKubeServer, Path], client: KubeClient
) -> None:
    state, _, _ = api
    state.bookmark_every_s = 0.2
    informer = client.endpointslices("serving", "vllm")
    await synced(informer)
    first = int(informer.resource_version or 0)
    state.pods["serving"] = [{"metadata": {"name": "unrelated", "labels": {"app": "other"}}, "status": {}}]

    async def advanced() -> bool:  # a change elsewhere moves the version; a bookmark carries it here
        return int(informer.resource_version or 0) > first

    await eventually(advanced, timeout=10.0)
    assert addresses(informer) == {"10.0.0.1", "10.0.0.2"}


def _ts(seconds_ago: float) -> str:
    return (datetime.now(UTC) - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod(name: str, ip: str | None, *, ready: bool, age_s: float, **status: Any) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": _ts(age_s - 100)}]
    if status.pop("unschedulable", False):
        conditions = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                       "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]  # fmt: skip
    st: dict[str, Any] = {"phase": "Running" if ip else "Pending", "conditions": conditions, **status}
    if ip:
        st["podIP"] = ip
    return {"metadata": {"name": name, "labels": SELECTOR, "creationTimestamp": _ts(age_s)}, "status": st}


async def test_dual_stack_and_stuck_pods_end_to_end(api: tuple[FakeKube, FakeKubeServer, Path]) -> None:
    state, server_api, token = api
    port = unused_port()
    if True:
        ready = [Replica(AT_TARGET, host=f"127.0.0.{i}", port=port) for i in (2, 3)]
        try:
            state.port = port
            state.selectors[("serving", "vllm")] = SELECTOR
            backoff = {"state": {"waiting": {"reason": "CrashLoopBackOff"}}, "name": "vllm", "restartCount": 5}
            state.pods["serving"] = [
                _pod("p2", "127.0.0.2", ready=True, age_s=900),
                _pod("p3", "127.0.0.3", ready=True, age_s=900),
                _pod("stuck", "127.0.0.4", ready=False, age_s=2000),  # past the 900 s budget
                _pod("crash", "127.0.0.5", ready=False, age_s=60, containerStatuses=[backoff]),
                _pod("nogpu", None, ready=False, age_s=600, unschedulable=True),
                _pod("new", "127.0.0.6", ready=False, age_s=20),
            ]
            state.services[("serving", "vllm")] = [
                # dual-stack: every pod has an IPv4 and an IPv6 endpoint, in two slices
                *(Endpoint(f"127.0.0.{i}", pod=f"p{i}") for i in (2, 3)),
                *(Endpoint(f"fd00::{i}", pod=f"p{i}") for i in (2, 3)),
                *(Endpoint(f"127.0.0.{i}", pod=n, ready=False) for i, n in ((4, "stuck"), (5, "crash"), (6, "new"))),
                *(Endpoint(f"fd00::{i}", pod=n, ready=False) for i, n in ((4, "stuck"), (5, "crash"), (6, "new"))),
            ]
            async with (
                running_scaler(kube_api_url=server_api.url, kube_token_file=token) as scaler,
                channel_to(scaler) as ch,
            ):
                keda = KedaEmulator(ch, "llm", "serving", {"service": "vllm", "port": str(port), **FAST})
                assert (await keda.poll()).value == 2.0  # two pods at target, not four addresses
                snap = scaler.registry.targets()[0].snapshot
                assert snap is not None
                m = snap.membership
                assert (m.count(READY), m.count(STARTING), m.count(PENDING), m.count(FAILED_TO_START)) == (2, 1, 1, 2)
                assert snap.starting == 1
                assert {r.url for r in snap.evaluation.replicas} == {
                    f"http://127.0.0.{i}:{port}/metrics" for i in (2, 3)
                }
                for r in ready:  # 2 replica-equivalents each (KV 1, backlog 1): an excess of 2 over the two ready
                    r.set(payload=vllm_v1([EngineLoad(60, 30, 0.85)]))

                async def scaled() -> bool:
                    # one starting pod takes one of the excess: 2 + (2 - 1). Counting the three stuck
                    # pods as starting too would take none of it (4: the bug)
                    return (await keda.poll()).value == pytest.approx(3.0, abs=0.01)

                await eventually(scaled, timeout=10.0)
                text = await asyncio.to_thread(
                    lambda: (
                        urllib.request.urlopen(f"http://127.0.0.1:{scaler.metrics_port}/metrics", timeout=5)
                        .read()
                        .decode()
                    )
                )
                for phase, count in ((READY, 2), (STARTING, 1), (PENDING, 1), (FAILED_TO_START, 2)):
                    assert re.search(rf'llm_scaler_members{{[^}}]*phase="{phase}"[^}}]*}} {count}\.0', text), phase
        finally:
            for r in ready:
                r.close()


async def test_two_triggers_on_one_fleet_scrape_it_once_per_interval() -> None:
    with replicas(AT_TARGET, AT_TARGET) as fleet:
        endpoints = ",".join(r.url for r in fleet)
        async with running_scaler() as scaler, channel_to(scaler) as ch:
            a = KedaEmulator(ch, "llm", "serving", {"endpoints": endpoints, **FAST})
            b = KedaEmulator(ch, "llm", "serving", {"endpoints": endpoints, **FAST, "targetKvUsage": "0.425"})
            c = KedaEmulator(ch, "other", "serving", {"endpoints": endpoints, **FAST, "activationThreshold": "3"})
            values = [(await k.poll()).value for k in (a, b, c)]
            assert values == [2.0, 4.0, 2.0]  # each trigger scores with its own parameters
            assert len(scaler.registry.targets()) == 3 and len(scaler.registry.fleets()) == 1
            worker = scaler.registry.fleets()[0]
            before = [r.requests for r in fleet]
            cycles_before = worker.scrapes // len(fleet)
            await asyncio.sleep(3.0)
            cycles = worker.scrapes // len(fleet) - cycles_before
            per_replica = [r.requests - b for r, b in zip(fleet, before, strict=True)]
            assert cycles >= 2
            # one scrape per replica per cycle, whatever the number of triggers (three would triple it)
            assert all(abs(n - cycles) <= 1 for n in per_replica), (per_replica, cycles)
            snaps = [t.snapshot for t in scaler.registry.targets()]
            assert len({s.cycle for s in snaps if s is not None}) == 1  # the same cycle, scored three ways


async def test_a_hung_dns_lookup_does_not_delay_another_target(monkeypatch: pytest.MonkeyPatch) -> None:
    async with DnsServer(Zone(hang={"hung.dns.test"})) as dns_server:  # a DNS server that never answers
        monkeypatch.setattr("keda_llm_scaler.discovery.DNS_NAMESERVERS", dns_server.nameservers)
        monkeypatch.setattr("keda_llm_scaler.discovery.DNS_TIMEOUT_S", 1.0)
        with replicas(AT_TARGET) as (r,):
            async with running_scaler() as scaler, channel_to(scaler) as ch:
                hung = KedaEmulator(ch, "hung", "serving", {"dnsName": "hung.dns.test", **FAST})
                ok = KedaEmulator(ch, "ok", "serving", {"endpoints": r.url, **FAST})
                with pytest.raises(grpc.aio.AioRpcError):
                    await hung.poll()
                assert (await ok.poll()).value == 1.0
                healthy = next(t for t in scaler.registry.targets() if t.cfg.name == "ok")
                first = healthy.snapshot.cycle if healthy.snapshot else 0
                await asyncio.sleep(2.0)
                assert healthy.snapshot is not None and healthy.snapshot.cycle - first >= 2  # kept its pace
                stuck = next(t for t in scaler.registry.targets() if t.cfg.name == "hung")
                assert stuck.snapshot is not None and "timed out after 1 s" in (stuck.snapshot.discovery_error or "")


async def test_more_open_watches_than_the_get_pool_has_connections(
    api: tuple[FakeKube, FakeKubeServer, Path], client: KubeClient
) -> None:
    # each watch holds its connection for minutes; the 9th+ informer must not wait for one (GETs have 8)
    state, _, _ = api
    for n in range(12):
        state.services[("serving", f"svc{n}")] = [Endpoint(f"10.1.0.{n + 1}", pod=f"s{n}")]
    informers = [client.endpointslices("serving", f"svc{n}") for n in range(12)]
    for informer in informers:
        await synced(informer)

    async def all_watching() -> bool:
        return lists_and_watches(state, "endpointslices")[1] >= 12

    await eventually(all_watching, timeout=15.0)
    assert await client.get_service("serving", "svc11") is not None  # GETs still get through
    state.services[("serving", "svc11")].append(Endpoint("10.1.0.99", pod="late"))

    async def seen() -> bool:
        return "10.1.0.99" in addresses(informers[-1])

    await eventually(seen, timeout=15.0)


async def test_a_hung_fleet_does_not_delay_another_targets_snapshot() -> None:
    # 12 replicas that never answer in time, 8 scrape slots in the whole process: the hung fleet may
    # hold a quarter of them; the healthy fleet's cycles keep their pace and never see `throttled`
    hung = [Replica(AT_TARGET) for _ in range(12)]
    try:
        for r in hung:
            r.set(delay_s=8)
        with replicas(AT_TARGET, AT_TARGET) as healthy:
            async with running_scaler(max_concurrent_scrapes=8) as scaler, channel_to(scaler) as ch:
                # its scrapes hold their slots for almost the whole interval (timeout 4.9 s of 5 s)
                slow = {"scrapeInterval": "5", "scrapeTimeout": "4.9", "staleAfter": "15"}
                bad = KedaEmulator(ch, "bad", "serving", {"endpoints": ",".join(r.url for r in hung), **slow})
                good = KedaEmulator(ch, "good", "serving", {"endpoints": ",".join(r.url for r in healthy), **FAST})
                await good.poll()
                with pytest.raises(grpc.aio.AioRpcError):
                    await bad.poll()  # nothing fresh there: UNAVAILABLE, KEDA's fallback applies
                target = next(t for t in scaler.registry.targets() if t.cfg.name == "good")
                assert target.snapshot is not None
                first = target.snapshot.cycle
                for _ in range(6):  # three seconds, while the hung fleet holds its slots
                    await asyncio.sleep(0.5)
                    snap = target.snapshot
                    # given all 8 slots, the hung fleet would leave this one `throttled` (then expired)
                    assert all(r.state == "fresh" for r in snap.evaluation.replicas), snap.evaluation.replicas
                assert snap.cycle - first >= 3  # kept (about) its pace beside the hung fleet
                assert (await good.poll()).value == 2.0
    finally:
        for r in hung:
            r.close()


async def test_one_tenants_many_hung_fleets_do_not_starve_another_namespace() -> None:
    # 4 fleets x 6 hung replicas in one namespace, 8 slots in the process: by fleet shares alone they
    # would hold all 8 (2 each); the namespace's share (half) leaves the other tenant its slots
    hung = [Replica(AT_TARGET) for _ in range(24)]
    try:
        for r in hung:
            r.set(delay_s=8)
        with replicas(AT_TARGET, AT_TARGET) as healthy:
            async with running_scaler(max_concurrent_scrapes=8) as scaler, channel_to(scaler) as ch:
                slow = {"scrapeInterval": "5", "scrapeTimeout": "4.9", "staleAfter": "15"}
                for n in range(4):
                    urls = ",".join(r.url for r in hung[6 * n : 6 * n + 6])
                    with pytest.raises(grpc.aio.AioRpcError):
                        await KedaEmulator(ch, f"bad{n}", "tenant-a", {"endpoints": urls, **slow}).poll()
                good = KedaEmulator(ch, "good", "tenant-b", {"endpoints": ",".join(r.url for r in healthy), **FAST})
                await good.poll()
                target = next(t for t in scaler.registry.targets() if t.cfg.name == "good")
                for _ in range(6):
                    await asyncio.sleep(0.5)
                    snap = target.snapshot
                    assert snap is not None
                    assert all(r.state == "fresh" for r in snap.evaluation.replicas), snap.evaluation.replicas
    finally:
        for r in hung:
            r.close()


def test_fleets_registered_together_spread_their_cycles_over_the_interval() -> None:
    # before: every fleet ticked from its creation, so 50 ScaledObjects registered in the same second (a
    # scaler restart) scraped in one burst every interval and ran out of scrape slots together
    interval, now = 5.0, 1000.0
    ids = [hashlib.sha256(f"fleet-{i}".encode()).hexdigest()[:8] for i in range(50)]
    ticks = sorted(next_tick(now, interval, cycle_phase(i, interval)) - now for i in ids)
    assert all(0 < t <= interval for t in ticks)  # the next cycle within one interval, never later
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    assert ticks[-1] - ticks[0] > 0.8 * interval and max(gaps) < 0.5 * interval, ticks
    # each fleet keeps its place: one interval apart, whenever its cycle ends inside the interval
    phase = cycle_phase(ids[0], interval)
    first = next_tick(now, interval, phase)
    assert next_tick(first + 0.3, interval, phase) == pytest.approx(first + interval)
    assert next_tick(first + 1.7 * interval, interval, phase) == pytest.approx(first + 2 * interval)  # overran
