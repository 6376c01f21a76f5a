"""A batch pool at zero wakes from its gateway's queue: the pool has no replica, so nothing but the
gateway sees the requests waiting for it. A stand-in for llm-d's router (its flow-control queue family,
labelled by pool) answers on loopback; the scaler reads it as it reads replicas.

While the router holds requests for another pool only, the pool stays at zero (its own series decide);
once it holds one for this pool, the scaler pushes ``active`` and KEDA wakes the Deployment. As in
test_push, KEDA polls every 5 s until it has seen the pool inactive, then only every 300 s, so a wake
within a minute is the push from the gateway's reading, not a poll.
"""

from __future__ import annotations

import time

from keda_llm_scaler.controlplane.api import Api
from keda_llm_scaler.testing.replicas import Replica
from tests.e2e.kube import Fleet, Pods, eventually, scaled_object_active, scaler_metric

POLLING_S = 300


def _router(**held: int) -> str:
    lines = ["# TYPE llm_d_epp_flow_control_queue_size gauge"]
    for pool, n in held.items():
        lines.append(
            f'llm_d_epp_flow_control_queue_size{{fairness_id="default",inference_pool="{pool}",'
            f'model_name="llama",priority="0",target_model_name="llama"}} {n}'
        )
    return "\n".join(lines) + "\n"


def test_a_batch_pool_at_zero_wakes_from_the_routers_queue(api: Api, pods: Pods, fleet: Fleet) -> None:
    ns = fleet.namespace
    fleet.replicas = 0
    fleet.create(grace_s=5)
    router = Replica(_router(vllm=0, other=4))
    try:
        meta = {"service": "vllm", "engine": "vllm", "workloadClass": "batch", "scrapeInterval": "1",
                "gatewayMetricsUrl": router.url}  # fmt: skip
        fleet.scaled_object(meta, trigger="external-push", min_replicas=0, max_replicas=3, polling_s=5,
                            cooldown_s=10)  # fmt: skip

        eventually(
            lambda: scaled_object_active(api, ns, "vllm") == "False",
            60,
            "the pool at zero inactive (the router holds only another's)",
        )
        api.patch("keda.sh/v1alpha1", "ScaledObject", ns, "vllm", {"spec": {"pollingInterval": POLLING_S}})
        time.sleep(5)
        assert scaled_object_active(api, ns, "vllm") == "False" and fleet.spec_replicas() == 0, (
            "another pool's queue is not this pool's"
        )
        held = scaler_metric("llm_scaler_gateway_held_requests", scaledobject="vllm", namespace=ns)
        assert held == 0.0, held

        start = time.monotonic()
        router.set(payload=_router(vllm=2, other=4))  # two requests held for this pool
        eventually(lambda: fleet.spec_replicas() >= 1, 60, "KEDA wakes the Deployment from the router's queue")
        woke_s = time.monotonic() - start
        assert woke_s < POLLING_S / 5, f"woke after {woke_s:.0f}s: a poll, not the push"
        assert scaled_object_active(api, ns, "vllm") == "True"
        assert scaler_metric("llm_scaler_gateway_held_requests", scaledobject="vllm", namespace=ns) == 2.0
        eventually(lambda: any(p["ready"] for p in pods.of(ns, "vllm")), 60, "the woken pod serving")
    finally:
        router.close()
