"""The grpc-go kedaclient (calls a scaler the way the KEDA operator does) against `keda-llm-scaler serve`.

Runs when $KEDACLIENT names the binary (.ci/run sets it when the team's tool is present).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from keda_llm_scaler.testing.payloads import EngineLoad, vllm_v1
from keda_llm_scaler.testing.replicas import replicas
from keda_llm_scaler.testing.serveproc import serve

KEDACLIENT = os.environ.get("KEDACLIENT", "")
pytestmark = [
    pytest.mark.kedaclient,
    pytest.mark.skipif(not (KEDACLIENT and os.access(KEDACLIENT, os.X_OK)), reason="set KEDACLIENT=<path>"),
]


def kedaclient(address: str, op: str, meta: str, *extra: str) -> list[dict[str, object]]:
    out = subprocess.run(
        [KEDACLIENT, "-addr", address, "-op", op, "-meta", meta, "-name", "llm", "-namespace", "serving", *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def test_kedaclient_gets_the_right_answers() -> None:
    with replicas(vllm_v1([EngineLoad(0, 30, 0.85)]), vllm_v1([EngineLoad(10, 20, 0.85)])) as fleet, serve() as s:
        meta = f"endpoints={fleet[0].url},{fleet[1].url};scrapeInterval=1;enableTLS=false"
        results = {r["op"]: r for r in kedaclient(s.address, "all", meta)}
        assert results["spec"]["specs"] == [{"metricName": "llm_composite", "targetSize": 1, "targetSizeFloat": 1}]
        value = results["metrics"]["values"][0]  # type: ignore[index]
        assert value["metricValueFloat"] == pytest.approx(1 + 1 + 10 / 20)
        assert value["metricValue"] == 3
        assert results["active"]["result"] is True
        assert results["stream"]["received"] == [True]

        bad = kedaclient(s.address, "spec", f"endpoints={fleet[0].url};targetKvUsage=abc")[0]
        assert bad["code"] == "InvalidArgument" and "targetKvUsage" in str(bad["message"])
        spec_stream = kedaclient(s.address, "specstream", meta)[0]
        assert spec_stream["code"] == "Unimplemented"
        for service in ("", "liveness", "readiness"):
            health = kedaclient(s.address, "health", "", "-health-service", service)[0]
            assert health["status"] == "SERVING"
        fleet[0].set(delay_s=3.0)  # from now on its scrapes take the whole 1 s scrapeTimeout
        load = kedaclient(s.address, "load", meta, "-c", "16", "-d", "2s")[-1]
        assert load["errors"] == 0 and load["calls"] > 100
        # answered from memory, never waiting on a scrape: a call that waited on the held replica would take
        # its 1 s scrapeTimeout, the budget here (the product's 100 ms p99 is measured in the soak)
        assert float(load["p99_ms"]) < 1000  # type: ignore[arg-type]


def test_kedaclient_sees_unavailable_for_a_dead_fleet() -> None:
    with serve() as s:
        out = kedaclient(s.address, "metrics", "endpoints=http://127.0.0.1:9;scrapeInterval=1", "-timeout", "3s")
        assert out[-1]["code"] == "Unavailable"
