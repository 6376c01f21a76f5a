"""(d) The scaler answering UNAVAILABLE (no replica has fresh metrics): KEDA's ``fallback`` replicas are
applied by the real HPA, and the fleet returns to the composite's size once the metrics come back."""

from __future__ import annotations

from keda_llm_scaler.controlplane.api import Api
from tests.e2e.kube import Fleet, Pods, condition, eventually

FAST = {"service": "vllm", "engine": "vllm", "replicaCapacity": "3", "scrapeInterval": "1", "demandWindow": "20"}
BEHAVIOR = {
    "scaleUp": {"stabilizationWindowSeconds": 0, "policies": [{"type": "Pods", "value": 4, "periodSeconds": 5}]},
    "scaleDown": {"stabilizationWindowSeconds": 5, "policies": [{"type": "Pods", "value": 4, "periodSeconds": 5}]},
}


def test_unavailable_applies_fallback_then_recovers(api: Api, pods: Pods, fleet: Fleet) -> None:
    fleet.create(grace_s=5)
    fleet.scaled_object(FAST, min_replicas=1, max_replicas=6, behavior=BEHAVIOR,
                        fallback={"failureThreshold": 2, "replicas": 4})  # fmt: skip
    ns = fleet.namespace
    eventually(fleet.hpa, 60, "KEDA creates the HPA")
    eventually(lambda: any(p["ready"] for p in pods.of(ns, "vllm")), 60, "the first pod ready")

    def scaled_object() -> dict[str, object]:
        got = api.get("keda.sh/v1alpha1", "ScaledObject", ns, "vllm")
        assert got is not None
        return got

    eventually(lambda: condition(scaled_object(), "Ready") == "True", 60, "the ScaledObject Ready")
    assert fleet.spec_replicas() == 1

    # every replica answers 500: after staleAfter (15 s) the scaler answers UNAVAILABLE, never a 0
    pods.fail(ns, "vllm", 500)
    eventually(lambda: fleet.spec_replicas() == 4, 120, "KEDA applies the fallback (4 replicas)")
    # the operator writes the condition from its own polling loop, which can lag the HPA path that applied
    # the fallback replicas (a loaded CI run read False right after the fleet reached 4)
    eventually(lambda: condition(scaled_object(), "Fallback") == "True", 60, "the Fallback condition")

    pods.fail(ns, "vllm", None)
    eventually(lambda: condition(scaled_object(), "Fallback") == "False", 120, "the fallback ends")
    eventually(lambda: fleet.spec_replicas() == 1, 120, "back to the composite's size (idle: minReplicaCount)")
