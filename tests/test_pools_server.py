"""Fleets of pools through the real gRPC server against real HTTP replicas on loopback: two ScaledObjects in
one fleet, a reserved pool and a burst pool, each answering its share of the fleet's demand; the pool's
size read from its ScaledObject (the Kubernetes API stand-in); refusals naming the key; the cost exported."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from keda_llm_scaler.registry import TargetRegistry
from keda_llm_scaler.scrape import Scraper
from keda_llm_scaler.sim.keda import KedaEmulator
from keda_llm_scaler.sim.kubeapi import FakeKube, FakeKubeServer
from keda_llm_scaler.target import Target
from keda_llm_scaler.testing.payloads import EngineLoad, vllm_v1
from keda_llm_scaler.testing.replicas import dead_port, replicas
from keda_llm_scaler.testing.scalerproc import channel_to, running_scaler
from tests.test_server_keda import eventually
from tests.test_telemetry import scrape

FAST = {"scrapeInterval": "0.5", "scrapeTimeout": "0.4", "staleAfter": "1.5"}
BUDGET = 10.0  # generous: the scrape interval is 0.5 s; a busy machine may take several
HOT = vllm_v1([EngineLoad(30, 20, 0.97)])  # a deep queue and a full KV cache: more than one replica's worth
COOL = vllm_v1([EngineLoad(0, 2, 0.1)])


def pool(urls: list[str], tier: str, **extra: str) -> dict[str, str]:
    return {"endpoints": ",".join(urls), "fleet": "chat", "poolTier": tier, **FAST, **extra}


async def value(keda: KedaEmulator) -> float | None:
    try:
        return (await keda.poll()).value
    except grpc.aio.AioRpcError:
        return None


def own_composites(port: int) -> dict[str, float]:
    return {labels["pool"]: v for labels, v in scrape(port).get("llm_scaler_pool_own_composite", [])}


async def test_the_reserved_pool_answers_at_most_its_size_and_burst_the_excess_in_any_order() -> None:
    with replicas(HOT, HOT, COOL) as (a, b, c):
        async with running_scaler() as server, channel_to(server) as ch:
            reserved = KedaEmulator(ch, "chat-reserved", "serving", pool([a.url, b.url], "reserved", poolSize="2"))
            burst = KedaEmulator(ch, "chat-burst", "serving", pool([c.url], "burst"))
            own: dict[str, float] = {}

            async def both_pools_read() -> bool:
                # both pools registered and scraped: each one's own composite is exported
                await value(reserved), await value(burst)
                own.update(await asyncio.to_thread(own_composites, server.metrics_port))
                return set(own) == {"chat-reserved", "chat-burst"}

            await eventually(both_pools_read, BUDGET)
            assert own["chat-reserved"] > 2.5, own  # the reserved pool's own replicas are overloaded
            # no capacity is known from these payloads: both pools' units are assumed equal, so the fleet's
            # demand is the sum of the own composites, and burst takes what is beyond the reserved 2
            excess = own["chat-reserved"] + own["chat-burst"] - 2.0
            first = [await value(reserved), await value(burst)]
            second = [await value(burst), await value(reserved)][::-1]  # asked the other way round
            assert first == second
            assert first[0] == 2.0  # never above its size, though its own replicas ask for more
            assert first[1] == pytest.approx(excess, abs=0.01)
            assert first[1] > own["chat-burst"]  # the burst pool is asked for the reserved pool's excess
            # activity follows the share: both pools are active
            assert (await reserved.poll()).active and (await burst.poll()).active

            # the reserved pool's replicas cool down: the demand fits the reserved pool, burst goes to 0
            for r in (a, b):
                r.set(payload=COOL)

            async def burst_emptied() -> bool:
                return await value(burst) == 0.0

            await eventually(burst_emptied, BUDGET)
            got = await value(reserved)
            assert got is not None and 0 < got <= 2.0


async def test_a_pool_without_fresh_data_is_unavailable_and_counted_at_target_by_the_others() -> None:
    # the reserved pool has room (size 5) and its own replica is cool: what it answers is its own reading
    # plus whatever the burst pool's replica is counted for
    with replicas(COOL, HOT) as (a, b):
        async with running_scaler() as server, channel_to(server) as ch:
            reserved = KedaEmulator(ch, "chat-reserved", "serving", pool([a.url], "reserved", poolSize="5"))
            burst = KedaEmulator(ch, "chat-burst", "serving", pool([b.url], "burst"))

            async def answering() -> bool:
                got = [await value(reserved), await value(burst)]  # both asked: both registered
                return got[0] is not None and got[1] is not None

            await eventually(answering, BUDGET)
            b.set(status=500)  # the burst replica stops answering its scrapes

            async def burst_unavailable() -> bool:
                return await value(burst) is None

            await eventually(burst_unavailable, BUDGET)
            own = await asyncio.to_thread(own_composites, server.metrics_port)
            # no capacity is known from these payloads (units assumed equal): the burst pool's one member is
            # counted at target, one replica's worth, never as zero load, and the reservation has room for it
            got = await value(reserved)
            assert got == pytest.approx(own["chat-reserved"] + 1.0, abs=0.02), (got, own)
            m = await asyncio.to_thread(scrape, server.metrics_port)
            served = {labels["scaledobject"]: v for labels, v in m["llm_scaler_composite"]}
            assert served["chat-reserved"] == pytest.approx(own["chat-reserved"] + 1.0, abs=0.02)


async def test_the_cost_of_each_pool_and_of_the_fleet_is_exported() -> None:
    with replicas(HOT, HOT, COOL) as (a, b, c):
        async with running_scaler() as server, channel_to(server) as ch:
            reserved = KedaEmulator(
                ch, "chat-reserved", "serving", pool([a.url, b.url], "reserved", poolSize="3", replicaCostPerHour="4")
            )
            burst = KedaEmulator(ch, "chat-burst", "serving", pool([c.url], "burst", replicaCostPerHour="7.5"))
            m: dict[str, list[tuple[dict[str, str], float]]] = {}

            async def costed() -> bool:
                await value(reserved), await value(burst)
                m.update(await asyncio.to_thread(scrape, server.metrics_port))
                return len(m.get("llm_scaler_pool_cost_per_hour", [])) == 2

            await eventually(costed, BUDGET)
            pools = {
                labels["pool"]: (labels["tier"], labels["fleet"], v) for labels, v in m["llm_scaler_pool_cost_per_hour"]
            }
            # the reserved pool costs its size (3) though 2 run; the burst pool its one running replica
            assert pools == {"chat-reserved": ("reserved", "chat", 12.0), "chat-burst": ("burst", "chat", 7.5)}
            assert m["llm_scaler_fleet_cost_per_hour"] == [({"namespace": "serving", "fleet": "chat"}, 19.5)]
            # no tokens counted by these replicas: no cost per million tokens, never a 0 for unknown
            assert "llm_scaler_fleet_cost_per_million_tokens" not in m
            share = {labels["pool"]: v for labels, v in m["llm_scaler_pool_share_requests_per_second"]}
            fleet = {labels["pool"]: v for labels, v in m["llm_scaler_fleet_demand_requests_per_second"]}
            assert set(share) == set(fleet) == {"chat-reserved", "chat-burst"}
            assert fleet["chat-reserved"] == fleet["chat-burst"] == pytest.approx(sum(share.values()))


async def test_pool_keys_are_refused_naming_the_key() -> None:
    async with running_scaler() as server, channel_to(server) as ch:
        for name, meta, key in (
            ("a", pool(["http://10.0.0.7:8000"], "spot"), "poolTier"),
            ("b", pool(["http://10.0.0.7:8000"], "burst", poolSize="many"), "poolSize"),
            ("c", {"endpoints": "http://10.0.0.7:8000", "poolTier": "burst", **FAST}, "poolTier"),  # no fleet
            # a reserved pool needs a size: neither poolSize nor Kubernetes access to read maxReplicaCount
            ("d", pool(["http://10.0.0.7:8000"], "reserved"), "poolSize"),
        ):
            keda = KedaEmulator(ch, name, "serving", meta)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await keda.stub.GetMetricSpec(keda.ref)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"'{key}'" in (err.value.details() or ""), err.value.details()


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[tuple[FakeKube, FakeKubeServer, Path]]:
    state = FakeKube(port=8000)
    state.scaled_objects[("serving", "chat-reserved")] = {"spec": {"maxReplicaCount": 2, "minReplicaCount": 1}}
    server = FakeKubeServer(state)
    token = tmp_path / "token"
    token.write_text(state.token + "\n")
    yield state, server, token
    server.close()


async def test_a_reserved_pool_without_pool_size_is_its_scaledobjects_max_replica_count(
    kube: tuple[FakeKube, FakeKubeServer, Path],
) -> None:
    _, api, token = kube
    with replicas(HOT, HOT, COOL) as (a, b, c):
        async with running_scaler(kube_api_url=api.url, kube_token_file=token) as server, channel_to(server) as ch:
            reserved = KedaEmulator(ch, "chat-reserved", "serving", pool([a.url, b.url], "reserved"))
            burst = KedaEmulator(ch, "chat-burst", "serving", pool([c.url], "burst"))

            async def split_at_two() -> bool:
                got = [await value(reserved), await value(burst)]  # both asked: both registered
                return got[0] == 2.0 and (got[1] or 0.0) > 1.0

            await eventually(split_at_two, BUDGET)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_the_registry_groups_pools_by_namespace_and_fleet_and_eviction_removes_them() -> None:
    dead = f"http://127.0.0.1:{dead_port()}"
    clock = Clock()
    reg = TargetRegistry(Scraper(), idle_ttl_s=60.0, clock=clock)
    try:

        def ensure(ns: str, name: str, **extra: str) -> Target:
            return reg.ensure(reg.config_for(ns, name, {"endpoints": dead, "fleet": "chat", **extra}))

        res = ensure("serving", "chat-a100", poolTier="reserved", poolSize="2")
        first = ensure("serving", "chat-l4", poolTier="burst", pool="l4")
        other_ns = ensure("staging", "chat-a100", poolTier="reserved", poolSize="2")
        assert len(reg.groups()) == 2 and res.group is first.group and other_ns.group is not res.group
        assert res.group is not None and set(res.group.members()) == {"chat-a100", "l4"}
        clock.now += 30.0
        # another ScaledObject claims pool l4: the most recently registered is the pool
        second = ensure("serving", "chat-l4-new", poolTier="burst", pool="l4")
        assert res.group.members()["l4"] is second
        # no snapshot anywhere yet: nothing fresh, the split counts no member; the pools still answer NoFreshData
        assert set(res.group.split()) == {"chat-a100", "l4"}
        clock.now += 40.0  # the first claimant (and staging's pool) unused for 70 s; the others touched
        for t in (res, second):
            t.touch()
        assert await reg.evict_idle() == 2
        assert res.group.members() == {"chat-a100": res, "l4": second} and first.group is None
        assert [g.namespace for g in reg.groups()] == ["serving"]
        clock.now += 61.0
        assert await reg.evict_idle() == 2
        assert reg.groups() == [] and res.group is None
    finally:
        await reg.aclose()
