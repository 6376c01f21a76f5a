"""``keda-llm-scaler demo``: the whole loop on a laptop, in about a minute.

A small simulated vLLM fleet serves real ``/metrics`` on loopback and is published through a stand-in
Kubernetes API (EndpointSlices, ready pods only); the real scaler server discovers and scrapes it; a
KEDA + HPA emulator calls the scaler over gRPC at the HPA's cadence and resizes the fleet. A bundled
trace (Azure conversation, with a burst overlaid) is replayed ``speed`` times faster than real time.
Nothing is downloaded; everything listens on 127.0.0.1 and stops at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import math
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from prometheus_client.parser import text_string_to_metric_families

from keda_llm_scaler.config import Settings
from keda_llm_scaler.metadata import DEFAULTS
from keda_llm_scaler.server import ScalerServer
from keda_llm_scaler.sim.exporter import ReplicaExporter
from keda_llm_scaler.sim.fleet import DRAINING, READY, STARTING, SimulatedFleet
from keda_llm_scaler.sim.hpa import AVERAGE_VALUE, Behavior, Hpa, MetricReading, ScalingPolicy
from keda_llm_scaler.sim.keda import KedaEmulator
from keda_llm_scaler.sim.kubeapi import Endpoint, FakeKube, FakeKubeServer
from keda_llm_scaler.sim.profiles import PROFILES
from keda_llm_scaler.sim.replica import Request
from keda_llm_scaler.sim.run import add_ttft_p95, percentile
from keda_llm_scaler.sim.trace import BUNDLED_TRACE, TraceRequest, load_trace, scale_rate, slice_trace

__all__ = ["add_demo_arguments", "demo_main"]

NAMESPACE, SERVICE, SCALED_OBJECT = "demo", "vllm-llama", "llama"
HPA_SYNC_S = 15.0  # simulated seconds
DEFAULT_DEMAND_WINDOW_S = float(DEFAULTS["demandWindow"])
# The demo's load: (start minute, end minute, rate multiplier) over the bundled trace — a day's morning
# ramp compressed into minutes (x2 to x6, about a third of a replica's worth per cold start), a 30-second
# burst of +50 % at the top, and the evening ramp down.
SEGMENTS: Sequence[tuple[float, float, float]] = (
    (0, 1.25, 2.0),
    (1.25, 2.5, 3.0),
    (2.5, 3.75, 4.0),
    (3.75, 5, 5.0),
    (5, 6, 6.0),
    (6, 6.5, 9.0),
    (6.5, 7.5, 5.0),
    (7.5, 8.5, 3.0),
    (8.5, 60, 2.0),
)  # the quiet tail goes on for --minutes beyond 12
TRACE_OFFSET_S = 600.0
# Minute-long cold starts: add up to 4 pods a minute, remove one every 30 s after a minute of calm (the
# README's recommended behavior, compressed for a demo; the real-engine demo uses it too).
DEMO_BEHAVIOR = Behavior(
    up_stabilization_s=0.0,
    up_policies=(ScalingPolicy("Pods", 4, 60),),
    down_stabilization_s=60.0,
    down_policies=(ScalingPolicy("Pods", 1, 30),),
)


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--engine",
        choices=("sim", "vllm"),
        default="sim",
        help="what serves: simulated replicas (default), or real vLLM engines from scripts/engine build, in "
        "real time (root, for a CPU quota per engine)",
    )
    p.add_argument("--cpus", type=float, default=0.5, help="--engine vllm: each engine's CPU quota (default 0.5)")
    p.add_argument("--speed", type=float, default=12.0, help="simulated seconds per real second (default 12)")
    p.add_argument(
        "--minutes", type=float, default=None, help="minutes to replay (default 12 simulated; 8 real with vllm)"
    )
    p.add_argument("--profile", default="8b-h100", choices=list(PROFILES), help="default 8b-h100")
    p.add_argument(
        "--target-utilization", default=None, help="the trigger's targetUtilization (default: the scaler's own, 0.9)"
    )
    p.add_argument(
        "--target-kv-usage", default=None, help="the trigger's targetKvUsage (default: the scaler's own, 0.85)"
    )
    p.add_argument("--max-replicas", type=int, default=None, help="default 8 (3 with vllm: ~4.4 GB each)")
    p.add_argument("--slo-ttft", type=float, default=2.0)
    p.add_argument("--out-dir", type=Path, default=Path("demo-output"), help="summary.json and demo.png go here")
    p.add_argument("--no-live", action="store_true", help="one line per HPA sync instead of the live view")


def demo_trace(minutes: float) -> list[TraceRequest]:
    base = load_trace(BUNDLED_TRACE)
    out: list[TraceRequest] = []
    for start_min, end_min, factor in SEGMENTS:
        if start_min >= minutes:
            break
        start, length = start_min * 60.0, (min(end_min, minutes) - start_min) * 60.0
        segment = slice_trace(base, TRACE_OFFSET_S + start, length)
        out.extend(TraceRequest(r.t + start, r.prompt, r.output) for r in scale_rate(segment, factor))
    out.sort(key=lambda r: r.t)
    return out


@dataclass
class _State:
    composite: float | None = None
    planned_rps: float | None = None  # the scaler's explanation, in simulated requests/s
    capacity_rps: float | None = None
    desired: int = 1
    ups: int = 0
    downs: int = 0
    errors: int = 0
    timeline: list[dict[str, float | None]] = field(default_factory=list)


class Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.profile = PROFILES[args.profile]
        self.lock = threading.Lock()  # the exporters read replicas from their HTTP threads
        self.fleet = SimulatedFleet(
            self.profile, self.profile.cold_start_mean_s, self.profile.cold_start_p90_s, seed=1, routing="least-loaded"
        )
        self.trace = demo_trace(args.minutes)
        self.requests = [Request(i, r.t, r.prompt, r.output) for i, r in enumerate(self.trace)]
        self.end = args.minutes * 60.0
        self.exporters: dict[str, ReplicaExporter] = {}
        self.kube = FakeKube(token="demo-token")
        self.kube.services[(NAMESPACE, SERVICE)] = []
        self.state = _State()
        self.metrics_port = 0
        self.hpa = Hpa(1, args.max_replicas, DEMO_BEHAVIOR)

    # -- the simulated cluster -------------------------------------------------------------------
    def _sync_endpoints(self) -> None:
        for pod in self.fleet.pods:
            if pod.state == READY and pod.name not in self.exporters:
                self.exporters[pod.name] = ReplicaExporter(pod.replica, self.lock)
        ready = [p for p in self.fleet.pods if p.state == READY and p.name in self.exporters]
        starting = [p for p in self.fleet.pods if p.state == STARTING]
        self.kube.services[(NAMESPACE, SERVICE)] = [
            *(Endpoint("127.0.0.1", pod=p.name, port=self.exporters[p.name].port) for p in ready),
            # a pod whose model is still loading: in the slice, not ready (capacity on its way)
            *(Endpoint("127.0.0.1", pod=p.name, ready=False, port=1) for p in starting),
        ]
        serving = {p.name for p in self.fleet.pods if p.state in (READY, DRAINING)}
        for name in [n for n in self.exporters if n not in serving]:
            self.exporters.pop(name).close()

    def metadata(self) -> dict[str, str]:
        """The scaler's defaults, on a clock ``speed`` times faster: the demand's 5-minute window shrinks
        with it (start-up times are measured, so they shrink by themselves)."""
        meta = {
            "service": SERVICE,
            "engine": "vllm",
            "scrapeInterval": "0.5",
            "scrapeTimeout": "0.4",
            "staleAfter": "2",
            "demandWindow": f"{max(5.0, DEFAULT_DEMAND_WINDOW_S / self.args.speed):g}",
        }
        if self.args.target_utilization is not None:
            meta["targetUtilization"] = str(self.args.target_utilization)
        if self.args.target_kv_usage is not None:
            meta["targetKvUsage"] = str(self.args.target_kv_usage)
        return meta

    # -- the loop --------------------------------------------------------------------------------
    async def run(self) -> dict[str, Any]:
        api = FakeKubeServer(self.kube)
        tmp = tempfile.TemporaryDirectory()
        token = Path(tmp.name) / "token"
        token.write_text(self.kube.token)
        server = ScalerServer(
            Settings(
                host="127.0.0.1",
                grpc_port=0,
                metrics_port=0,
                kube_api_url=api.url,
                kube_token_file=token,
                log_level="warning",
            )
        )
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
                keda = KedaEmulator(channel, SCALED_OBJECT, NAMESPACE, self.metadata())
                return await self._loop(keda, server.metrics_port)
        finally:
            await server.stop()
            for exporter in self.exporters.values():
                exporter.close()
            api.close()
            tmp.cleanup()

    async def _loop(self, keda: KedaEmulator, metrics_port: int) -> dict[str, Any]:
        self.metrics_port = metrics_port
        speed = self.args.speed
        with self.lock:
            self.fleet.add(0.0, ready=True)
        self.hpa.warm_start(0.0, 1)
        self._sync_endpoints()
        await self._first_answer(keda)
        arrivals = [r.arrival for r in self.requests]
        i, sim_t, next_sync, next_sample, next_frame = 0, 0.0, HPA_SYNC_S, 0.0, 0.0
        wall0 = time.monotonic()
        while sim_t < self.end:
            await asyncio.sleep(0.05)
            target = min(self.end, (time.monotonic() - wall0) * speed)
            if target <= sim_t:
                continue
            with self.lock:
                j = bisect.bisect_left(arrivals, target, lo=i)
                self.fleet.step(target, target - sim_t, self.requests[i:j])
                i = j
                self.fleet.finished.clear()  # the demo judges its own request list
            sim_t = target
            self._sync_endpoints()
            if sim_t >= next_sync:
                next_sync += HPA_SYNC_S
                await self._hpa_sync(keda, sim_t)
            if sim_t >= next_sample:
                next_sample += 10.0
                self._sample(sim_t, arrivals)
            if sim_t >= next_frame:
                next_frame += HPA_SYNC_S if self.args.no_live else speed * 0.5
                self._show(sim_t, arrivals, metrics_port)
        return self._summary(metrics_port)

    async def _first_answer(self, keda: KedaEmulator, budget_s: float = 30.0) -> None:
        """Start the clock once the scaler has scraped the fleet, as KEDA's first reconcile would find
        it: on a busy machine the first scrape can outlast the one warm-up wait a new target gets, and
        the demo's first HPA syncs would count as metric errors."""
        deadline = time.monotonic() + budget_s
        while time.monotonic() < deadline:
            try:
                await keda.hpa()
                return
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.2)

    async def _hpa_sync(self, keda: KedaEmulator, sim_t: float) -> None:
        try:
            obs = await keda.hpa()  # GetMetricSpec + GetMetrics + IsActive under one 3 s deadline
            self.state.composite = obs.value
            reading: MetricReading | None = MetricReading(AVERAGE_VALUE, obs.value, obs.target)
        except grpc.aio.AioRpcError:
            self.state.errors += 1  # no metric: the HPA holds (KEDA's fallback would count these)
            reading = None
        await self._read_explanation()
        with self.lock:
            current = self.fleet.spec_replicas
            desired = self.hpa.decide(sim_t, current, len(self.fleet.with_state(READY)), reading)
            self.state.desired = desired
            if desired != current:
                self.state.ups += desired > current
                self.state.downs += desired < current
                self.fleet.scale_to(desired, sim_t)
        self._sync_endpoints()

    async def _read_explanation(self) -> None:
        """What the scaler plans for and thinks one replica serves, from its own /metrics."""

        def fetch() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as resp:
                return str(resp.read().decode())

        try:
            text = await asyncio.to_thread(fetch)
        except OSError:
            return
        found: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.labels.get("scaledobject") == SCALED_OBJECT:
                    found[sample.name] = sample.value
        speed = self.args.speed  # the scaler counts requests per real second
        planned = found.get("llm_scaler_planned_requests_per_second")
        capacity = found.get("llm_scaler_replica_capacity_requests_per_second")
        self.state.planned_rps = None if planned is None else planned / speed
        self.state.capacity_rps = None if capacity is None else capacity / speed

    def _sample(self, sim_t: float, arrivals: list[float]) -> None:
        lo = _index(arrivals, sim_t - 60.0)
        hi = _index(arrivals, sim_t)
        self.state.timeline.append(
            {
                "t": sim_t,
                "load_rps": (hi - lo) / min(60.0, max(sim_t, 1.0)),
                "ready": float(len(self.fleet.with_state(READY))),
                "starting": float(len(self.fleet.with_state(STARTING))),
                "draining": float(len(self.fleet.with_state(DRAINING))),
                "metric": self.state.composite,
                "desired": float(self.fleet.spec_replicas),
                "metric_replicas": self.state.composite,
                "need_rps": self.state.planned_rps,
                "capacity_rps": self.state.capacity_rps,
            }
        )

    def _show(self, sim_t: float, arrivals: list[float], metrics_port: int) -> None:
        lo, hi = _index(arrivals, sim_t - 30.0), _index(arrivals, sim_t)
        load = (hi - lo) / min(30.0, max(sim_t, 1.0))
        comp = "  -  " if self.state.composite is None else f"{self.state.composite:5.2f}"
        head = (
            f"sim {int(sim_t // 60):02d}:{int(sim_t % 60):02d}/{int(self.end // 60):02d}:00  load "
            f"{load:5.1f} req/s  composite {comp}  desired {self.state.desired}  ready "
            f"{len(self.fleet.with_state(READY))}  starting {len(self.fleet.with_state(STARTING))}"
        )
        if self.args.no_live or not sys.stdout.isatty():
            print(head, flush=True)
            return
        lines = [
            f"keda-llm-scaler demo: {self.profile.description}, x{self.args.speed:g} speed, "
            f"scaler metrics on http://127.0.0.1:{metrics_port}/metrics",
            head,
            "",
        ]
        with self.lock:
            for pod in self.fleet.live():
                r = pod.replica
                bar = "#" * round(10 * r.kv_usage) + "." * (10 - round(10 * r.kv_usage))
                lines.append(
                    f"  {pod.name:7} {pod.state:9} waiting {len(r.waiting):5d}  running {r.running:4d}  "
                    f"KV [{bar}] {r.kv_usage:4.2f}"
                )
        print("\x1b[H\x1b[2J" + "\n".join(lines), flush=True)

    def _summary(self, metrics_port: int) -> dict[str, Any]:
        with self.lock:
            tail = self.end
            while tail < self.end + 300 and any(p.replica.in_flight() for p in self.fleet.live()):
                tail += 5.0
                self.fleet.advance(tail, 5.0)
            slo = self.args.slo_ttft
            with_ttft = [r.ttft for r in self.requests if r.ttft is not None]
            add_ttft_p95(self.state.timeline, self.requests)
            return {
                "policy": "composite",
                "knob": "targetUtilization",
                "knob_value": float(self.args.target_utilization or DEFAULTS["targetUtilization"]),
                "profile": self.profile.name,
                "trace": BUNDLED_TRACE.name,
                "requests": len(self.requests),
                "slo_ttft_s": slo,
                "slo_attainment": sum(1 for t in with_ttft if t <= slo) / max(1, len(self.requests)),
                "ttft_p95_s": percentile(with_ttft, 0.95),
                "gpu_hours": self.fleet.gpu_seconds / 3600.0,
                "mean_replicas": sum((p["ready"] or 0) + (p["starting"] or 0) for p in self.state.timeline)
                / max(1, len(self.state.timeline)),
                "max_replicas": max(int((p["ready"] or 0) + (p["starting"] or 0)) for p in self.state.timeline),
                "scale_events": self.state.ups + self.state.downs,
                "scale_ups": self.state.ups,
                "scale_downs": self.state.downs,
                "streams_cut": self.fleet.streams_cut,
                "metric_errors": self.state.errors,
                "speed": self.args.speed,
                "simulated_minutes": self.args.minutes,
                "routing": self.fleet.routing,
                "config": {"max_replicas": self.hpa.max_replicas, "hpa_behavior": "demo"},
            }


def _index(sorted_values: list[float], x: float) -> int:
    return bisect.bisect_left(sorted_values, x)


def demo_main(args: argparse.Namespace) -> int:
    args.minutes = 12.0 if args.minutes is None else args.minutes
    args.max_replicas = 8 if args.max_replicas is None else args.max_replicas
    if args.speed <= 0 or args.minutes <= 0 or not math.isfinite(args.speed):
        print("keda-llm-scaler demo: --speed and --minutes must be > 0", file=sys.stderr)
        return 2
    from keda_llm_scaler.logs import configure_logging

    configure_logging("warning", json=False)
    demo = Demo(args)
    start = time.monotonic()
    summary = asyncio.run(demo.run())
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    from keda_llm_scaler.sim.plots import plot_run

    with contextlib.suppress(ValueError):
        plot_run(args.out_dir / "demo.png", summary, demo.state.timeline)
    print(
        f"\ndemo finished in {time.monotonic() - start:.0f}s: {summary['requests']} requests, SLO attainment "
        f"{summary['slo_attainment']:.1%} (TTFT <= {summary['slo_ttft_s']:g}s), {summary['scale_ups']} scale-ups, "
        f"{summary['scale_downs']} scale-downs, max {summary['max_replicas']} replicas, "
        f"{summary['streams_cut']} streams cut"
    )
    print(f"wrote {args.out_dir / 'summary.json'} and {args.out_dir / 'demo.png'}")
    return 0
