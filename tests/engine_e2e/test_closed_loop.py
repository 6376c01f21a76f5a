"""Issue #30 (a) and (c) on real engines: Deployments of real vLLM, scaled by real KEDA and the real HPA
through the scaler, with the chart's drain example applied to their pods.

(c) Scale-down with the drain example: on a fleet of three engines with streams on two, the ranking marks
the idle engine and the ReplicaSet removes it first, then the less loaded busy one; the removed engines
finish their streams (none cut).
(a) A ramp, a plateau above one engine's capacity, a burst, then a fall: the fleet goes 1 -> N -> 1, and
the client-side TTFT attainment is >= 95 % outside the stretch no reactive policy can serve: the first
cold start, until the queue it left behind has drained (every ready engine's waiting gauge at 0 once the
second engine serves). That stretch must end before the burst, so it cannot hide one. The bound is
measured in the same run: the same load on a static fleet of the peak size (the fleet (c) then scales
down), over the same stretch.

The load: streaming /v1/completions from the pod stand-in (``--pods vllm``), least-in-flight over the
serving pods, in units of one engine's saturated throughput measured first.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from keda_llm_scaler.controlplane.api import Api
from keda_llm_scaler.enginelab.build import MODEL_NAME
from keda_llm_scaler.enginelab.sweep import saturated_throughput
from tests.e2e.kube import Fleet, Pods, eventually

EXAMPLES = Path(__file__).resolve().parents[2] / "charts" / "keda-llm-scaler" / "examples"
DRAIN_EXAMPLE = EXAMPLES / "vllm-deployment-drain.yaml"
COST = "controller.kubernetes.io/pod-deletion-cost"
SLO_S = 2.0
PROMPT, OUTPUT = 200, 50  # the stand-in's default token mix (--prompt-tokens, --output-tokens)
PEAK = 3  # maxReplicaCount, and the static fleet the bound is measured on
START_BUDGET_S = 600.0  # engines compiling on 2 shared cores
TRIGGER = {
    "service": "vllm",
    "engine": "vllm",
    "ttftSloSeconds": str(SLO_S),
    "scrapeInterval": "2",
    "demandWindow": "60",  # the calm window, shortened so the fall is seen within the test
}
BEHAVIOR = {
    "scaleUp": {"stabilizationWindowSeconds": 0, "policies": [{"type": "Pods", "value": 4, "periodSeconds": 5}]},
    "scaleDown": {"stabilizationWindowSeconds": 30, "policies": [{"type": "Pods", "value": 1, "periodSeconds": 15}]},
}


def drain_container() -> tuple[dict[str, Any], int]:
    """The chart's drain example, as applied to our pods: its preStop, its --shutdown-timeout, its grace."""
    docs = [d for d in yaml.safe_load_all(DRAIN_EXAMPLE.read_text()) if d and d["kind"] == "Deployment"]
    pod = docs[0]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    args = [a for a in container["args"] if a.startswith("--shutdown-timeout")]
    assert args, "the drain example sets --shutdown-timeout"
    return {"args": args, "lifecycle": container["lifecycle"]}, int(pod["terminationGracePeriodSeconds"])


def new_fleet(api: Api, prefix: str) -> Fleet:
    return Fleet.in_new_namespace(api, f"{prefix}-{uuid.uuid4().hex[:4]}")


def ready_pods(pods: Pods, fleet: Fleet) -> list[dict[str, Any]]:
    return [p for p in pods.of(fleet.namespace, fleet.app) if p["ready"] and not p["deleting"]]


def all_ready(pods: Pods, fleet: Fleet, n: int) -> list[dict[str, Any]]:
    got = eventually(lambda: ready_pods(pods, fleet) if len(ready_pods(pods, fleet)) == n else None,
                     START_BUDGET_S, f"{n} engines ready in {fleet.namespace}", interval=3)  # fmt: skip
    return list(got)


def gone(api: Api, pods: Pods, fleet: Fleet) -> None:
    if api.get("v1", "Namespace", None, fleet.namespace) is not None:
        fleet.delete_namespace()
    eventually(lambda: not pods.of(fleet.namespace, fleet.app), 300, f"{fleet.namespace} gone", interval=2)


def records(pods: Pods, pod_names: set[str], since: float) -> list[dict[str, Any]]:
    rows = httpx.get(f"{pods.url}/records", timeout=60).json()
    return [r for r in rows if r["pod"] in pod_names and r["sent"] >= since]


def attainment(rows: list[dict[str, Any]]) -> float:
    ok = sum(1 for r in rows if r["complete"] and r["ttft_s"] is not None and r["ttft_s"] <= SLO_S)
    return ok / len(rows) if rows else float("nan")


def streams_cut(pods: Pods, fleet: Fleet) -> int:
    return sum(d["streams_cut"] for d in pods.status()["deleted"] if d["namespace"] == fleet.namespace)


@dataclass
class Timeline:
    """The fleet every 2 s while a profile runs: (wall time, spec replicas, ready pods, rate)."""

    points: list[tuple[float, int, int, float]] = field(default_factory=list)
    pod_names: set[str] = field(default_factory=set)
    first_scaled_ready: float | None = None  # when a second pod first served
    backlog_drained: float | None = None  # then, when no ready engine had a request waiting


def waiting(url: str) -> float:
    """The engine's own waiting gauge (vLLM V1: one sample per engine)."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "vllm:num_requests_waiting")  # fmt: skip


def run_profile(pods: Pods, fleet: Fleet, steps: list[tuple[float, float, float]], timeline: Timeline) -> None:
    """Each step (seconds, rate at its start, rate at its end), the rate moved linearly every 2 s."""
    for duration, r0, r1 in steps:
        t0 = time.monotonic()
        while (elapsed := time.monotonic() - t0) < duration:
            rate = r0 + (r1 - r0) * elapsed / duration
            pods.load(fleet.namespace, fleet.app, rate)
            ready = ready_pods(pods, fleet)
            timeline.pod_names |= {p["name"] for p in pods.of(fleet.namespace, fleet.app)}
            if len(ready) >= 2 and timeline.first_scaled_ready is None:
                timeline.first_scaled_ready = time.time()
            if timeline.first_scaled_ready is not None and timeline.backlog_drained is None:
                with contextlib.suppress(httpx.HTTPError):
                    if sum(waiting(p["url"]) for p in ready) == 0:
                        timeline.backlog_drained = time.time()
            timeline.points.append((time.time(), fleet.spec_replicas(), len(ready), rate))
            time.sleep(2.0)
    pods.load(fleet.namespace, fleet.app, 0)
    eventually(lambda: all(p["in_flight"] == 0 for p in pods.of(fleet.namespace, fleet.app)), 300,
               f"{fleet.namespace}'s streams done", interval=1)  # fmt: skip


def profile(throughput: float, cold_start_s: float) -> list[tuple[float, float, float]]:
    """Ramp, a plateau above one engine's capacity, a burst, a fall: in units of one engine's saturated
    throughput T (its capacity within a 2 s TTFT is about 0.8 T: two engines serve the plateau at about
    80 % and the burst at about 95 %; a burst shorter than a cold start is served by what is there).

    The plateau outlasts a cold start measured in the same run, with time to drain the queue it leaves:
    the excluded stretch must end before the burst, and an engine's start-up here runs from 100 s to
    250 s with the CPU (an AVX2-only machine's plateau of 120 s ended 4 s before its second engine was
    ready)."""
    t = throughput
    plateau = max(120.0, cold_start_s + 90.0)
    return [(120, 0.2 * t, 1.3 * t), (plateau, 1.3 * t, 1.3 * t), (20, 1.5 * t, 1.5 * t), (90, 0.3 * t, 0.3 * t)]


def burst_starts_s(steps: list[tuple[float, float, float]]) -> float:
    return steps[0][0] + steps[1][0]


@dataclass
class StaticRun:
    fleet: Fleet
    throughput: float
    steps: list[tuple[float, float, float]]
    started: float
    rows: list[dict[str, Any]]


@pytest.fixture(scope="module")
def static(api: Api, pods: Pods) -> Iterator[StaticRun]:
    """The peak fleet, static, under the profile up to its fall (where a static fleet of the peak has
    nothing left to show): the bound of (a), and the fleet (c) scales down."""
    container, grace = drain_container()
    fleet = new_fleet(api, "static")
    fleet.replicas = PEAK
    created = time.monotonic()
    fleet.create(grace_s=grace, container=container)
    ready = all_ready(pods, fleet, PEAK)
    cold_start_s = time.monotonic() - created  # PEAK engines starting at once: no shorter than one alone
    throughput = saturated_throughput(ready[0]["url"], MODEL_NAME, 96, PROMPT, OUTPUT)
    assert throughput > 0.5, "an engine that serves nothing: the engine, not the scaler, is broken"
    steps = profile(throughput, cold_start_s)
    timeline = Timeline()
    started = time.time()
    run_profile(pods, fleet, steps[:-1], timeline)
    yield StaticRun(fleet, throughput, steps, started, records(pods, timeline.pod_names, started))
    gone(api, pods, fleet)


def test_c_scale_down_drains_and_removes_the_least_loaded_engine(api: Api, pods: Pods, static: StaticRun) -> None:
    fleet = static.fleet
    names = sorted(p["name"] for p in all_ready(pods, fleet, PEAK))
    busy, idle = names[:2], names[2]
    behavior = {"scaleDown": {"stabilizationWindowSeconds": 0,
                              "policies": [{"type": "Pods", "value": 1, "periodSeconds": 5}]}}  # fmt: skip
    # a capacity far above the load: minReplicaCount alone decides the size, the ranking which pod goes
    fleet.scaled_object({**TRIGGER, "replicaCapacity": "100"}, min_replicas=PEAK, max_replicas=PEAK, polling_s=2,
                        behavior=behavior)  # fmt: skip
    removed: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        left = set(names)
        while not stop.wait(0.5):
            serving = {p["name"] for p in pods.of(fleet.namespace, fleet.app) if not p["deleting"]}
            removed.extend(sorted(left - serving))
            left &= serving

    # The two busy engines must hold clearly more than the four requests that take a pod out of idle
    # (victims.LEVEL_HYSTERESIS); the third gets none. Requests held = token rate x inter-token latency, so
    # a fixed rate is not enough: 1 req/s of 150-token answers held 3-4 streams on a fast day (the ranking
    # rightly kept the busy pods idle, and the test failed). At 0.65 of the engine's saturated token rate
    # (measured by `static`), its batch holds 6-7 streams at any engine speed, below the knee.
    answer = 150
    rate = len(busy) * 0.65 * static.throughput * OUTPUT / answer
    pods.load(fleet.namespace, fleet.app, rate, only=busy, output_tokens=answer)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        seen: list[dict[str, Any]] = []  # the last pass, for the failure message

        def ranked() -> dict[str, int] | None:
            costs = {n: int((p["metadata"].get("annotations") or {}).get(COST, 0))
                     for n, p in pod_objects(api, fleet).items()}  # fmt: skip
            held = {p["name"]: p["in_flight"] for p in pods.of(fleet.namespace, fleet.app)}
            seen[:] = [{"costs": costs, "in_flight": held}]
            return costs if len(costs) == PEAK and all(costs[idle] < costs[b] for b in busy) else None

        try:
            costs = eventually(ranked, 180, "deletion costs rank the idle engine below the busy ones", interval=1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; idle {idle}, last seen {seen}") from None
        resize(api, fleet, PEAK - 1)
        eventually(lambda: len(removed) >= 1, 180, "one engine removed", interval=1)
        time.sleep(10)  # the ranking catches up with the two left
        resize(api, fleet, PEAK - 2)
        eventually(lambda: len(removed) >= 2, 180, "a second engine removed", interval=1)
        eventually(lambda: len(pods.of(fleet.namespace, fleet.app)) == 1, 300, "two engines gone", interval=2)
    finally:
        pods.load(fleet.namespace, fleet.app, 0)
        stop.set()
        watcher.join()
    report = {"busy": busy, "idle": idle, "rate": round(rate, 2), "costs": costs, "removed": removed,
              "streams_cut": streams_cut(pods, fleet),
              "deleted": [d for d in pods.status()["deleted"] if d["namespace"] == fleet.namespace]}  # fmt: skip
    print(json.dumps(report), file=sys.stderr)
    assert removed[0] == idle, report  # the ranking chose the idle engine, and the ReplicaSet followed it
    assert report["streams_cut"] == 0, report  # the busy one that went finished every stream it held


def test_a_real_fleet_scales_out_and_back_and_holds_the_slo(api: Api, pods: Pods, static: StaticRun) -> None:
    gone(api, pods, static.fleet)  # its engines' memory and cores are the loop's now
    container, grace = drain_container()
    fleet = new_fleet(api, "loop")
    fleet.create(grace_s=grace, container=container)
    all_ready(pods, fleet, 1)
    fleet.scaled_object(TRIGGER, min_replicas=1, max_replicas=PEAK, polling_s=2, cooldown_s=30, behavior=BEHAVIOR)
    timeline = Timeline()
    started = time.time()
    run_profile(pods, fleet, static.steps, timeline)
    # back: the fall asks for one engine; the others drain as the example says
    eventually(lambda: fleet.spec_replicas() == 1 and len(pods.of(fleet.namespace, fleet.app)) == 1, 420,
               "the fleet back at one engine", interval=3)  # fmt: skip
    rows = records(pods, timeline.pod_names, started)
    cut = streams_cut(pods, fleet)
    peak = max((p[1] for p in timeline.points), default=0)
    end = timeline.backlog_drained
    after = [r for r in rows if end is not None and r["sent"] >= end]
    offset = None if end is None else end - started
    static_after = [r for r in static.rows if r["sent"] >= static.started + (offset or 0.0)]
    report = {
        "throughput_rps": static.throughput,
        "steps": static.steps,
        "first_cold_start_ends_s": None
        if timeline.first_scaled_ready is None
        else timeline.first_scaled_ready - started,
        "its_backlog_drained_s": offset,
        "peak_replicas": peak,
        "attainment_outside_the_first_cold_start": attainment(after),
        "attainment_whole_run": attainment(rows),
        "static_attainment_same_stretch": attainment(static_after),
        "static_attainment_whole_run": attainment(static.rows),
        "requests": len(rows),
        "streams_cut": cut,
        "timeline": [(round(t - started), spec, ready, round(rate, 2)) for t, spec, ready, rate in timeline.points],
    }
    print(json.dumps(report), file=sys.stderr)
    gone(api, pods, fleet)
    assert timeline.first_scaled_ready is not None and peak >= 2, report  # 1 -> N
    assert offset is not None and offset < burst_starts_s(static.steps), report  # the excluded stretch hides no burst
    # the bound: the peak fleet serves this load over the same stretch (else the load, not the scaler, is wrong)
    assert attainment(static_after) >= 0.95, report
    assert attainment(after) >= 0.95, report
    assert cut == 0, report


def pod_objects(api: Api, fleet: Fleet) -> dict[str, dict[str, Any]]:
    listed = api.list("v1", "Pod", fleet.namespace, labelSelector=f"app={fleet.app}")
    return {p["metadata"]["name"]: p for p in listed["items"] if not p["metadata"].get("deletionTimestamp")}


def resize(api: Api, fleet: Fleet, n: int) -> None:
    api.patch("keda.sh/v1alpha1", "ScaledObject", fleet.namespace, fleet.app,
              {"spec": {"minReplicaCount": n, "maxReplicaCount": n}})  # fmt: skip
