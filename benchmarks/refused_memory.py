#!/usr/bin/env python3
"""Memory on refused oversized requests (issue #23): ``serve`` as a process, calls each with a distinct
metadata map, the process tree's RSS as it goes, and normal calls' p99 before and after.

    python -m benchmarks.refused_memory 360                  # 3.5 MB maps: refused by gRPC's receive limit
    python -m benchmarks.refused_memory 360 --map-mb 0.9     # inside the limit: refused by the handler
    python -m benchmarks.refused_memory --soak 300           # five minutes of both sizes, alternating

Calls rotate over GetMetricSpec (INVALID_ARGUMENT for size), GetMetrics with an unknown metric name
(NOT_FOUND) and StreamIsActive; 3.5 MB maps get RESOURCE_EXHAUSTED from gRPC on every method.
"""

from __future__ import annotations

import argparse
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


def send_rotating(stub: pb_grpc.ExternalScalerStub, i: int, ref: pb.ScaledObjectRef) -> str:
    """Call ``i`` of a rotation over GetMetricSpec, GetMetrics with an unknown metric name and StreamIsActive;
    the status code's name ("OK" when answered)."""
    try:
        if i % 3 == 2:
            next(iter(stub.StreamIsActive(ref, timeout=10)))
        elif i % 3 == 1:
            stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref, metricName="nope"), timeout=10)
        else:
            stub.GetMetricSpec(ref, timeout=10)
    except grpc.RpcError as exc:
        return str(exc.code().name)  # type: ignore[attr-defined]
    return "OK"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("calls", type=int, nargs="?", default=360)
    ap.add_argument("--map-mb", type=float, default=3.5, help="size of each distinct metadata map")
    ap.add_argument(
        "--soak",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="send for this long instead, 0.9 and 3.5 MB maps alternating",
    )
    args = ap.parse_args()
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
                for _ in range(100):
                    start = time.perf_counter()
                    stub.GetMetricSpec(normal, timeout=5)
                    took.append(time.perf_counter() - start)
                return sorted(took)[98] * 1000

            idle_p99, idle = p99_ms(), _proc_stats(proc.pid)[0]
            print(f"idle: {idle:.0f} MB, normal p99 {idle_p99:.1f} ms", flush=True)
            worst, codes, sent_mb = idle, {}, 0.0
            start, i, during = time.monotonic(), 0, []
            while (time.monotonic() - start < args.soak) if args.soak else (i < args.calls):
                size_mb = (0.9 if i % 2 else 3.5) if args.soak else args.map_mb
                chunk = int(size_mb * 1e6 / 100)
                meta = {f"k{j}": "".join(rng.choices(string.ascii_letters, k=chunk)) for j in range(100)}
                ref = pb.ScaledObjectRef(name=f"so{i}", namespace="serving", scalerMetadata=meta)
                code = send_rotating(stub, i, ref)
                codes[code] = codes.get(code, 0) + 1
                sent_mb += size_mb
                t0 = time.perf_counter()
                stub.GetMetricSpec(normal, timeout=5)  # a normal call between every two refused ones
                during.append(time.perf_counter() - t0)
                i += 1
                if i % 30 == 0:
                    rss = _proc_stats(proc.pid)[0]
                    worst = max(worst, rss)
                    print(
                        f"{i} calls, {time.monotonic() - start:.0f} s, {sent_mb:.0f} MB sent: "
                        f"{rss:.0f} MB (max {worst:.0f})",
                        flush=True,
                    )
            during_p99 = sorted(during)[int(0.99 * (len(during) - 1))] * 1000
            print(
                f"{i} calls, {sent_mb:.0f} MB sent: grew {worst - idle:.0f} MB over {idle:.0f} MB idle; normal p99 "
                f"{during_p99:.1f} ms during, {p99_ms():.1f} ms after (idle {idle_p99:.1f}); {codes}"
            )
    finally:
        proc.terminate()
        proc.wait(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
