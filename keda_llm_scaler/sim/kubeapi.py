"""A stand-in for the Kubernetes API on loopback: real-shaped discovery.k8s.io/v1 EndpointSlice,
core/v1 Service and Pod, apps/v1 Deployment/StatefulSet and keda.sh/v1alpha1 ScaledObject JSON, a
bearer-token check, and switchable failures (401/403/500, slow answers).

The demo publishes its simulated pods through it (the scaler discovers them exactly as in a cluster);
the tests use it where no API server can run. One EndpointSlice per distinct port.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["Endpoint", "FakeKube", "FakeKubeServer"]


@dataclass
class Endpoint:
    address: str
    ready: bool | None = True  # None: no `ready` condition (means ready)
    pod: str = ""
    port: int | None = None  # None: the FakeKube's port


@dataclass
class FakeKube:
    token: str = "test-token"
    services: dict[tuple[str, str], list[Endpoint]] = field(default_factory=dict)
    port: int = 8000
    fail_status: int = 0
    delay_s: float = 0.0  # answer slowly (timeouts)
    requests: list[str] = field(default_factory=list)
    scaled_objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    workloads: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)  # (ns, plural, name)
    pods: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # namespace -> Pod objects

    def pods_matching(self, namespace: str, selector: str) -> dict[str, Any]:
        wanted = dict(part.split("=", 1) for part in selector.split(",") if "=" in part)
        items = [
            p
            for p in self.pods.get(namespace, [])
            if all((p.get("metadata", {}).get("labels") or {}).get(k) == v for k, v in wanted.items())
        ]
        return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "99"}, "items": items}

    def endpointslice_list(self, namespace: str, service: str) -> dict[str, Any]:
        eps = list(self.services.get((namespace, service), []))
        by_port: dict[int, list[Endpoint]] = {}
        for e in eps:
            by_port.setdefault(e.port or self.port, []).append(e)
        if (namespace, service) in self.services and not by_port:
            by_port[self.port] = []  # a Service without ready pods still has its (empty) slice
        items = []
        for n, (port, group) in enumerate(sorted(by_port.items())):
            endpoints = []
            for e in group:
                conditions: dict[str, Any] = {"serving": True, "terminating": False}
                if e.ready is not None:
                    conditions["ready"] = e.ready
                endpoints.append(
                    {
                        "addresses": [e.address],
                        "conditions": conditions,
                        "targetRef": {"kind": "Pod", "namespace": namespace, "name": e.pod or e.address},
                        "nodeName": "node-1",
                    }
                )
            items.append(
                {
                    "metadata": {
                        "name": f"{service}-{n:05d}",
                        "namespace": namespace,
                        "generateName": f"{service}-",
                        "labels": {
                            "kubernetes.io/service-name": service,
                            "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                        },
                        "resourceVersion": "1234",
                    },
                    "addressType": "IPv4",
                    "endpoints": endpoints,
                    "ports": [{"name": "http", "protocol": "TCP", "port": port}],
                }
            )
        return {
            "kind": "EndpointSliceList",
            "apiVersion": "discovery.k8s.io/v1",
            "metadata": {"resourceVersion": "1234"},
            "items": items,
        }


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, code: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        kube = self.server.kube
        url = urlsplit(self.path)
        kube.requests.append(self.path)
        if kube.delay_s:
            time.sleep(kube.delay_s)
        if self.headers.get("Authorization") != f"Bearer {kube.token}":
            return self._send(401, _status(401, "Unauthorized", "Unauthorized"))
        if kube.fail_status:
            reasons = {403: "Forbidden", 500: "InternalError"}
            return self._send(
                kube.fail_status,
                _status(
                    kube.fail_status,
                    reasons.get(kube.fail_status, "Error"),
                    "endpointslices.discovery.k8s.io is forbidden" if kube.fail_status == 403 else "etcd unavailable",
                ),
            )
        parts = url.path.strip("/").split("/")
        if parts[:3] == ["apis", "discovery.k8s.io", "v1"] and len(parts) == 6 and parts[5] == "endpointslices":
            selector = parse_qs(url.query).get("labelSelector", [""])[0]
            service = selector.removeprefix("kubernetes.io/service-name=")
            return self._send(200, kube.endpointslice_list(parts[4], service))
        if parts[:2] == ["api", "v1"] and len(parts) == 6 and parts[4] == "services":
            if (parts[3], parts[5]) in kube.services:
                return self._send(
                    200,
                    {
                        "kind": "Service",
                        "apiVersion": "v1",
                        "metadata": {"name": parts[5], "namespace": parts[3]},
                        "spec": {"clusterIP": "None", "ports": [{"port": kube.port}]},
                    },
                )
            return self._send(404, _status(404, "NotFound", f'services "{parts[5]}" not found'))
        if parts[:3] == ["apis", "keda.sh", "v1alpha1"] and len(parts) == 7 and parts[5] == "scaledobjects":
            so = kube.scaled_objects.get((parts[4], parts[6]))
            if so is None:
                return self._send(404, _status(404, "NotFound", f'scaledobjects.keda.sh "{parts[6]}" not found'))
            return self._send(200, so)
        if parts[:3] == ["apis", "apps", "v1"] and len(parts) == 7:
            workload = kube.workloads.get((parts[4], parts[5], parts[6]))
            if workload is None:
                return self._send(404, _status(404, "NotFound", f'{parts[5]}.apps "{parts[6]}" not found'))
            return self._send(200, workload)
        if parts[:2] == ["api", "v1"] and len(parts) == 5 and parts[4] == "pods":
            selector = parse_qs(url.query).get("labelSelector", [""])[0]
            return self._send(200, kube.pods_matching(parts[3], selector))
        return self._send(404, _status(404, "NotFound", "the server could not find the requested resource"))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    kube: FakeKube


class FakeKubeServer:
    def __init__(self, kube: FakeKube) -> None:
        self.kube = kube
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.kube = kube
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
