"""`workloadClass`: an interactive fleet (the default) is active whenever it has members, so that
`minReplicaCount: 0` cannot empty it by idling; a batch fleet is inactive as soon as it is idle. Missing
data is never `false` in either class. Through the real gRPC server against real HTTP replicas (and the
Kubernetes API stand-in for membership phases), as KEDA calls it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest

from keda_llm_scaler._proto import externalscaler_pb2 as pb
from keda_llm_scaler.server import ScalerServer
from keda_llm_scaler.sim.keda import KedaEmulator
from keda_llm_scaler.sim.kubeapi import Endpoint, FakeKube, FakeKubeServer
from keda_llm_scaler.target import Target
from keda_llm_scaler.testing.payloads import EngineLoad, vllm_v1
from keda_llm_scaler.testing.replicas import Replica, replicas
from keda_llm_scaler.testing.scalerproc import channel_to, running_scaler
from tests.test_server_keda import Stream, eventually
from tests.test_telemetry import scrape

FAST = {"scrapeInterval": "0.5", "scrapeTimeout": "0.4", "staleAfter": "1.5"}
IDLE = vllm_v1([EngineLoad(0, 0, 0.0)])
IN_FLIGHT = vllm_v1([EngineLoad(0, 1, 0.0)])  # one request running, KV gauge at 0
BUDGET = 10.0  # generous: the scrape interval is 0.5 s; a busy machine may take several


def meta(*urls: str, **extra: str) -> dict[str, str]:
    return {"endpoints": ",".join(urls), **FAST, **extra}


async def is_active(keda: KedaEmulator) -> bool | grpc.StatusCode:
    """IsActive's result, or the status code it failed with."""
    try:
        return (await keda.stub.IsActive(keda.ref)).result
    except grpc.aio.AioRpcError as err:
        return err.code()


async def answers(keda: KedaEmulator, want: bool | grpc.StatusCode) -> bool:
    return await is_active(keda) == want


async def metrics_code(keda: KedaEmulator) -> grpc.StatusCode:
    try:
        await keda.stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=keda.ref, metricName="llm_composite"))
    except grpc.aio.AioRpcError as err:
        return err.code()
    return grpc.StatusCode.OK


def target_named(server: ScalerServer, name: str) -> Target:
    (target,) = [t for t in server.registry.targets() if t.cfg.name == name]
    return target


async def cycles_pass(target: Target, n: int = 2) -> None:
    """Wait (by the target's own cycle count, not by the clock) until ``n`` more cycles have been published."""
    start = target.snapshot.cycle if target.snapshot else -1

    async def passed() -> bool:
        return target.snapshot is not None and target.snapshot.cycle >= start + n

    await eventually(passed, BUDGET)


async def active_gauge(server: ScalerServer) -> dict[str, float]:
    """``llm_scaler_active`` by ScaledObject name (absent: no sample)."""
    m = await asyncio.to_thread(scrape, server.metrics_port)
    return {labels["scaledobject"]: v for labels, v in m.get("llm_scaler_active", [])}


# -- static fleets --------------------------------------------------------------------------------


async def test_an_idle_interactive_fleet_with_replicas_stays_active(
    scaler: ScalerServer, channel: grpc.aio.Channel
) -> None:
    with replicas(IDLE, IDLE) as fleet:
        keda = KedaEmulator(channel, "chat", "serving", meta(*(r.url for r in fleet)))  # default: interactive
        obs = await keda.poll()
        assert (obs.value, obs.active) == (0.0, True)  # the composite is still 0; the floor is on activity
        explicit = KedaEmulator(channel, "chat2", "serving", meta(*(r.url for r in fleet), workloadClass="interactive"))
        assert await is_active(explicit) is True
        stream = Stream(keda.stub.StreamIsActive(keda.ref))
        first = await stream.next(BUDGET)
        assert first is not None and first.result is True
        await cycles_pass(target_named(scaler, "chat"))
        assert stream.queue.empty()  # the state holds: nothing more (a repeated true would delay cooldown)
        stream.cancel()
        assert (await active_gauge(scaler))["chat"] == 1.0


async def test_an_idle_batch_fleet_is_inactive_until_a_request_is_in_flight(
    scaler: ScalerServer, channel: grpc.aio.Channel
) -> None:
    with replicas(IDLE) as (r,):
        keda = KedaEmulator(channel, "jobs", "serving", meta(r.url, workloadClass="batch"))
        obs = await keda.poll()
        assert (obs.value, obs.active) == (0.0, False)
        assert (await active_gauge(scaler))["jobs"] == 0.0
        stream = Stream(keda.stub.StreamIsActive(keda.ref))
        first = await stream.next(BUDGET)
        assert first is not None and first.result is False  # the first known state may be false
        r.set(payload=IN_FLIGHT)
        msg = await stream.next(BUDGET)
        assert msg is not None and msg.result is True  # inactive -> active is pushed
        assert await is_active(keda) is True
        assert (await active_gauge(scaler))["jobs"] == 1.0
        stream.cancel()


async def test_failing_scrapes_interactive_is_active_batch_is_unavailable(
    scaler: ScalerServer, channel: grpc.aio.Channel
) -> None:
    broken = Replica(IDLE)
    try:
        broken.set(status=500)  # every scrape fails, from the first: no composite at all
        chat = KedaEmulator(channel, "chat", "serving", meta(broken.url))
        jobs = KedaEmulator(channel, "jobs", "serving", meta(broken.url, workloadClass="batch"))
        assert await metrics_code(chat) == grpc.StatusCode.UNAVAILABLE  # the value stays missing, in both classes
        assert await metrics_code(jobs) == grpc.StatusCode.UNAVAILABLE
        # two triggers that differ only by class are two views of one fleet: one scrape loop
        assert len(scaler.registry.targets()) == 2 and len(scaler.registry.fleets()) == 1
        await eventually(lambda: answers(chat, True), BUDGET)  # replicas exist: that much is known
        assert await is_active(jobs) == grpc.StatusCode.UNAVAILABLE  # never false on missing data
        chat_stream = Stream(chat.stub.StreamIsActive(chat.ref))
        jobs_stream = Stream(jobs.stub.StreamIsActive(jobs.ref))
        first = await chat_stream.next(BUDGET)
        assert first is not None and first.result is True
        await cycles_pass(target_named(scaler, "jobs"))
        assert jobs_stream.queue.empty() and not jobs_stream.call.done()  # silent, still open: no false
        gauge = await active_gauge(scaler)
        assert gauge.get("chat") == 1.0 and "jobs" not in gauge  # no sample rather than a 0
        chat_stream.cancel()
        jobs_stream.cancel()
    finally:
        broken.close()


async def test_a_bad_workload_class_is_invalid_argument_naming_the_key(channel: grpc.aio.Channel) -> None:
    for bad in ("realtime", "batch,interactive"):
        keda = KedaEmulator(channel, "llm", "serving", meta("http://127.0.0.1:1", workloadClass=bad))
        request = pb.GetMetricsRequest(scaledObjectRef=keda.ref, metricName="llm_composite")
        for call in (keda.stub.GetMetricSpec(keda.ref), keda.stub.IsActive(keda.ref), keda.stub.GetMetrics(request)):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            details = err.value.details() or ""
            assert "'workloadClass'" in details and "interactive | batch" in details
        stream = keda.stub.StreamIsActive(keda.ref)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stream.read()
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "'workloadClass'" in (err.value.details() or "")


# -- membership phases (EndpointSlices and pods from the Kubernetes API stand-in) ---------------------

SELECTOR = {"app": "vllm"}


def _pod(name: str, *, unschedulable: bool = False, ip: str | None = None) -> dict[str, Any]:
    created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    conditions = [{"type": "Ready", "status": "False"}]
    if unschedulable:
        conditions = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                       "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]  # fmt: skip
    status: dict[str, Any] = {"phase": "Running" if ip else "Pending", "conditions": conditions}
    if ip:
        status["podIP"] = ip
    meta = {
        "name": name,
        "namespace": "serving",
        "uid": f"uid-serving-{name}",
        "labels": SELECTOR,
        "creationTimestamp": created,
    }
    return {"metadata": meta, "status": status}


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[tuple[FakeKube, FakeKubeServer, Path]]:
    state = FakeKube(port=8000)
    state.services[("serving", "vllm")] = []
    state.selectors[("serving", "vllm")] = SELECTOR
    state.pods["serving"] = []
    server = FakeKubeServer(state)
    token = tmp_path / "token"
    token.write_text(state.token + "\n")
    yield state, server, token
    server.close()


async def test_no_member_follows_the_composite_and_any_member_keeps_an_interactive_fleet_active(
    kube: tuple[FakeKube, FakeKubeServer, Path],
) -> None:
    state, api, token = kube
    async with running_scaler(kube_api_url=api.url, kube_token_file=token) as server, channel_to(server) as ch:
        chat = KedaEmulator(ch, "chat", "serving", {"service": "vllm", **FAST})
        jobs = KedaEmulator(ch, "jobs", "serving", {"service": "vllm", "workloadClass": "batch", **FAST})

        async def both(want_chat: bool, want_jobs: bool) -> bool:
            return (await is_active(chat), await is_active(jobs)) == (want_chat, want_jobs)

        # no member at all: the normal rule (a fleet of zero is a real 0, not missing data)
        await eventually(lambda: both(False, False), BUDGET)
        for keda in (chat, jobs):
            obs = await keda.poll()
            assert (obs.value, obs.active) == (0.0, False)
        # a pending pod (no node fits): not capacity on its way, so the composite stays 0 and batch
        # stays inactive; interactive is active as long as the fleet has a member in any phase
        state.pods["serving"] = [_pod("vllm-nogpu", unschedulable=True)]
        await eventually(lambda: both(True, False), BUDGET)
        # a starting pod: capacity on its way, which the composite counts, so both are active
        state.pods["serving"] = [_pod("vllm-new", ip="10.0.0.9")]
        state.services[("serving", "vllm")] = [Endpoint("10.0.0.9", pod="vllm-new", ready=False)]
        await eventually(lambda: both(True, True), BUDGET)
        snap = target_named(server, "chat").snapshot
        assert snap is not None and snap.starting == 1
        # the fleet empties again: back to the normal rule
        state.pods["serving"] = []
        state.services[("serving", "vllm")] = []
        await eventually(lambda: both(False, False), BUDGET)
