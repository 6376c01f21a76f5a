"""Shadow mode (issue #33): ``shadow`` scrapes and scores workloads exactly as ``serve`` does without answering
KEDA, and exports what the HPA would set beside what runs; ``shadow-report`` turns what it recorded (or
Prometheus' copy of its series) into a PNG and a markdown report."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from keda_llm_scaler.shadow import ShadowConfigError, hpa_desired, load_shadow_config, run_shadow
from keda_llm_scaler.shadow_report import Sample, from_prometheus, read_record, summarize
from keda_llm_scaler.testing.payloads import EngineLoad, vllm_v1
from keda_llm_scaler.testing.replicas import replicas
from keda_llm_scaler.testing.scalerproc import BASE
from tests.test_server_keda import eventually
from tests.test_telemetry import scrape

EXE = str(Path(sys.executable).parent / "keda-llm-scaler")
FAST = {"scrapeInterval": "0.5", "scrapeTimeout": "0.4", "staleAfter": "1.5"}
HOT = vllm_v1([EngineLoad(30, 20, 0.97)])  # a deep queue and a full KV cache: more than one replica's worth
SETTINGS = replace(BASE, scrape_workers="0")


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "shadow.yaml"
    p.write_text(text)
    return p


# -- the workload file ------------------------------------------------------------------------------
def test_a_workload_file_reads_as_scaled_objects_would(tmp_path: Path) -> None:
    (w,) = load_shadow_config(
        _write(
            tmp_path,
            "workloads:\n- name: llama\n  namespace: serving\n  metadata: {service: vllm, ttftSloSeconds: 2}\n"
            "  scaleTargetRef: {kind: Deployment, name: vllm}\n  maxReplicaCount: 8\n",
        )
    )
    assert (w.label, w.metadata, w.min_replicas, w.max_replicas) == (
        "serving/llama",
        {"service": "vllm", "ttftSloSeconds": "2"},
        1,
        8,
    )
    assert w.scale_target == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "vllm"}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("workloads: []\n", "workloads:"),
        ("workloads:\n- namespace: x\n", "`name` is required"),
        ("workloads:\n- name: a\n  metadata: {endpoints: 'http://10.0.0.1:8000', targetValue: -1}\n", "targetValue"),
        ("workloads:\n- name: a\n  metadata: {endpoints: 'http://10.0.0.1:8000'}\n  replicas: 3\n", "'replicas'"),
        ("workloads:\n- name: a\n  metadata: {endpoints: 'http://10.0.0.1:8000'}\n  minReplicaCount: 5\n"
         "  maxReplicaCount: 2\n", "minReplicaCount"),
        ("workloads:\n- name: a\n  metadata: {endpoints: 'http://10.0.0.1:8000'}\n- name: a\n"
         "  metadata: {endpoints: 'http://10.0.0.1:8000'}\n", "listed twice"),
        ("workloads:\n- name: a\n  metadata: {endpoints: 'http://10.0.0.1:8000'}\n"
         "  scaleTargetRef: {kind: Deployment}\n", "scaleTargetRef"),
        ("{not yaml", "shadow.yaml"),
    ],
)  # fmt: skip
def test_a_broken_workload_file_names_the_workload_and_the_key(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(ShadowConfigError) as err:
        load_shadow_config(_write(tmp_path, text))
    assert says in str(err.value), str(err.value)


def test_the_cli_refuses_a_broken_file_with_exit_2(tmp_path: Path) -> None:
    path = _write(tmp_path, "workloads:\n- name: a\n  metadata: {endpoints: 'http://10.0.0.1:8000', targetValue: x}\n")
    out = subprocess.run([EXE, "shadow", "--config", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "workload default/a" in out.stderr and "targetValue" in out.stderr


# -- what the HPA would set ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "current", "want"),
    [
        (5.2, 2, 6),  # ceil(value / target)
        (2.1, 2, 2),  # within the HPA's 10 % tolerance: kept
        (1.7, 2, 2),  # 15 % below: ceil(1.7) = 2 anyway
        (0.4, 3, 1),  # never below minReplicaCount
        (50.0, 3, 8),  # never above maxReplicaCount
        (0.5, 0, 1),  # from zero
    ],
)
def test_desired_replicas_are_what_the_hpa_would_set(value: float, current: int, want: int) -> None:
    assert hpa_desired(value, 1.0, current, 1, 8) == want


def test_desired_replicas_follow_the_target_value() -> None:
    assert hpa_desired(6.0, 2.0, 1, 1, 8) == 3


# -- shadow on loopback replicas ---------------------------------------------------------------------
async def test_shadow_exports_more_replicas_than_exist_for_an_overloaded_fleet_and_records_it(tmp_path: Path) -> None:
    with replicas(HOT, HOT) as reps:
        path = _write(
            tmp_path,
            "workloads:\n- name: llama\n  namespace: serving\n"
            f"  metadata: {json.dumps({'endpoints': ','.join(r.url for r in reps), **FAST})}\n",
        )
        record = tmp_path / "record.jsonl"
        stop, ready = asyncio.Event(), asyncio.Event()
        with record.open("a") as out:
            task = asyncio.create_task(run_shadow(SETTINGS, load_shadow_config(path), out, stop, ready))
            await asyncio.wait_for(ready.wait(), 30)

            async def asks_for_more() -> bool:
                lines = [json.loads(line) for line in record.read_text().splitlines()]
                return sum(1 for r in lines if (r.get("desired") or 0) > 2) >= 3

            try:
                await eventually(asks_for_more, timeout=20.0)
            finally:
                stop.set()
                await task
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    hot = [r for r in lines if r.get("desired") is not None]
    assert hot and all(r["desired"] > 2 and r["composite"] > 2 for r in hot[-3:]), hot[-3:]
    assert all(r["namespace"] == "serving" and r["scaledobject"] == "llama" for r in lines)
    assert hot[-1]["members_ready"] == 2 and hot[-1]["waiting"] == 60


async def test_shadow_serves_its_series_on_metrics_and_answers_no_keda(tmp_path: Path) -> None:
    with replicas(HOT, HOT) as reps:
        path = _write(
            tmp_path,
            "workloads:\n- name: llama\n  namespace: serving\n"
            f"  metadata: {json.dumps({'endpoints': ','.join(r.url for r in reps), **FAST})}\n",
        )
        stop, ready = asyncio.Event(), asyncio.Event()
        seen: dict[str, float] = {}
        from keda_llm_scaler import shadow as shadow_module

        made: list[object] = []
        real = shadow_module.ScalerServer

        def spy(*args: object, **kwargs: object) -> object:
            made.append(server := real(*args, **kwargs))  # type: ignore[arg-type]
            return server

        shadow_module.ScalerServer = spy  # type: ignore[misc,assignment]
        try:
            task = asyncio.create_task(run_shadow(SETTINGS, load_shadow_config(path), None, stop, ready))
            await asyncio.wait_for(ready.wait(), 30)
            server = made[0]
            assert server.grpc_port == 0, "shadow binds no gRPC port: no KEDA can reach it"  # type: ignore[attr-defined]

            async def exported() -> bool:
                text = scrape(server.metrics_port)  # type: ignore[attr-defined]
                for name in ("llm_scaler_shadow_desired_replicas", "llm_scaler_composite"):
                    for labels, v in text.get(name, []):
                        if labels.get("scaledobject") == "llama":
                            seen[name] = v
                return len(seen) == 2

            await eventually(exported, timeout=20.0)
        finally:
            shadow_module.ScalerServer = real  # type: ignore[misc]
            stop.set()
            await task
    assert seen["llm_scaler_shadow_desired_replicas"] > 2 and seen["llm_scaler_composite"] > 2, seen


# -- shadow-report -------------------------------------------------------------------------------------
def _recording(tmp_path: Path) -> Path:
    """An hour at a 60 s cycle: the HPA ran 2 replicas; the composite asked 4 in the middle 20 minutes."""
    lines = []
    for i in range(61):
        busy = 20 <= i < 40
        lines.append(
            json.dumps(
                {
                    "t": 1000.0 + 60 * i,
                    "namespace": "serving",
                    "scaledobject": "llama",
                    "actual": 2,
                    "ready": 2,
                    "desired": 4 if busy else 2,
                    "composite": 3.6 if busy else 1.5,
                    "ttft_p95_s": 4.0 if busy else 0.4,
                    "waiting": 30 if busy else 0,
                }
            )
        )
    path = tmp_path / "record.jsonl"
    path.write_text("\n".join(lines) + "\n{torn line")
    return path


def test_the_report_counts_replica_hours_and_the_time_asking_for_more(tmp_path: Path) -> None:
    (samples,) = read_record(_recording(tmp_path)).values()
    s = summarize(samples, gpus_per_replica=4.0, slo_s=2.0)
    assert s["actual_replica_hours"] == pytest.approx(2.0)
    assert s["desired_replica_hours"] == pytest.approx(2.0 + 2 * 20 / 60)
    assert s["gpu_hours_difference"] == pytest.approx(4 * 2 * 20 / 60)
    assert s["share_asking_more"] == pytest.approx(20 / 61) and s["max_shortfall"] == 2
    assert s["share_over_slo_while_asking_more"] == 1.0


def test_shadow_report_writes_a_png_and_a_markdown_report(tmp_path: Path) -> None:
    out = tmp_path / "report"
    run = subprocess.run(
        [EXE, "shadow-report", str(_recording(tmp_path)), "--out", str(out), "--gpus-per-replica", "4",
         "--slo-ttft", "2"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    png = out / "shadow-serving_llama.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    md = (out / "report.md").read_text()
    assert "| serving/llama |" in md and "2.00 / 2.67" in md and "+2.67" in md
    assert "![serving/llama](shadow-serving_llama.png)" in md
    assert "asked for more replicas than ran 33%" in md
    bad = subprocess.run([EXE, "shadow-report", "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "record FILE or --prometheus" in bad.stderr


def test_the_report_reads_prometheus_range_queries() -> None:
    def matrix(values: list[tuple[float, str]]) -> dict[str, object]:
        series = {"metric": {"namespace": "serving", "scaledobject": "llama"}, "values": [list(v) for v in values]}
        return {"status": "success", "data": {"resultType": "matrix", "result": [series]}}

    got = from_prometheus(
        {
            "desired": matrix([(0.0, "3"), (30.0, "4")]),
            "actual": matrix([(0.0, "2"), (30.0, "2")]),
            "ttft_p95_s": matrix([(0.0, "NaN"), (30.0, "1.5")]),
        }
    )
    assert got == {
        "serving/llama": [Sample(0.0, 3.0, 2.0), Sample(30.0, 4.0, 2.0, ttft_p95_s=1.5)],
    }
    with pytest.raises(ValueError, match="range query"):
        from_prometheus({"desired": {"data": {"resultType": "vector", "result": []}}})


@pytest.mark.parametrize(
    ("flags", "says"),
    [(["--victim-ranking", "serving"], "--victim-ranking"), (["--state-configmap", "keda/x"], "--state-configmap")],
)
def test_shadow_refuses_the_flags_that_write_to_the_cluster(tmp_path: Path, flags: list[str], says: str) -> None:
    path = _write(tmp_path, "workloads:\n- name: a\n  metadata: {endpoints: 'http://10.0.0.1:8000'}\n")
    out = subprocess.run(
        [EXE, "shadow", "--config", str(path), *flags, "--kube-api-url", "https://127.0.0.1:1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and says in out.stderr and "acts on nothing" in out.stderr + "shadow acts on nothing", (
        out.stderr
    )
