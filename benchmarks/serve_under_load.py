"""GetMetrics under load while the scaler scrapes a large fleet, against a bare gRPC server in the same run.

    python -m benchmarks.serve_under_load --kedaclient ../shared/tools/kedaclient [--replicas 1000]
        [--interval 5] [--callers 16] [--seconds 20] [--out docs/performance/serve_under_load.json]

Issue #11's serve-under-load measure. Replicas are one server (nginx when installed, else an asyncio
HTTP/1.1 server in its own process: keda_llm_scaler/testing/fleetserver.py) that serves the 41 KB vLLM V1
fixture on 127.0.0.1:<port>/r<i>/metrics (keep-alive). The scaler is the real `keda-llm-scaler serve` with
one ScaledObject over all replicas; once its first cycle is in, kedaclient (the grpc-go client that calls
like the KEDA operator) runs `-op load` with `--callers` for `--seconds`. The reference is a bare `grpc.aio`
ExternalScaler that returns a constant, loaded the same way, in the same run. Prints both and the ratios,
and the scaler's CPU and scrape-cycle time during the load; writes JSON to `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.soak import _cpu_s
from keda_llm_scaler.testing.fleetserver import start_fleet
from keda_llm_scaler.testing.replicas import unused_port

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests/fixtures/metrics/vllm_v1_reconstructed_latest_1engine.txt"

BARE_SERVER = """
import asyncio, sys
import grpc
from keda_llm_scaler._proto import externalscaler_pb2 as pb, externalscaler_pb2_grpc as pb_grpc

class Bare(pb_grpc.ExternalScalerServicer):
    async def GetMetricSpec(self, request, context):
        return pb.GetMetricSpecResponse(metricSpecs=[pb.MetricSpec(metricName="llm_composite", targetSizeFloat=1)])
    async def GetMetrics(self, request, context):
        return pb.GetMetricsResponse(metricValues=[pb.MetricValue(metricName="llm_composite", metricValueFloat=1.5)])
    async def IsActive(self, request, context):
        return pb.IsActiveResponse(result=True)

async def main():
    server = grpc.aio.server()
    pb_grpc.add_ExternalScalerServicer_to_server(Bare(), server)
    server.add_insecure_port("127.0.0.1:" + sys.argv[1])
    await server.start()
    await server.wait_for_termination()

asyncio.run(main())
"""


def _load(kedaclient: str, address: str, meta: str, callers: int, seconds: float) -> dict[str, Any]:
    out = subprocess.run(
        [kedaclient, "-addr", address, "-op", "load", "-meta", meta, "-c", str(callers), "-d", f"{seconds:g}s"],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
    )
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"kedaclient gave no result: {out.stderr.strip()[:300]}")
    return lines[-1]


def _scaler_metric(port: int, name: str) -> float | None:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kedaclient", required=True, help="path to the kedaclient binary")
    parser.add_argument("--replicas", type=int, default=1000)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--callers", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--out", default="")
    parser.add_argument("--fleet", default="auto", choices=["auto", "nginx", "asyncio"], help="fleet server")
    parser.add_argument("--scrape-workers", default="auto", help="the scaler's --scrape-workers (0: in process)")
    args = parser.parse_args()

    fleet = start_fleet(FIXTURE.read_bytes(), args.fleet)
    endpoints = ",".join(fleet.url(i) for i in range(args.replicas))
    timeout = min(args.interval, 2.0 if args.interval <= 5 else 5.0)
    meta = f"endpoints={endpoints};scrapeInterval={args.interval:g};scrapeTimeout={timeout:g};enableTLS=false"
    grpc_port, metrics_port, bare_port = unused_port(), unused_port(), unused_port()
    env = {
        **os.environ,
        "LLM_SCALER_HOST": "127.0.0.1",
        "LLM_SCALER_GRPC_PORT": str(grpc_port),
        "LLM_SCALER_METRICS_PORT": str(metrics_port),
        "LLM_SCALER_LOG_LEVEL": "warning",
        "LLM_SCALER_MAX_CONCURRENT_SCRAPES": "64",
        "LLM_SCALER_SCRAPE_WORKERS": args.scrape_workers,
    }
    exe = os.path.join(os.path.dirname(sys.executable), "keda-llm-scaler")
    scaler = subprocess.Popen([exe, "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bare = subprocess.Popen([sys.executable, "-c", BARE_SERVER, str(bare_port)], cwd=ROOT)
    result: dict[str, Any] = {"config": vars(args), "machine_cores": os.cpu_count(), "fleet_server": fleet.kind}
    try:
        time.sleep(2.0)
        print("reference: bare grpc.aio server ...", flush=True)
        result["bare"] = _load(args.kedaclient, f"127.0.0.1:{bare_port}", meta, args.callers, args.seconds)
        print(f"  {result['bare']}", flush=True)
        print(f"scaler: registering {args.replicas} replicas, waiting for the first cycle ...", flush=True)
        for _ in range(120):
            first = _load(args.kedaclient, f"127.0.0.1:{grpc_port}", meta, 1, 1)
            if first.get("errors", 1) == 0:
                break
            time.sleep(1.0)
        cpu0, t0 = _cpu_s(scaler.pid, children=True), time.monotonic()
        print(f"scaler under load ({args.callers} callers, {args.seconds:g} s) ...", flush=True)
        result["scaler"] = _load(args.kedaclient, f"127.0.0.1:{grpc_port}", meta, args.callers, args.seconds)
        result["scaler_cpu_cores"] = round((_cpu_s(scaler.pid, children=True) - cpu0) / (time.monotonic() - t0), 2)
        result["scrape_cycle_s"] = _scaler_metric(metrics_port, "llm_scaler_scrape_cycle_seconds")
        print(f"  {result['scaler']}", flush=True)
    finally:
        scaler.terminate()
        bare.terminate()
        fleet.stop()
        scaler.wait(15)
        bare.wait(15)
    b, s = result["bare"], result["scaler"]
    result["rps_ratio"] = round(float(s["rps"]) / float(b["rps"]), 3)
    result["p99_ratio"] = round(float(s["p99_ms"]) / float(b["p99_ms"]), 2)
    print(
        f"\nGetMetrics, {args.callers} callers, while {args.replicas} replicas are scraped every {args.interval:g} s:\n"
        f"  bare grpc.aio : {float(b['rps']):8.0f} RPS  p99 {float(b['p99_ms']):7.1f} ms\n"
        f"  scaler        : {float(s['rps']):8.0f} RPS  p99 {float(s['p99_ms']):7.1f} ms  errors {s['errors']}\n"
        f"  ratio         : {result['rps_ratio']:.0%} of bare RPS, p99 {result['p99_ratio']}x bare's\n"
        f"  scaler CPU {result['scaler_cpu_cores']} cores, last scrape cycle {result['scrape_cycle_s']} s"
    )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
