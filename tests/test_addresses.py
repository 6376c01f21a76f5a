"""Address safety: every spelling of a refused address is refused, names are checked on what they resolve
to when the scrape connects, and errors do not leak addresses or query strings."""

from __future__ import annotations

import socket
from typing import Any

import grpc
import pytest

from keda_llm_scaler.addresses import normalize_host, redact, refusal
from keda_llm_scaler.errors import BadMetadata
from keda_llm_scaler.metadata import parse_trigger
from keda_llm_scaler.scrape import Scraper
from keda_llm_scaler.sim.keda import KedaEmulator
from tests.payloads import EngineLoad, vllm_v1
from tests.replicas import replicas, unused_port
from tests.scalerproc import channel_to, running_scaler

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
    urls = [f"http://127.0.0.1:{unused_port()}/metrics?token={secret}" for _ in range(3)]
    async with running_scaler() as scaler, channel_to(scaler) as ch:
        keda = KedaEmulator(ch, "llm", "serving", {"endpoints": ",".join(urls), "scrapeInterval": "0.5"})
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await keda.poll()
    details = err.value.details() or ""
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "127.0.0.1" not in details and secret not in details
    assert "3 connect_error" in details, details
