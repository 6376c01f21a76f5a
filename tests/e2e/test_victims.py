"""(e) Scale-down with victim ranking: the scaler writes ``controller.kubernetes.io/pod-deletion-cost``
from what it scrapes, and the real ReplicaSet controller removes the pods it ranked lowest: the idle
ones, so no stream is cut."""

from __future__ import annotations

from typing import Any

from keda_llm_scaler.controlplane.api import Api
from tests.e2e.kube import Fleet, Pods, eventually

COST = "controller.kubernetes.io/pod-deletion-cost"
FAST = {"service": "vllm", "engine": "vllm", "replicaCapacity": "3", "scrapeInterval": "1", "demandWindow": "20"}
BEHAVIOR = {
    "scaleDown": {"stabilizationWindowSeconds": 0, "policies": [{"type": "Pods", "value": 4, "periodSeconds": 5}]}
}


def _costs(api: Api, ns: str) -> dict[str, int | None]:
    listed = api.list("v1", "Pod", ns, labelSelector="app=vllm")
    out: dict[str, int | None] = {}
    for pod in listed["items"]:
        if pod["metadata"].get("deletionTimestamp") or not pod["metadata"].get("ownerReferences"):
            continue
        value = (pod["metadata"].get("annotations") or {}).get(COST)
        out[pod["metadata"]["name"]] = None if value is None else int(value)
    return out


def test_replicaset_removes_the_pods_the_ranking_chose(api: Api, pods: Pods, fleet: Fleet) -> None:
    ns = fleet.namespace
    fleet.replicas = 4
    fleet.create(grace_s=5)
    # minReplicaCount 4 holds the fleet while the ranking learns who is busy
    fleet.scaled_object(FAST, min_replicas=4, max_replicas=4, behavior=BEHAVIOR)
    ready = eventually(lambda: [p for p in pods.of(ns, "vllm") if p["ready"]] if len(
        [p for p in pods.of(ns, "vllm") if p["ready"]]) == 4 else None, 90, "4 pods ready")  # fmt: skip
    names = sorted(p["name"] for p in ready)
    busy, idle = names[:2], names[2:]
    pods.load(ns, "vllm", 2.0, only=busy)  # long streams on two pods; the other two get nothing

    def ranked() -> dict[str, Any] | None:
        # no annotation is cost 0 to the ReplicaSet; the scaler writes only what moves a pod's place
        costs = _costs(api, ns)
        if len(costs) != 4:
            return None
        lowest_busy = min(costs[n] or 0 for n in busy)
        return costs if all((costs[n] or 0) < lowest_busy for n in idle) else None

    costs = eventually(ranked, 90, "deletion costs rank the idle pods below the busy ones", interval=1)
    before = pods.status()["streams_cut"]

    so = api.get("keda.sh/v1alpha1", "ScaledObject", ns, "vllm")
    assert so is not None
    api.patch("keda.sh/v1alpha1", "ScaledObject", ns, "vllm", {"spec": {"minReplicaCount": 2}})
    eventually(lambda: fleet.spec_replicas() == 2, 120, "the HPA scales down to 2")
    eventually(lambda: len(_costs(api, ns)) == 2, 60, "the ReplicaSet deleted two pods")
    survivors = sorted(_costs(api, ns))
    assert survivors == busy, f"costs {costs}: the ReplicaSet kept {survivors}, the ranking chose to keep {busy}"
    eventually(lambda: len(pods.of(ns, "vllm")) == 2, 60, "the deleted pods gone from the stand-in")
    assert pods.status()["streams_cut"] == before, "removing idle pods cut no stream"
