"""The scaler as KEDA uses it, on real engines: a real ``serve`` process, a trigger per ScaledObject, and
its answers and its own /metrics read while load runs."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import grpc
from prometheus_client.parser import text_string_to_metric_families

from keda_llm_scaler._proto import externalscaler_pb2 as pb
from keda_llm_scaler._proto import externalscaler_pb2_grpc as pb_grpc
from keda_llm_scaler.testing.serveproc import ServeProcess, serve


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


@dataclass
class Trigger:
    stub: pb_grpc.ExternalScalerStub
    ref: pb.ScaledObjectRef
    metric: str

    def value(self) -> float:
        req = pb.GetMetricsRequest(scaledObjectRef=self.ref, metricName=self.metric)
        return float(self.stub.GetMetrics(req, timeout=15).metricValues[0].metricValueFloat)


@dataclass
class Scaler:
    proc: ServeProcess
    stub: pb_grpc.ExternalScalerStub

    def trigger(self, name: str, metadata: dict[str, str]) -> Trigger:
        ref = pb.ScaledObjectRef(name=name, namespace="lab", scalerMetadata=metadata)
        spec = self.stub.GetMetricSpec(ref, timeout=15)
        return Trigger(self.stub, ref, spec.metricSpecs[0].metricName)

    def gauge(self, name: str, scaledobject: str, **labels: str) -> float | None:
        """One of the scaler's own series for a ScaledObject (None: not exported)."""
        for n, lab, value in samples(fetch(f"http://127.0.0.1:{self.proc.metrics_port}/metrics")):
            if (
                n == name
                and lab.get("scaledobject") == scaledobject
                and all(lab.get(k) == v for k, v in labels.items())
            ):
                return value
        return None

    def capacity(self, scaledobject: str) -> tuple[str, float] | None:
        for n, lab, value in samples(fetch(f"http://127.0.0.1:{self.proc.metrics_port}/metrics")):
            if n == "llm_scaler_replica_capacity_requests_per_second" and lab.get("scaledobject") == scaledobject:
                return lab["source"], value
        return None


@contextmanager
def scaler(*args: str) -> Iterator[Scaler]:
    with serve(*args) as proc, grpc.insecure_channel(proc.address) as channel:
        yield Scaler(proc, pb_grpc.ExternalScalerStub(channel))


@dataclass
class Watch:
    """GetMetrics every ``every_s`` seconds in a thread, as KEDA's polling does: (seconds, value)."""

    trigger: Trigger
    every_s: float = 5.0
    readings: list[tuple[float, float]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Watch:
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.readings.append((time.monotonic() - self._t0, self.trigger.value()))
            except grpc.RpcError as exc:
                self.errors.append(str(exc.code()))
            self._stop.wait(self.every_s)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
