#!/usr/bin/env python3
"""Memory on refused oversized requests (issue #23): ``serve`` as a process, N GetMetrics/GetMetricSpec
calls each with a distinct 3.5 MB metadata map (half refused for size, half for an unknown metric name),
the process tree's RSS every 30 calls, and normal calls' p99 before and after.

    python -m benchmarks.refused_memory 360
"""

from __future__ import annotations

import random
import socket
import string
import subprocess
import sys
import time

import grpc

from benchmarks.soak import _proc_stats  # the process tree's RSS, as the soak reads it
from keda_llm_scaler._proto import externalscaler_pb2 as pb
from keda_llm_scaler._proto import externalscaler_pb2_grpc as pb_grpc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 360
    grpc_port, metrics_port = _free_port(), _free_port()
    cmd = [sys.executable, "-m", "keda_llm_scaler", "serve", "--host", "127.0.0.1", "--grpc-port", str(grpc_port),
           "--metrics-port", str(metrics_port), "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rng = random.Random(0)
    try:
        time.sleep(3)
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}", options=[("grpc.max_send_message_length", 8 << 20)]) as ch:
            stub = pb_grpc.ExternalScalerStub(ch)
            normal = pb.ScaledObjectRef(
                name="ok", namespace="serving", scalerMetadata={"endpoints": "http://127.0.0.1:9"}
            )

            def p99_ms() -> float:
                took = []
                for _ in range(50):
                    start = time.perf_counter()
                    stub.GetMetricSpec(normal, timeout=5)
                    took.append(time.perf_counter() - start)
                return sorted(took)[48] * 1000

            idle_p99, idle = p99_ms(), _proc_stats(proc.pid)[0]
            print(f"idle: {idle:.0f} MB, normal p99 {idle_p99:.1f} ms", flush=True)
            worst, codes = idle, {}
            for i in range(calls):
                meta = {f"k{j}": "".join(rng.choices(string.ascii_letters, k=35_000)) for j in range(100)}
                ref = pb.ScaledObjectRef(name=f"so{i}", namespace="serving", scalerMetadata=meta)
                try:
                    if i % 2:
                        stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref, metricName="nope"), timeout=10)
                    else:
                        stub.GetMetricSpec(ref, timeout=10)
                except grpc.RpcError as exc:
                    codes[exc.code().name] = codes.get(exc.code().name, 0) + 1
                if i % 30 == 29:
                    worst = max(worst, _proc_stats(proc.pid)[0])
                    print(f"{i + 1} calls: {worst:.0f} MB", flush=True)
            print(f"grew {worst - idle:.0f} MB over idle; normal p99 {p99_ms():.1f} ms (idle {idle_p99:.1f}); {codes}")
    finally:
        proc.terminate()
        proc.wait(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
