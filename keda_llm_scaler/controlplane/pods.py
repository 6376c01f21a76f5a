"""The pod stand-in: a kubelet's part of the e2e, for pods whose container is a simulated vLLM replica.

It registers a Node, binds every pending pod to it (no scheduler runs), gives each an address from the
namespace's pod range, serves the project's replica model (``sim.replica``) as vLLM ``/metrics`` at that
address, and reports the pod Running — Ready after ``--ready-after`` seconds (the model loading).
A load generator sends Poisson arrivals of a token mix to the ready pods of each app (least-loaded), at
a rate the test sets. Deletion is honoured as a kubelet does: the pod stops getting requests, its
streams drain until its grace period ends, what is left is cut (counted), then the pod is deleted for
good (grace 0, UID precondition).

Its control API (HTTP on 127.0.0.1, JSON):
- ``GET /status``: pods (name, namespace, app, ip, ready, running, waiting, kv, deleting), streams cut,
  requests sent and finished, TTFT attainment; per app (``apps``) the requests sent, finished and
  finished within the SLO;
- ``POST /load`` ``{"namespace", "app", "rps", "pods"?}``: the offered rate of one app, sent only to the
  named pods when ``pods`` is given (a fleet whose load is uneven); with real engines also
  ``"prompt_tokens"?, "output_tokens"?`` (the app's requests from then on);
- ``POST /fail`` ``{"namespace", "app", "status"}``: every pod of the app answers its scrapes with that
  HTTP status (``null``: back to normal).
"""

from __future__ import annotations

import ipaddress
import json
import math
import random
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

import httpx

from keda_llm_scaler.controlplane.api import Api, ApiError, reply_json
from keda_llm_scaler.sim.exporter import ReplicaExporter
from keda_llm_scaler.sim.mixes import MIXES, LognormalMix
from keda_llm_scaler.sim.profiles import get_profile
from keda_llm_scaler.sim.replica import Request, SimReplica

__all__ = ["PodStandIn", "ReportedPod", "Stats"]

NODE = "standin-0"
TICK_S = 0.05
DEFAULT_PORT = 8000


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class LocalPod:
    namespace: str
    name: str
    uid: str
    app: str
    ip: str
    replica: SimReplica
    exporter: ReplicaExporter
    started: float
    ready_at: float
    ready: bool = False
    deleting_since: float | None = None
    grace_s: float = 30.0
    reported_ready: bool = False

    @property
    def serving(self) -> bool:
        return self.ready and self.deleting_since is None


class ReportedPod(Protocol):
    """What a pod's status report needs (a simulated replica's pod or a real engine's)."""

    namespace: str
    name: str
    uid: str
    ip: str
    reported_ready: bool


@dataclass
class Stats:
    sent: int = 0
    finished: int = 0
    within_slo: int = 0
    streams_cut: int = 0
    drained: int = 0  # pods that finished every stream before their grace ended
    deleted: list[dict[str, Any]] = field(default_factory=list)
    # per (namespace, app): [sent, finished, within the SLO], so that two fleets of one run compare
    by_app: dict[tuple[str, str], list[int]] = field(default_factory=dict)

    def of_app(self, namespace: str, app: str) -> list[int]:
        return self.by_app.setdefault((namespace, app), [0, 0, 0])


class PodStandIn:
    def __init__(
        self, api: Api, pod_cidr: str, profile: str, mix: str, ready_after_s: float, slo_ttft_s: float
    ) -> None:
        self.api = api
        self.profile = get_profile(profile)
        chosen = MIXES[mix]
        if not isinstance(chosen, LognormalMix):
            raise ValueError(f"the stand-in draws tokens from a lognormal mix, not {mix!r}")
        self.mix = chosen
        self.ready_after_s = ready_after_s
        self.slo_ttft_s = slo_ttft_s
        self.lock = threading.Lock()  # pods, loads, stats; the exporters read replicas under it too
        self.pods: dict[str, LocalPod] = {}  # by uid
        self.loads: dict[tuple[str, str], float] = {}
        self.only_pods: dict[tuple[str, str], set[str]] = {}
        self.failing: dict[tuple[str, str], int | None] = {}
        self.stats = Stats()
        net = ipaddress.ip_network(pod_cidr)
        self.free_ips = [str(ip) for ip in list(net.hosts())[9:]]  # .10 and up; .1 is the node
        self.rng = random.Random(7)
        self.stopping = threading.Event()
        self.next_rid = 0
        self.errors: list[str] = []

    # -- the node -----------------------------------------------------------------------------------
    def register_node(self) -> None:
        self.api.apply({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
        })  # fmt: skip
        status = {
            "status": {
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "lastHeartbeatTime": _now(), "lastTransitionTime": _now()}],
                "addresses": [{"type": "InternalIP", "address": "10.244.0.1"}, {"type": "Hostname", "address": NODE}],
                "capacity": {"cpu": "64", "memory": "512Gi", "pods": "200", "nvidia.com/gpu": "64"},
                "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "200", "nvidia.com/gpu": "64"},
            }
        }  # fmt: skip
        self.api.patch("v1", "Node", None, NODE, status, sub="status")

    # -- pods ---------------------------------------------------------------------------------------
    def watch_pods(self) -> None:
        rv = ""
        while not self.stopping.is_set():
            try:
                if not rv:
                    listed = self.api.list("v1", "Pod")
                    for pod in listed["items"]:
                        self.reconcile(pod)
                    rv = listed["metadata"]["resourceVersion"]
                for event in self.api.watch("/api/v1/pods", rv, timeout_s=30):
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        rv = ""  # 410 Gone: list again
                        break
                    rv = obj["metadata"].get("resourceVersion", rv)
                    if event["type"] == "BOOKMARK":
                        continue
                    if event["type"] == "DELETED":
                        self._forget(obj["metadata"]["uid"], cut=True)
                    else:
                        self.reconcile(obj)
            except Exception as exc:  # the API server restarting, a dropped watch: resume
                self._error(f"pod watch: {exc}")
                rv = ""
                self.stopping.wait(1.0)

    def _error(self, msg: str) -> None:
        with self.lock:
            self.errors = [*self.errors[-49:], msg]

    def reconcile(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        uid = meta["uid"]
        if not spec.get("nodeName"):
            if not meta.get("deletionTimestamp"):
                self._bind(meta)
            return
        if spec["nodeName"] != NODE:
            return
        if meta.get("deletionTimestamp"):
            if not self._begin_deletion(uid, float(meta.get("deletionGracePeriodSeconds", 30))):
                self._delete_now(meta)  # nothing runs for it here: delete it for good
            return
        if not self._known(uid) and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            self._start(pod)

    def _known(self, uid: str) -> bool:
        with self.lock:
            return uid in self.pods

    def _begin_deletion(self, uid: str, grace_s: float) -> bool:
        """A graceful deletion seen: the pod stops getting requests and drains for ``grace_s``. False when
        no such pod runs here."""
        with self.lock:
            local = self.pods.get(uid)
            if local is not None and local.deleting_since is None:
                local.deleting_since, local.grace_s = time.monotonic(), grace_s
        return local is not None

    def _bind(self, meta: dict[str, Any]) -> None:
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": meta["name"]},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}}  # fmt: skip
        try:
            self.api.request("POST", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding",
                             json=binding, what="bind")  # fmt: skip
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise

    def _start(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        with self.lock:
            if not self.free_ips:
                self._error(f"no free pod address for {meta['name']}")
                return
            ip = self.free_ips.pop(0)
        port = DEFAULT_PORT
        for c in pod["spec"].get("containers", []):
            for p in c.get("ports", []):
                port = int(p["containerPort"])
                break
        replica = SimReplica(self.profile, name=meta["name"], start=time.monotonic())
        exporter = ReplicaExporter(replica, self.lock, host=ip, port=port)
        ready_after = float(meta.get("annotations", {}).get("e2e.keda-llm-scaler/ready-after", self.ready_after_s))
        now = time.monotonic()
        local = LocalPod(meta["namespace"], meta["name"], meta["uid"], meta.get("labels", {}).get("app", ""),
                         ip, replica, exporter, now, now + ready_after)  # fmt: skip
        with self.lock:
            exporter.failing = self.failing.get((local.namespace, local.app))
            self.pods[local.uid] = local
        self._report(local, ready=False)

    def _report(self, local: ReportedPod, ready: bool) -> None:
        now = _now()
        cond = "True" if ready else "False"
        status = {
            "status": {
                "phase": "Running", "hostIP": "10.244.0.1", "podIP": local.ip, "podIPs": [{"ip": local.ip}],
                "startTime": now,
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                    {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                    {"type": "ContainersReady", "status": cond, "lastTransitionTime": now},
                    {"type": "Ready", "status": cond, "lastTransitionTime": now},
                ],
                "containerStatuses": [{"name": "vllm", "ready": ready, "restartCount": 0, "started": True,
                                       "image": "vllm/vllm-openai:sim", "imageID": "", "containerID": f"sim://{local.uid}",
                                       "state": {"running": {"startedAt": now}}}],
            }
        }  # fmt: skip
        try:
            self.api.patch("v1", "Pod", local.namespace, local.name, status, sub="status", kind_of_patch="strategic")
            local.reported_ready = ready
        except ApiError as exc:
            if exc.status != 404:
                self._error(f"status of {local.name}: {exc}")
        except httpx.HTTPError as exc:  # the API server restarting: the engine loop reports it again
            self._error(f"status of {local.name}: {exc}")

    def _delete_now(self, meta: dict[str, Any]) -> None:
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
        try:
            self.api.request("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", json=body,
                             ok=(404, 409), what="final delete")  # fmt: skip
        except (ApiError, httpx.HTTPError) as exc:
            self._error(f"delete {meta['name']}: {exc}")

    def _forget(self, uid: str, cut: bool) -> None:
        with self.lock:
            local = self.pods.pop(uid, None)
            if local is None:
                return
            cut_now = len(local.replica.cut_all(time.monotonic())) if cut else 0
            self.stats.streams_cut += cut_now
            self.stats.deleted.append({"name": local.name, "namespace": local.namespace, "streams_cut": cut_now})
            self.free_ips.append(local.ip)
        local.exporter.close()

    # -- the engines and the load ---------------------------------------------------------------------
    def run_engines(self) -> None:
        last = time.monotonic()
        while not self.stopping.wait(TICK_S):
            now = time.monotonic()
            to_report: list[LocalPod] = []
            to_finish: list[tuple[LocalPod, int]] = []
            with self.lock:
                self._arrivals(last, now)
                for local in self.pods.values():
                    local.replica.advance(now)
                    for r in local.replica.finished:
                        if r.first_token_at is not None:
                            within = (r.first_token_at - r.arrival) <= self.slo_ttft_s
                            self.stats.finished += 1
                            self.stats.within_slo += within
                            counts = self.stats.of_app(local.namespace, local.app)
                            counts[1] += 1
                            counts[2] += within
                    local.replica.finished = []
                    if not local.ready and now >= local.ready_at and local.deleting_since is None:
                        local.ready = True
                    if local.ready and not local.reported_ready and local.deleting_since is None:
                        to_report.append(local)
                    if local.deleting_since is not None:
                        drained = local.replica.in_flight() == 0
                        if drained or now - local.deleting_since >= local.grace_s:
                            to_finish.append((local, int(drained)))
            last = now
            for local in to_report:
                self._report(local, ready=True)
            for local, fully_drained in to_finish:
                with self.lock:
                    self.stats.drained += fully_drained
                self._forget(local.uid, cut=True)
                self._delete_now({"namespace": local.namespace, "name": local.name, "uid": local.uid})

    def _arrivals(self, t0: float, t1: float) -> None:
        for (ns, app), rps in self.loads.items():
            if rps <= 0:
                continue
            only = self.only_pods.get((ns, app))
            serving = [
                p
                for p in self.pods.values()
                if p.namespace == ns and p.app == app and p.serving and (only is None or p.name in only)
            ]
            n = _poisson(self.rng, rps * (t1 - t0))
            self.stats.of_app(ns, app)[0] += n
            for _ in range(n):
                self.stats.sent += 1
                if not serving:
                    continue  # nobody to send it to: counted as sent, never finished
                arrival = self.rng.uniform(t0, t1)
                prompt, output = self.mix.draw(self.rng)
                target = min(serving, key=lambda p: p.replica.in_flight())
                self.next_rid += 1
                target.replica.submit([Request(self.next_rid, arrival, prompt, output)])

    # -- control ------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        with self.lock:
            pods = [
                {"name": p.name, "namespace": p.namespace, "app": p.app, "ip": p.ip, "ready": p.ready,
                 "deleting": p.deleting_since is not None, "running": p.replica.running,
                 "waiting": len(p.replica.waiting), "in_flight": p.replica.in_flight(), "kv": p.replica.kv_usage}
                for p in self.pods.values()
            ]  # fmt: skip
            s = self.stats
            return {
                "pods": pods,
                "sent": s.sent,
                "finished": s.finished,
                "ttft_attainment": s.within_slo / s.finished if s.finished else None,
                "streams_cut": s.streams_cut,
                "drained": s.drained,
                "deleted": list(s.deleted),
                "loads": [{"namespace": ns, "app": app, "rps": r} for (ns, app), r in self.loads.items()],
                "apps": [
                    {"namespace": ns, "app": app, "sent": c[0], "finished": c[1], "within_slo": c[2]}
                    for (ns, app), c in s.by_app.items()
                ],
                "errors": list(self.errors),
            }

    def set_tokens(self, namespace: str, app: str, prompt: int | None, output: int | None) -> None:
        """Real engines' load only: the simulated load draws its tokens from ``--mix``."""
        raise ValueError("prompt_tokens and output_tokens are set with real engines (--engine vllm)")

    def stop_all(self) -> None:
        """Stop what the pods run (nothing to stop for simulated replicas)."""

    def record_rows(self) -> list[dict[str, Any]] | None:
        """Every request with how it went (real engines only: the simulated load keeps counts)."""
        return None

    def set_load(self, namespace: str, app: str, rps: float, only: list[str] | None = None) -> None:
        if not (math.isfinite(rps) and rps >= 0):
            raise ValueError("rps must be a finite number >= 0")
        with self.lock:
            self.loads[(namespace, app)] = rps
            if only is None:
                self.only_pods.pop((namespace, app), None)
            else:
                self.only_pods[(namespace, app)] = set(only)

    def set_failing(self, namespace: str, app: str, status: int | None) -> None:
        with self.lock:
            self.failing[(namespace, app)] = status
            for p in self.pods.values():
                if p.namespace == namespace and p.app == app:
                    p.exporter.failing = status

    def serve_control(self, host: str, port: int) -> ThreadingHTTPServer:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, code: int, body: Any) -> None:
                reply_json(self, code, body)

            def do_GET(self) -> None:
                records = standin.record_rows() if self.path == "/records" else None
                if self.path == "/status":
                    self._send(200, standin.status())
                elif records is not None:
                    self._send(200, records)
                else:
                    self._send(404, {"error": "GET /status (or /records, with real engines)"})

            def do_POST(self) -> None:
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                    if self.path == "/load":
                        if body.get("prompt_tokens") is not None or body.get("output_tokens") is not None:
                            standin.set_tokens(body["namespace"], body["app"], body.get("prompt_tokens"),
                                               body.get("output_tokens"))  # fmt: skip
                        standin.set_load(body["namespace"], body["app"], float(body["rps"]), body.get("pods"))
                    elif self.path == "/fail":
                        status = body.get("status")
                        standin.set_failing(body["namespace"], body["app"], None if status is None else int(status))
                    else:
                        self._send(404, {"error": "POST /load or /fail"})
                        return
                    self._send(200, {"ok": True})
                except (KeyError, ValueError, TypeError) as exc:
                    self._send(400, {"error": str(exc)})

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer((host, port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True, name="standin-control").start()
        return server


def _poisson(rng: random.Random, mean: float) -> int:
    if mean <= 0:
        return 0
    if mean > 50:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1
