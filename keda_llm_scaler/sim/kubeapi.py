"""A stand-in for the Kubernetes API on loopback: real-shaped discovery.k8s.io/v1 EndpointSlice,
core/v1 Service and Pod, apps/v1 Deployment/StatefulSet and keda.sh/v1alpha1 ScaledObject JSON, a
bearer-token check, and switchable failures (401/403/500, slow answers).

Lists and watches behave as the API server's do: every object carries a ``resourceVersion`` from one
counter, a list answers the collection's version, ``?watch=true&resourceVersion=N`` streams the
ADDED / MODIFIED / DELETED events after N as chunked JSON lines (BOOKMARKs when asked for), ends after
``timeoutSeconds``, and a version older than the last ``compact()`` gets an ERROR event with a 410
Status. ``drop_watches()`` cuts every open stream mid-chunk, as a restarting API server or a load
balancer does. State is declared (``services``, ``pods``): changes are turned into events as they are
seen (every 20 ms while a watch is open).

The demo publishes its simulated pods through it (the scaler discovers them exactly as in a cluster);
the tests use it where no API server can run. One EndpointSlice per distinct port and address family.
"""

from __future__ import annotations

import ipaddress
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
    terminating: bool = False


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
    selectors: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)  # Service -> spec.selector
    bookmark_every_s: float = 2.0
    # pod PATCH (the deletion-cost annotation): a status to answer instead (403: no RBAC), a delay, and
    # every patch applied, as (namespace, name, annotations)
    patch_status: int = 0
    patch_delay_s: float = 0.0
    patches: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    # resource versions and the event history (guarded by _lock)
    rv: int = 100
    compacted_rv: int = 0
    history: list[tuple[int, str, str, dict[str, Any]]] = field(default_factory=list)  # (rv, type, coll, obj)
    _objects: dict[tuple[str, str, str], tuple[str, dict[str, Any]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _drops: int = 0
    _synced_at: float = 0.0

    # -- resource versions -----------------------------------------------------------------------
    def _current(self) -> dict[tuple[str, str, str], dict[str, Any]]:
        """Every object the declared state describes, by (collection, namespace, name)."""
        out: dict[tuple[str, str, str], dict[str, Any]] = {}
        for ns, svc in list(self.services):
            for item in self.endpointslice_items(ns, svc):
                out[("endpointslices", ns, item["metadata"]["name"])] = item
        for ns, pods in list(self.pods.items()):
            for pod in list(pods):
                meta = dict(pod.get("metadata") or {})
                meta.setdefault("namespace", ns)
                meta.setdefault("uid", f"uid-{ns}-{meta.get('name')}")
                out[("pods", ns, str(meta.get("name")))] = {**pod, "metadata": meta}
        return out

    def sync(self, max_age_s: float = 0.0) -> int:
        """Turn declared changes into events; returns the current resourceVersion. ``max_age_s``: skip
        the (whole-state) comparison when one ran that recently (open watches poll with it)."""
        with self._lock:
            now = time.monotonic()
            if max_age_s and now - self._synced_at < max_age_s:
                return self.rv
            self._synced_at = now
            current = self._current()
            for key, obj in current.items():
                body = json.dumps(obj, sort_keys=True)
                old = self._objects.get(key)
                if old is None or old[0] != body:
                    self.rv += 1
                    stamped = json.loads(body)
                    stamped["metadata"]["resourceVersion"] = str(self.rv)
                    self._objects[key] = (body, stamped)
                    self.history.append((self.rv, "ADDED" if old is None else "MODIFIED", key[0], stamped))
            for key in [k for k in self._objects if k not in current]:
                self.rv += 1
                _, last = self._objects.pop(key)
                gone = json.loads(json.dumps(last))
                gone["metadata"]["resourceVersion"] = str(self.rv)
                self.history.append((self.rv, "DELETED", key[0], gone))
            return self.rv

    def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """A JSON merge patch of a declared pod's metadata.annotations, as the API server applies it: a UID
        in the patch that is not the pod's is a change of an immutable field (422 Invalid)."""
        meta_patch = patch.get("metadata") or {}
        with self._lock:
            pod = next((p for p in self.pods.get(namespace, []) if (p.get("metadata") or {}).get("name") == name), None)
            if pod is None:
                return 404, _status(404, "NotFound", f'pods "{name}" not found')
            meta = pod.setdefault("metadata", {})
            uid = meta.get("uid") or f"uid-{namespace}-{name}"
            if meta_patch.get("uid") and meta_patch["uid"] != uid:
                # metadata.uid is immutable: the API server refuses the update as invalid
                message = (
                    f'Pod "{name}" is invalid: metadata.uid: Invalid value: "{meta_patch["uid"]}": field is immutable'
                )
                return 422, _status(422, "Invalid", message)
            annotations = dict(meta.get("annotations") or {})
            for key, value in (meta_patch.get("annotations") or {}).items():
                if value is None:
                    annotations.pop(key, None)
                else:
                    annotations[key] = value
            meta["annotations"] = annotations
            self.patches.append((namespace, name, dict(meta_patch.get("annotations") or {})))
            return 200, {"kind": "Pod", "apiVersion": "v1", **pod}

    def compact(self) -> None:
        """Forget the history (etcd compaction): watches from older versions get 410 Gone."""
        self.sync()
        with self._lock:
            self.compacted_rv = self.rv
            self.history.clear()

    def drop_watches(self) -> None:
        """Cut every open watch stream without its final chunk."""
        with self._lock:
            self._drops += 1

    def events_after(self, rv: int, collection: str, namespace: str, selector: str) -> tuple[list[dict[str, Any]], int]:
        """The collection's events after ``rv``, and the version they bring a watcher up to."""
        with self._lock:
            events = [
                {"type": kind, "object": obj}
                for v, kind, coll, obj in self.history
                if v > rv and coll == collection and _matches(obj, namespace, selector)
            ]
            return events, self.rv

    def collection(self, collection: str, namespace: str, selector: str) -> dict[str, Any]:
        rv = self.sync()
        with self._lock:
            items = [
                obj
                for (coll, _, _), (_, obj) in sorted(self._objects.items())
                if coll == collection and _matches(obj, namespace, selector)
            ]
        kind = {"pods": ("PodList", "v1"), "endpointslices": ("EndpointSliceList", "discovery.k8s.io/v1")}
        list_kind, api_version = kind[collection]
        return {"kind": list_kind, "apiVersion": api_version, "metadata": {"resourceVersion": str(rv)}, "items": items}

    def endpointslice_items(self, namespace: str, service: str) -> list[dict[str, Any]]:
        eps = list(self.services.get((namespace, service), []))
        groups: dict[tuple[int, str], list[Endpoint]] = {}
        for e in eps:
            groups.setdefault((e.port or self.port, _family(e.address)), []).append(e)
        if (namespace, service) in self.services and not groups:
            groups[(self.port, "IPv4")] = []  # a Service without ready pods still has its (empty) slice
        items = []
        for n, ((port, family), group) in enumerate(sorted(groups.items())):
            endpoints = []
            for e in group:
                conditions: dict[str, Any] = {"serving": not e.terminating, "terminating": e.terminating}
                if e.ready is not None:
                    conditions["ready"] = e.ready and not e.terminating
                name = e.pod or e.address
                endpoints.append(
                    {
                        "addresses": [e.address],
                        "conditions": conditions,
                        "targetRef": {
                            "kind": "Pod",
                            "namespace": namespace,
                            "name": name,
                            "uid": f"uid-{namespace}-{name}",
                        },
                        "nodeName": "node-1",
                    }
                )
            items.append(
                {
                    "metadata": {
                        "name": f"{service}-{family.lower()}-{n:05d}",
                        "namespace": namespace,
                        "generateName": f"{service}-",
                        "labels": {
                            "kubernetes.io/service-name": service,
                            "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                        },
                    },
                    "addressType": family,
                    "endpoints": endpoints,
                    "ports": [{"name": "http", "protocol": "TCP", "port": port}],
                }
            )
        return items


def _family(address: str) -> str:
    try:
        return "IPv6" if isinstance(ipaddress.ip_address(address), ipaddress.IPv6Address) else "IPv4"
    except ValueError:
        return "FQDN"


def _matches(obj: dict[str, Any], namespace: str, selector: str) -> bool:
    """Equality-based label selectors (``a=b,c=d``), which is what the scaler sends."""
    meta = obj.get("metadata") or {}
    if meta.get("namespace") != namespace:
        return False
    labels = meta.get("labels") or {}
    wanted = dict(part.split("=", 1) for part in selector.split(",") if "=" in part)
    return all(labels.get(k) == v for k, v in wanted.items())


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
    protocol_version = "HTTP/1.1"  # keep-alive, and chunked watch streams as the API server sends them

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
        query = parse_qs(url.query)
        selector = query.get("labelSelector", [""])[0]
        collection = None
        if parts[:3] == ["apis", "discovery.k8s.io", "v1"] and len(parts) == 6 and parts[5] == "endpointslices":
            collection, namespace = "endpointslices", parts[4]
        if parts[:2] == ["api", "v1"] and len(parts) == 5 and parts[4] == "pods":
            collection, namespace = "pods", parts[3]
        if collection is not None:
            if query.get("watch", [""])[0] in ("true", "1"):
                return self._watch(collection, namespace, selector, query)
            return self._send(200, kube.collection(collection, namespace, selector))
        if parts[:2] == ["api", "v1"] and len(parts) == 6 and parts[4] == "services":
            if (parts[3], parts[5]) in kube.services:
                spec: dict[str, Any] = {"clusterIP": "None", "ports": [{"port": kube.port}]}
                if (parts[3], parts[5]) in kube.selectors:
                    spec["selector"] = kube.selectors[(parts[3], parts[5])]
                return self._send(
                    200,
                    {
                        "kind": "Service",
                        "apiVersion": "v1",
                        "metadata": {"name": parts[5], "namespace": parts[3]},
                        "spec": spec,
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
        return self._send(404, _status(404, "NotFound", "the server could not find the requested resource"))

    def do_PATCH(self) -> None:
        kube = self.server.kube
        url = urlsplit(self.path)
        kube.requests.append(f"PATCH {self.path}")
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if kube.patch_delay_s:
            time.sleep(kube.patch_delay_s)
        if self.headers.get("Authorization") != f"Bearer {kube.token}":
            return self._send(401, _status(401, "Unauthorized", "Unauthorized"))
        parts = url.path.strip("/").split("/")
        if not (parts[:2] == ["api", "v1"] and len(parts) == 6 and parts[4] == "pods"):
            return self._send(405, _status(405, "MethodNotAllowed", "the server does not allow this method"))
        namespace, name = parts[3], parts[5]
        if kube.patch_status:
            message = (
                f'pods "{name}" is forbidden: User "system:serviceaccount:keda:keda-llm-scaler" cannot patch '
                f'resource "pods" in API group "" in the namespace "{namespace}"'
            )
            reason = {403: "Forbidden", 429: "TooManyRequests"}.get(kube.patch_status, "InternalError")
            return self._send(kube.patch_status, _status(kube.patch_status, reason, message))
        if self.headers.get("Content-Type") != "application/merge-patch+json":
            return self._send(
                415, _status(415, "UnsupportedMediaType", "the body of the request was in an unknown format")
            )
        try:
            patch = json.loads(raw)
        except ValueError:
            return self._send(400, _status(400, "BadRequest", "invalid JSON"))
        code, body = kube.patch_pod(namespace, name, patch if isinstance(patch, dict) else {})
        return self._send(code, body)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _watch(self, collection: str, namespace: str, selector: str, query: dict[str, list[str]]) -> None:
        kube = self.server.kube
        try:
            since = int(query.get("resourceVersion", ["0"])[0] or 0)
        except ValueError:
            return self._send(400, _status(400, "BadRequest", "invalid resourceVersion"))
        timeout_s = float(query.get("timeoutSeconds", ["1800"])[0])
        bookmarks = query.get("allowWatchBookmarks", [""])[0] == "true"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        kube.sync()
        if since < kube.compacted_rv:
            gone = _status(410, "Expired", f"too old resource version: {since} ({kube.compacted_rv})")
            self._chunk(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
            self._chunk(b"")
            return
        drops, started, last_bookmark = kube._drops, time.monotonic(), time.monotonic()
        try:
            while time.monotonic() - started < timeout_s and not self.server.closing:
                if kube._drops != drops:
                    self.close_connection = True  # cut mid-stream: no terminating chunk
                    return
                events, upto = kube.events_after(since, collection, namespace, selector)
                for event in events:
                    self._chunk(json.dumps(event).encode() + b"\n")
                since = upto
                if bookmarks and time.monotonic() - last_bookmark >= kube.bookmark_every_s:
                    last_bookmark = time.monotonic()
                    mark = {
                        "kind": "Pod" if collection == "pods" else "EndpointSlice",
                        "metadata": {"resourceVersion": str(since)},
                    }
                    self._chunk(json.dumps({"type": "BOOKMARK", "object": mark}).encode() + b"\n")
                time.sleep(0.02)
                kube.sync(max_age_s=0.02)
            self._chunk(b"")  # the server's timeout: a clean end of the stream
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    kube: FakeKube
    closing = False


class FakeKubeServer:
    def __init__(self, kube: FakeKube) -> None:
        self.kube = kube
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.kube = kube
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self._server.closing = True
        self._server.shutdown()
        self._server.server_close()
