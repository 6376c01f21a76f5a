"""Names that cannot hurt (issue #23, item 2): a ScaledObjectRef's ``name`` and ``namespace`` are checked
as Kubernetes checks them before any target, series or log line exists, and the refusal quotes only a
short prefix. Through the real gRPC server, as KEDA would call it."""

from __future__ import annotations

import grpc
import pytest
import structlog.testing
from prometheus_client import generate_latest

from keda_llm_scaler._proto import externalscaler_pb2 as pb
from keda_llm_scaler._proto import externalscaler_pb2_grpc as pb_grpc
from keda_llm_scaler.metadata import check_object_ref
from keda_llm_scaler.testing.scalerproc import channel_to, running_scaler

META = {"endpoints": "http://127.0.0.1:9/metrics"}
LONGEST_LINE = 1024


@pytest.mark.parametrize(
    ("namespace", "name", "key"),
    [
        ("serving", "x" * 1_000_000, "name"),
        ("serving", "a" * 20_000, "name"),
        ("serving", "llm\nINFO forged log line", "name"),
        ("serving", "LLM", "name"),
        ("serving", "", "name"),
        ("serving", "a" * 254, "name"),
        ("n" * 64, "llm", "namespace"),
        ("serving/other", "llm", "namespace"),
        ("", "llm", "namespace"),
    ],
    ids=["1MB", "20k", "newline", "uppercase", "empty", "254", "ns-64", "ns-slash", "ns-empty"],
)
async def test_a_name_kubernetes_would_refuse_is_invalid_argument_and_leaves_nothing(
    namespace: str, name: str, key: str
) -> None:
    ref = pb.ScaledObjectRef(name=name, namespace=namespace, scalerMetadata=META)
    with structlog.testing.capture_logs() as logs:
        async with running_scaler() as server, channel_to(server) as ch:
            stub = pb_grpc.ExternalScalerStub(ch)
            calls = [
                stub.GetMetricSpec(ref),
                stub.IsActive(ref),
                stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref, metricName="llm_composite")),
                stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref, metricName="nope")),
            ]
            for call in calls:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                details = err.value.details() or ""
                assert f"ScaledObjectRef {key} " in details
                assert len(details.encode()) < 300, details
            stream = stub.StreamIsActive(ref)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stream.read()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert server.registry.targets() == []
            exposition = generate_latest(server.metrics.registry).decode()
    assert max(len(line) for line in exposition.splitlines()) <= LONGEST_LINE
    assert "\nINFO forged" not in exposition
    for event in logs:
        assert len(repr(event)) <= LONGEST_LINE, repr(event)[:200]


@pytest.mark.parametrize(
    ("namespace", "name"),
    [("serving", "llm"), ("a" * 63, "b" * 253), ("ns-1", "my.scaled-object.v2"), ("0", "9")],
)
def test_names_kubernetes_accepts_pass(namespace: str, name: str) -> None:
    check_object_ref(namespace, name)


VALUE_KEYS = [
    "endpoints", "dnsName", "service", "metricsPath", "engine", "workloadClass", "targetQueueDepth", "targetKvUsage",
    "targetUtilization", "targetValue", "activationThreshold", "scrapeInterval", "scrapeTimeout", "staleAfter",
    "ttftSloSeconds", "ttftSloQuantile", "replicaCapacity", "startupSeconds", "startupBudgetSeconds", "demandWindow",
]  # fmt: skip


async def test_a_refused_metadata_value_is_quoted_by_a_short_prefix() -> None:
    # before: the whole value was quoted (a 200 KB value made a 200 KB reply, past gRPC's metadata limit,
    # which KEDA would have seen as RESOURCE_EXHAUSTED instead of the reason)
    async with running_scaler() as server, channel_to(server) as ch:
        stub = pb_grpc.ExternalScalerStub(ch)
        for key in VALUE_KEYS:
            for value in ("x" * 200_000, "é" * 100_000, "\U0001f600" * 50_000, "http://" + "a" * 200_000 + ":80"):
                meta = {"endpoints": "http://127.0.0.1:9"} if key not in ("endpoints", "dnsName", "service") else {}
                meta[key] = value
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.GetMetricSpec(pb.ScaledObjectRef(name="llm", namespace="serving", scalerMetadata=meta))
                details = err.value.details() or ""
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (key, details[:200])
                assert f"'{key}'" in details and len(details.encode()) < 300, (key, len(details.encode()))
        # a key name of 300,000 characters is quoted the same way
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetMetricSpec(
                pb.ScaledObjectRef(name="llm", namespace="serving", scalerMetadata={"k" * 300_000: "v"})
            )
        assert len((err.value.details() or "").encode()) < 300
