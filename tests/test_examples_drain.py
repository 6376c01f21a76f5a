"""The drain examples (charts/keda-llm-scaler/examples/*-drain*.yaml, docs/scale-down.md): valid manifests,
grace arithmetic that holds, HPA scale-down no faster than a pod drains, and the older-vLLM preStop
script run for real against a loopback /metrics server (the project's copies of real payloads)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from keda_llm_scaler.testing.payloads import EngineLoad, vllm_v1
from keda_llm_scaler.testing.replicas import Replica, dead_port
from tests.conftest import fixture_text
from tests.test_server_keda import eventually

EXAMPLES = Path(__file__).resolve().parent.parent / "charts" / "keda-llm-scaler" / "examples"
K8S_VERSION = "1.30.0"
MARGIN_S = 10  # the grace must leave at least this after the drain: the engine's own exit, a last poll
LONGEST_RESPONSE_S = 30  # the examples' worked example: 500 output tokens at ~47 ms/token ~ 24 s
BUDGET_S = 10.0  # generous waits for the script (it polls every 0.05 s here)

DP4 = fixture_text("vllm_v1_reconstructed_v0.10_dp4.txt")  # 4 data-parallel engines: 571 running, 21 waiting
V0 = fixture_text("vllm_v0.4.x_datadog-fixture.txt")  # V0 engine: running, waiting and swapped all 0


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def deployment(name: str) -> dict[str, Any]:
    (dep,) = [d for d in docs(name) if d["kind"] == "Deployment"]
    return dep


def pod_spec(dep: dict[str, Any]) -> dict[str, Any]:
    return dep["spec"]["template"]["spec"]


def container(dep: dict[str, Any]) -> dict[str, Any]:
    (c,) = pod_spec(dep)["containers"]
    return c


def prestop_sleep(c: dict[str, Any]) -> int:
    command = c["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep", command
    return int(command[1])


def flag(c: dict[str, Any], name: str) -> str:
    args = [*c.get("command", []), *c.get("args", [])]
    for i, arg in enumerate(args):
        if arg == name:
            return str(args[i + 1])
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{name} not in {args}")


def env(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c.get("env", [])}


def check_probes(c: dict[str, Any]) -> None:
    (port,) = c["ports"]
    for probe in ("readinessProbe", "startupProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] == "/health" and get["port"] in (port["name"], port["containerPort"]), probe


DRAIN_FILES = ["vllm-deployment-drain.yaml", "vllm-legacy-drain-prestop.yaml", "sglang-deployment-drain.yaml"]


@pytest.mark.parametrize("name", DRAIN_FILES)
def test_the_drain_examples_are_valid_kubernetes(name: str) -> None:
    for doc in docs(name):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_vllm_grace_covers_the_prestop_sleep_and_the_shutdown_timeout() -> None:
    dep = deployment("vllm-deployment-drain.yaml")
    c = container(dep)
    grace, sleep = pod_spec(dep)["terminationGracePeriodSeconds"], prestop_sleep(c)
    timeout = int(flag(c, "--shutdown-timeout"))
    assert timeout >= LONGEST_RESPONSE_S  # the default, 0, aborts in-flight requests at once
    assert grace > sleep + timeout and grace - (sleep + timeout) >= MARGIN_S, (grace, sleep, timeout)
    assert sleep >= 5  # endpoint and gateway propagation takes seconds
    tag = c["image"].rsplit(":", 1)[1].lstrip("v")
    assert tuple(int(x) for x in tag.split(".")[:2]) >= (0, 18)  # --shutdown-timeout came with 0.18
    check_probes(c)


def test_sglang_grace_covers_the_prestop_sleep_and_the_longest_response() -> None:
    dep = deployment("sglang-deployment-drain.yaml")
    c = container(dep)
    grace, sleep = pod_spec(dep)["terminationGracePeriodSeconds"], prestop_sleep(c)
    watchdog = 10  # SGLang notices SIGTERM within 5 s and checks what remains every 5 s
    assert grace - (sleep + LONGEST_RESPONSE_S + watchdog) >= 5, grace
    assert "SGL_FORCE_SHUTDOWN" not in env(c)  # it would skip the drain
    assert "--enable-metrics" in c["args"]
    check_probes(c)


def legacy_script() -> tuple[dict[str, Any], str]:
    dep = deployment("vllm-legacy-drain-prestop.yaml")
    c = container(dep)
    command = c["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["python3", "-c"]  # the vLLM image has python3; curl is not guaranteed
    return dep, command[2]


def test_legacy_grace_covers_the_settle_and_the_drain_deadline_and_the_script_compiles() -> None:
    dep, script = legacy_script()
    c = container(dep)
    compile(script, "preStop", "exec")
    variables = env(c)
    settle, timeout = float(variables["DRAIN_SETTLE_S"]), float(variables["DRAIN_TIMEOUT_S"])
    grace = pod_spec(dep)["terminationGracePeriodSeconds"]
    assert timeout >= LONGEST_RESPONSE_S and settle >= 5
    assert grace > settle + timeout and grace - (settle + timeout) >= MARGIN_S, (grace, settle, timeout)
    # the script's own defaults are the manifest's values (so a copy without the env still fits the grace)
    for name, value in variables.items():
        assert re.search(rf'"{name}", "{re.escape(value)}"', script), name
    assert variables["DRAIN_METRICS_URL"].endswith(f":{container(dep)['ports'][0]['containerPort']}/metrics")
    assert "--shutdown-timeout" not in str(c)  # older vLLM has no such flag
    check_probes(c)


def test_scale_down_is_no_faster_than_a_pod_drains() -> None:
    graces = {
        (d["metadata"]["namespace"], d["metadata"]["name"]): pod_spec(d)["terminationGracePeriodSeconds"]
        for name in DRAIN_FILES
        for d in docs(name)
        if d["kind"] == "Deployment"
    }
    paired = 0
    for path in sorted(EXAMPLES.glob("scaledobject-*.yaml")):
        for so in docs(path.name):
            down = so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
            up = so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleUp"]
            assert down["stabilizationWindowSeconds"] >= 300, path.name
            assert up["stabilizationWindowSeconds"] == 0, path.name  # scale up fast
            for policy in down["policies"]:  # a pod at a time, or a small share: never half the fleet at once
                assert (policy["type"], policy["value"]) == ("Pods", 1) or (
                    policy["type"] == "Percent" and policy["value"] <= 20
                ), path.name
            grace = graces.get((so["metadata"]["namespace"], so["spec"]["scaleTargetRef"]["name"]))
            if grace is not None:
                paired += 1
                assert all(p["periodSeconds"] >= grace for p in down["policies"]), path.name
            for trigger in so["spec"]["triggers"]:
                if trigger["type"].startswith("external"):
                    assert trigger["metadata"]["workloadClass"] in ("interactive", "batch"), path.name
                    if so["spec"].get("minReplicaCount", 0) == 0:  # 0 is reached only by batch fleets and
                        # the burst pools of a fleet (whose reserved pool serves the interactive path)
                        meta = trigger["metadata"]
                        assert meta["workloadClass"] == "batch" or meta.get("poolTier") == "burst", path.name
    assert paired >= 2  # the vLLM and SGLang ScaledObjects name the drain examples' Deployments


def test_the_batch_example_wakes_on_a_second_trigger() -> None:
    (so,) = docs("scaledobject-batch.yaml")
    spec = so["spec"]
    assert spec["minReplicaCount"] == 0 and spec["cooldownPeriod"] > 0 and "initialCooldownPeriod" in spec
    assert spec["fallback"]["replicas"] >= 1
    kinds = [t["type"] for t in spec["triggers"]]
    assert kinds[0] == "external" and spec["triggers"][0]["metadata"]["workloadClass"] == "batch"
    assert len(kinds) == 2 and kinds[1] != "external"  # KEDA's own queue scaler


# -- the older-vLLM preStop script, run ------------------------------------------------------------


def zeroed(payload: str) -> str:
    return re.sub(
        r"^(vllm:num_requests_(?:running|waiting|swapped)(?:\{[^}]*\})?) \S+$", r"\1 0.0", payload, flags=re.M
    )


def with_value(payload: str, family: str, value: str) -> str:
    return re.sub(rf"^({re.escape(family)}(?:\{{[^}}]*\}})?) \S+$", rf"\g<1> {value}", payload, flags=re.M)


def run_prestop(url: str, timeout_s: float = 60.0) -> subprocess.Popen[str]:
    _, script = legacy_script()
    variables = {"DRAIN_METRICS_URL": url, "DRAIN_SETTLE_S": "0", "DRAIN_TIMEOUT_S": str(timeout_s)}
    return subprocess.Popen(
        [sys.executable, "-c", script],
        env={**os.environ, **variables, "DRAIN_POLL_S": "0.05"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=BUDGET_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err


async def polled(replica: Replica, n: int) -> None:
    start = replica.requests

    async def enough() -> bool:
        return replica.requests >= start + n

    await eventually(enough, BUDGET_S)


async def test_the_prestop_waits_while_requests_run_and_returns_when_they_reach_zero() -> None:
    assert "vllm:num_requests_running{engine=" in DP4  # one series per data-parallel engine
    replica = Replica(DP4)
    try:
        proc = run_prestop(f"{replica.url}/metrics")
        await polled(replica, 5)
        assert proc.poll() is None  # 592 requests in flight across 4 engines: still waiting
        # engines 0-2 done, one request still queued on engine 3: every engine counts, not the first
        last = zeroed(DP4).replace(
            'vllm:num_requests_waiting{engine="3",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0',
            'vllm:num_requests_waiting{engine="3",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0',
        )
        assert last != zeroed(DP4)
        replica.set(payload=last)
        await polled(replica, 5)
        assert proc.poll() is None
        replica.set(payload=zeroed(DP4))
        code, err = finish(proc)
        assert code == 0, err
    finally:
        replica.close()


async def test_the_prestop_counts_v0_swapped_requests_and_gives_up_at_its_deadline() -> None:
    idle = Replica(V0)  # V0: the same running/waiting names, plus swapped
    try:
        code, err = finish(run_prestop(f"{idle.url}/metrics"))
        assert code == 0, err
    finally:
        idle.close()
    swapped = Replica(with_value(V0, "vllm:num_requests_swapped", "2.0"))
    try:
        start = time.monotonic()
        code, err = finish(run_prestop(f"{swapped.url}/metrics", timeout_s=0.5))
        assert code == 1 and "2 requests still in flight after 0.5 s" in err
        # its deadline is what is tested: it gave up after the 0.5 s asked, not the 60 s default; the
        # budget is room for a loaded machine to start the interpreter, far from the default either way
        assert time.monotonic() - start < BUDGET_S
    finally:
        swapped.close()


async def test_the_prestop_reads_unknown_as_busy_and_a_gone_server_as_drained() -> None:
    code, err = finish(run_prestop(f"http://127.0.0.1:{dead_port()}/metrics"))
    assert code == 0, err  # connection refused: the server is gone, nothing left to drain
    failing = Replica(vllm_v1([EngineLoad(0, 0, 0.0)]))
    try:
        failing.set(status=500)
        code, err = finish(run_prestop(f"{failing.url}/metrics", timeout_s=0.5))
        assert code == 1 and "an unknown number of requests" in err  # unknown is not zero
        failing.set(status=200, payload="# no vLLM gauges here\nother_metric 1.0\n")
        code, err = finish(run_prestop(f"{failing.url}/metrics", timeout_s=0.5))
        assert code == 1, err
    finally:
        failing.close()
