#!/usr/bin/env python3
"""A new target's first calls (issue #23, item 4): ``serve`` as a process, one replica on loopback whose
``/metrics`` answers only after ``--delay`` seconds (a large fleet's first scrape), and KEDA's start-up
burst: ``--calls`` GetMetrics calls of the same new ScaledObject, ``--gap`` seconds apart, each timed.

    python -m benchmarks.first_calls                 # 6 calls in the first second, one after the other
    python -m benchmarks.first_calls --concurrent    # each started on time, whether or not the last ended

Only the first call may wait (``--warmup-wait``, 0.5 s by default); every other call, during that wait or
after it, answers at once: UNAVAILABLE "first scrape still in progress" while the scrape runs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time

import grpc

from keda_llm_scaler._proto import externalscaler_pb2 as pb
from keda_llm_scaler._proto import externalscaler_pb2_grpc as pb_grpc
from keda_llm_scaler.testing.payloads import EngineLoad, vllm_v1
from keda_llm_scaler.testing.replicas import Replica, unused_port


def _healthy(address: str, budget_s: float) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + budget_s
    while True:
        with grpc.insecure_channel(address) as ch:
            try:
                health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="readiness"), timeout=0.5)
                return
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--gap", type=float, default=0.15, help="seconds between the calls' starts")
    ap.add_argument("--concurrent", action="store_true", help="start each call on time, in its own thread")
    ap.add_argument("--delay", type=float, default=4.0, help="seconds the replica takes to answer /metrics")
    args = ap.parse_args()
    replica = Replica(vllm_v1([EngineLoad(2, 30, 0.5)]))
    replica.set(delay_s=args.delay)
    grpc_port, metrics_port = unused_port(), unused_port()
    cmd = [sys.executable, "-m", "keda_llm_scaler", "serve", "--host", "127.0.0.1", "--grpc-port", str(grpc_port),
           "--metrics-port", str(metrics_port), "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        address = f"127.0.0.1:{grpc_port}"
        _healthy(address, 30)
        with grpc.insecure_channel(address) as ch:
            stub = pb_grpc.ExternalScalerStub(ch)
            stub.GetMetricSpec(
                pb.ScaledObjectRef(name="warm", namespace="bench", scalerMetadata={"endpoints": replica.url})
            )
            ref = pb.ScaledObjectRef(
                name="new",
                namespace="bench",
                scalerMetadata={"endpoints": replica.url, "scrapeInterval": "10", "scrapeTimeout": "8"},
            )
            request = pb.GetMetricsRequest(scaledObjectRef=ref, metricName="llm_composite")
            start = time.monotonic()

            def call(i: int) -> None:
                t0 = time.perf_counter()
                try:
                    stub.GetMetrics(request, timeout=5)
                    code = "OK"
                except grpc.RpcError as exc:
                    code = f"{exc.code().name} {exc.details()}"  # type: ignore[attr-defined]
                took_ms = (time.perf_counter() - t0) * 1000
                print(f"call {i + 1} at {t0 - start_pc:.2f} s: {took_ms:.1f} ms, {code}", flush=True)

            start_pc = time.perf_counter()
            threads = []
            for i in range(args.calls):
                time.sleep(max(0.0, start + i * args.gap - time.monotonic()))
                if args.concurrent:
                    threads.append(threading.Thread(target=call, args=(i,)))
                    threads[-1].start()
                else:
                    call(i)
            for thread in threads:
                thread.join()
    finally:
        proc.terminate()
        proc.wait(10)
        replica.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
