"""(a) The chart's RBAC on the real API server: its ServiceAccount, Roles and RoleBindings applied as Helm
renders them, and a second scaler run with nothing but that ServiceAccount's token.

Discovery works in the namespaces ``rbac.namespaces`` lists and answers UNAVAILABLE, saying HTTP 403, in
one it does not. Victim ranking writes ``pod-deletion-cost`` where ``victimRanking.namespaces`` grants
``patch pods``; where the scaler is told to rank (``--victim-ranking``) but the chart grants nothing, the
real API server refuses the patch with 403, which the scaler counts as ``forbidden``, and no pod there
carries the annotation."""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import grpc
import httpx
import pytest
import yaml

from keda_llm_scaler._proto import externalscaler_pb2 as pb
from keda_llm_scaler._proto import externalscaler_pb2_grpc as pb_grpc
from keda_llm_scaler.controlplane.api import Api
from keda_llm_scaler.metadata import METRIC_NAME
from keda_llm_scaler.victims import IDLE_COST
from tests.e2e.kube import Fleet, Pods, eventually, free_port, scaler_metric, start_scaler, stop_process
from tests.test_chart import render  # Helm's own engine, release namespace "keda"

RELEASE_NAMESPACE = "keda"  # the harness makes it (KEDA's own namespace)
COST = "controller.kubernetes.io/pod-deletion-cost"
# test_victims.py's trigger: 1 s scrapes, a short demand window
FAST = {"service": "vllm", "engine": "vllm", "replicaCapacity": "3", "scrapeInterval": "1", "demandWindow": "20"}
RBAC_KINDS = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
PATCHES = "llm_scaler_deletion_cost_patches_total"


def _annotations(api: Api, ns: str) -> dict[str, str | None]:
    """pod name -> its deletion-cost annotation (None: absent), for the live pods of the fleet."""
    listed = api.list("v1", "Pod", ns, labelSelector="app=vllm")
    return {
        p["metadata"]["name"]: (p["metadata"].get("annotations") or {}).get(COST)
        for p in listed["items"]
        if not p["metadata"].get("deletionTimestamp")
    }


@dataclass
class Granted:
    """What the chart was rendered for: two granted namespaces (ranking in ``ga`` only), one not."""

    ga: str
    gb: str
    nx: str
    service_account: str
    applied: list[dict[str, Any]]
    state_configmap: str  # the learned state's (in the release namespace), which the chart creates


@pytest.fixture
def granted(api: Api, pods: Pods) -> Iterator[Granted]:
    suffix = uuid.uuid4().hex[:6]
    ga, gb, nx = f"rbac-ga-{suffix}", f"rbac-gb-{suffix}", f"rbac-nx-{suffix}"
    release = f"rbac-{suffix}"  # its own ServiceAccount and names: nothing else in "keda" is touched
    docs = render({"rbac": {"namespaces": [ga, gb]}, "victimRanking": {"namespaces": [ga]}}, release)
    rbac = [
        d
        for d in docs
        if d["kind"] in RBAC_KINDS or (d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-state"))
    ]
    (state,) = [d["metadata"]["name"] for d in rbac if d["kind"] == "ConfigMap"]
    accounts = [d for d in rbac if d["kind"] == "ServiceAccount"]
    assert len(accounts) == 1, f"the chart renders one ServiceAccount: {accounts}"
    sa = accounts[0]["metadata"]["name"]
    applied: list[dict[str, Any]] = []
    namespaces = (ga, gb, nx)
    try:
        api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": RELEASE_NAMESPACE}})
        for ns in namespaces:
            api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        for doc in rbac:  # Roles go into ga/gb: the namespaces exist by now
            api.apply(doc)
            applied.append(doc)
        for ns in namespaces:
            # the serviceaccount controller makes "default"; pods are refused until it exists
            eventually(partial(api.get, "v1", "ServiceAccount", ns, "default"), 60, f"default ServiceAccount in {ns}")
            Fleet(api=api, namespace=ns, app="vllm", replicas=2).create(grace_s=1)
        yield Granted(ga, gb, nx, sa, applied, state)
    finally:
        for ns in namespaces:
            with contextlib.suppress(httpx.HTTPError):
                pods.load(ns, "vllm", 0)
            api.delete("v1", "Namespace", None, ns)
        for doc in applied:  # what lives outside the three namespaces: the SA in "keda", cluster-scoped ones
            meta = doc["metadata"]
            if meta.get("namespace") not in namespaces:
                api.delete(doc["apiVersion"], doc["kind"], meta.get("namespace"), meta["name"])


@dataclass
class Scaler:
    grpc_address: str
    metrics_url: str
    log: Path
    proc: subprocess.Popen[bytes]

    def events(self, event: str) -> list[dict[str, Any]]:
        """The scaler's JSON log lines of one event."""
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict) and doc.get("event") == event:
                out.append(doc)
        return out


def _cluster() -> tuple[str, Path]:
    """The API server's URL and its CA file, from the harness's admin kubeconfig."""
    conf = yaml.safe_load(Path(os.environ["KUBECONFIG"]).read_text())
    cluster = conf["clusters"][0]["cluster"]
    return str(cluster["server"]), Path(cluster["certificate-authority"])


@pytest.fixture
def scaler(api: Api, granted: Granted, tmp_path: Path) -> Iterator[Scaler]:
    """A second keda-llm-scaler, authenticated as the chart's ServiceAccount (a TokenRequest token)."""
    review = api.request(
        "POST",
        f"/api/v1/namespaces/{RELEASE_NAMESPACE}/serviceaccounts/{granted.service_account}/token",
        json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}},
    )
    token_file = tmp_path / "token"
    token_file.write_text(review["status"]["token"])
    token_file.chmod(0o600)
    server, ca = _cluster()
    grpc_port, metrics_port = free_port(), free_port()
    log = tmp_path / "scaler.log"
    # the harness's flags (keda_llm_scaler/controlplane/__main__.py) with the token instead of the kubeconfig;
    # ranking asked for in gb too, where the chart grants no `patch pods`
    args = ["serve", "--host", "127.0.0.1", "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
            "--kube-api-url", server, "--kube-token-file", str(token_file), "--kube-ca-file", str(ca),
            "--log-json", "true", "--scrape-workers", "0",
            "--victim-ranking", f"{granted.ga},{granted.gb}", "--victim-ranking-interval", "2",
            "--state-configmap", f"{RELEASE_NAMESPACE}/{granted.state_configmap}", "--state-interval", "1"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLM_SCALER_") and k != "KUBECONFIG"}
    proc = start_scaler(args, log, env)
    try:
        yield Scaler(f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{metrics_port}/metrics", log, proc)
    finally:
        stop_process(proc, log, "second scaler")


def _audited_pod_patches(user: str) -> dict[str, int]:
    """Pod patches by ``user`` per namespace, as the API server's audit log has them."""
    out: dict[str, int] = {}
    for line in Path(os.environ["KLS_AUDIT_LOG"]).read_text().splitlines():
        ev = json.loads(line)
        ref = ev.get("objectRef") or {}
        if ev.get("verb") == "patch" and ref.get("resource") == "pods" and ev.get("user", {}).get("username") == user:
            out[ref.get("namespace", "")] = out.get(ref.get("namespace", ""), 0) + 1
    return out


def _ready(pods: Pods, ns: str, n: int) -> list[str] | None:
    names = sorted(p["name"] for p in pods.of(ns, "vllm") if p["ready"])
    return names if len(names) == n else None


def _holding(pods: Pods, ns: str, name: str, n: int) -> bool:
    return any(p["name"] == name and p["running"] + p["waiting"] >= n for p in pods.of(ns, "vllm"))


def _members(metrics_url: str, ns: str, n: int) -> bool:
    return scaler_metric("llm_scaler_members", metrics_url, namespace=ns, phase="ready") == n


def _value(stub: pb_grpc.ExternalScalerStub, ns: str) -> tuple[float | None]:
    """(GetMetrics' value,): a tuple, so that a composite of 0 is an answer too."""
    code, message, value = _ask(stub, ns)
    if code != grpc.StatusCode.OK:
        raise AssertionError(f"{code.name}: {message}")  # eventually() reports the last one
    return (value,)


def _ask(stub: pb_grpc.ExternalScalerStub, ns: str) -> tuple[grpc.StatusCode, str, float | None]:
    """GetMetrics for ScaledObject ``ns/vllm``: (status, message, value)."""
    ref = pb.ScaledObjectRef(name="vllm", namespace=ns, scalerMetadata=FAST)
    try:
        resp = stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref, metricName=METRIC_NAME), timeout=10)
    except grpc.RpcError as exc:
        call = cast(grpc.Call, exc)  # the sync stub's errors are calls too
        return call.code(), str(call.details()), None
    return grpc.StatusCode.OK, "", float(resp.metricValues[0].metricValueFloat)


def test_the_charts_rbac_grants_discovery_and_ranking_only_where_it_says(
    api: Api, pods: Pods, granted: Granted, scaler: Scaler, tmp_path: Path
) -> None:
    ga, gb, nx = granted.ga, granted.gb, granted.nx
    kinds = sorted((d["kind"], d["metadata"].get("namespace", "")) for d in granted.applied)
    assert ("ClusterRole", "") not in kinds, f"namespaced RBAC renders no ClusterRole: {kinds}"
    ranking_roles = [d["metadata"]["namespace"] for d in granted.applied
                     if d["kind"] == "Role" and d["metadata"]["name"].endswith("-victim-ranking")]  # fmt: skip
    assert ranking_roles == [ga], f"`patch pods` is granted in {ranking_roles}, victimRanking.namespaces is [{ga}]"

    ready: dict[str, list[str]] = {}
    for ns in (ga, gb, nx):
        ready[ns] = eventually(partial(_ready, pods, ns, 2), 90, f"2 pods ready in {ns}")
    busy = {ns: ready[ns][0] for ns in (ga, gb)}
    idle = {ns: ready[ns][1] for ns in (ga, gb)}
    for ns in (ga, gb):
        pods.load(ns, "vllm", 1.0, only=[busy[ns]])
    for ns in (ga, gb):  # the busy pod holds a few streams (level 2) before the scaler first looks
        eventually(partial(_holding, pods, ns, busy[ns], 4), 60, f"{busy[ns]} in {ns} holds 4 requests")

    with grpc.insecure_channel(scaler.grpc_address) as channel:
        stub = pb_grpc.ExternalScalerStub(channel)  # type: ignore[no-untyped-call]

        # discovery: granted namespaces answer with a value from both members
        for ns in (ga, gb):
            (value,) = eventually(partial(_value, stub, ns), 60, f"GetMetrics OK in {ns} under the chart's RBAC")
            assert value is not None and value >= 0, value
            eventually(partial(_members, scaler.metrics_url, ns, 2), 30, f"/metrics: 2 ready members in {ns}")

        # no grant: UNAVAILABLE (KEDA's fallback applies), and the answer names the API server's 403
        def refused() -> tuple[grpc.StatusCode, str, float | None] | None:
            a = _ask(stub, nx)
            if a[0] == grpc.StatusCode.UNAVAILABLE and "HTTP 403" in a[1]:
                return a
            raise AssertionError(f"answered {a[0].name} {a[1]!r}, value {a[2]}")  # eventually() reports the last

        _, message, _ = eventually(refused, 60, f"GetMetrics in {nx}: UNAVAILABLE saying HTTP 403")
        assert "forbidden" in message and granted.service_account in message, message
        assert scaler_metric("llm_scaler_target_up", scaler.metrics_url, namespace=nx) == 0.0
        assert scaler_metric("llm_scaler_composite", scaler.metrics_url, namespace=nx) is None, "no value, never a 0"

        # victim ranking: written in ga, refused by the API server in gb
        def ranked_in_ga() -> dict[str, str | None]:
            _ask(stub, ga)  # KEDA's polling: keeps the targets asked for
            _ask(stub, gb)
            got = _annotations(api, ga)
            # an absent annotation is cost 0 to the ReplicaSet: the busy pod needs none to be kept
            if got.get(idle[ga]) == str(IDLE_COST) and int(got.get(busy[ga]) or 0) > IDLE_COST:
                return got
            raise AssertionError(f"costs {got}")  # eventually() reports the last

        costs_ga = eventually(ranked_in_ga, 90, f"{ga}: the idle pod {idle[ga]} ranked below the busy {busy[ga]}")

        def refused_in_gb() -> float | None:
            _ask(stub, gb)
            got = scaler_metric(PATCHES, scaler.metrics_url, namespace=gb, result="forbidden")
            if got:
                return got
            ok = scaler_metric(PATCHES, scaler.metrics_url, namespace=gb, result="ok")
            raise AssertionError(f"forbidden {got}, ok {ok}, annotations {_annotations(api, gb)}")

        forbidden_gb = eventually(refused_in_gb, 60, f"a forbidden patch counted in {gb}")
        assert forbidden_gb >= 1

    ok_ga = scaler_metric(PATCHES, scaler.metrics_url, namespace=ga, result="ok")
    assert ok_ga is not None and ok_ga >= 1, f"patches in {ga}: {ok_ga}"
    assert not scaler_metric(PATCHES, scaler.metrics_url, namespace=ga, result="forbidden"), f"none refused in {ga}"
    assert not scaler_metric(PATCHES, scaler.metrics_url, namespace=gb, result="ok"), f"none accepted in {gb}"
    assert all(v is None for v in _annotations(api, gb).values()), f"{gb}: {_annotations(api, gb)}"
    assert all(v is None for v in _annotations(api, nx).values()), f"{nx}: {_annotations(api, nx)}"

    # the scaler's report of the refusal carries the API server's own status
    told = [e for e in scaler.events("deletion_cost_forbidden") if e.get("namespace") == gb]
    assert told and all(e.get("status") == 403 for e in told), f"deletion_cost_forbidden in {gb}: {told}"
    assert not [e for e in scaler.events("deletion_cost_forbidden") if e.get("namespace") == ga]

    # the API server saw the ServiceAccount try: a patch on a pod of gb, as that user (the audit policy logs
    # each request as it arrives, before authorization, so the 403 itself is what the scaler counted)
    user = f"system:serviceaccount:{RELEASE_NAMESPACE}:{granted.service_account}"
    patches = _audited_pod_patches(user)
    assert patches.get(gb, 0) >= 1 and patches.get(ga, 0) >= 1, f"pod patches by {user}: {patches} ({costs_ga})"
    assert nx not in patches

    # learned state: written into the chart's ConfigMap, for both fleets it scrapes, under the chart's Role
    def state_written() -> set[str]:
        cm = api.get("v1", "ConfigMap", RELEASE_NAMESPACE, granted.state_configmap) or {}
        raw = (cm.get("data") or {}).get("learned-state.json")
        labels = {r["label"] for r in json.loads(raw)["fleets"].values()} if raw else set()
        if {f"{ga}/vllm", f"{gb}/vllm"} <= labels:
            return labels
        raise AssertionError(f"fleets in the state: {labels}")

    eventually(state_written, 30, "the learned state written for both fleets")
    assert scaler_metric("llm_scaler_state_writes_total", scaler.metrics_url, outcome="ok")
    assert not scaler_metric("llm_scaler_state_writes_total", scaler.metrics_url, outcome="error")
    # and that one ConfigMap is all it may touch: another in the same namespace is refused, read or written
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"other-{granted.state_configmap}",
             "namespace": RELEASE_NAMESPACE}, "data": {"k": "v"}}  # fmt: skip
    api.apply(other)
    try:
        server, ca = _cluster()
        token = (tmp_path / "token").read_text()
        url = f"{server}/api/v1/namespaces/{RELEASE_NAMESPACE}/configmaps/{other['metadata']['name']}"
        with httpx.Client(
            verify=ssl.create_default_context(cafile=str(ca)), headers={"Authorization": f"Bearer {token}"}, timeout=10
        ) as sa:
            assert sa.get(url).status_code == 403
            assert sa.put(url, json=other).status_code == 403
    finally:
        api.delete("v1", "ConfigMap", RELEASE_NAMESPACE, other["metadata"]["name"])
