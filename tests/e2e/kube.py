"""Helpers of the end-to-end tests: objects for a fleet, the pod stand-in's control API, the scaler's
own /metrics. They run inside ``scripts/controlplane run``, which sets the ``KLS_*`` variables."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from keda_llm_scaler.controlplane.api import Api

__all__ = [
    "Fleet",
    "Pods",
    "admin_api",
    "condition",
    "eventually",
    "free_port",
    "scaler_metric",
    "start_scaler",
    "stop_process",
]


def admin_api() -> Api:
    return Api.from_kubeconfig(Path(os.environ["KUBECONFIG"]))


def eventually(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.5) -> Any:
    """``check()`` until truthy; on timeout, fail with ``what`` and the last value or error."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            got = check()
            if got:
                return got
            last = got
        except Exception as exc:  # not there yet: keep trying
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f}s (last: {last!r})")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_scaler(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``keda-llm-scaler ARGS`` with its output in ``log``; returns once its /metrics answers (the
    ``--metrics-port`` in ``args``), failing with the log's tail if it exits first."""
    port = args[args.index("--metrics-port") + 1]
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "keda_llm_scaler", *args], stdout=out,
                                stderr=subprocess.STDOUT, env=env)  # fmt: skip

    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:  # at once, not after the budget: a scaler that exited will not come up
            raise AssertionError(f"{args[0]} exited with {proc.returncode}: {log.read_text(errors='replace')[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            stop_process(proc, log, args[0])
            raise AssertionError(f"{args[0]}'s /metrics: not within 60s: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.5)
    return proc


def stop_process(proc: subprocess.Popen[bytes], log: Path | None = None, what: str = "process") -> None:
    """SIGTERM, then SIGKILL after 15 s; prints the tail of its log (pytest shows it on failure)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    if log is not None:
        print(f"--- {what}'s log (tail) ---\n{log.read_text(errors='replace')[-6000:]}")


class Pods:
    """The pod stand-in's control API."""

    def __init__(self, url: str | None = None) -> None:
        self.url = url or os.environ["KLS_PODS"]

    def status(self) -> dict[str, Any]:
        return dict(httpx.get(f"{self.url}/status", timeout=10).json())

    def of(self, namespace: str, app: str) -> list[dict[str, Any]]:
        return [p for p in self.status()["pods"] if p["namespace"] == namespace and p["app"] == app]

    def served(self, namespace: str, app: str) -> tuple[int, int, int]:
        """(requests sent, finished, finished within the SLO) to the app's pods so far."""
        for a in self.status().get("apps", []):
            if a["namespace"] == namespace and a["app"] == app:
                return int(a["sent"]), int(a["finished"]), int(a["within_slo"])
        return 0, 0, 0

    def load(
        self, namespace: str, app: str, rps: float, only: list[str] | None = None, output_tokens: int | None = None
    ) -> None:
        """``output_tokens``: the answers' length from then on (real engines only)."""
        body: dict[str, Any] = {"namespace": namespace, "app": app, "rps": rps, "pods": only}
        if output_tokens is not None:
            body["output_tokens"] = output_tokens
        httpx.post(f"{self.url}/load", json=body, timeout=10).raise_for_status()

    def fail(self, namespace: str, app: str, status: int | None) -> None:
        r = httpx.post(f"{self.url}/fail", json={"namespace": namespace, "app": app, "status": status}, timeout=10)
        r.raise_for_status()


def condition(so: dict[str, Any], kind: str) -> str | None:
    """A ScaledObject's condition of that type ("True", "False", "Unknown"), None before KEDA sets it."""
    for c in (so.get("status") or {}).get("conditions", []):
        if c.get("type") == kind:
            return str(c.get("status"))
    return None


def scaled_object_active(api: Api, namespace: str, name: str) -> str | None:
    """The ScaledObject's ``Active`` condition ("True", "False"), None before KEDA sets it."""
    return condition(api.get("keda.sh/v1alpha1", "ScaledObject", namespace, name) or {}, "Active")


def scaler_metric(name: str, url: str | None = None, **labels: str) -> float | None:
    text = httpx.get(url or os.environ["KLS_SCALER_METRICS"], timeout=10).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


@dataclass
class Fleet:
    """A Deployment of simulated vLLM pods, its Service and (optionally) a ScaledObject."""

    api: Api
    namespace: str
    app: str = "vllm"
    replicas: int = 1

    @classmethod
    def in_new_namespace(cls, api: Api, prefix: str, **kw: Any) -> Fleet:
        ns = f"{prefix}-{uuid.uuid4().hex[:6]}"
        api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        # the serviceaccount controller makes "default"; pods are refused until it exists
        eventually(lambda: api.get("v1", "ServiceAccount", ns, "default"), 30, f"default ServiceAccount in {ns}")
        return cls(api, ns, **kw)

    def create(
        self, grace_s: int = 30, ready_after_s: float | None = None, container: dict[str, Any] | None = None
    ) -> None:
        """``container``: more of the container's spec (args, lifecycle), as a real Deployment gives them."""
        annotations = {} if ready_after_s is None else {"e2e.keda-llm-scaler/ready-after": str(ready_after_s)}
        self.api.apply({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": self.app, "namespace": self.namespace},
            "spec": {
                "replicas": self.replicas,
                "selector": {"matchLabels": {"app": self.app}},
                "template": {
                    "metadata": {"labels": {"app": self.app}, "annotations": annotations},
                    "spec": {
                        "terminationGracePeriodSeconds": grace_s,
                        "automountServiceAccountToken": False,
                        "containers": [{"name": "vllm", "image": "vllm/vllm-openai:sim",
                                        "ports": [{"name": "http", "containerPort": 8000}], **(container or {})}],
                    },
                },
            },
        })  # fmt: skip
        self.api.apply({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": self.app, "namespace": self.namespace},
            "spec": {"selector": {"app": self.app}, "ports": [{"name": "http", "port": 8000, "targetPort": 8000}]},
        })  # fmt: skip

    def scaled_object(self, metadata: dict[str, str], *, trigger: str = "external", min_replicas: int = 1,
                      max_replicas: int = 6, polling_s: int = 5, cooldown_s: int = 30, fallback: dict[str, Any] | None = None,  # noqa: E501
                      behavior: dict[str, Any] | None = None, name: str | None = None,
                      scaler_address: str | None = None) -> dict[str, Any]:  # fmt: skip
        spec: dict[str, Any] = {
            "scaleTargetRef": {"name": self.app},
            "pollingInterval": polling_s,
            "cooldownPeriod": cooldown_s,
            "minReplicaCount": min_replicas,
            "maxReplicaCount": max_replicas,
            "triggers": [
                {
                    "type": trigger,
                    "metadata": {"scalerAddress": scaler_address or os.environ["KLS_SCALER_ADDRESS"], **metadata},
                }
            ],
        }
        if fallback:
            spec["fallback"] = fallback
        if behavior:
            spec["advanced"] = {"horizontalPodAutoscalerConfig": {"behavior": behavior}}
        obj = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
               "metadata": {"name": name or self.app, "namespace": self.namespace}, "spec": spec}  # fmt: skip
        return self.api.apply(obj)

    def deployment(self) -> dict[str, Any]:
        got = self.api.get("apps/v1", "Deployment", self.namespace, self.app)
        assert got is not None
        return got

    def spec_replicas(self) -> int:
        return int(self.deployment()["spec"].get("replicas", 0))

    def hpa(self, name: str | None = None) -> dict[str, Any] | None:
        return self.api.get("autoscaling/v2", "HorizontalPodAutoscaler", self.namespace, f"keda-hpa-{name or self.app}")

    def delete_namespace(self) -> None:
        self.api.delete("v1", "Namespace", None, self.namespace)


_SUFFIX = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9}


def quantity(text: str) -> float:
    """A Kubernetes quantity as the HPA's status writes one (``1333m``, ``2``, ``1500k``)."""
    num = text.rstrip("numkMG")
    return float(num) * _SUFFIX[text[len(num) :]]


def hpa_external_total(hpa: dict[str, Any]) -> tuple[float, int] | None:
    """(the metric's total as the HPA last read it, the replicas it divided by), from its status."""
    status = hpa.get("status", {})
    for m in status.get("currentMetrics") or []:
        current = (m.get("external") or {}).get("current") or {}
        if "averageValue" in current:
            replicas = int(status.get("currentReplicas", 0))
            return quantity(current["averageValue"]) * replicas, replicas
        if "value" in current:
            return quantity(current["value"]), int(status.get("currentReplicas", 0))
    return None
