"""A client that calls the scaler the way the KEDA operator does (KEDA-EXTERNAL-SCALER.md §3, §16).

One shared channel per address; the same ScaledObjectRef on every call; the poll sequence
(GetMetricSpec, then GetMetrics + IsActive per spec, no deadline) and the HPA sequence (the same
three under one 3 s deadline); after an error, one immediate retry.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import grpc

from keda_llm_scaler._proto import externalscaler_pb2 as pb
from keda_llm_scaler._proto import externalscaler_pb2_grpc as pb_grpc


@dataclass
class Observation:
    spec_name: str
    target: float
    value: float
    active: bool
    elapsed_s: float


class KedaEmulator:
    def __init__(self, channel: grpc.aio.Channel, name: str, namespace: str, metadata: Mapping[str, str]):
        self.stub = pb_grpc.ExternalScalerStub(channel)  # type: ignore[no-untyped-call]
        self.ref = pb.ScaledObjectRef(
            name=name, namespace=namespace, scalerMetadata={"scalerAddress": "llm-scaler.keda:9090", **metadata}
        )

    async def _once(self, timeout: float | None) -> Observation:
        start = time.perf_counter()
        deadline = None if timeout is None else start + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.perf_counter())

        spec = await self.stub.GetMetricSpec(self.ref, timeout=left())
        assert len(spec.metricSpecs) >= 1
        value, active = 0.0, False
        for s in spec.metricSpecs:
            metrics = await self.stub.GetMetrics(
                pb.GetMetricsRequest(scaledObjectRef=self.ref, metricName=s.metricName), timeout=left()
            )
            assert len(metrics.metricValues) == 1
            v = metrics.metricValues[0]
            value = v.metricValueFloat if v.metricValueFloat > 0 else float(v.metricValue)
            active = (await self.stub.IsActive(self.ref, timeout=left())).result
        s0 = spec.metricSpecs[0]
        return Observation(s0.metricName, s0.targetSizeFloat, value, active, time.perf_counter() - start)

    async def _with_retry(self, timeout: float | None) -> Observation:
        try:
            return await self._once(timeout)
        except grpc.aio.AioRpcError:
            return await self._once(timeout)  # KEDA rebuilds the scaler and retries once

    async def poll(self) -> Observation:
        """The operator's scale loop: no deadline."""
        return await self._with_retry(None)

    async def hpa(self) -> Observation:
        """The metrics adapter's path: one 3 s deadline over everything."""
        return await self._with_retry(3.0)
