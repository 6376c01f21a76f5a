"""Shadow mode on the real control plane (issue #33): a Deployment scaled by a CPU HorizontalPodAutoscaler
under load, with ``keda-llm-scaler shadow`` running beside it. The HPA keeps control: shadow creates no
ScaledObject and changes no replica count. It scrapes and scores the fleet as ``serve`` would, and exports
more replicas than the HPA runs while the fleet is overloaded (the CPU HPA, as on a real inference fleet,
sees nothing to act on: here it has no CPU metric at all). ``shadow-report`` then turns its recording into
a PNG and a markdown report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from keda_llm_scaler.controlplane.api import Api
from tests.e2e.kube import Fleet, Pods, eventually, free_port, scaler_metric, start_scaler, stop_process

TRIGGER = {"service": "vllm", "engine": "vllm", "replicaCapacity": "3", "scrapeInterval": "1", "demandWindow": "20"}


@pytest.fixture
def shadow(fleet: Fleet, tmp_path: Path) -> Iterator[tuple[str, Path, subprocess.Popen[bytes]]]:
    config = tmp_path / "shadow.yaml"
    config.write_text(
        json.dumps(
            {
                "workloads": [
                    {
                        "name": "vllm",
                        "namespace": fleet.namespace,
                        "metadata": TRIGGER,
                        "scaleTargetRef": {"kind": "Deployment", "name": "vllm"},
                        "maxReplicaCount": 6,
                    }
                ]
            }
        )
    )
    record, log = tmp_path / "record.jsonl", tmp_path / "shadow.log"
    port = free_port()
    proc = start_scaler(
        ["shadow", "--config", str(config), "--record", str(record), "--host", "127.0.0.1",
         "--metrics-port", str(port), "--kubeconfig", os.environ["KUBECONFIG"], "--log-json", "true",
         "--scrape-workers", "0"],
        log,
    )  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}/metrics", record, proc
    finally:
        stop_process(proc, log, "shadow")


def test_shadow_beside_a_cpu_hpa_asks_for_more_than_it_runs_and_acts_on_nothing(
    api: Api, pods: Pods, fleet: Fleet, shadow: tuple[str, Path, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    url, record, proc = shadow
    ns = fleet.namespace
    fleet.create(grace_s=5)
    cpu = {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 60}}}
    api.apply({
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "vllm", "namespace": ns},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "vllm"},
                 "minReplicas": 1, "maxReplicas": 4, "metrics": [cpu]},
    })  # fmt: skip
    eventually(lambda: any(p["ready"] for p in pods.of(ns, "vllm")), 60, "a pod ready")

    def gauge(name: str) -> float | None:
        return scaler_metric(name, url, namespace=ns, scaledobject="vllm")

    # idle: shadow agrees with what runs
    eventually(lambda: gauge("llm_scaler_shadow_actual_replicas") == 1, 60, "shadow reads the Deployment's replicas")
    eventually(lambda: gauge("llm_scaler_shadow_desired_replicas") == 1, 60, "shadow asks for 1 while idle")
    # 10 req/s on one replica that serves ~3: the composite asks for about 4
    pods.load(ns, "vllm", 10.0)
    asked = eventually(
        lambda: (d := gauge("llm_scaler_shadow_desired_replicas")) is not None and d >= 3 and d,
        120,
        "shadow asks for more replicas than exist",
    )
    composite = gauge("llm_scaler_composite")
    assert composite is not None and composite > 2, composite
    # the HPA kept control: one replica, no ScaledObject, shadow wrote nothing to the cluster
    dep = api.get("apps/v1", "Deployment", ns, "vllm") or {}
    assert dep["spec"]["replicas"] == 1 and gauge("llm_scaler_shadow_actual_replicas") == 1
    assert asked > dep["spec"]["replicas"]
    assert not api.list("keda.sh/v1alpha1", "ScaledObject", ns)["items"]
    hpa = api.get("autoscaling/v2", "HorizontalPodAutoscaler", ns, "vllm") or {}
    assert hpa["spec"]["scaleTargetRef"]["name"] == "vllm"
    pods.load(ns, "vllm", 0.0)

    # what it recorded, as a report
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert proc.returncode == 0
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert any((r.get("desired") or 0) >= 3 and r.get("actual") == 1 for r in lines)
    out = tmp_path / "report"
    run = subprocess.run(
        [sys.executable, "-m", "keda_llm_scaler", "shadow-report", str(record), "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert (out / f"shadow-{ns}_vllm.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"| {ns}/vllm |" in (out / "report.md").read_text()
    keep = os.environ.get("KLS_KEEP_SHADOW_REPORT")  # docs/shadow/: the example in docs/shadow.md
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        (Path(keep) / "shadow-example.png").write_bytes((out / f"shadow-{ns}_vllm.png").read_bytes())
        report = (out / "report.md").read_text().replace(f"shadow-{ns}_vllm.png", "shadow-example.png")
        (Path(keep) / "report.md").write_text(report.replace(ns, "shadow-e2e"))
