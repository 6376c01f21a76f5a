"""The small benchmarks issue #23 and #20 quote: `benchmarks.first_calls` against `serve` as a process, and the
pieces `benchmarks.capacity_bounds` builds its bounds from (the first burst's onset, the policy that asks
for a fleet at a given second)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from benchmarks.capacity_bounds import AskAt, _first_burst_s
from keda_llm_scaler.sim.trace import TraceRequest
from keda_llm_scaler.sim.workload import TraceWorkload

ROOT = Path(__file__).resolve().parent.parent


def test_first_calls_waits_once_then_answers_at_once() -> None:
    got = subprocess.run(
        [sys.executable, "-m", "benchmarks.first_calls", "--calls", "6", "--delay", "3"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr[-2000:]
    took = [float(ms) for ms in re.findall(r"^call \d+ at [\d.]+ s: ([\d.]+) ms, UNAVAILABLE", got.stdout, re.M)]
    assert len(took) == 6, got.stdout
    # the first call waited the warm-up budget for the slow first scrape; the other five did not wait
    assert all(t < took[0] / 5 for t in took[1:]), took


def _workload(per_10s: list[int]) -> TraceWorkload:
    trace = [TraceRequest(10.0 * b + i * 10.0 / n, 100, 10) for b, n in enumerate(per_10s) for i in range(n)]
    return TraceWorkload("synthetic", trace)


def test_the_first_burst_is_the_first_bin_over_twice_the_last_five_minutes() -> None:
    calm = [10] * 40  # 400 s at 1 req/s
    assert _first_burst_s(_workload([*calm, 21, 5, 30])) == 400.0
    assert _first_burst_s(_workload([*calm, 20, 10, 30])) == 420.0  # 20 is not more than twice 10


def test_ask_at_holds_the_starting_fleet_until_its_second() -> None:
    policy = AskAt("ask-at", 9.0, "replicas", at_s=480.0)
    assert policy.fixed_replicas(0.0) is None and policy.fixed_replicas(480.0) is None
    assert policy.fixed_replicas(480.5) == 9
