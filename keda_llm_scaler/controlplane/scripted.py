"""An ExternalScaler that serves a scripted composite series and records every GetMetrics call.

The end-to-end comparison of the replay's HPA emulation (``keda_llm_scaler.sim.hpa``) with the real HPA
controller puts this behind KEDA: the metrics adapter calls GetMetrics once per HPA sync, so the recorded
calls are the syncs, at the times the controller made them, with the values it read. Replaying those
readings through the emulation gives what it would have decided at the same instants: any difference is
the emulation's arithmetic, not timing.
"""

from __future__ import annotations

import bisect
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc

from keda_llm_scaler._proto import externalscaler_pb2 as pb
from keda_llm_scaler._proto import externalscaler_pb2_grpc as pb_grpc

__all__ = ["Call", "Script", "ScriptedScaler"]

METRIC = "composite"


@dataclass(frozen=True, slots=True)
class Call:
    t: float  # monotonic seconds
    value: float


@dataclass
class Script:
    """A step function: ``steps[i] = (seconds after begin, value)``; before ``begin`` the first value."""

    steps: list[tuple[float, float]]
    began: float | None = None
    calls: list[Call] = field(default_factory=list)

    def value(self, now: float) -> float:
        if self.began is None:
            return self.steps[0][1]
        i = bisect.bisect_right([s for s, _ in self.steps], now - self.began) - 1
        return self.steps[max(i, 0)][1]

    @property
    def duration(self) -> float:
        return self.steps[-1][0]


class _Servicer(pb_grpc.ExternalScalerServicer):
    def __init__(self, scripts: dict[str, Script], lock: threading.Lock) -> None:
        self._scripts, self._lock = scripts, lock

    def _script(self, ref: pb.ScaledObjectRef, context: grpc.ServicerContext) -> Script:
        with self._lock:
            script = self._scripts.get(f"{ref.namespace}/{ref.name}")
        if script is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no script for {ref.namespace}/{ref.name}")
        assert script is not None
        return script

    def IsActive(self, request: pb.ScaledObjectRef, context: grpc.ServicerContext) -> pb.IsActiveResponse:
        self._script(request, context)
        return pb.IsActiveResponse(result=True)

    def GetMetricSpec(self, request: pb.ScaledObjectRef, context: grpc.ServicerContext) -> pb.GetMetricSpecResponse:
        self._script(request, context)
        return pb.GetMetricSpecResponse(
            metricSpecs=[pb.MetricSpec(metricName=METRIC, targetSize=1, targetSizeFloat=1.0)]
        )

    def GetMetrics(self, request: pb.GetMetricsRequest, context: grpc.ServicerContext) -> pb.GetMetricsResponse:
        script = self._script(request.scaledObjectRef, context)
        now = time.monotonic()
        with self._lock:
            value = script.value(now)
            script.calls.append(Call(now, value))
        # the integer field too: KEDA reads the float only when it is set, older releases only the int
        metric = pb.MetricValue(
            metricName=request.metricName or METRIC, metricValue=round(value), metricValueFloat=value
        )
        return pb.GetMetricsResponse(metricValues=[metric])

    def StreamIsActive(self, request: pb.ScaledObjectRef, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "external trigger only")


class ScriptedScaler:
    """A real gRPC server (``address``) serving one :class:`Script` per ScaledObject (``namespace/name``)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._lock = threading.Lock()
        self.scripts: dict[str, Script] = {}
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        pb_grpc.add_ExternalScalerServicer_to_server(_Servicer(self.scripts, self._lock), self._server)  # type: ignore[no-untyped-call]
        port = self._server.add_insecure_port(f"{host}:0")
        self.address = f"{host}:{port}"

    def add(self, namespace: str, name: str, script: Script) -> Script:
        with self._lock:
            self.scripts[f"{namespace}/{name}"] = script
        return script

    def begin(self, *scripts: Script) -> float:
        """Start the given scripts' clocks together; the start time (monotonic)."""
        now = time.monotonic()
        with self._lock:
            for s in scripts:
                s.began = now
        return now

    def calls(self, script: Script) -> list[Call]:
        with self._lock:
            return list(script.calls)

    def __enter__(self) -> ScriptedScaler:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=None).wait(5)
