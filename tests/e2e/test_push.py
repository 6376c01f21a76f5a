"""(c) ``external-push``: a batch fleet at zero wakes through ``StreamIsActive``.

The fleet's Service selects the Deployment's pods and one pinned pod of the same app (a reserved replica
that is always there, the overflow scaling from zero behind it). While the pinned pod idles, the batch
fleet is inactive and stays at zero; when work reaches it, the scaler pushes ``active`` and KEDA wakes
the Deployment. KEDA polls every 5 s until it has seen the idle fleet inactive (its first poll can come
before the scaler has a rate, and KEDA >= 2.18 ignores a pushed ``false``), then the ScaledObject is
patched to poll only every 300 s, so a wake within a minute can only be the push.
"""

from __future__ import annotations

import time

from keda_llm_scaler.controlplane.api import Api
from tests.e2e.kube import Fleet, Pods, eventually, scaled_object_active

POLLING_S = 300


def test_batch_fleet_at_zero_wakes_through_the_push_stream(api: Api, pods: Pods, fleet: Fleet) -> None:
    ns = fleet.namespace
    fleet.replicas = 0
    fleet.create(grace_s=5)
    api.apply({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "vllm-pinned", "namespace": ns, "labels": {"app": "vllm"}},  # noqa: E501
        "spec": {"automountServiceAccountToken": False, "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "vllm", "image": "vllm/vllm-openai:sim", "ports": [{"containerPort": 8000}]}]},
    })  # fmt: skip
    eventually(lambda: any(p["ready"] for p in pods.of(ns, "vllm")), 60, "the pinned pod ready")
    meta = {"service": "vllm", "engine": "vllm", "workloadClass": "batch", "replicaCapacity": "3",
            "scrapeInterval": "1", "demandWindow": "20"}  # fmt: skip
    fleet.scaled_object(meta, trigger="external-push", min_replicas=0, max_replicas=4, polling_s=5,
                        cooldown_s=10)  # fmt: skip

    eventually(lambda: scaled_object_active(api, ns, "vllm") == "False", 60, "the idle batch fleet inactive")
    # KEDA restarts the scale loop on a spec change: one immediate poll (inactive), the next in 300 s
    api.patch("keda.sh/v1alpha1", "ScaledObject", ns, "vllm", {"spec": {"pollingInterval": POLLING_S}})
    time.sleep(5)
    assert scaled_object_active(api, ns, "vllm") == "False", (
        "still inactive after the restarted scale loop's first poll"
    )
    assert fleet.spec_replicas() == 0, "an idle batch fleet stays at zero"

    start = time.monotonic()
    pods.load(ns, "vllm", 4.0)  # reaches the pinned pod only: the Deployment has none
    eventually(lambda: fleet.spec_replicas() >= 1, 60, "KEDA wakes the Deployment from zero")
    woke_s = time.monotonic() - start
    assert woke_s < POLLING_S / 5, f"woke after {woke_s:.0f}s: a poll, not the push"
    # KEDA scales the Deployment first and writes the ScaledObject's Active condition after: read on a busy
    # machine straight after the scale, it can still say False
    eventually(lambda: scaled_object_active(api, ns, "vllm") == "True", 30, "the ScaledObject active")
    eventually(lambda: len([p for p in pods.of(ns, "vllm") if p["ready"]]) >= 2, 60, "the woken pod serving")
