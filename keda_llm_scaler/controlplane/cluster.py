"""Start and stop the e2e control plane inside the current (private) network namespace.

etcd → kube-apiserver → KEDA's CRDs, the APIService for its metrics adapter → kube-controller-manager →
KEDA's operator and adapter. Every port is fixed: the namespace is the test's own, nothing else listens
in it. Each process is started with a parent-death signal, and stopped by its pid (SIGTERM, then SIGKILL
after a grace), in reverse order.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import yaml

from keda_llm_scaler.controlplane.api import Api, ProcessDied, eventually, reply_json
from keda_llm_scaler.controlplane.build import Binaries
from keda_llm_scaler.controlplane.pki import Pki, make_pki

__all__ = ["ControlPlane", "Ports"]

NODE_IP = "10.244.0.1"  # the API server's advertised address; pods get 10.244.0.10 and up
POD_CIDR = "10.244.0.0/24"
SERVICE_CIDR = "10.96.0.0/16"
KEDA_NAMESPACE = "keda"


@dataclass(frozen=True)
class Ports:
    etcd: int = 2379
    etcd_peer: int = 2380
    apiserver: int = 6443
    adapter: int = 6444
    keda_grpc: int = 9666
    keda_metrics: int = 8080
    keda_probe: int = 8081
    adapter_metrics: int = 8082
    controller_manager: int = 10257


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG: a control plane never outlives the runner that started it, even on SIGKILL
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


@dataclass
class ControlPlane:
    workdir: Path
    binaries: Binaries
    hpa_sync_period_s: float = 15.0
    ports: Ports = field(default_factory=Ports)
    log: IO[str] = sys.stderr
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    def _say(self, msg: str) -> None:
        print(f"[controlplane] {msg}", file=self.log, flush=True)

    # -- processes ------------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        logfile = open(self.workdir / "logs" / f"{name}.log", "ab")  # noqa: SIM115 (closed by the child's exit)
        proc = subprocess.Popen(
            argv,
            stdout=logfile,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            cwd=self.workdir,
            preexec_fn=_die_with_parent,
        )
        logfile.close()
        self.procs[name] = proc
        return proc

    def _check_alive(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is not None:
            tail = (self.workdir / "logs" / f"{name}.log").read_text(errors="replace")[-3000:]
            raise ProcessDied(f"{name} exited with {proc.returncode}; its log ends:\n{tail}")

    def stop_process(self, name: str, grace_s: float = 10.0) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    def stop(self) -> None:
        for name in reversed(list(self.procs)):
            self.stop_process(name)

    # -- start ----------------------------------------------------------------------------------
    def start(self) -> None:
        t0 = time.monotonic()
        for sub in ("logs", "etcd", "keda"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        self.pki = make_pki(self.workdir / "pki", [NODE_IP, "10.96.0.1"])
        self._write_kubeconfigs(self.pki)
        self.start_etcd()
        self.start_apiserver()
        self.timings["apiserver_ready_s"] = time.monotonic() - t0
        api = self.admin()
        try:
            self._install_keda_api(api)
            self._start_controller_manager()
            self._start_keda()
            eventually(lambda: self._apiservice_available(api), 90, "KEDA's metrics adapter Available")
        finally:
            api.close()
        self.timings["ready_s"] = time.monotonic() - t0
        self._say(f"ready in {self.timings['ready_s']:.1f}s (API server {self.timings['apiserver_ready_s']:.1f}s)")

    def admin(self) -> Api:
        return Api(self.server, self.pki.file("ca.crt"), self.pki.file("admin.crt"), self.pki.file("admin.key"))

    def _write_kubeconfigs(self, pki: Pki) -> None:
        for user, out in (("admin", self.kubeconfig), ("controller-manager", self.workdir / "cm.kubeconfig")):
            conf = {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "e2e", "cluster": {"server": self.server, "certificate-authority": str(pki.file("ca.crt"))}}],  # noqa: E501
                "users": [{"name": user, "user": {"client-certificate": str(pki.file(f"{user}.crt")),
                                                  "client-key": str(pki.file(f"{user}.key"))}}],
                "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
                "current-context": "e2e",
            }  # fmt: skip
            out.write_text(yaml.safe_dump(conf))

    def start_etcd(self) -> None:
        etcd = shutil.which("etcd") or "/usr/bin/etcd"
        p = self.ports
        # the data lives on tmpfs where there is one: Debian's etcd 3.4 has no --unsafe-no-fsync
        shm = Path("/dev/shm")
        data = (shm / f"kls-etcd-{os.getpid()}") if shm.is_dir() else self.workdir / "etcd"
        self.etcd_data = data
        self._spawn(
            "etcd",
            [etcd, "--name", "e2e", "--data-dir", str(data),
             "--listen-client-urls", f"http://127.0.0.1:{p.etcd}", "--advertise-client-urls", f"http://127.0.0.1:{p.etcd}",
             "--listen-peer-urls", f"http://127.0.0.1:{p.etcd_peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{p.etcd_peer}",
             "--initial-cluster", f"e2e=http://127.0.0.1:{p.etcd_peer}", "--log-level", "warn"],
            env={"ETCD_UNSUPPORTED_ARCH": ""},
        )  # fmt: skip

        def healthy() -> bool:
            self._check_alive("etcd")
            import httpx

            return bool(httpx.get(f"http://127.0.0.1:{p.etcd}/health", timeout=2).json().get("health") == "true")

        eventually(healthy, 30, "etcd healthy", 0.2)

    def _audit_policy(self) -> Path:
        """Every request on EndpointSlices and pods, logged once as it arrives: the e2e tests count the
        lists and watches a client makes, per namespace, from what the server itself saw."""
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump({
            "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
            "omitStages": ["ResponseStarted", "ResponseComplete", "Panic"],
            "rules": [
                {"level": "Metadata", "resources": [{"group": "discovery.k8s.io", "resources": ["endpointslices"]},
                                                    {"group": "", "resources": ["pods"]}]},
                {"level": "None"},
            ],
        }))  # fmt: skip
        return policy

    @property
    def audit_log(self) -> Path:
        return self.workdir / "logs" / "audit.log"

    def start_apiserver(self) -> None:
        pki, p = self.pki, self.ports
        self._spawn(
            "kube-apiserver",
            [str(self.binaries.path("kube-apiserver")),
             f"--etcd-servers=http://127.0.0.1:{p.etcd}",
             "--bind-address=127.0.0.1", f"--secure-port={p.apiserver}", f"--advertise-address={NODE_IP}",
             f"--tls-cert-file={pki.file('apiserver.crt')}", f"--tls-private-key-file={pki.file('apiserver.key')}",
             f"--client-ca-file={pki.file('ca.crt')}",
             "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
             f"--service-account-key-file={pki.file('sa.pub')}",
             f"--service-account-signing-key-file={pki.file('sa.key')}",
             f"--service-cluster-ip-range={SERVICE_CIDR}",
             "--authorization-mode=RBAC",
             "--endpoint-reconciler-type=none",
             f"--requestheader-client-ca-file={pki.file('front-proxy-ca.crt')}",
             "--requestheader-allowed-names=front-proxy-client",
             "--requestheader-username-headers=X-Remote-User",
             "--requestheader-group-headers=X-Remote-Group",
             "--requestheader-extra-headers-prefix=X-Remote-Extra-",
             f"--proxy-client-cert-file={pki.file('front-proxy-client.crt')}",
             f"--proxy-client-key-file={pki.file('front-proxy-client.key')}",
             f"--audit-policy-file={self._audit_policy()}", f"--audit-log-path={self.audit_log}",
             "--audit-log-maxbackup=1", "--audit-log-maxsize=200",
             "--profiling=false", "--v=1"],
        )  # fmt: skip
        api = Api(
            self.server, self.pki.file("ca.crt"), self.pki.file("admin.crt"), self.pki.file("admin.key"), timeout=5
        )

        def ready() -> bool:
            self._check_alive("kube-apiserver")
            return bool(api.request("GET", "/readyz") == "ok")

        try:
            eventually(ready, 90, "kube-apiserver ready", 0.3)
        finally:
            api.close()

    def _install_keda_api(self, api: Api) -> None:
        for crd in sorted((self.binaries.root / "crds").glob("*.yaml")):
            api.apply_yaml(crd.read_text())
        api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KEDA_NAMESPACE}})
        # the aggregation layer finds the adapter through a Service; ExternalName resolves to loopback
        api.apply({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "keda-metrics-apiserver", "namespace": KEDA_NAMESPACE},
            "spec": {"type": "ExternalName", "externalName": "127.0.0.1",
                     "ports": [{"name": "https", "port": self.ports.adapter, "protocol": "TCP"}]},
        })  # fmt: skip
        api.apply({
            "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": "v1beta1.external.metrics.k8s.io"},
            "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1",
                     "service": {"name": "keda-metrics-apiserver", "namespace": KEDA_NAMESPACE, "port": self.ports.adapter},  # noqa: E501
                     "caBundle": _b64(self.pki.file("ca.crt").read_bytes()),
                     "groupPriorityMinimum": 100, "versionPriority": 100},
        })  # fmt: skip

        def crds_established() -> bool:
            listed = api.list("apiextensions.k8s.io/v1", "CustomResourceDefinition")
            keda = [c for c in listed["items"] if c["spec"]["group"] == "keda.sh"]
            return bool(keda) and all(
                any(cond["type"] == "Established" and cond["status"] == "True" for cond in c.get("status", {}).get("conditions", []))  # noqa: E501
                for c in keda
            )  # fmt: skip

        eventually(crds_established, 30, "KEDA's CRDs established")

    def _start_controller_manager(self) -> None:
        controllers = (
            "deployment,replicaset,endpointslice,horizontalpodautoscaling,garbagecollector,namespace,serviceaccount"
        )
        self._spawn(
            "kube-controller-manager",
            [str(self.binaries.path("kube-controller-manager")),
             f"--kubeconfig={self.workdir / 'cm.kubeconfig'}",
             f"--authentication-kubeconfig={self.workdir / 'cm.kubeconfig'}",
             f"--authorization-kubeconfig={self.workdir / 'cm.kubeconfig'}",
             "--bind-address=127.0.0.1", f"--secure-port={self.ports.controller_manager}",
             f"--controllers={controllers}", "--use-service-account-credentials=true",
             "--leader-elect=false",
             f"--horizontal-pod-autoscaler-sync-period={self.hpa_sync_period_s:g}s",
             f"--root-ca-file={self.pki.file('ca.crt')}", "--v=1"],
        )  # fmt: skip
        time.sleep(0.5)
        self._check_alive("kube-controller-manager")

    def _start_keda(self) -> None:
        p, certs = self.ports, self.pki.dir / "keda"
        env = {"KUBECONFIG": str(self.kubeconfig), "WATCH_NAMESPACE": "", "POD_NAMESPACE": KEDA_NAMESPACE,
               "KEDA_CLUSTER_OBJECT_NAMESPACE": KEDA_NAMESPACE, "POD_NAME": "keda-operator"}  # fmt: skip
        self._spawn(
            "keda-operator",
            [str(self.binaries.path("keda-operator")), "--leader-elect=false", "--enable-cert-rotation=false",
             f"--cert-dir={certs}", f"--metrics-bind-address=127.0.0.1:{p.keda_metrics}",
             f"--health-probe-bind-address=127.0.0.1:{p.keda_probe}",
             f"--metrics-service-bind-address=127.0.0.1:{p.keda_grpc}",
             "--enable-webhook-patching=false", "--enable-apiservice-patching=false", "--zap-log-level=info",
             f"--ca-dir={certs}"],
            env=env,
        )  # fmt: skip
        self._spawn(
            "keda-adapter",
            [str(self.binaries.path("keda-adapter")), f"--secure-port={p.adapter}", "--bind-address=127.0.0.1",
             f"--cert-dir={certs}", f"--tls-cert-file={certs / 'tls.crt'}", f"--tls-private-key-file={certs / 'tls.key'}",  # noqa: E501
             f"--metrics-service-address=127.0.0.1:{p.keda_grpc}",
             "--metrics-service-grpc-authority=keda-operator.keda.svc.cluster.local",
             f"--port={p.adapter_metrics}", f"--kubeconfig={self.kubeconfig}",
             f"--authentication-kubeconfig={self.kubeconfig}", f"--authorization-kubeconfig={self.kubeconfig}",
             f"--lister-kubeconfig={self.kubeconfig}", "--zap-log-level=info"],
            env=env,
        )  # fmt: skip

    def _apiservice_available(self, api: Api) -> bool:
        for name in ("keda-operator", "keda-adapter", "kube-controller-manager"):
            self._check_alive(name)
        svc = api.get("apiregistration.k8s.io/v1", "APIService", None, "v1beta1.external.metrics.k8s.io") or {}
        conds = svc.get("status", {}).get("conditions", [])
        return any(c["type"] == "Available" and c["status"] == "True" for c in conds)

    # -- faults the tests ask for ----------------------------------------------------------------------
    def restart_apiserver(self) -> float:
        """Stop kube-apiserver (SIGTERM) and start it again; returns the seconds until it is ready."""
        t0 = time.monotonic()
        self.stop_process("kube-apiserver")
        self.start_apiserver()
        return time.monotonic() - t0

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision (what the API server does every 5 min);
        returns that revision. Through etcd's own gRPC gateway: no etcdctl needed."""
        import httpx

        base = f"http://127.0.0.1:{self.ports.etcd}/v3"
        # a range over one absent key returns the header with the current revision
        head = httpx.post(f"{base}/kv/range", json={"key": "AA=="}, timeout=10).json()
        revision = int(head["header"]["revision"])
        httpx.post(
            f"{base}/kv/compaction", json={"revision": revision, "physical": True}, timeout=30
        ).raise_for_status()
        return revision

    def serve_control(self, port: int) -> object:
        """``POST /restart-apiserver`` and ``POST /compact-etcd`` on 127.0.0.1 (JSON answers)."""
        import threading
        from concurrent.futures import ThreadPoolExecutor
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        plane = self
        # processes are started from one long-lived thread: PR_SET_PDEATHSIG fires when the *thread*
        # that forked a child exits, and each HTTP request runs on a thread of its own
        worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="controlplane-faults")

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                try:
                    if self.path == "/restart-apiserver":
                        body: dict[str, object] = {"ready_after_s": worker.submit(plane.restart_apiserver).result()}
                    elif self.path == "/compact-etcd":
                        body = {"revision": worker.submit(plane.compact_etcd).result()}
                    else:
                        body = {"error": "POST /restart-apiserver or /compact-etcd"}
                except Exception as exc:  # report, keep serving
                    body, code = {"error": str(exc)}, 500
                else:
                    code = 404 if "error" in body else 200
                reply_json(self, code, body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True, name="controlplane-control").start()
        return server

    def cleanup(self) -> None:
        data = getattr(self, "etcd_data", None)
        if data is not None and str(data).startswith("/dev/shm/"):
            shutil.rmtree(data, ignore_errors=True)


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()
