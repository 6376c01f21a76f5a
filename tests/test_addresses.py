"""Address safety: every spelling of a refused address is refused, names are checked on what they resolve
to when the scrape connects, and errors do not leak addresses or query strings."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from keda_llm_scaler._proto import externalscaler_pb2 as pb
from keda_llm_scaler._proto import externalscaler_pb2_grpc as pb_grpc
from keda_llm_scaler.addresses import AddressPolicy, normalize_host, parse_networks, redact, refusal, set_policy
from keda_llm_scaler.errors import BadMetadata
from keda_llm_scaler.metadata import parse_trigger
from keda_llm_scaler.scrape import Scraper
from keda_llm_scaler.sim.keda import KedaEmulator
from keda_llm_scaler.testing.payloads import EngineLoad, vllm_v1
from keda_llm_scaler.testing.replicas import dead_port, replicas, unused_port
from keda_llm_scaler.testing.scalerproc import channel_to, running_scaler

METADATA_SPELLINGS = [
    "169.254.169.254",
    "2852039166",  # decimal
    "0xa9fea9fe",  # hex
    "0251.0376.0251.0376",  # octal
    "169.254.43518",  # short form
    "169。254。169。254",  # ideographic full stops (IDNA maps them to dots)
    "169\uff0e254\uff0e169\uff0e254",  # full-width full stops
    "[::ffff:169.254.169.254]",
    "[fe80::1]",
    "[fd00:ec2::254]",  # AWS IMDS over IPv6
    "metadata.google.internal",
    "METADATA.GOOGLE.INTERNAL.",
    "0",  # 0.0.0.0 connects to this host
    # IPv6 forms that embed the IPv4 metadata address (issue #23)
    "[::169.254.169.254]",  # IPv4-compatible
    "[::a9fe:a9fe]",
    "[2002:a9fe:a9fe::1]",  # 6to4
    "[2001:0:4136:e378:8000:63bf:5601:5601]",  # Teredo, client 169.254.169.254 (bits inverted)
    "[64:ff9b::169.254.169.254]",  # NAT64 well-known prefix
    "[64:ff9b:1:a9fe:a9:fe00::]",  # NAT64 local-use /48 (RFC 6052)
    "[fe80::1%25eth0]",  # a zone id
]


@pytest.mark.parametrize("host", METADATA_SPELLINGS)
def test_every_spelling_of_a_metadata_address_is_refused_in_metadata(host: str) -> None:
    assert refusal(host) is not None
    with pytest.raises(BadMetadata, match="endpoints"):
        parse_trigger("serving", "llm", {"endpoints": f"http://{host}:8000"})
    bare = host.strip("[]")
    if ":" not in bare:
        with pytest.raises(BadMetadata, match="dnsName"):
            parse_trigger("serving", "llm", {"dnsName": bare})


def test_ordinary_hosts_pass_and_normalise() -> None:
    assert normalize_host("127.1") == "127.0.0.1" and refusal("127.1") is None
    assert normalize_host("bücher.example") == "xn--bcher-kva.example"
    for host in ("10.0.0.7", "vllm-0.vllm-headless.serving.svc.cluster.local", "[fd00::7]"):
        assert refusal(host) is None, host
    assert redact("http://u:p@10.0.0.7:8000/metrics?token=s3cret") == "http://10.0.0.7:8000/metrics?…"


async def test_a_name_resolving_to_a_metadata_address_is_never_connected(monkeypatch: pytest.MonkeyPatch) -> None:
    # the check happens on the resolved address, at connect time: no time-of-check/time-of-use gap
    real = socket.getaddrinfo
    port = unused_port()

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "evil.example":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", port))]
        if host == "mixed.example":
            return [
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", port)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
            ]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    s = Scraper()
    try:
        res = await s.scrape(f"http://evil.example:{port}/metrics", timeout=2, engine="auto", model=None)
        assert res.reason == "refused_address" and "evil.example" in res.detail
        with replicas(vllm_v1([EngineLoad(1, 2, 0.3)])) as (r,):
            # an answer with one refused and one allowed address: only the allowed one is connected to
            res = await s.scrape(f"http://mixed.example:{r.port}/metrics", timeout=2, engine="auto", model=None)
            assert res.reason is None and res.signals is not None and r.requests == 1
    finally:
        await s.aclose()


async def test_unavailable_answers_name_reasons_not_addresses() -> None:
    # an unauthenticated gRPC port must not tell a tenant which internal addresses answer
    secret = "s3cret-token"
    urls = [f"http://127.0.0.1:{dead_port()}/metrics?token={secret}" for _ in range(3)]
    async with running_scaler() as scaler, channel_to(scaler) as ch:
        keda = KedaEmulator(ch, "llm", "serving", {"endpoints": ",".join(urls), "scrapeInterval": "0.5"})
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await keda.poll()
    details = err.value.details() or ""
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "127.0.0.1" not in details and secret not in details
    assert "3 connect_error" in details, details


LOOPBACK_SPELLINGS = ["127.0.0.1", "127.1", "2130706433", "0x7f000001", "0177.0.0.1", "127.8.9.10", "[::1]",
                      "[::ffff:127.0.0.1]"]  # fmt: skip


@pytest.fixture
def refuse_loopback() -> Iterator[None]:
    previous = set_policy(AddressPolicy(refuse=parse_networks("loopback", "--refuse-networks")))
    yield
    set_policy(previous)


@pytest.mark.parametrize("host", LOOPBACK_SPELLINGS)
def test_refused_networks_cover_every_spelling(host: str, refuse_loopback: None) -> None:
    why = refusal(host)
    assert why is not None and "--refuse-networks" in why
    with pytest.raises(BadMetadata) as err:
        parse_trigger("serving", "llm", {"endpoints": f"http://{host}:8000/metrics"})
    assert err.value.key == "endpoints"


def test_without_the_flag_loopback_is_allowed_and_the_allow_list_confines() -> None:
    assert all(refusal(h) is None for h in LOOPBACK_SPELLINGS)  # the laptop demo scrapes loopback
    previous = set_policy(AddressPolicy(allow=parse_networks("10.244.0.0/16, fd00:10:244::/56", "--allow-networks")))
    try:
        assert refusal("10.244.3.7") is None and refusal("fd00:10:244::5") is None
        assert "outside --allow-networks" in (refusal("10.96.0.1") or "")  # a ClusterIP, not a pod
        assert "outside --allow-networks" in (refusal("2130706433") or "")
    finally:
        set_policy(previous)


def test_network_aliases_and_bad_networks() -> None:
    private = parse_networks("private", "--refuse-networks")
    assert {str(n) for n in private} >= {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"}
    assert parse_networks(" , ", "--refuse-networks") == ()
    for bad in ("10.0.0.0/33", "pods", "10.0.0.0/8;rm"):
        with pytest.raises(ValueError, match="--refuse-networks"):
            parse_networks(bad, "--refuse-networks")


async def test_a_name_resolving_into_a_refused_network_is_never_connected(refuse_loopback: None) -> None:
    # metadata can only check literals; "localhost" passes it and is refused where the scrape connects
    with replicas(vllm_v1([EngineLoad(1, 2, 0.3)])) as (r,):
        s = Scraper()
        try:
            res = await s.scrape(f"http://localhost:{r.port}/metrics", timeout=2, engine="auto", model=None)
        finally:
            await s.aclose()
        assert res.reason == "refused_address" and "--refuse-networks" in res.detail
        assert r.requests == 0


async def test_serve_with_refused_loopback_answers_invalid_argument_naming_the_key() -> None:
    with replicas(vllm_v1([EngineLoad(1, 2, 0.3)])) as (r,):
        async with running_scaler(refuse_networks="loopback") as scaler, channel_to(scaler) as ch:
            keda = KedaEmulator(ch, "llm", "serving", {"endpoints": r.url})
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await keda.poll()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "endpoints" in (err.value.details() or "")
        assert r.requests == 0
    assert refusal("127.0.0.1") is None  # the policy is the server's: it ends with it


async def test_embedded_and_port_zero_forms_are_invalid_argument_through_grpc() -> None:
    # through the running server, as KEDA calls it: the refusal names the key
    forms = [f"http://{h}:8000" for h in METADATA_SPELLINGS if h.startswith("[") and "::" in h]
    forms += ["http://10.0.0.7:0", "http://[fd00::7]:0"]
    async with running_scaler() as server, channel_to(server) as ch:
        stub = pb_grpc.ExternalScalerStub(ch)
        for url in forms:
            ref = pb.ScaledObjectRef(name="llm", namespace="serving", scalerMetadata={"endpoints": url})
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.GetMetricSpec(ref)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, url
            assert "'endpoints'" in (err.value.details() or ""), url
        assert server.registry.targets() == []


@pytest.mark.parametrize("spelling", ["2130706433", "0177.0.0.1", "127.1", "127.0.0.1.", "0x7f.1"])
async def test_a_legacy_loopback_spelling_scrapes_the_address_it_means(spelling: str) -> None:
    # before: accepted in metadata (checked as 127.0.0.1) but scraped as spelled, so every scrape failed
    with replicas(vllm_v1([EngineLoad(waiting=0, running=2, kv=0.2)])) as (r,):
        cfg = parse_trigger("serving", "llm", {"endpoints": f"http://{spelling}:{r.port}"})
        assert cfg.discovery.endpoints == (f"http://127.0.0.1:{r.port}/metrics",)
        async with running_scaler() as server, channel_to(server) as ch:
            keda = KedaEmulator(ch, "llm", "serving", {"endpoints": f"http://{spelling}:{r.port}"})
            assert (await keda.poll()).value >= 0
            assert r.requests >= 1
