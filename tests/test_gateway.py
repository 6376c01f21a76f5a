"""Waking a pool at zero from its gateway: the requests llm-d's router (or another gateway) holds for it
are its demand while it has no ready replica. The reading, the trigger keys, the policy, and the real gRPC
server against a real HTTP gateway on loopback and the Kubernetes API stand-in for the pool's members."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from keda_llm_scaler.errors import BadMetadata, InvalidSignal, MissingSignal
from keda_llm_scaler.fleet import FleetState
from keda_llm_scaler.gateway import DEFAULT_GATEWAY_FAMILIES, GatewaySpec, parse_labels, read_gateway
from keda_llm_scaler.metadata import parse_trigger
from keda_llm_scaler.policy import ReplicaInput, ScoringParams, composite
from keda_llm_scaler.sim.keda import KedaEmulator
from keda_llm_scaler.sim.kubeapi import FakeKube, FakeKubeServer
from keda_llm_scaler.testing.replicas import Replica
from keda_llm_scaler.testing.scalerproc import channel_to, running_scaler
from tests.conftest import fixture_text
from tests.test_server_keda import eventually
from tests.test_telemetry import scrape
from tests.test_workload_class import BUDGET, FAST, is_active
from tests.test_workload_class import kube as pool_at_zero  # noqa: F401 (a fixture: the Service has no endpoint)

ROUTER = fixture_text("llm-d-router_flow-control_constructed.txt")


def spec(**labels: str) -> GatewaySpec:
    return GatewaySpec("http://gw/metrics", DEFAULT_GATEWAY_FAMILIES, tuple(sorted(labels.items())))


def test_the_routers_queue_for_the_pool_is_summed_over_its_flows() -> None:
    assert read_gateway(ROUTER, spec(inference_pool="vllm")) == 5  # two fairness ids; not the old mirror too
    assert read_gateway(ROUTER, spec(inference_pool="other")) == 7
    assert read_gateway(ROUTER, spec(inference_pool="vllm", priority="-10")) == 2
    assert read_gateway(ROUTER, spec(inference_pool="idle")) == 0  # no series yet for this pool: nothing held
    old = "\n".join(ln for ln in ROUTER.splitlines() if "llm_d_epp_flow_control_queue_size" not in ln) + "\n"
    assert read_gateway(old, spec(inference_pool="vllm")) == 5  # a router before the rename


def test_a_gateway_without_the_family_is_missing_data_unless_it_is_the_routers_idle_queue() -> None:
    quiet_router = "\n".join(ln for ln in ROUTER.splitlines() if "queue_size" not in ln) + "\n"
    assert read_gateway(quiet_router, spec(inference_pool="vllm")) == 0.0  # the router, nothing held yet
    with pytest.raises(MissingSignal):
        read_gateway("envoy_cluster_upstream_rq_pending_active 3\n", spec(inference_pool="vllm"))
    custom = GatewaySpec("http://gw/metrics", ("pending_requests",), (("backend", "vllm"),))
    with pytest.raises(MissingSignal):  # a misspelt family is never an idle pool
        read_gateway(ROUTER, custom)
    assert read_gateway('pending_requests{backend="vllm"} 4\npending_requests{backend="x"} 9\n', custom) == 4
    with pytest.raises(InvalidSignal):
        read_gateway('pending_requests{backend="vllm"} -1\n', custom)


def test_the_spec_travels_the_scrape_path_as_one_line() -> None:
    s = spec(inference_pool="vllm", priority="0")
    assert GatewaySpec.from_channel(s.url, s.channel) == s
    assert parse_labels(" b=2, a=1 ,") == (("a", "1"), ("b", "2"))
    for bad in ("a", "=1", "a=", 'a="1"', "1a=2", "a=1,a=2"):
        with pytest.raises(ValueError, match=r"name=value|twice"):
            parse_labels(bad)


def test_trigger_keys_default_to_the_routers_queue_for_this_scaledobjects_pool() -> None:
    base = {"endpoints": "http://10.0.0.7:8000"}
    cfg = parse_trigger("ns", "chat", {**base, "gatewayMetricsUrl": "http://epp.llm-d:9090"})
    assert cfg.gateway == GatewaySpec(
        "http://epp.llm-d:9090/metrics", DEFAULT_GATEWAY_FAMILIES, (("inference_pool", "chat"),)
    )
    cfg = parse_trigger("ns", "chat", {**base, "gatewayMetricsUrl": "http://epp:9090/m", "gatewayPool": "llama",
                                       "gatewayLabels": "priority=0"})  # fmt: skip
    assert cfg.gateway is not None and cfg.gateway.labels == (("inference_pool", "llama"), ("priority", "0"))
    cfg = parse_trigger("ns", "chat", {**base, "gatewayMetricsUrl": "http://i:9090", "gatewayMetric": "pending",
                                       "gatewayLabels": "backend=chat"})  # fmt: skip
    assert cfg.gateway is not None and (cfg.gateway.families, cfg.gateway.labels) == (
        ("pending",),
        (("backend", "chat"),),
    )
    assert parse_trigger("ns", "chat", base).gateway is None
    assert (
        parse_trigger("ns", "chat", {**base, "gatewayMetricsUrl": "http://a:1"}).fleet_key
        != parse_trigger("ns", "chat", {**base, "gatewayMetricsUrl": "http://b:1"}).fleet_key
    )  # another gateway is another scrape loop
    for key, bad in (
        ("gatewayMetricsUrl", "ftp://epp"),
        ("gatewayMetricsUrl", "http://169.254.169.254/latest"),  # the address guards of replicas
        ("gatewayMetricsUrl", "http://a:1,http://b:1"),
        ("gatewayMetric", "queue size"),
        ("gatewayLabels", "pool"),
        ("gatewayPool", "Not_A_Pool"),
    ):
        meta = {**base, "gatewayMetricsUrl": "http://epp:9090", key: bad}
        with pytest.raises(BadMetadata) as err:
            parse_trigger("ns", "chat", meta)
        assert key in str(err.value)
    with pytest.raises(BadMetadata, match="gatewayPool"):  # a refinement without the gateway
        parse_trigger("ns", "chat", {**base, "gatewayPool": "llama"})


def test_held_requests_are_the_demand_of_a_pool_with_no_ready_replica() -> None:
    p = ScoringParams(target_queue_depth=5.0)
    woke = composite([], p, held=1)
    assert (woke.value, woke.dominant) == (1.0, "gateway")  # the first held request wakes it
    assert composite([], p, held=23).value == pytest.approx(23 / 5)
    assert composite([], p, held=0).dominant == "idle" and composite([], p, held=0).value == 0
    assert composite([], p, incoming=6, held=3).value == 6  # already on their way
    # with a replica ready, its own readings rule: the gateway's queue is not added
    ready = [ReplicaInput(waiting=0, running=2, kv_usage=0.3)]
    assert composite(ready, p, held=50).value == composite(ready, p).value
    # a gateway that cannot be read, and no replica: unknown, not 0
    ev = FleetState(p, 15.0, 1.0).evaluate(0.0, gateway=(None, "connect_error"))
    assert ev.composite is None and ev.error is not None and "connect_error" in ev.error


def _router(pool: str, held: int) -> str:
    series = (
        f'llm_d_epp_flow_control_queue_size{{fairness_id="a",inference_pool="{pool}",model_name="m",'
        f'priority="0",target_model_name="m"}} {held}\n'
    )
    return '# TYPE llm_d_epp_ready_endpoints gauge\nllm_d_epp_ready_endpoints{name="vllm"} 0\n' + (
        series if held else ""
    )


async def test_a_batch_pool_at_zero_wakes_within_a_scrape_of_the_first_held_request(
    pool_at_zero: tuple[FakeKube, FakeKubeServer, Path],  # noqa: F811 (the imported fixture)
) -> None:
    """IsActive and StreamIsActive, through the real server: the pool has no endpoint; the router holds
    nothing, then one request for it (and all along requests for another pool, which are not its own)."""
    _, api, token = pool_at_zero
    gateway = Replica(_router("vllm", 0) + _router("other", 9).split("\n", 2)[2])
    try:
        async with running_scaler(kube_api_url=api.url, kube_token_file=token) as server, channel_to(server) as ch:
            meta = {"service": "vllm", "workloadClass": "batch", "gatewayMetricsUrl": gateway.url, **FAST}
            keda = KedaEmulator(ch, "vllm", "serving", meta)
            await eventually(lambda: _answers(keda, False), BUDGET)
            stream = keda.stub.StreamIsActive(keda.ref)
            assert (await asyncio.wait_for(stream.read(), BUDGET)).result is False  # the state on opening
            gateway.set(payload=_router("vllm", 1) + _router("other", 9).split("\n", 2)[2])
            pushed = await asyncio.wait_for(stream.read(), BUDGET)  # pushed on the change: no poll needed
            assert pushed.result is True
            assert await is_active(keda) is True
            obs = await keda.poll()
            assert obs.value == 1.0
            m = await asyncio.to_thread(scrape, server.metrics_port)
            held = [v for lab, v in m.get("llm_scaler_gateway_held_requests", []) if lab["scaledobject"] == "vllm"]
            assert held == [1.0]
            stream.cancel()
            # the gateway fails while the pool is still at zero: no answer, never "inactive"
            gateway.set(status=503)
            await eventually(lambda: _answers(keda, grpc.StatusCode.UNAVAILABLE), BUDGET)
    finally:
        gateway.close()


async def _answers(keda: KedaEmulator, want: bool | grpc.StatusCode) -> bool:
    return await is_active(keda) == want


async def test_a_gateway_address_the_guards_refuse_is_never_fetched(
    pool_at_zero: tuple[FakeKube, FakeKubeServer, Path],  # noqa: F811 (the imported fixture)
) -> None:
    _, api, token = pool_at_zero
    async with running_scaler(kube_api_url=api.url, kube_token_file=token) as server, channel_to(server) as ch:
        meta = {"service": "vllm", "workloadClass": "batch", "gatewayMetricsUrl": "http://[fe80::1]:9090", **FAST}
        keda = KedaEmulator(ch, "vllm", "serving", meta)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await keda.stub.IsActive(keda.ref)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "gatewayMetricsUrl" in (
            err.value.details() or ""
        )
