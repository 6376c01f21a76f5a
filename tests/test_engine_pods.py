"""Real engines in the control plane's pods (controlplane.enginepods) and in the demo (enginelab.demo): what
the stand-in reads from a pod spec as a kubelet would, and the demo's load. The engines themselves run in
tests/engine_e2e (inside ``scripts/controlplane run --pods vllm``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from keda_llm_scaler.controlplane.enginepods import prestop_seconds, shutdown_args
from keda_llm_scaler.enginelab.demo import arrivals, load_curve

EXAMPLES = Path(__file__).resolve().parent.parent / "charts" / "keda-llm-scaler" / "examples"


@pytest.mark.parametrize(
    ("hook", "seconds"),
    [
        ({"exec": {"command": ["sleep", "15"]}}, 15.0),
        ({"exec": {"command": ["/bin/sleep", "2.5"]}}, 2.5),
        ({"exec": {"command": ["sh", "-c", "sleep 7"]}}, 7.0),
        ({"sleep": {"seconds": 20}}, 20.0),  # the native hook (Kubernetes >= 1.30)
        ({"exec": {"command": ["/bin/drain.sh"]}}, 0.0),  # nothing here can exec in an engine's container
        ({"exec": {"command": ["sleep", "forever"]}}, 0.0),
        ({}, 0.0),
    ],
)
def test_prestop_seconds_are_read_from_the_hook(hook: dict, seconds: float) -> None:
    assert prestop_seconds({"lifecycle": {"preStop": hook}}) == seconds


def test_the_drain_examples_settings_reach_the_engine() -> None:
    docs = [d for d in yaml.safe_load_all((EXAMPLES / "vllm-deployment-drain.yaml").read_text()) if d]
    container = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert prestop_seconds(container) == 15.0
    assert shutdown_args(container) == ("--shutdown-timeout=30",)
    # the other spellings; the last one wins, as in vLLM's argument parser; none means vLLM's default (abort)
    assert shutdown_args({"args": ["--shutdown-timeout", "45"]}) == ("--shutdown-timeout=45",)
    assert shutdown_args({"command": ["vllm", "serve", "--shutdown-timeout=5"], "args": ["--shutdown-timeout=9"]}) == (
        "--shutdown-timeout=9",
    )
    assert shutdown_args({"args": ["--port=8000"]}) == ()


def test_the_demo_load_ramps_past_one_engine_bursts_and_falls() -> None:
    duration, t = 480.0, 4.0
    assert load_curve(0.0, duration, t) == pytest.approx(1.2)
    assert load_curve(0.5 * duration, duration, t) == pytest.approx(6.4)  # 1.6 engines' worth
    assert load_curve(0.62 * duration, duration, t) == pytest.approx(8.0)  # the burst
    assert load_curve(0.9 * duration, duration, t) == pytest.approx(1.2)
    times = arrivals(duration, t, seed=3)
    assert times == sorted(times) and times == arrivals(duration, t, seed=3)  # deterministic per seed
    expected = sum(load_curve(x + 0.5, duration, t) for x in range(int(duration)))
    assert abs(len(times) - expected) < 4 * expected**0.5  # Poisson around the curve's integral
    plateau = [x for x in times if 0.4 * duration <= x < 0.6 * duration]
    assert abs(len(plateau) / (0.2 * duration) - 6.4) < 1.0


def test_the_engine_demo_says_what_it_needs(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "KLS_ENGINE_CACHE": str(tmp_path / "none")}
    out = subprocess.run([sys.executable, "-m", "keda_llm_scaler", "demo", "--engine", "vllm", "--out-dir",
                          str(tmp_path / "o")], capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "scripts/engine build" in out.stderr
    assert not (tmp_path / "o").exists()
