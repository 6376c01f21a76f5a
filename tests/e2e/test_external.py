"""(b) An ``external`` trigger end to end: KEDA creates the HPA, the real HPA controller reads the
composite through KEDA's metrics adapter, and the Deployment follows the simulated load up and down."""

from __future__ import annotations

from keda_llm_scaler.controlplane.api import Api
from tests.e2e.kube import Fleet, Pods, eventually, hpa_external_total, scaler_metric

# One replica serves 3 requests/s (stated, so the test does not depend on learning it); a 20-s demand
# window and 1-s scrapes so the composite follows the load within the test's minutes.
FAST = {"service": "vllm", "engine": "vllm", "replicaCapacity": "3", "scrapeInterval": "1", "demandWindow": "20"}
BEHAVIOR = {
    "scaleUp": {"stabilizationWindowSeconds": 0, "policies": [{"type": "Pods", "value": 4, "periodSeconds": 5}]},
    "scaleDown": {"stabilizationWindowSeconds": 10, "policies": [{"type": "Pods", "value": 4, "periodSeconds": 5}]},
}


def test_hpa_follows_the_composite_up_and_down(api: Api, pods: Pods, fleet: Fleet) -> None:
    fleet.create(grace_s=20)
    fleet.scaled_object(FAST, min_replicas=1, max_replicas=6, behavior=BEHAVIOR)
    ns = fleet.namespace
    hpa = eventually(fleet.hpa, 60, "KEDA creates the HPA")
    metric = hpa["spec"]["metrics"][0]
    assert metric["type"] == "External"
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    eventually(lambda: any(p["ready"] for p in pods.of(ns, "vllm")), 60, "the first pod ready")

    pods.load(ns, "vllm", 8.0)  # 8 req/s at 3 per replica, planned at 0.9: at least 3 replicas
    eventually(lambda: fleet.spec_replicas() >= 3, 150, "the HPA scales the Deployment up")
    eventually(lambda: sum(p["ready"] for p in pods.of(ns, "vllm")) >= 3, 60, "the new pods ready and serving")

    def hpa_matches_exported() -> bool:
        composite = scaler_metric("llm_scaler_composite", scaledobject="vllm", namespace=ns)
        seen = hpa_external_total(fleet.hpa() or {})
        if composite is None or seen is None:
            return False
        total, _ = seen
        return abs(total - composite) <= 0.1 * composite + 0.05

    # the HPA's status (its last read) and the scaler's export (now) agree once the composite holds still
    eventually(hpa_matches_exported, 120, "the HPA's metric equals the exported llm_scaler_composite", interval=1)

    pods.load(ns, "vllm", 0.0)
    eventually(lambda: fleet.spec_replicas() == 1, 240, "the HPA scales back to minReplicaCount")
    status = pods.status()
    assert status["errors"] == [] or all("watch" in e for e in status["errors"]), status["errors"]
