"""RPC latency and scrape-cycle time of the real server against a loopback fleet serving the fixtures.

    python benchmarks/serve_bench.py [--replicas 24] [--seconds 5]

Replicas cycle through the vLLM V1 (1 engine), vLLM v0.10 DP=4 and SGLang fixtures. Reports:
scrape cycle p50/p95 for the whole fleet; KEDA-pattern RPC latency (GetMetricSpec + GetMetrics +
IsActive) sequentially and under 50 concurrent GetMetrics callers while 200 streams are open. The
reference in the same run is a gRPC health Check (no scaler logic), so the ratio says what the
scaler adds on top of grpcio itself.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

from grpc_health.v1 import health_pb2, health_pb2_grpc

from keda_llm_scaler._proto import externalscaler_pb2 as pb
from keda_llm_scaler.sim.keda import KedaEmulator
from keda_llm_scaler.testing.replicas import Replica
from keda_llm_scaler.testing.scalerproc import channel_to, running_scaler

ROOT = Path(__file__).resolve().parent.parent

FIXTURES = [
    "vllm_v1_reconstructed_latest_1engine.txt",
    "vllm_v1_reconstructed_v0.10_dp4.txt",
    "sglang_v0.4.x_docs-production-metrics-md.txt",
]


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))]


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replicas", type=int, default=24)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    texts = [(ROOT / "tests" / "fixtures" / "metrics" / f).read_text() for f in FIXTURES]
    fleet = [Replica(texts[i % len(texts)]) for i in range(args.replicas)]
    total_bytes = sum(len(texts[i % len(texts)]) for i in range(args.replicas))
    try:
        async with running_scaler() as server, channel_to(server) as ch:
            keda = KedaEmulator(
                ch,
                "bench",
                "default",
                {"endpoints": ",".join(r.url for r in fleet), "scrapeInterval": "1", "engine": "auto"},
            )
            obs = await keda.poll()
            print(f"fleet: {args.replicas} replicas, {total_bytes / 1e6:.2f} MB per cycle; composite {obs.value}")
            target = server.registry.targets()[0]
            cycles: list[float] = []
            last = -1
            end = time.monotonic() + args.seconds
            print("measuring scrape cycles ...", flush=True)
            while time.monotonic() < end:
                snap = target.snapshot
                if snap is not None and snap.cycle != last:
                    last = snap.cycle
                    cycles.append(snap.cycle_s)
                await asyncio.sleep(0.05)
            print(
                f"scrape cycle: n={len(cycles)} p50={statistics.median(cycles) * 1e3:.1f} ms "
                f"p95={pct(cycles, 0.95) * 1e3:.1f} ms"
            )

            health = health_pb2_grpc.HealthStub(ch)
            ref_t, poll_t = [], []
            for _ in range(300):
                t0 = time.perf_counter()
                await health.Check(health_pb2.HealthCheckRequest(service="readiness"))
                ref_t.append(time.perf_counter() - t0)
                poll_t.append((await keda.hpa()).elapsed_s)
            p50, ref = statistics.median(poll_t), statistics.median(ref_t)
            print(
                f"KEDA HPA sequence (spec+metrics+active): p50={p50 * 1e3:.2f} ms "
                f"p99={pct(poll_t, 0.99) * 1e3:.2f} ms; health Check reference p50={ref * 1e3:.2f} ms; "
                f"ratio {p50 / ref:.1f}x (three calls vs one)"
            )

            streams = [keda.stub.StreamIsActive(keda.ref) for _ in range(200)]
            await asyncio.gather(*(s.read() for s in streams))
            req = pb.GetMetricsRequest(scaledObjectRef=keda.ref, metricName="llm_composite")
            lat: list[float] = []

            async def caller() -> None:
                for _ in range(40):
                    t0 = time.perf_counter()
                    await keda.stub.GetMetrics(req)
                    lat.append(time.perf_counter() - t0)

            t0 = time.perf_counter()
            await asyncio.gather(*(caller() for _ in range(50)))
            wall = time.perf_counter() - t0
            print(
                f"GetMetrics, 50 concurrent callers, 200 open streams: n={len(lat)} "
                f"p50={statistics.median(lat) * 1e3:.2f} ms p99={pct(lat, 0.99) * 1e3:.2f} ms "
                f"({len(lat) / wall:.0f} calls/s, client in the same process)"
            )
            for s in streams:
                s.cancel()
    finally:
        for r in fleet:
            r.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
