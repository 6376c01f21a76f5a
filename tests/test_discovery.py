"""Discovery: DNS (all A/AAAA records) and Kubernetes EndpointSlices through a fake API server,
end to end through the gRPC API."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from scaler.discovery import DiscoveryError, DnsResolver
from scaler.metadata import parse_trigger
from scaler.sim.keda import KedaEmulator
from scaler.sim.kubeapi import Endpoint, FakeKube, FakeKubeServer
from tests.payloads import EngineLoad, vllm_v1
from tests.replicas import Replica, unused_port
from tests.scalerproc import channel_to, running_scaler

FAST = {"scrapeInterval": "0.5", "scrapeTimeout": "0.4", "staleAfter": "1.5"}
AT_TARGET = vllm_v1([EngineLoad(0, 30, 0.85)])


async def test_dns_resolves_every_address() -> None:
    cfg = parse_trigger("serving", "llm", {"dnsName": "localhost", "port": "8123"})
    urls = await DnsResolver(cfg.discovery).resolve()
    assert "http://127.0.0.1:8123/metrics" in urls
    assert urls == sorted(set(urls))


async def test_dns_name_without_records_is_an_empty_fleet_not_an_error() -> None:
    cfg = parse_trigger("serving", "llm", {"dnsName": "no-such-service.invalid"})
    try:
        assert await DnsResolver(cfg.discovery).resolve() == []
    except DiscoveryError as exc:  # a resolver with no upstream answers "try again", which is not "no records"
        assert "failed" in str(exc)


@pytest.fixture
def fleet() -> Iterator[list[Replica]]:
    port = unused_port()
    started = [Replica(AT_TARGET, host=f"127.0.0.{i}", port=port) for i in (2, 3, 4)]
    yield started
    for r in started:
        r.close()


@pytest.fixture
def kube(fleet: list[Replica], tmp_path: Path) -> Iterator[tuple[FakeKube, FakeKubeServer, Path]]:
    state = FakeKube(port=fleet[0].port)
    state.services[("serving", "vllm")] = [Endpoint(r.host) for r in fleet]
    state.services[("serving", "empty")] = []
    server = FakeKubeServer(state)
    token = tmp_path / "token"
    token.write_text(state.token + "\n")
    yield state, server, token
    server.close()


async def test_endpointslices_end_to_end(fleet: list[Replica], kube: tuple[FakeKube, FakeKubeServer, Path]) -> None:
    state, api, token = kube
    async with running_scaler(kube_api_url=api.url, kube_token_file=token) as server, channel_to(server) as ch:
        keda = KedaEmulator(ch, "llm", "serving", {"service": "vllm", "port": str(fleet[0].port), **FAST})
        assert (await keda.poll()).value == 3.0
        # an unready endpoint is not scraped; a missing `ready` condition means ready
        state.services[("serving", "vllm")] = [Endpoint(fleet[0].host, ready=False), Endpoint(fleet[1].host),
                                               Endpoint(fleet[2].host, ready=None)]
        await asyncio.sleep(1.2)
        assert (await keda.poll()).value == 2.0
        # zero ready pods is a legitimate 0, not missing data (C13)
        state.services[("serving", "vllm")] = []
        await asyncio.sleep(1.2)
        obs = await keda.poll()
        assert (obs.value, obs.active) == (0.0, False)
        assert any("labelSelector=kubernetes.io%2Fservice-name%3Dvllm" in r or
                   "labelSelector=kubernetes.io/service-name=vllm" in r for r in state.requests)


@pytest.mark.parametrize("status", [401, 403, 500])
async def test_api_errors_keep_the_last_fleet(status: int, fleet: list[Replica],
                                              kube: tuple[FakeKube, FakeKubeServer, Path]) -> None:
    state, api, token = kube
    async with running_scaler(kube_api_url=api.url, kube_token_file=token) as server, channel_to(server) as ch:
        keda = KedaEmulator(ch, "llm", "serving", {"service": "vllm", "port": str(fleet[0].port), **FAST})
        assert (await keda.poll()).value == 3.0
        if status == 401:
            state.token = "rotated"
        else:
            state.fail_status = status
        await asyncio.sleep(1.2)
        assert (await keda.poll()).value == 3.0  # the API failing is not the fleet vanishing


async def test_never_resolved_is_unavailable(kube: tuple[FakeKube, FakeKubeServer, Path]) -> None:
    state, api, token = kube
    state.fail_status = 403
    async with running_scaler(kube_api_url=api.url, kube_token_file=token) as server, channel_to(server) as ch:
        keda = KedaEmulator(ch, "llm", "serving", {"service": "vllm", **FAST})
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await keda.poll()
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "403" in (err.value.details() or "")


async def test_missing_service_is_unavailable_not_zero(kube: tuple[FakeKube, FakeKubeServer, Path]) -> None:
    _, api, token = kube
    async with running_scaler(kube_api_url=api.url, kube_token_file=token) as server, channel_to(server) as ch:
        keda = KedaEmulator(ch, "llm", "serving", {"service": "typo", **FAST})
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await keda.poll()
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "does not exist" in (err.value.details() or "")
        empty = KedaEmulator(ch, "llm", "serving", {"service": "empty", **FAST})
        assert (await empty.poll()).value == 0.0


async def test_cross_namespace_is_refused_unless_enabled(kube: tuple[FakeKube, FakeKubeServer, Path]) -> None:
    _, api, token = kube
    async with running_scaler(kube_api_url=api.url, kube_token_file=token) as server, channel_to(server) as ch:
        keda = KedaEmulator(ch, "llm", "other", {"service": "serving/vllm", **FAST})
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await keda.stub.GetMetricSpec(keda.ref)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    async with running_scaler(kube_api_url=api.url, kube_token_file=token, allow_cross_namespace=True) as server, \
            channel_to(server) as ch:
        keda = KedaEmulator(ch, "llm", "other", {"service": "serving/vllm", **FAST})
        assert len((await keda.stub.GetMetricSpec(keda.ref)).metricSpecs) == 1
