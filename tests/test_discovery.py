"""Discovery: DNS (all A/AAAA records) and Kubernetes EndpointSlices through a fake API server,
end to end through the gRPC API."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
import structlog.testing

from keda_llm_scaler.discovery import DiscoveryError, DnsResolver
from keda_llm_scaler.metadata import Discovery, parse_trigger
from keda_llm_scaler.sim.keda import KedaEmulator
from keda_llm_scaler.sim.kubeapi import Endpoint, FakeKube, FakeKubeServer
from keda_llm_scaler.testing.dnsserver import DnsServer, Zone
from keda_llm_scaler.testing.payloads import EngineLoad, vllm_v1
from keda_llm_scaler.testing.replicas import Replica, unused_port
from keda_llm_scaler.testing.scalerproc import channel_to, running_scaler
from tests.test_server_keda import eventually


async def value_is(keda: KedaEmulator, value: float) -> bool:
    try:
        return (await keda.poll()).value == value
    except grpc.aio.AioRpcError:
        return False


FAST = {"scrapeInterval": "0.5", "scrapeTimeout": "0.4", "staleAfter": "1.5"}
AT_TARGET = vllm_v1([EngineLoad(0, 30, 0.85)])


async def unavailable_because(keda: KedaEmulator, reason: str) -> bool:
    """True once the GetMetrics answer is UNAVAILABLE for ``reason``; a value is a failure."""
    try:
        observed = await keda.poll()
    except grpc.aio.AioRpcError as exc:
        return exc.code() == grpc.StatusCode.UNAVAILABLE and reason in (exc.details() or "")
    raise AssertionError(f"answered {observed.value} instead of UNAVAILABLE ({reason})")


@pytest.fixture
async def dns_server() -> AsyncIterator[DnsServer]:
    async with DnsServer(Zone()) as server:
        yield server


def dns_trigger(name: str, port: int = 8123) -> Discovery:
    return parse_trigger("serving", "llm", {"dnsName": name, "port": str(port)}).discovery


async def test_dns_resolves_every_address(dns_server: DnsServer) -> None:
    dns_server.zone.records["vllm.serving.svc.cluster.local"] = ["10.1.0.3", "10.1.0.2", "10.1.0.2", "fd00::5"]
    resolver = DnsResolver(dns_trigger("vllm.serving.svc.cluster.local"), nameservers=dns_server.nameservers)
    urls = (await resolver.resolve()).urls
    assert urls == ["http://10.1.0.2:8123/metrics", "http://10.1.0.3:8123/metrics", "http://[fd00::5]:8123/metrics"]


async def test_dns_name_without_records_is_an_empty_fleet_not_an_error(dns_server: DnsServer) -> None:
    dns_server.zone.records["empty.serving.svc.cluster.local"] = []  # the name exists: NOERROR, no answer
    resolver = DnsResolver(dns_trigger("empty.serving.svc.cluster.local"), nameservers=dns_server.nameservers)
    assert (await resolver.resolve()).urls == []


async def test_a_dns_name_that_does_not_exist_is_an_error_not_an_empty_fleet(dns_server: DnsServer) -> None:
    # a typo in dnsName used to read as an idle fleet: with minReplicaCount 0, production scaled to zero
    resolver = DnsResolver(dns_trigger("vllm-typo.serving.svc.cluster.local"), nameservers=dns_server.nameservers)
    with pytest.raises(DiscoveryError, match=r"vllm-typo\.serving\.svc\.cluster\.local does not exist \(NXDOMAIN\)"):
        await resolver.resolve()
    with pytest.raises(DiscoveryError, match="NXDOMAIN"):  # every cycle, not only the first
        await resolver.resolve()


async def test_a_name_that_resolved_then_lost_its_records_is_a_fleet_of_zero(dns_server: DnsServer) -> None:
    # cluster DNS answers NXDOMAIN for a headless Service with no ready pods (Kubernetes DNS spec)
    name = "vllm.serving.svc.cluster.local"
    dns_server.zone.records[name] = ["10.1.0.2"]
    resolver = DnsResolver(dns_trigger(name), nameservers=dns_server.nameservers)
    assert len((await resolver.resolve()).urls) == 1
    del dns_server.zone.records[name]
    assert (await resolver.resolve()).urls == []


async def test_a_dns_server_that_never_answers_times_out_within_the_budget(dns_server: DnsServer) -> None:
    dns_server.zone.hang.add("hung.serving.svc.cluster.local")
    resolver = DnsResolver(
        dns_trigger("hung.serving.svc.cluster.local"), timeout_s=0.5, nameservers=dns_server.nameservers
    )
    lookup = asyncio.ensure_future(resolver.resolve())
    # generous: the lookup's own lifetime is 0.5 s; the point is that it ends, with a reason
    done, _ = await asyncio.wait({lookup}, timeout=10.0)
    assert done, "a DNS lookup with no answer never ended"
    with pytest.raises(DiscoveryError, match=r"timed out after 0\.5 s"):
        lookup.result()


async def test_dns_discovery_end_to_end_never_reads_a_typo_as_zero(
    dns_server: DnsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("keda_llm_scaler.discovery.DNS_NAMESERVERS", dns_server.nameservers)
    port = unused_port()
    started = [Replica(AT_TARGET, host=f"127.0.0.{i}", port=port) for i in (2, 3)]
    dns_server.zone.records["vllm.serving.svc.cluster.local"] = ["127.0.0.2", "127.0.0.3"]
    try:
        async with running_scaler() as scaler, channel_to(scaler) as ch:
            meta = {"port": str(port), **FAST}
            good = KedaEmulator(ch, "good", "serving", {"dnsName": "vllm.serving.svc.cluster.local", **meta})
            typo = KedaEmulator(ch, "typo", "serving", {"dnsName": "vlm.serving.svc.cluster.local", **meta})
            await eventually(lambda: value_is(good, 2.0), timeout=15.0)
            await eventually(lambda: unavailable_because(typo, "NXDOMAIN"), timeout=15.0)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await typo.stub.IsActive(typo.ref)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE  # never "false": no scale to zero on a typo
            # the good fleet's pods all go unready: cluster DNS now says NXDOMAIN, and that is zero
            del dns_server.zone.records["vllm.serving.svc.cluster.local"]
            await eventually(lambda: value_is(good, 0.0), timeout=15.0)
    finally:
        for r in started:
            r.close()


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
        state.services[("serving", "vllm")] = [
            Endpoint(fleet[0].host, ready=False),
            Endpoint(fleet[1].host),
            Endpoint(fleet[2].host, ready=None),
        ]
        await eventually(lambda: value_is(keda, 2.0))  # the watch delivers the change; budget: a busy machine
        # zero ready pods is a legitimate 0, not missing data (C13)
        state.services[("serving", "vllm")] = []
        await eventually(lambda: value_is(keda, 0.0))
        obs = await keda.poll()
        assert (obs.value, obs.active) == (0.0, False)
        assert any(
            "labelSelector=kubernetes.io%2Fservice-name%3Dvllm" in r
            or "labelSelector=kubernetes.io/service-name=vllm" in r
            for r in state.requests
        )


@pytest.mark.parametrize("status", [401, 403, 500])
async def test_api_errors_keep_the_last_fleet(
    status: int, fleet: list[Replica], kube: tuple[FakeKube, FakeKubeServer, Path]
) -> None:
    state, api, token = kube
    async with running_scaler(kube_api_url=api.url, kube_token_file=token) as server, channel_to(server) as ch:
        keda = KedaEmulator(ch, "llm", "serving", {"service": "vllm", "port": str(fleet[0].port), **FAST})
        assert (await keda.poll()).value == 3.0
        if status == 401:
            state.token = "rotated"
        else:
            state.fail_status = status
        state.drop_watches()  # the open watch would carry on; its reconnect meets the failure

        async def degraded() -> bool:
            # a watch still opening at the failure (the first poll answers from the list) was let in before
            # it and starts past the drop: it carries on for its timeout (once in CI, 30 s in vain). Cut it
            # again until a reconnect meets the failure
            state.drop_watches()
            snap = server.registry.targets()[0].snapshot
            return snap is not None and f"HTTP {status}" in (snap.discovery_error or "")

        await eventually(degraded, timeout=30.0)  # a watch's reconnect, then its back-off: a busy machine
        assert (await keda.poll()).value == 3.0  # the API failing is not the fleet vanishing


async def test_never_resolved_is_unavailable(kube: tuple[FakeKube, FakeKubeServer, Path]) -> None:
    state, api, token = kube
    state.fail_status = 403
    with structlog.testing.capture_logs() as logs:
        async with running_scaler(kube_api_url=api.url, kube_token_file=token) as server, channel_to(server) as ch:
            keda = KedaEmulator(ch, "llm", "serving", {"service": "vllm", **FAST})
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await keda.poll()
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "403" in (err.value.details() or "")
            target = server.registry.targets()[0]
            first = target.snapshot.cycle if target.snapshot else 0

            async def four_more_cycles() -> bool:
                return target.snapshot is not None and target.snapshot.cycle >= first + 4

            await eventually(four_more_cycles, timeout=15.0)
            # a fleet never discovered has no size to show: no replica or member samples, never 0
            labels = {"namespace": "serving", "scaledobject": "llm", "target": target.id}
            get = server.metrics.registry.get_sample_value
            assert get("llm_scaler_target_up", labels) == 0.0
            assert get("llm_scaler_members", {**labels, "phase": "ready"}) is None
            assert get("llm_scaler_replicas", {**labels, "state": "fresh"}) is None
            # and answers without data are one warning too: KEDA neither acts on such a target nor takes it to zero
            for _ in range(3):
                with pytest.raises(grpc.aio.AioRpcError):
                    await keda.poll()
    # the same 403 on every cycle is one warning, not one per cycle
    assert len([e for e in logs if e["event"] == "discovery_failed"]) == 1
    unanswered = [e for e in logs if e["event"] == "answers_unavailable"]
    assert len(unanswered) == 1 and "403" in unanswered[0]["error"], unanswered


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
    async with (
        running_scaler(kube_api_url=api.url, kube_token_file=token, allow_cross_namespace=True) as server,
        channel_to(server) as ch,
    ):
        keda = KedaEmulator(ch, "llm", "other", {"service": "serving/vllm", **FAST})
        assert len((await keda.stub.GetMetricSpec(keda.ref)).metricSpecs) == 1


def _pod(
    name: str, ip: str | None, ready: bool, labels: dict[str, str], *, terminating: bool = False, port: int = 8000
) -> dict[str, object]:
    meta: dict[str, object] = {"name": name, "namespace": "serving", "labels": labels, "uid": f"uid-{name}"}
    if terminating:
        meta["deletionTimestamp"] = "2026-11-29T12:00:00Z"
    status: dict[str, object] = {
        "phase": "Running" if ip else "Pending",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    if ip:
        status["podIP"] = ip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": "vllm", "ports": [{"name": "http", "containerPort": port}]}]},
        "status": status,
    }


def _zero_config_cluster(state: FakeKube, fleet: list[Replica]) -> None:
    labels = {"app.kubernetes.io/name": "vllm-llama"}
    state.scaled_objects[("serving", "llm")] = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "llm", "namespace": "serving"},
        "spec": {
            "scaleTargetRef": {"name": "vllm-llama"},  # apiVersion/kind default: apps/v1 Deployment
            "triggers": [{"type": "external", "metadata": {"scalerAddress": "scaler:9090"}}],
        },
    }
    state.workloads[("serving", "deployments", "vllm-llama")] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "vllm-llama", "namespace": "serving"},
        "spec": {
            "replicas": 5,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "vllm", "ports": [{"name": "http", "containerPort": fleet[0].port}]}]},
            },
        },
    }
    state.pods["serving"] = [
        *(_pod(f"vllm-{i}", r.host, True, labels, port=r.port) for i, r in enumerate(fleet)),
        _pod("vllm-starting", "127.0.0.9", False, labels),  # scheduled, model still loading
        _pod("vllm-pending", None, False, labels),  # no IP yet
        _pod("vllm-old", "127.0.0.8", True, labels, terminating=True),
        _pod("other", "127.0.0.7", True, {"app.kubernetes.io/name": "other"}),
    ]


async def test_zero_config_discovery_from_scale_target_ref(
    fleet: list[Replica], kube: tuple[FakeKube, FakeKubeServer, Path]
) -> None:
    state, api, token = kube
    _zero_config_cluster(state, fleet)
    async with running_scaler(kube_api_url=api.url, kube_token_file=token) as server, channel_to(server) as ch:
        keda = KedaEmulator(ch, "llm", "serving", FAST)  # no discovery key at all
        assert (await keda.poll()).value == 3.0  # three ready pods at target; starting ones not scraped
        snap = server.registry.targets()[0].snapshot
        assert snap is not None and snap.starting == 2
        assert {r.url for r in snap.evaluation.replicas} == {f"http://{r.host}:{r.port}/metrics" for r in fleet}
        for r in fleet:  # saturate: the excess over 3 ready replicas is discounted by the 2 starting
            r.set(payload=vllm_v1([EngineLoad(60, 30, 0.85)]))  # each: KV 1 + its backlog's one replica
        await asyncio.sleep(1.2)
        assert (await keda.poll()).value == pytest.approx(3 + max(3 * 1.0 - 2, 2), abs=0.01)  # 6 without
        paths = [p.split("?")[0] for p in state.requests]
        assert "/apis/keda.sh/v1alpha1/namespaces/serving/scaledobjects/llm" in paths
        assert "/apis/apps/v1/namespaces/serving/deployments/vllm-llama" in paths


async def test_zero_config_errors_are_unavailable(kube: tuple[FakeKube, FakeKubeServer, Path]) -> None:
    _, api, token = kube
    async with running_scaler(kube_api_url=api.url, kube_token_file=token) as server, channel_to(server) as ch:
        keda = KedaEmulator(ch, "missing", "serving", FAST)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await keda.poll()
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "ScaledObject serving/missing not found" in (err.value.details() or "")


async def test_api_calls_are_shared_and_cached(
    fleet: list[Replica], kube: tuple[FakeKube, FakeKubeServer, Path]
) -> None:
    state, api, token = kube
    _zero_config_cluster(state, fleet)
    async with running_scaler(kube_api_url=api.url, kube_token_file=token) as server, channel_to(server) as ch:
        # two triggers on the same ScaledObject (different thresholds): two targets, one set of API calls
        a = KedaEmulator(ch, "llm", "serving", FAST)
        b = KedaEmulator(ch, "llm", "serving", {**FAST, "activationThreshold": "0.5"})
        await a.poll()
        await b.poll()
        await asyncio.sleep(4.0)  # 8 scrape cycles per target
        pods = [p for p in state.requests if p.startswith("/api/v1/namespaces/serving/pods")]
        # one list, then one watch that stays open: no request per cycle, none per target
        assert len([p for p in pods if "watch=true" not in p]) == 1
        assert len([p for p in pods if "watch=true" in p]) == 1
        assert len(server.registry.targets()) == 2 and len(server.registry.fleets()) == 1


async def test_slow_api_keeps_the_last_fleet(fleet: list[Replica], kube: tuple[FakeKube, FakeKubeServer, Path]) -> None:
    state, api, token = kube
    async with running_scaler(kube_api_url=api.url, kube_token_file=token) as server, channel_to(server) as ch:
        keda = KedaEmulator(ch, "llm", "serving", {"service": "vllm", "port": str(fleet[0].port), **FAST})
        assert (await keda.poll()).value == 3.0
        state.delay_s = 6.0  # longer than the client's 5 s timeout
        state.drop_watches()

        async def timed_out() -> bool:
            state.drop_watches()  # a watch still opening at the change starts past the first drop (above)
            snap = server.registry.targets()[0].snapshot
            return snap is not None and "no answer within 5 s" in (snap.discovery_error or "")

        await eventually(timed_out, timeout=20.0)  # the reconnect hangs for 5 s first
        assert (await keda.poll()).value == 3.0  # the last known members are still scraped
        state.delay_s = 0.0


def test_kubeconfig_token_and_ca(tmp_path: Path) -> None:
    import base64

    from keda_llm_scaler.kube import KubeConfig

    ca = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()
    (tmp_path / "config").write_text(f"""
apiVersion: v1
kind: Config
current-context: dev
contexts:
- name: dev
  context: {{cluster: kind, user: me}}
clusters:
- name: kind
  cluster: {{server: "https://127.0.0.1:6443/", certificate-authority-data: {ca}}}
users:
- name: me
  user: {{token: abc123}}
""")
    cfg = KubeConfig.from_kubeconfig(tmp_path / "config")
    assert cfg.api_url == "https://127.0.0.1:6443" and cfg.token == "abc123"
    assert cfg.ca_file is not None and cfg.ca_file.read_bytes().startswith(b"-----BEGIN CERTIFICATE")
    (tmp_path / "exec").write_text(
        (tmp_path / "config").read_text().replace("user: {token: abc123}", "user: {exec: {command: aws}}")
    )
    from keda_llm_scaler.kube import KubeError

    with pytest.raises(KubeError, match="exec/auth-provider"):
        KubeConfig.from_kubeconfig(tmp_path / "exec")


async def test_a_cancelled_caller_does_not_cancel_the_shared_request(
    kube: tuple[FakeKube, FakeKubeServer, Path],
) -> None:
    from keda_llm_scaler.kube import KubeClient, KubeConfig

    state, api, token = kube
    state.delay_s = 0.5
    client = KubeClient(KubeConfig(api.url, token))
    try:
        first = asyncio.create_task(client.get_service("serving", "vllm"))
        second = asyncio.create_task(client.get_service("serving", "vllm"))
        await asyncio.sleep(0.1)
        first.cancel()  # e.g. its target was evicted
        service = await second
        assert service is not None and client.requests == 1
        assert first.cancelled()
    finally:
        state.delay_s = 0.0
        await client.aclose()
