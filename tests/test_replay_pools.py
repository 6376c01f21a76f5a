"""`replay --pools`, `--plan-reserved` and `--warmup`: a fleet of a reserved pool and a burst pool of another
replica type, each scaled by its share of the fleet's demand (the scaler's own split), with cost."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from keda_llm_scaler.sim.pools import PoolConfig, load_pools, plan_reserved, simulate_pools
from keda_llm_scaler.sim.run import RunConfig, simulate
from keda_llm_scaler.sim.trace import BUNDLED_TRACE, TraceRequest, load_trace
from keda_llm_scaler.sim.workload import TraceWorkload

EXE = os.path.join(os.path.dirname(sys.executable), "keda-llm-scaler")
COLD_S = 60.0  # short cold starts keep the runs short; the split does not depend on them


def _pools(reserved: int, burst_max: int = 8, reserved_min: int | None = 1, **burst: object) -> list[PoolConfig]:
    return [
        PoolConfig("h100", "70b-h100x4", 0, reserved, 8.0, reserved_min, cold_start_s=COLD_S),
        PoolConfig("h200", "70b-h200x2", 1, burst_max, 10.0, None, cold_start_s=COLD_S, **burst),  # type: ignore[arg-type]
    ]


def _step_day(
    low: float, high: float, minutes: tuple[int, int, int] = (15, 20, 15), ramp_s: float = 0.0
) -> TraceWorkload:
    """Poisson arrivals at ``low`` req/s, then ``high`` (reached over ``ramp_s``), then ``low`` again, with the
    bundled trace's tokens (thinned from a Poisson stream at ``high``: exact for a rate that changes)."""
    mix = load_trace(BUNDLED_TRACE)[:4000]
    rng = random.Random(7)
    rise, fall, end = 60 * minutes[0], 60 * (minutes[0] + minutes[1]), 60 * sum(minutes)

    def rate(t: float) -> float:
        if t < rise or t >= fall:
            return low
        return high if ramp_s <= 0 else min(high, low + (high - low) * (t - rise) / ramp_s)

    rows: list[TraceRequest] = []
    t = 0.0
    while True:
        t += rng.expovariate(high)
        if t >= end:
            break
        if rng.random() * high < rate(t):
            m = mix[len(rows) % len(mix)]
            rows.append(TraceRequest(t, m.prompt, m.output))
    return TraceWorkload("step", rows)


@pytest.fixture(scope="module")
def step_day() -> TraceWorkload:
    # 70b-h100x4 serves ~13 req/s within a 2 s TTFT on this mix: 2 reserved replicas hold 12 req/s, not 45
    return _step_day(12.0, 45.0)


@pytest.fixture(scope="module")
def step_run(step_day: TraceWorkload) -> dict[str, object]:
    return simulate_pools(step_day, _pools(reserved=2), RunConfig(warmup_s=300.0)).__dict__


def test_the_reserved_pool_fills_first_and_never_grows_past_its_size(step_run: dict[str, object]) -> None:
    s = step_run["summary"]
    timeline = step_run["timeline"]
    assert isinstance(s, dict) and isinstance(timeline, list)
    pools = s["pools"]
    assert pools["h100"]["max_replicas"] == 2
    assert max(p["desired:h100"] for p in timeline) <= 2
    # the burst pool ran only because the reserved pool was full: while it held the load, none ran
    first = [p for p in timeline if 300 <= p["t"] <= 15 * 60]
    assert all(p["desired:h200"] == 0 for p in first)
    busy = [p for p in timeline if p["desired:h200"] > 0]
    assert busy, "the burst pool never ran while the day needed three times the reserved pool"
    assert all(p["desired:h100"] == 2 for p in busy), "burst replicas while the reserved pool was not at its size"
    assert pools["h200"]["gpu_hours"] > 0
    # and it was given back first: the burst pool went back to zero while the reserved pool stayed at its size
    tail = [p for p in timeline if p["t"] >= 35 * 60 + 600]
    assert tail and tail[-1]["desired:h200"] == 0 and tail[-1]["desired:h100"] >= 1
    # a step to nearly four times the load within a second costs the start-up of what it needs
    assert s["after_warmup"]["slo_attainment"] >= 0.85


def test_the_cost_is_the_reservation_plus_the_burst_replica_hours(step_run: dict[str, object]) -> None:
    s = step_run["summary"]
    assert isinstance(s, dict)
    hours = s["duration_s"] / 3600.0
    h100, h200 = s["pools"]["h100"], s["pools"]["h200"]
    assert h100["cost"] == pytest.approx(2 * 8.0 * hours)  # paid for whether used or not
    assert h200["cost"] == pytest.approx(h200["replica_hours"] * 10.0)
    assert h200["replica_hours"] == pytest.approx(h200["gpu_hours"] / 2)  # 70b-h200x2: two GPUs a replica
    assert s["cost"] == pytest.approx(h100["cost"] + h200["cost"])
    w = s["after_warmup"]
    assert w["requests"] < s["requests"]
    assert w["pools"]["h100"]["cost"] == pytest.approx(2 * 8.0 * (s["duration_s"] - 300.0) / 3600.0)
    assert w["cost"] == pytest.approx(w["pools"]["h100"]["cost"] + w["pools"]["h200"]["cost"])
    assert w["gpu_hours"] < s["gpu_hours"]


def test_a_reserved_pool_that_covers_the_day_leaves_the_burst_pool_at_zero(step_day: TraceWorkload) -> None:
    # a reservation runs whole by default (it is paid for whether it serves or not); the day rises to 30 req/s
    # over ten minutes, which 8 replicas of ~13 req/s hold even at the composite's prior capacity from KV
    day = _step_day(12.0, 30.0, ramp_s=600.0)
    s = simulate_pools(day, _pools(reserved=8, reserved_min=None), RunConfig(warmup_s=300.0)).summary
    assert s["pools"]["h200"]["gpu_hours"] == 0.0
    assert s["pools"]["h200"]["max_replicas"] == 0
    assert s["pools"]["h100"]["max_replicas"] <= 8
    assert s["after_warmup"]["slo_attainment"] >= 0.99


def test_a_spot_reclaim_cuts_what_it_held_and_the_pool_gets_a_replica_back(step_day: TraceWorkload) -> None:
    s = simulate_pools(
        step_day, _pools(reserved=2, spot_reclaim_per_hour=6.0, node_provision_s=30.0), RunConfig(warmup_s=300.0)
    ).summary
    burst = s["pools"]["h200"]
    assert burst["spot_reclaims"] > 0 and burst["streams_cut"] > 0  # a reclaim gives no grace period
    assert s["spot_reclaims"] == burst["spot_reclaims"] and s["pools"]["h100"]["spot_reclaims"] == 0
    assert s["after_warmup"]["slo_attainment"] >= 0.8


def test_the_warmup_counts_from_its_end_and_keeps_the_whole_run(step_day: TraceWorkload) -> None:
    whole = simulate(step_day, RunConfig(profile="70b-h100x4", cold_start_s=COLD_S)).summary
    warm = simulate(step_day, RunConfig(profile="70b-h100x4", cold_start_s=COLD_S, warmup_s=600.0)).summary
    # the fleet runs the same either way: the warm-up only chooses what is counted
    assert warm["slo_attainment"] == whole["slo_attainment"] and warm["gpu_hours"] == whole["gpu_hours"]
    after = warm["after_warmup"]
    assert after["warmup_s"] == 600.0
    assert after["requests"] == sum(1 for r in step_day.trace if r.t >= 600.0)
    assert 0 < after["gpu_hours"] < warm["gpu_hours"]
    assert whole["after_warmup"]["requests"] == whole["requests"]
    assert whole["after_warmup"]["gpu_hours"] == pytest.approx(whole["gpu_hours"])


def test_planning_the_reservation_picks_the_cheapest_size_that_reaches_the_target() -> None:
    # the day rises to 45 req/s over ten minutes; each size runs whole (a reservation's default)
    day = _step_day(12.0, 45.0, ramp_s=600.0)
    plan = plan_reserved(day, _pools(reserved=1, reserved_min=None), RunConfig(warmup_s=300.0), (1, 4), 0.9)
    curve = plan["curve"]
    assert [r["reserved_size"] for r in curve] == [1, 2, 3, 4]
    meeting = [r for r in curve if r["slo_attainment"] >= 0.9]
    assert meeting
    best = min(meeting, key=lambda r: (r["cost"], r["reserved_size"]))
    assert plan["reserved_size"] == best["reserved_size"] and plan["cost"] == best["cost"]
    # every size costs its reservation: the curve is the size's cost plus what the burst pool ran
    for r in curve:
        reserved = r["pools"]["h100"]["cost"]
        assert reserved == pytest.approx(r["reserved_size"] * 8.0 * (day.duration_s - 300.0) / 3600.0)
        assert r["cost"] == pytest.approx(reserved + r["pools"]["h200"]["cost"])


def test_pools_files_are_checked_and_errors_name_the_pool_and_key(tmp_path: Path) -> None:
    def refused(text: str) -> str:
        f = tmp_path / "pools.yaml"
        f.write_text(text)
        with pytest.raises(ValueError, match=r".") as err:
            load_pools(f)
        return str(err.value)

    ok = "- {name: a, profile: 70b-h100x4, tier: reserved, size: 2, costPerHour: 8}\n"
    burst = "- {name: b, profile: 70b-h200x2, tier: burst, max: 4, costPerHour: 10}\n"
    assert "pool 'b': max is required" in refused(ok + "- {name: b, profile: 70b-h200x2, tier: burst, costPerHour: 1}")
    assert "unknown keys sise" in refused(ok + burst.replace("max: 4", "max: 4, sise: 2"))
    assert "costPerHour is required" in refused(ok.replace(", costPerHour: 8", "") + burst)
    assert "tier must be" in refused(ok + burst.replace("burst,", "spot,"))
    assert "at most one reserved pool" in refused(ok + ok.replace("name: a", "name: c") + burst)
    assert "one reserved pool and at least one burst pool" in refused(ok)
    assert "min 3 is above its size 2" in refused(ok.replace("size: 2", "size: 2, min: 3") + burst)
    assert "nine" in refused(ok.replace("70b-h100x4", "nine") + burst)
    assert "costPerHour must be a number >= 0" in refused(ok.replace("costPerHour: 8", "costPerHour: -1") + burst)
    f = tmp_path / "good.yaml"
    f.write_text(burst + ok)
    pools = load_pools(f)
    assert [p.name for p in pools] == ["a", "b"]  # reserved first, whatever the file's order
    assert pools[1].low == 0 and pools[0].low == 2  # a reservation runs whole unless told


def test_replay_pools_from_the_cli(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    lines = BUNDLED_TRACE.read_text().splitlines()
    trace.write_text("\n".join([lines[0]] + [line for line in lines[1:] if line < "2023-11-16 18:35:46"]) + "\n")
    pools = tmp_path / "pools.yaml"
    pools.write_text(
        "- {name: h100, profile: 70b-h100x4, tier: reserved, size: 1, costPerHour: 8, coldStart: 60}\n"
        "- {name: h200, profile: 70b-h200x2, tier: burst, max: 6, costPerHour: 10, coldStart: 60}\n"
    )
    png = tmp_path / "pools.png"
    out = subprocess.run(
        [EXE, "replay", "--trace", str(trace), "--rate-scale", "3", "--pools", str(pools), "--warmup", "300",
         "--json", "--plot", str(png), "--quiet"],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    s = json.loads(out.stdout)
    assert set(s["pools"]) == {"h100", "h200"}
    for p in s["pools"].values():
        assert {"gpu_hours", "replica_hours", "cost", "max_replicas"} <= set(p)
    assert math.isclose(s["cost"], s["pools"]["h100"]["cost"] + s["pools"]["h200"]["cost"])
    assert s["after_warmup"]["warmup_s"] == 300
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plan_png = tmp_path / "plan.png"
    out = subprocess.run(
        [EXE, "replay", "--trace", str(trace), "--rate-scale", "3", "--pools", str(pools), "--warmup", "300",
         "--plan-reserved", "1:2", "--target-attainment", "0.5", "--plot", str(plan_png), "--quiet"],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    assert "reserved_size" in out.stdout and out.stdout.strip().splitlines()[-1].startswith("reserved_size ")
    assert plan_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = subprocess.run(
        [EXE, "replay", "--trace", str(trace), "--plan-reserved", "1:2"], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "--plan-reserved goes with --pools" in bad.stderr
