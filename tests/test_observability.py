"""Alerts and exposition checked by promtool (Debian's `prometheus` package), the dashboard and the
alerts checked against what the scaler really exports."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import runpy
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
import yaml

from keda_llm_scaler._proto import externalscaler_pb2 as pb
from keda_llm_scaler._proto import externalscaler_pb2_grpc as pb_grpc
from keda_llm_scaler.sim.keda import KedaEmulator
from keda_llm_scaler.testing.payloads import EngineLoad, vllm_v1
from keda_llm_scaler.testing.replicas import replicas
from keda_llm_scaler.testing.scalerproc import channel_to, running_scaler
from tests.test_chart import ALL_ON, ROOT, by_kind, render

PROMTOOL = shutil.which("promtool")


@pytest.fixture
def promtool() -> str:
    if PROMTOOL is None:
        if os.environ.get("CI"):
            pytest.fail("promtool missing: .ci/run installs Debian's `prometheus` package")
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return PROMTOOL


@pytest.fixture(scope="module")
def exposition() -> str:
    """The scaler's /metrics after serving one fleet (with one dead replica, so errors exist too)."""

    async def go() -> str:
        with replicas(vllm_v1([EngineLoad(3, 20, 0.5)], http_2xx=10, http_5xx=1, ttft_observations=[0.1] * 5)) as (r,):
            async with running_scaler() as server, channel_to(server) as ch:
                meta = {"endpoints": f"{r.url},http://127.0.0.1:9", "scrapeInterval": "0.5", "scrapeTimeout": "0.4"}
                await KedaEmulator(ch, "llm", "serving", meta).poll()
                # one request past gRPC's receive limit: refused before the handler, and counted
                huge = pb.ScaledObjectRef(name="huge", namespace="serving", scalerMetadata={"x": "y" * (1 << 21)})
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await pb_grpc.ExternalScalerStub(ch).GetMetricSpec(huge)
                # new TTFT observations and completions between scrapes: windowed p95s, rates and the
                # demand estimate (a few 2 s bins of arrivals) exist; 30 s is a generous budget on a busy machine
                deadline = time.monotonic() + 30.0
                success = 20.0
                while True:
                    r.set(
                        payload=vllm_v1(
                            [EngineLoad(3, 20, 0.5)],
                            http_2xx=30,
                            http_5xx=1,
                            success=success,
                            ttft_observations=[0.1] * 5 + [0.2] * 20,  # cumulative, as an engine's are
                        )
                    )
                    success += 10.0
                    await asyncio.sleep(0.3)
                    text = await asyncio.to_thread(
                        lambda: (
                            urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics").read().decode()
                        )
                    )
                    wanted = (
                        "llm_scaler_planned_requests_per_second",
                        "llm_scaler_replica_capacity_requests_per_second",
                        "llm_scaler_ttft_p95_seconds",
                        "llm_scaler_queue_time_p95_seconds",
                        "llm_scaler_rejects_per_second",
                        "llm_scaler_preemptions_per_second",
                    )
                    if all(f"\n{name}{{" in text for name in wanted) or time.monotonic() > deadline:
                        return text

    return asyncio.run(go())


def _rules_file(tmp_path: Path) -> Path:
    rule = by_kind(render(ALL_ON), "PrometheusRule")[0]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    return path


def test_promtool_checks_the_rendered_alert_rules(promtool: str, tmp_path: Path) -> None:
    out = subprocess.run([promtool, "check", "rules", str(_rules_file(tmp_path))], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 7 rules found" in out.stdout


def test_promtool_unit_tests_the_alerts(promtool: str, tmp_path: Path) -> None:
    rules = _rules_file(tmp_path)
    labels = '{namespace="serving",scaledobject="llm",target="abcd1234"}'
    (tmp_path / "test.yaml").write_text(f"""
rule_files: [{rules.name}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'llm_scaler_target_up{labels}'
        values: '1 1 0 0 0 0 0 0 0'
      - series: 'llm_scaler_rejects_per_second{labels}'
        values: '0 0.5x15'
      - series: 'llm_scaler_ttft_p95_seconds{labels}'
        values: '0.3x15'
      - series: 'llm_scaler_wake_replicas{labels}'
        values: '0 0 2x10 0x5'
      - series: 'llm_scaler_build_info{{version="0.2.0"}}'
        values: '1x15'
      - series: 'llm_scaler_composite{labels}'
        values: '16x20'
      - series: 'kube_horizontalpodautoscaler_spec_max_replicas{{namespace="serving",horizontalpodautoscaler="keda-hpa-llm"}}'
        values: '16x20'
    alert_rule_test:
      - eval_time: 8m
        alertname: LLMScalerStaleScrapes
        exp_alerts:
          - exp_labels: {{severity: warning, namespace: serving, scaledobject: llm, target: abcd1234}}
            exp_annotations:
              summary: "No fresh scrapes for serving/llm"
              description: "Every replica of the fleet failed to scrape for longer than staleAfter: KEDA gets UNAVAILABLE and applies its fallback. Check llm_scaler_scrape_errors_total by reason."
      - eval_time: 12m
        alertname: LLMScalerSustainedRejects
        exp_alerts:
          - exp_labels: {{severity: warning, namespace: serving, scaledobject: llm, target: abcd1234}}
            exp_annotations:
              summary: "serving/llm rejects 500m requests/s"
              description: "Admission control (HTTP 503) has been turning requests away for 10 minutes; users see errors."
      - eval_time: 8m
        alertname: LLMScalerWakeRequested
        exp_alerts:
          - exp_labels: {{severity: warning, namespace: serving, scaledobject: llm, target: abcd1234}}
            exp_annotations:
              summary: "serving/llm needs 2 of its replicas asleep woken"
              description: "The need exceeds the awake replicas, and replicas asleep (vLLM sleep mode) that would cover it have not been woken for 5 minutes; no new replica is asked for while they could. Wake them (POST /wake_up) or check what puts them to sleep."
      - eval_time: 15m
        alertname: LLMScalerWakeRequested
        exp_alerts: []
      - eval_time: 12m
        alertname: LLMScalerTtftSloBreach
        exp_alerts: []
      - eval_time: 16m
        alertname: LLMScalerPinnedAtMaxReplicas
        exp_alerts:
          - exp_labels: {{severity: warning, namespace: serving, scaledobject: llm}}
            exp_annotations:
              summary: "serving/llm wants at least maxReplicaCount for 15 minutes"
              description: "The composite demand has reached the HPA's maxReplicas; more load is queued or rejected. Raise maxReplicaCount or add capacity."
""")
    out = subprocess.run([promtool, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_checks_the_scaler_exposition(promtool: str, exposition: str) -> None:
    out = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "" and out.stderr.strip() == "", out.stdout + out.stderr  # no lint findings


def _exported_names(exposition: str) -> set[str]:
    return {line.split("{")[0].split()[0] for line in exposition.splitlines() if line and not line.startswith("#")}


def test_dashboard_is_generated_and_uses_only_exported_metrics(exposition: str) -> None:
    module = runpy.run_path(str(ROOT / "scripts" / "gen_dashboard.py"))
    path = ROOT / "charts" / "keda-llm-scaler" / "files" / "dashboard.json"
    assert path.read_text() == module["render"](), "run: python scripts/gen_dashboard.py"
    dashboard = json.loads(path.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = set(re.findall(r"\bllm_scaler_[a-z0-9_]+", " ".join(exprs)))
    assert used and used <= _exported_names(exposition), used - _exported_names(exposition)
    titles = " ".join(p["title"] for p in dashboard["panels"])
    for topic in ("Composite vs desired vs ready", "Composite terms", "Scrape", "gRPC latency"):
        assert topic in titles


def test_alerts_use_only_exported_metrics(exposition: str, tmp_path: Path) -> None:
    rules = yaml.safe_load(_rules_file(tmp_path).read_text())
    exprs = " ".join(r["expr"] for g in rules["groups"] for r in g["rules"])
    used = set(re.findall(r"\bllm_scaler_[a-z0-9_]+", exprs))
    assert used <= _exported_names(exposition), used - _exported_names(exposition)


def _families_read() -> set[str]:
    from keda_llm_scaler.engines import ADAPTERS
    from keda_llm_scaler.gateway import DEFAULT_GATEWAY_FAMILIES

    names = set(DEFAULT_GATEWAY_FAMILIES)
    for adapter in ADAPTERS.values():
        for n in adapter.sample_names.names:
            base = re.sub(r"_(bucket|count|sum)$", "", n)
            # a histogram's parts name the family; a counter whose name ends so is itself the family
            names.add(base if f"{base}_bucket" in adapter.sample_names.names else n)
    return names


@pytest.mark.parametrize("doc", ["README.md", "docs/metrics.md"])
def test_every_family_the_readers_ask_for_is_documented(doc: str) -> None:
    text = (ROOT / doc).read_text()
    missing = sorted(n for n in _families_read() if f"`{n}`" not in text and f"`{n}{{" not in text)
    assert not missing, f"{doc} does not name: {missing}"
