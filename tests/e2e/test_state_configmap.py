"""The learned state's ConfigMap store on the real API server (issue #33): created where it is missing,
and two scaler pods writing into it at once lose nothing (each write is a read-merge-replace with the
object's resourceVersion; a 409 is read again and retried)."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from pathlib import Path

from keda_llm_scaler.controlplane.api import Api
from keda_llm_scaler.kube import KubeClient, KubeConfig
from keda_llm_scaler.learned import FleetRecord, LearnedState
from keda_llm_scaler.state_store import CONFIGMAP_KEY, ConfigMapStore, StateKeeper

NAMESPACE = "keda"  # the harness makes it


def _record(n: float) -> FleetRecord:
    return FleetRecord("ns/so", (("ttft_slo_s", 2.0),), time.time(), LearnedState(startups=(n,)))


def test_two_pods_writing_at_once_lose_no_record_and_the_object_is_created_where_missing(api: Api) -> None:
    name = f"state-{uuid.uuid4().hex[:6]}"
    api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})

    async def run() -> dict[str, FleetRecord]:
        kube_a = KubeClient(KubeConfig.from_kubeconfig(Path(os.environ["KUBECONFIG"])))
        kube_b = KubeClient(KubeConfig.from_kubeconfig(Path(os.environ["KUBECONFIG"])))
        try:
            a = StateKeeper(ConfigMapStore(kube_a, NAMESPACE, name), 1.0)
            b = StateKeeper(ConfigMapStore(kube_b, NAMESPACE, name), 1.0)
            assert await a.load() and await b.load() and a.records == {}  # no object yet: nothing to read
            for i in range(6):  # both at once, every time: conflicts on every round but the first
                await asyncio.gather(a.write({f"a{i}": _record(i)}), b.write({f"b{i}": _record(i)}))
            c = StateKeeper(ConfigMapStore(kube_a, NAMESPACE, name), 1.0)
            assert await c.load()
            return c.records
        finally:
            await kube_a.aclose()
            await kube_b.aclose()

    try:
        records = asyncio.run(run())
        assert sorted(records) == sorted([f"a{i}" for i in range(6)] + [f"b{i}" for i in range(6)])
        cm = api.get("v1", "ConfigMap", NAMESPACE, name) or {}
        doc = json.loads(cm["data"][CONFIGMAP_KEY])
        assert len(doc["fleets"]) == 12
    finally:
        api.delete("v1", "ConfigMap", NAMESPACE, name)
