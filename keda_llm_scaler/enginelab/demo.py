"""``keda-llm-scaler demo --engine vllm``: the demo's loop on real vLLM engines instead of simulated replicas.

The same loop as the simulated demo (``sim.demo``): the real scaler server discovers the fleet through a
stand-in Kubernetes API (EndpointSlices: ready engines, and starting ones not ready), a KEDA + HPA
emulator calls it over gRPC every 15 s and resizes the fleet, and the run ends with the same summary and
plot. What differs is what serves: each replica is a real engine from ``scripts/engine build`` on
loopback, in its own cgroup held to ``--cpus`` once ready, so a scale-up waits for a real start-up and
the load is real streaming requests, measured client-side. It runs in real time (no ``--speed``).

The load, in units of one engine's saturated throughput T (measured first, so it fits any machine):
a ramp from 0.3T to 1.6T over the first 40 % of the run, a plateau, a 2T burst, then 0.3T to the end.
A scale-down removes the engine with the fewest streams in flight; it stops getting requests and gets
SIGTERM once they are done (vLLM's ``--shutdown-timeout`` finishes any left), so no stream is cut.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import signal
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from prometheus_client.parser import text_string_to_metric_families

from keda_llm_scaler.config import Settings
from keda_llm_scaler.enginelab.build import MODEL_NAME, engine_env
from keda_llm_scaler.enginelab.cgroups import CgroupUnavailable, cpu_controller, remove_groups
from keda_llm_scaler.enginelab.loadgen import Arrival, RequestRecord, Router, stream_one
from keda_llm_scaler.enginelab.run import Engine, EngineSpec, is_ready, launch_engine, stop_engines
from keda_llm_scaler.enginelab.sweep import saturated_throughput
from keda_llm_scaler.server import ScalerServer
from keda_llm_scaler.sim.demo import DEMO_BEHAVIOR
from keda_llm_scaler.sim.hpa import AVERAGE_VALUE, Hpa, MetricReading
from keda_llm_scaler.sim.keda import KedaEmulator
from keda_llm_scaler.sim.kubeapi import Endpoint, FakeKube, FakeKubeServer
from keda_llm_scaler.sim.run import percentile

__all__ = ["engine_demo_main", "load_curve"]

NAMESPACE, SERVICE, SCALED_OBJECT = "demo", "vllm-tiny", "tiny"
HPA_SYNC_S = 15.0
PROMPT, OUTPUT = 200, 50
SHUTDOWN_TIMEOUT_S = 30  # vLLM finishes what it holds on SIGTERM (its default, 0, aborts it)
STARTING, READY, DRAINING = "starting", "ready", "draining"
DEMO_GROUP_PREFIX = "kls-demo-"


def load_curve(t: float, duration: float, throughput: float) -> float:
    """Requests/s at ``t`` seconds into a run of ``duration``: ramp, plateau, burst, fall (module docstring)."""
    x = t / duration
    if x < 0.4:
        return throughput * (0.3 + 1.3 * x / 0.4)
    if x < 0.6:
        return throughput * 1.6
    if x < 0.65:
        return throughput * 2.0
    return throughput * 0.3


def arrivals(duration: float, throughput: float, seed: int = 1) -> list[float]:
    """Poisson arrival times under ``load_curve`` (thinning), deterministic per seed."""
    rng, peak = random.Random(seed), 2.0 * throughput
    out: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= duration:
            return out
        if rng.random() * peak <= load_curve(t, duration, throughput):
            out.append(t)


@dataclass
class DemoEngine:
    name: str
    engine: Engine
    state: str = STARTING
    port: int = 0


@dataclass
class _State:
    composite: float | None = None
    planned_rps: float | None = None
    capacity_rps: float | None = None
    desired: int = 1
    ups: int = 0
    downs: int = 0
    errors: int = 0
    timeline: list[dict[str, float | None]] = field(default_factory=list)


class EngineDemo:
    def __init__(self, args: argparse.Namespace, log_dir: Path) -> None:
        self.args = args
        self.env = engine_env()
        drain = (f"--shutdown-timeout={SHUTDOWN_TIMEOUT_S}",)
        self.spec = EngineSpec(cpus=args.cpus, max_num_seqs=16, extra_args=drain)
        self.log_dir = log_dir
        self.duration = args.minutes * 60.0
        self.pods: list[DemoEngine] = []
        self.started = 0
        self.router = Router([])
        self.records: list[RequestRecord] = []
        self.kube = FakeKube(token="demo-token")
        self.kube.services[(NAMESPACE, SERVICE)] = []
        self.state = _State()
        self.engine_seconds = 0.0
        self.throughput = 0.0
        self.hpa = Hpa(1, args.max_replicas, DEMO_BEHAVIOR)

    # -- the fleet -------------------------------------------------------------------------------
    def _launch(self) -> DemoEngine:
        self.started += 1
        name = f"engine-{self.started}"
        group = f"{DEMO_GROUP_PREFIX}{os.getpid()}-{name}"
        e = launch_engine(self.env, self.spec, self.started, group, self.log_dir / f"{name}.log")
        pod = DemoEngine(name, e, port=int(e.url.rsplit(":", 1)[1]))
        self.pods.append(pod)
        return pod

    def _poll_ready(self) -> None:
        for pod in self.pods:
            if pod.state == STARTING and is_ready(pod.engine):
                pod.engine.cgroup.limit(self.spec.cpus)
                pod.state = READY
        self._sync()

    def _sync(self) -> None:
        self.router.route([p.engine.url for p in self.pods if p.state == READY])
        self.kube.services[(NAMESPACE, SERVICE)] = [
            *(Endpoint("127.0.0.1", pod=p.name, port=p.port) for p in self.pods if p.state == READY),
            *(Endpoint("127.0.0.1", pod=p.name, ready=False, port=p.port) for p in self.pods if p.state == STARTING),
        ]

    def _scale_to(self, n: int) -> None:
        live = [p for p in self.pods if p.state in (STARTING, READY)]
        for _ in range(n - len(live)):
            self._launch()
        if n < len(live):
            # starting engines go first (as a ReplicaSet removes not-ready pods), then the least busy
            order = sorted(live, key=lambda p: (p.state == READY, self.router.in_flight.get(p.engine.url, 0)))
            for pod in order[: len(live) - n]:
                pod.state = DRAINING
        self._sync()

    def _reap_drained(self) -> None:
        for pod in [p for p in self.pods if p.state == DRAINING]:
            if self.router.in_flight.get(pod.engine.url, 0) == 0:
                stop_engines([pod.engine], grace_s=SHUTDOWN_TIMEOUT_S + 5)
                self.pods.remove(pod)

    # -- the loop --------------------------------------------------------------------------------
    async def run(self) -> dict[str, Any]:
        first = self._launch()
        say(f"starting the first engine (a real start-up: about a minute), log {first.engine.log}")
        await asyncio.to_thread(wait_ready, first.engine)
        say(f"engine ready in {first.engine.ready_s:.0f} s; measuring what it serves under its quota")
        first.engine.cgroup.limit(self.spec.cpus)  # before measuring: the load is sized to a held engine
        throughput = await asyncio.to_thread(saturated_throughput, first.engine.url, MODEL_NAME, 64, PROMPT, OUTPUT)
        first.state = READY
        self._sync()
        self.throughput = throughput
        say(f"{throughput:.2f} req/s at saturation; the load peaks at {2 * throughput:.1f} req/s")
        api = FakeKubeServer(self.kube)
        tmp = tempfile.TemporaryDirectory()
        token = Path(tmp.name) / "token"
        token.write_text(self.kube.token)
        server = ScalerServer(Settings(host="127.0.0.1", grpc_port=0, metrics_port=0, kube_api_url=api.url,
                                       kube_token_file=token, log_level="warning"))  # fmt: skip
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
                keda = KedaEmulator(channel, SCALED_OBJECT, NAMESPACE, self.metadata())
                return await self._loop(keda, server.metrics_port)
        finally:
            await server.stop()
            api.close()
            tmp.cleanup()

    def metadata(self) -> dict[str, str]:
        return {
            "service": SERVICE,
            "engine": "vllm",
            "scrapeInterval": "1",
            "ttftSloSeconds": f"{self.args.slo_ttft:g}",
            # the calm window in proportion to a run of minutes, not a day (the default is 300 s)
            "demandWindow": f"{max(30.0, self.duration / 8):g}",
        }

    async def _loop(self, keda: KedaEmulator, metrics_port: int) -> dict[str, Any]:
        times = arrivals(self.duration, self.throughput)
        self.hpa.warm_start(0.0, 1)
        rng = random.Random(2)
        tasks: set[asyncio.Task[None]] = set()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            wall0 = time.monotonic()
            i, next_sync, next_sample, last = 0, HPA_SYNC_S, 0.0, 0.0
            while (t := time.monotonic() - wall0) < self.duration:
                while i < len(times) and times[i] <= t:
                    task = asyncio.create_task(self._send(session, Arrival(times[i], PROMPT, OUTPUT), wall0, rng))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    i += 1
                self.engine_seconds += (t - last) * sum(1 for p in self.pods if p.state != DRAINING)
                last = t
                if t >= next_sync:
                    next_sync += HPA_SYNC_S
                    await asyncio.to_thread(self._poll_ready)
                    await self._hpa_sync(keda, t, metrics_port)
                    await asyncio.to_thread(self._reap_drained)
                if t >= next_sample:
                    next_sample += 10.0
                    self._sample(t, times)
                    self._show(t, times)
                await asyncio.sleep(0.02)
            say("load done; waiting for the last streams (up to 5 minutes)")
            if tasks:
                _, pending = await asyncio.wait(tasks, timeout=300)
                for task in pending:  # still queued after that: counted as misses, not awaited forever
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
        return self._summary()

    async def _send(self, session: aiohttp.ClientSession, a: Arrival, wall0: float, rng: random.Random) -> None:
        if not self.router.urls:
            self.records.append(RequestRecord(a.t, a.t, "", PROMPT, OUTPUT, error="no_engine"))
            return
        rec = RequestRecord(a.t, a.t, "", PROMPT, OUTPUT, error="unfinished")  # still waiting when the demo ended
        try:
            rec = await stream_one(session, self.router, MODEL_NAME, a, wall0, rng, 600.0)
        finally:
            self.records.append(rec)

    async def _hpa_sync(self, keda: KedaEmulator, t: float, metrics_port: int) -> None:
        try:
            obs = await keda.hpa()
            self.state.composite = obs.value
            reading: MetricReading | None = MetricReading(AVERAGE_VALUE, obs.value, obs.target)
        except grpc.aio.AioRpcError:
            self.state.errors += 1
            reading = None
        await self._read_explanation(metrics_port)
        live = [p for p in self.pods if p.state in (STARTING, READY)]
        ready = [p for p in live if p.state == READY]
        desired = self.hpa.decide(t, len(live), len(ready), reading)
        self.state.desired = desired
        if desired != len(live):
            self.state.ups += desired > len(live)
            self.state.downs += desired < len(live)
            await asyncio.to_thread(self._scale_to, desired)

    async def _read_explanation(self, metrics_port: int) -> None:
        def fetch() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2) as resp:
                return str(resp.read().decode())

        try:
            text = await asyncio.to_thread(fetch)
        except OSError:
            return
        found = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
                 if s.labels.get("scaledobject") == SCALED_OBJECT}  # fmt: skip
        self.state.planned_rps = found.get("llm_scaler_planned_requests_per_second")
        self.state.capacity_rps = found.get("llm_scaler_replica_capacity_requests_per_second")

    def _sample(self, t: float, times: list[float]) -> None:
        recent = [r for r in self.records if t - 60.0 <= r.t < t]
        ttfts = [r.ttft_s if r.ttft_s is not None else math.inf for r in recent]
        self.state.timeline.append({
            "t": t,
            "load_rps": sum(1 for x in times if t - 60.0 <= x < t) / min(60.0, max(t, 1.0)),
            "ready": float(sum(1 for p in self.pods if p.state == READY)),
            "starting": float(sum(1 for p in self.pods if p.state == STARTING)),
            "draining": float(sum(1 for p in self.pods if p.state == DRAINING)),
            "metric": self.state.composite,
            "metric_replicas": self.state.composite,
            "desired": float(self.state.desired),
            "need_rps": self.state.planned_rps,
            "capacity_rps": self.state.capacity_rps,
            "ttft_p95_s": percentile(ttfts, 0.95) if ttfts else None,
        })  # fmt: skip

    def _show(self, t: float, times: list[float]) -> None:
        load = sum(1 for x in times if t - 30.0 <= x < t) / min(30.0, max(t, 1.0))
        comp = "  -  " if self.state.composite is None else f"{self.state.composite:5.2f}"
        states = " ".join(f"{p.name}:{p.state}" for p in self.pods)
        print(f"{int(t // 60):02d}:{int(t % 60):02d}/{int(self.duration // 60):02d}:00  load {load:5.1f} req/s  "
              f"composite {comp}  desired {self.state.desired}  {states}", flush=True)  # fmt: skip

    def _summary(self) -> dict[str, Any]:
        slo = self.args.slo_ttft
        ttfts = [r.ttft_s for r in self.records if r.ttft_s is not None]
        ok = sum(1 for r in self.records if r.complete and r.ttft_s is not None and r.ttft_s <= slo)
        timeline = self.state.timeline
        return {
            "policy": "composite",
            "knob": "targetUtilization",
            "knob_value": 0.9,
            "profile": f"vllm-cpu tiny-llama, {self.args.cpus:g} CPU per engine",
            "engine": "vllm",
            "throughput_rps": self.throughput,
            "requests": len(self.records),
            "slo_ttft_s": slo,
            "slo_attainment": ok / max(1, len(self.records)),
            "ttft_p95_s": percentile(ttfts, 0.95) if ttfts else None,
            "engine_hours": self.engine_seconds / 3600.0,
            "gpu_hours": self.engine_seconds / 3600.0,  # an engine here stands for a GPU replica (the plot's title)
            "mean_replicas": sum((p["ready"] or 0) + (p["starting"] or 0) for p in timeline) / max(1, len(timeline)),
            "max_replicas": max((int((p["ready"] or 0) + (p["starting"] or 0)) for p in timeline), default=1),
            "scale_events": self.state.ups + self.state.downs,
            "scale_ups": self.state.ups,
            "scale_downs": self.state.downs,
            "streams_cut": sum(1 for r in self.records if r.url and not r.complete),
            "metric_errors": self.state.errors,
            "minutes": self.args.minutes,
            "routing": "least-loaded",
            "config": {"max_replicas": self.hpa.max_replicas, "hpa_behavior": "demo"},
        }

    def stop(self) -> None:
        stop_engines([p.engine for p in self.pods], grace_s=10.0)


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def wait_ready(engine: Engine) -> None:
    while not is_ready(engine):
        time.sleep(1.0)


def say(msg: str) -> None:
    print(f"[demo] {msg}", file=sys.stderr, flush=True)


def engine_demo_main(args: argparse.Namespace) -> int:
    args.minutes = 8.0 if args.minutes is None else args.minutes
    args.max_replicas = 3 if args.max_replicas is None else args.max_replicas
    if not engine_env().complete:
        print("keda-llm-scaler demo --engine vllm: no engine environment: run scripts/engine build first",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.minutes <= 0 or not (0 < args.cpus <= 64):
        print("keda-llm-scaler demo: --minutes must be > 0 and --cpus in (0, 64]", file=sys.stderr)
        return 2
    try:
        cpu_controller()
    except CgroupUnavailable as exc:
        print(f"keda-llm-scaler demo --engine vllm: cannot hold engines to a CPU quota here: {exc}. Stopping: "
              "unthrottled engines would share the cores; scaling out would add nothing", file=sys.stderr)  # fmt: skip
        return 3
    from keda_llm_scaler.logs import configure_logging

    configure_logging("warning", json=False)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kls-demo-engines-") as logs:
        demo = EngineDemo(args, Path(logs))
        signal.signal(signal.SIGTERM, _interrupt)  # a SIGTERM stops the engines as ^C does
        try:
            summary = asyncio.run(demo.run())
        except KeyboardInterrupt:
            say("interrupted: stopping the engines")
            return 130
        finally:
            demo.stop()
            remove_groups(f"{DEMO_GROUP_PREFIX}{os.getpid()}-")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    from keda_llm_scaler.sim.plots import plot_run

    with contextlib.suppress(ValueError):
        plot_run(args.out_dir / "demo.png", summary, demo.state.timeline)
    print(
        f"\ndemo finished in {time.monotonic() - start:.0f}s: {summary['requests']} requests, SLO attainment "
        f"{summary['slo_attainment']:.1%} (TTFT <= {summary['slo_ttft_s']:g}s), {summary['scale_ups']} scale-ups, "
        f"{summary['scale_downs']} scale-downs, max {summary['max_replicas']} engines, "
        f"{summary['streams_cut']} streams cut"
    )
    print(f"wrote {args.out_dir / 'summary.json'} and {args.out_dir / 'demo.png'}")
    return 0
