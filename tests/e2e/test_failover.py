"""(l) Two scaler pods behind one Service address, one killed during a ramp.

Two ``serve`` processes share the learned state in a ConfigMap (the chart's ``replicaCount: 2``) behind
a Service proxy that does kube-proxy's part (``keda_llm_scaler.controlplane.serviceproxy``): KEDA's one
gRPC connection reaches the first; the second is a standby that no call reaches. During a ramp the
first is killed with SIGKILL (an OOM kill, a crash: no last write, no stream ended cleanly). KEDA's
connection breaks, its next call opens a new one, which reaches the standby.

The reference is measured in the same run: a control fleet in another namespace gets the same load at
the same moments through the harness's scaler, which nobody kills. The fleet that failed over must
never apply KEDA's fallback, the standby's first answers must be within one replica of the primary's
at the same load (or hold the fleet's size, never more), the fleet must not shrink by more than the
composite's noise (one replica), must reach the ramp's top, and serve as well as the control fleet.

Seen to fail with the standby cold (no shared state) and the 0.2 scoring of a fleet's first seconds:
its first answer was 0.116 against the primary's 4.2, and the real HPA took the fleet from 5 to 1.
"""

from __future__ import annotations

import os
import signal
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from keda_llm_scaler.controlplane.api import Api
from keda_llm_scaler.controlplane.serviceproxy import ServiceProxy
from tests.e2e.kube import Fleet, Pods, condition, eventually, free_port, scaler_metric, start_scaler, stop_process

FAST = {"service": "vllm", "engine": "vllm", "replicaCapacity": "3", "scrapeInterval": "1", "demandWindow": "20"}
BEHAVIOR = {
    "scaleUp": {"stabilizationWindowSeconds": 0, "policies": [{"type": "Pods", "value": 4, "periodSeconds": 5}]},
    "scaleDown": {"stabilizationWindowSeconds": 10, "policies": [{"type": "Pods", "value": 4, "periodSeconds": 5}]},
}
# KEDA's default threshold; replicas 1: a fallback during the ramp would shrink the fleet, visibly
FALLBACK = {"failureThreshold": 3, "replicas": 1}
STATE_NAMESPACE = "keda"
RAMP = (3.0, 6.0, 9.0, 12.0)  # req/s, at 3 req/s per replica planned at 0.9: 2, 3, 4, 5 replicas
STEP_S = 25.0
KILL_AFTER_S = 15.0  # into the third step: the fleet is growing, the window mostly holds the new load
HOLD_S = 45.0  # at the top, after the ramp
SETTLED_S = 6.0  # the primary's last answers compared with the standby's first, over this long
DRAIN_S = 8.0  # after the load stops, before the requests are counted


@dataclass
class ScalerPod:
    name: str
    grpc_port: int
    metrics_url: str
    log: Path
    proc: Any = None

    def composite(self, ns: str) -> float | None:
        try:
            return scaler_metric("llm_scaler_composite", self.metrics_url, scaledobject="vllm", namespace=ns)
        except Exception:  # not up, or killed
            return None


@dataclass
class Sample:
    t: float
    replicas: int
    control_replicas: int
    failures: int
    fallback: str | None
    primary: float | None
    standby: float | None


@dataclass
class Watch:
    """What the test samples every half second, in a thread of its own, from the ramp's start."""

    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)


def _health_failures(so: dict[str, Any]) -> int:
    health = (so.get("status") or {}).get("health") or {}
    return max((int(h.get("numberOfFailures", 0)) for h in health.values()), default=0)


@pytest.fixture
def scaler_pods(api: Api, tmp_path: Path) -> Iterator[tuple[ScalerPod, ScalerPod, ServiceProxy]]:
    api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": STATE_NAMESPACE}})
    state = f"failover-{uuid.uuid4().hex[:6]}-state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLM_SCALER_")}
    started: list[ScalerPod] = []
    proxy: ServiceProxy | None = None
    try:
        for name in ("primary", "standby"):
            pod = ScalerPod(name, free_port(), "", tmp_path / f"{name}.log")
            metrics_port = free_port()
            pod.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
            # the harness's own flags (keda_llm_scaler/controlplane/__main__.py), the chart's state
            pod.proc = start_scaler(
                ["serve", "--host", "127.0.0.1", "--grpc-port", str(pod.grpc_port),
                 "--metrics-port", str(metrics_port), "--kubeconfig", os.environ["KUBECONFIG"],
                 "--log-json", "true", "--scrape-workers", "0",
                 "--state-configmap", f"{STATE_NAMESPACE}/{state}"],
                pod.log, env,
            )  # fmt: skip
            started.append(pod)
        primary, standby = started
        proxy = ServiceProxy([("127.0.0.1", primary.grpc_port), ("127.0.0.1", standby.grpc_port)])
        proxy.start()
        yield primary, standby, proxy
    finally:
        if proxy is not None:
            proxy.stop()
        for pod in started:
            stop_process(pod.proc, pod.log, f"{pod.name} scaler")
        api.delete("v1", "ConfigMap", STATE_NAMESPACE, state)


@pytest.fixture
def control(api: Api, pods: Pods) -> Iterator[Fleet]:
    f = Fleet.in_new_namespace(api, "failover-control")
    yield f
    pods.load(f.namespace, f.app, 0)
    f.delete_namespace()


def _watch(api: Api, fleet: Fleet, control: Fleet, primary: ScalerPod, standby: ScalerPod, w: Watch) -> None:
    start = time.monotonic()
    while not w.stop.wait(0.5):
        try:
            so = api.get("keda.sh/v1alpha1", "ScaledObject", fleet.namespace, "vllm") or {}
            w.samples.append(Sample(
                time.monotonic() - start, fleet.spec_replicas(), control.spec_replicas(), _health_failures(so),
                condition(so, "Fallback"), primary.composite(fleet.namespace), standby.composite(fleet.namespace),
            ))  # fmt: skip
        except Exception as exc:  # the API server busy for a moment: the next sample
            w.errors.append(repr(exc))


def test_a_scaler_pod_killed_during_a_ramp_hands_over_without_fallback_or_loss(
    api: Api,
    pods: Pods,
    fleet: Fleet,
    control: Fleet,
    scaler_pods: tuple[ScalerPod, ScalerPod, ServiceProxy],
) -> None:
    primary, standby, proxy = scaler_pods
    ns, cns = fleet.namespace, control.namespace
    for f, address in ((fleet, proxy.address), (control, None)):
        f.create(grace_s=20)
        f.scaled_object(FAST, min_replicas=1, max_replicas=6, behavior=BEHAVIOR, fallback=FALLBACK,
                        scaler_address=address)  # fmt: skip
    for f in (fleet, control):
        eventually(f.hpa, 60, f"KEDA creates the HPA in {f.namespace}")
        eventually(lambda f=f: any(p["ready"] for p in pods.of(f.namespace, "vllm")), 60, "the first pod ready")
    eventually(lambda: primary.composite(ns) is not None, 60, "the primary answers for the fleet")
    assert standby.composite(ns) is None, "the standby answers nothing while KEDA's connection is elsewhere"
    assert proxy.connections.get(("127.0.0.1", standby.grpc_port), 0) == 0

    w = Watch()
    watcher = threading.Thread(target=_watch, args=(api, fleet, control, primary, standby, w), daemon=True)
    before = (pods.served(ns, "vllm"), pods.served(cns, "vllm"))
    watcher.start()
    killed_at = None
    try:
        ramp_start = time.monotonic()
        for i, rps in enumerate(RAMP):
            pods.load(ns, "vllm", rps)
            pods.load(cns, "vllm", rps)
            if i == 2:
                time.sleep(KILL_AFTER_S)
                primary.proc.send_signal(signal.SIGKILL)
                primary.proc.wait(timeout=10)
                killed_at = time.monotonic() - ramp_start
                time.sleep(STEP_S - KILL_AFTER_S)
            else:
                time.sleep(STEP_S)
        time.sleep(HOLD_S)
    finally:
        w.stop.set()
        watcher.join(timeout=10)
    pods.load(ns, "vllm", 0)
    pods.load(cns, "vllm", 0)
    time.sleep(DRAIN_S)  # what is in flight finishes; what never will counts against its fleet
    after = (pods.served(ns, "vllm"), pods.served(cns, "vllm"))

    def attainment(i: int) -> tuple[float, int]:
        """Requests within the SLO over requests sent: one sent while no pod served, or cut, is a miss."""
        (s0, _, w0), (s1, _, w1) = before[i], after[i]
        return (w1 - w0) / max(s1 - s0, 1), s1 - s0

    (got, n), (reference, n_ref) = attainment(0), attainment(1)
    assert killed_at is not None
    trace = "\n".join(
        f"{s.t:6.1f} replicas {s.replicas} (control {s.control_replicas}) failures {s.failures} "
        f"fallback {s.fallback} primary {s.primary} standby {s.standby}"
        for s in w.samples
    )
    summary = (f"killed at {killed_at:.1f}s; attainment {got:.4f} of {n} sent against the control's "
               f"{reference:.4f} of {n_ref}; proxy connections {proxy.connections}; watch errors "
               f"{w.errors[-5:]}\n{trace}")  # fmt: skip
    print(summary)
    assert n > 1000 and n_ref > 1000, f"the load was sent\n{summary}"
    assert proxy.connections.get(("127.0.0.1", standby.grpc_port), 0) >= 1, f"KEDA never reached the standby\n{summary}"
    # the load is the same from 15 s before the kill to the step's end: the standby picks up where the
    # primary left off. Medians over 6 s, not single samples: at a steady 9 req/s one answer moves between
    # 2.6 and 4.2 (Poisson arrivals over 4-s bins). Within one replica of the primary's answer, or above
    # it only as far as the fleet's size: until its own rate is known the standby holds the replicas it
    # finds serving (the hold, keda_llm_scaler/policy.py), which asks for no replica the fleet lacks and
    # takes none away. A fleet the primary was shrinking when it died (the HPA's scale-down window still
    # keeping it) reads as that hold: 5.0 against the primary's 3.47 on a fleet of 5
    standby_answers = [s for s in w.samples if s.standby is not None]
    primary_then = [s.primary for s in w.samples if s.primary is not None and s.t > killed_at - SETTLED_S]
    assert standby_answers and primary_then, f"no answers to compare\n{summary}"
    start = standby_answers[0].t
    standby_first = [s.standby for s in standby_answers if s.standby is not None and s.t <= start + SETTLED_S]
    took_over, was = statistics.median(standby_first), statistics.median(primary_then)
    # the size at the takeover, not after it: a standby over-answering would have grown the fleet since
    fleet_then = max(s.replicas for s in w.samples if killed_at - SETTLED_S < s.t <= start)
    assert was - 1.0 <= took_over <= max(was + 1.0, fleet_then), (
        f"the standby's first answers {took_over} against the primary's {was} (a fleet of {fleet_then})\n{summary}"
    )
    assert max(s.failures for s in w.samples) <= FALLBACK["failureThreshold"], f"fallback's count\n{summary}"
    assert all(s.fallback != "True" for s in w.samples), f"KEDA applied the fallback\n{summary}"
    # one replica of slack: at a steady load the composite's noise alone can move a fleet by one (a 10 s
    # scale-down window); a standby answering what it does not know moved it from 5 to 1
    at_kill = [s.replicas for s in w.samples if s.t <= killed_at][-1]
    assert min(s.replicas for s in w.samples if s.t > killed_at) >= at_kill - 1, f"shrank after the kill\n{summary}"
    assert max(s.replicas for s in w.samples) >= 5, f"the ramp's top (12 req/s: 5 replicas) reached\n{summary}"
    assert got >= reference - 0.01, f"attainment lost against the control fleet\n{summary}"
