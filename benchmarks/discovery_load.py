"""What discovery and scraping cost the cluster: Kubernetes API requests per minute for N targets
(healthy API server, then a failing one), and replica scrapes per interval for two triggers on one fleet.

    python benchmarks/discovery_load.py [--targets 10] [--seconds 30]

Runs the real scaler in-process against the fake API server (keda_llm_scaler.sim.kubeapi) and loopback
replicas; prints one JSON object. Also runs against an older checkout whose package is still called
``scaler`` (``PYTHONPATH=<old checkout> python benchmarks/discovery_load.py --package scaler``), which is how the
before/after figures in the closing note of issue #9 were made.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from keda_llm_scaler.testing.payloads import EngineLoad, vllm_v1
from keda_llm_scaler.testing.replicas import Replica, unused_port

# `--package scaler` (with PYTHONPATH at an older checkout) measures the code from before the rename
PACKAGE = sys.argv[sys.argv.index("--package") + 1] if "--package" in sys.argv else "keda_llm_scaler"
Settings = importlib.import_module(f"{PACKAGE}.config").Settings
ScalerServer = importlib.import_module(f"{PACKAGE}.server").ScalerServer
KedaEmulator = importlib.import_module(f"{PACKAGE}.sim.keda").KedaEmulator
_kubeapi = importlib.import_module(f"{PACKAGE}.sim.kubeapi")
Endpoint, FakeKube, FakeKubeServer = _kubeapi.Endpoint, _kubeapi.FakeKube, _kubeapi.FakeKubeServer

BASE = Settings(host="127.0.0.1", grpc_port=0, metrics_port=0, warmup_wait=2.0, shutdown_grace=1.0)
INTERVAL = {"scrapeInterval": "0.5", "scrapeTimeout": "0.4", "staleAfter": "30"}


async def api_requests(targets: int, seconds: float) -> dict[str, float]:
    port = unused_port()
    replicas = [Replica(vllm_v1([EngineLoad(0, 30, 0.85)]), host=f"127.0.0.{2 + i}", port=port) for i in range(3)]
    kube = FakeKube(port=port)
    for t in range(targets):
        kube.services[("serving", f"svc{t}")] = [Endpoint(r.host, pod=f"p{t}-{i}") for i, r in enumerate(replicas)]
    api = FakeKubeServer(kube)
    token = Path(tempfile.mkdtemp()) / "token"
    token.write_text(kube.token)
    server = ScalerServer(replace(BASE, kube_api_url=api.url, kube_token_file=token))
    await server.start()
    out: dict[str, float] = {}
    try:
        import grpc

        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as ch:
            emulators = [
                KedaEmulator(ch, f"so{t}", "serving", {"service": f"svc{t}", "port": str(port), **INTERVAL})
                for t in range(targets)
            ]
            for k in emulators:
                await k.poll()
            await asyncio.sleep(2.0)  # past the first lists
            start = len(kube.requests)
            await asyncio.sleep(seconds)
            out["healthy_per_min"] = (len(kube.requests) - start) * 60.0 / seconds
            kube.fail_status = 500
            if hasattr(kube, "drop_watches"):
                kube.drop_watches()  # an API server restart: open watches end, reconnects meet the errors
            start = len(kube.requests)
            await asyncio.sleep(seconds)
            out["failing_per_min"] = (len(kube.requests) - start) * 60.0 / seconds
            kube.fail_status = 0
    finally:
        await server.stop()
        api.close()
        for r in replicas:
            r.close()
    return out


async def scrapes_per_interval(seconds: float) -> float:
    replicas = [Replica(vllm_v1([EngineLoad(0, 30, 0.85)])) for _ in range(2)]
    server = ScalerServer(BASE)
    await server.start()
    try:
        import grpc

        endpoints = ",".join(r.url for r in replicas)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as ch:
            a = KedaEmulator(ch, "llm", "serving", {"endpoints": endpoints, **INTERVAL})
            b = KedaEmulator(ch, "llm", "serving", {"endpoints": endpoints, **INTERVAL, "activationThreshold": "1"})
            await a.poll()
            await b.poll()
            before, t0 = sum(r.requests for r in replicas), time.monotonic()
            await asyncio.sleep(seconds)
            scrapes = sum(r.requests for r in replicas) - before
            intervals = (time.monotonic() - t0) / 0.5
    finally:
        await server.stop()
        for r in replicas:
            r.close()
    return scrapes / intervals / len(replicas)  # per replica per interval


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--package", default="keda_llm_scaler", help="import name of the scaler to measure")
    args = parser.parse_args()
    print(f"API requests, {args.targets} targets at 0.5 s, {args.seconds:g} s per phase ...", file=sys.stderr)
    api = asyncio.run(api_requests(args.targets, args.seconds))
    print("scrapes per interval, two triggers on one fleet ...", file=sys.stderr)
    per = asyncio.run(scrapes_per_interval(min(args.seconds, 10.0)))
    print(json.dumps({"targets": args.targets, **{k: round(v, 1) for k, v in api.items()},
                      "scrapes_per_replica_per_interval_two_triggers": round(per, 2)}))  # fmt: skip


if __name__ == "__main__":
    main()
