"""The scaler's own /metrics: names, labels, values that match what KEDA is served."""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.request

import grpc
from prometheus_client.parser import text_string_to_metric_families

from keda_llm_scaler.sim.keda import KedaEmulator
from keda_llm_scaler.testing.payloads import EngineLoad, vllm_v1
from keda_llm_scaler.testing.replicas import dead_port, replicas
from keda_llm_scaler.testing.scalerproc import channel_to, running_scaler

FAST = {"scrapeInterval": "0.5", "scrapeTimeout": "0.4", "staleAfter": "1.5"}


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


async def test_exported_values_match_the_served_composite() -> None:
    with replicas(vllm_v1([EngineLoad(10, 20, 0.85)]), vllm_v1([EngineLoad(0, 5, 0.17)])) as fleet:
        dead = f"http://127.0.0.1:{dead_port()}"
        async with running_scaler() as server, channel_to(server) as ch:
            keda = KedaEmulator(ch, "llm", "serving", {"endpoints": ",".join([*(r.url for r in fleet), dead]), **FAST})
            # past the first seconds, which hold the fleet's 3 replicas while its rate is not known yet
            # (policy.composite: two 2-s bins at this scrape interval)
            for _ in range(100):  # 20 s at most
                if (served := (await keda.poll()).value) != 3.0:
                    break
                await asyncio.sleep(0.2)
            m = await asyncio.to_thread(scrape, server.metrics_port)
    labels = {"namespace": "serving", "scaledobject": "llm"}

    def value(name: str, **extra: str) -> float:
        matches = [v for lab, v in m[name] if {**labels, **extra}.items() <= lab.items()]
        assert len(matches) == 1, (name, m.get(name))
        return matches[0]

    assert value("llm_scaler_composite") == served == 1 + 10 / 20 + 0.2 + 1.0  # dead replica: at target
    assert value("llm_scaler_composite_term", term="assumed") == 1.0
    assert value("llm_scaler_composite_term", term="queue") == 0.5
    assert value("llm_scaler_replicas", state="fresh") == 2
    assert value("llm_scaler_replicas", state="expired") == 1
    assert value("llm_scaler_waiting_requests") == 10 and value("llm_scaler_running_requests") == 25
    assert value("llm_scaler_kv_usage_ratio") == (0.85 + 0.17) / 2
    assert value("llm_scaler_target_up") == 1 and value("llm_scaler_active") == 1
    assert value("llm_scaler_decision_reason", reason="load") == 1
    assert value("llm_scaler_scrape_errors_total", reason="connect_error") >= 1
    assert value("llm_scaler_scrape_duration_seconds_count") >= 3
    assert value("llm_scaler_scrape_wait_seconds_count") == value("llm_scaler_scrape_duration_seconds_count")
    assert any(
        lab.get("method") == "GetMetrics" and lab.get("code") == "OK"
        for lab, _ in m["llm_scaler_rpc_duration_seconds_count"]
    )
    assert all(name.startswith("llm_scaler_") for name in m)


async def test_the_demand_behind_the_composite_is_exported() -> None:
    """A replica finishing 50 requests per scrape, with a configured capacity: the rate term, the offered
    and planned load and the capacity are on /metrics, and they are what KEDA was served."""
    import threading

    with replicas(vllm_v1([EngineLoad(0, 40, 0.3)])) as (replica,):
        stop = threading.Event()

        def count_up() -> None:  # the success counter grows with every scrape the replica answers
            while not stop.wait(0.02):
                replica.behaviour.payload = vllm_v1([EngineLoad(0, 40, 0.3)], success=50.0 * replica.requests)

        thread = threading.Thread(target=count_up, daemon=True)
        thread.start()
        try:
            async with running_scaler() as server, channel_to(server) as ch:
                meta = {"endpoints": replica.url, "replicaCapacity": "20", "targetUtilization": "0.5", **FAST}
                keda = KedaEmulator(ch, "llm", "serving", meta)
                await keda.poll()  # the first call registers the target and starts its scrape loop
                deadline = asyncio.get_running_loop().time() + 30.0  # a few 2 s bins of arrivals, on a busy machine
                while True:
                    m = await asyncio.to_thread(scrape, server.metrics_port)
                    if "llm_scaler_planned_requests_per_second" in m or asyncio.get_running_loop().time() > deadline:
                        break
                    await asyncio.sleep(0.3)
                served = (await keda.poll()).value
                m = await asyncio.to_thread(scrape, server.metrics_port)
        finally:
            stop.set()
            thread.join()
    labels = {"namespace": "serving", "scaledobject": "llm"}

    def value(name: str, **extra: str) -> float:
        matches = [v for lab, v in m[name] if {**labels, **extra}.items() <= lab.items()]
        assert len(matches) == 1, (name, m.get(name))
        return matches[0]

    offered, planned = value("llm_scaler_offered_requests_per_second"), value("llm_scaler_planned_requests_per_second")
    assert offered > 10 and planned >= offered  # ~100/s at 2 scrapes a second
    assert value("llm_scaler_replica_capacity_requests_per_second", source="configured") == 20.0
    assert value("llm_scaler_composite_term", term="rate") == planned / (20.0 * 0.5)
    assert value("llm_scaler_decision_reason", reason="rate") == 1
    assert value("llm_scaler_startup_seconds", source="default") > 0
    assert abs(served - value("llm_scaler_composite")) < 0.5 * served  # the next cycle may have moved it a bit


async def test_a_fleet_without_data_exports_no_queue_reading_and_says_why() -> None:
    """One ScaledObject whose only replica never answers, one whose replica answers with an empty queue:
    the first has no waiting/running/KV samples at all (a 0 would read as an idle fleet), and the scrape
    health series say why; the second exports its real zeros."""
    with replicas(vllm_v1([EngineLoad(0, 0, 0.0)])) as (idle,):
        dead = f"http://127.0.0.1:{dead_port()}"
        async with running_scaler() as server, channel_to(server) as ch:
            with contextlib.suppress(grpc.aio.AioRpcError):  # UNAVAILABLE: no replica has data
                await KedaEmulator(ch, "down", "serving", {"endpoints": dead, **FAST}).poll()
            await KedaEmulator(ch, "idle", "serving", {"endpoints": idle.url, **FAST}).poll()
            deadline = time.monotonic() + 15.0  # a budget for a busy machine
            while True:
                m = await asyncio.to_thread(scrape, server.metrics_port)
                scraped = {lab["scaledobject"] for lab, _ in m.get("llm_scaler_replicas", [])}
                if scraped == {"down", "idle"} or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)

    def values(name: str, scaledobject: str, **extra: str) -> list[float]:
        want = {"namespace": "serving", "scaledobject": scaledobject, **extra}
        return [v for lab, v in m.get(name, []) if want.items() <= lab.items()]

    for name in ("waiting_requests", "running_requests", "kv_usage_ratio", "rejects_per_second", "composite"):
        assert values(f"llm_scaler_{name}", "down") == [], name  # absent, not 0
    assert values("llm_scaler_target_up", "down") == [0.0]
    assert values("llm_scaler_replicas", "down", state="expired") == [1.0]
    assert values("llm_scaler_replicas", "down", state="fresh") == [0.0]
    assert values("llm_scaler_scrape_errors_total", "down", reason="connect_error")[0] >= 1
    # a fleet that answered with nothing waiting still reads 0: absence means no data, not an empty queue
    assert values("llm_scaler_waiting_requests", "idle") == [0.0]
    assert values("llm_scaler_running_requests", "idle") == [0.0]
    assert values("llm_scaler_kv_usage_ratio", "idle") == [0.0]
    assert values("llm_scaler_replicas", "idle", state="fresh") == [1.0]


async def test_deferred_requests_are_exported_apart_and_kept_out_of_the_queue() -> None:
    """Two vLLM 0.34 data-parallel engines (their own exporter's payload): engine 0 runs 4 and waits 4, of
    which 1 for capacity and 3 deferred; engine 1 runs 2 and waits for nothing. The fleet's waiting and the
    queue term read the 1 (the worst engine's queue over max(targetQueueDepth 5, its batch of 4): 1/5,
    where all 4 would read 4/5); the 3 are exported on their own. A fleet whose engines do not split their waiting has
    no deferred series at all: unknown, not 0."""
    from tests.conftest import fixture_text

    split = fixture_text("vllm_v0.34.0_dp2-deferred.txt")
    with replicas(split) as new, replicas(vllm_v1([EngineLoad(3, 5, 0.2)])) as old:
        async with running_scaler() as server, channel_to(server) as ch:
            for name, fleet in (("new", new), ("old", old)):
                await KedaEmulator(ch, name, "serving", {"endpoints": fleet[0].url, **FAST}).poll()
            m = await asyncio.to_thread(scrape, server.metrics_port)

    def values(name: str, scaledobject: str, **extra: str) -> list[float]:
        want = {"namespace": "serving", "scaledobject": scaledobject, **extra}
        return [v for lab, v in m.get(name, []) if want.items() <= lab.items()]

    assert values("llm_scaler_waiting_requests", "new") == [1.0]
    assert values("llm_scaler_deferred_requests", "new") == [3.0]
    assert values("llm_scaler_composite_term", "new", term="queue") == [0.2]
    assert values("llm_scaler_waiting_requests", "old") == [3.0]
    assert values("llm_scaler_deferred_requests", "old") == []


async def test_engine_faults_are_exported_as_a_rate_once_two_scrapes_are_in() -> None:
    """An SGLang 0.5.23 replica (its own collectors' payload) with 3 answers failed with a 500, unchanged
    between scrapes: the fault rate is known, and it is 0."""
    from tests.conftest import fixture_text

    with replicas(fixture_text("sglang_v0.5.23_aborts-and-500s.txt")) as (sg,):
        async with running_scaler() as server, channel_to(server) as ch:
            await KedaEmulator(ch, "sg", "serving", {"endpoints": sg.url, **FAST}).poll()
            deadline = time.monotonic() + 20.0  # a budget for a busy machine
            while True:
                m = await asyncio.to_thread(scrape, server.metrics_port)
                faults = [
                    v for lab, v in m.get("llm_scaler_engine_faults_per_second", []) if lab["scaledobject"] == "sg"
                ]
                if faults or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.3)
    assert faults == [0.0]


async def test_replicas_asleep_are_exported_with_how_many_the_need_asks_to_wake() -> None:
    """One vLLM 0.34 replica awake with 7 waiting for capacity beside its batch of 5, two asleep (their
    own exporter's payloads): the awake one's need is past one replica, and one of the asleep is asked to
    wake; they are not scored as idle capacity."""
    from tests.conftest import fixture_text

    awake, asleep = (
        fixture_text("vllm_v0.34.0_capacity-and-deferred.txt"),
        fixture_text("vllm_v0.34.0_sleeping-level1.txt"),
    )
    with replicas(awake, asleep, asleep) as fleet:
        async with running_scaler() as server, channel_to(server) as ch:
            keda = KedaEmulator(ch, "sl", "serving", {"endpoints": ",".join(r.url for r in fleet), **FAST})
            await keda.poll()
            m = await asyncio.to_thread(scrape, server.metrics_port)

    def one(name: str) -> float:
        (v,) = [v for lab, v in m.get(name, []) if lab["scaledobject"] == "sl"]
        return v

    assert one("llm_scaler_asleep_replicas") == 2.0
    assert 1.0 < one("llm_scaler_composite") <= 2.0 and one("llm_scaler_wake_replicas") == 1.0
