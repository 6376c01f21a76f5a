"""The sim-to-real benchmark's bound (docs/sim-to-real.md): the calibrated profile held to the engines'
speed just before a load. The engines' side needs real engines and runs as the benchmark; what is tested
here is the arithmetic every reported bound rests on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.sim_to_real import _drain_shapes, add_at_speed, at_speed, load_arrivals, speed_check_before
from keda_llm_scaler.enginelab.calibrate import Fit, simulated_throughput, write_profile
from keda_llm_scaler.sim.profiles import load_profile

MIX = [(64 + 29 * i % 449, 16 + 7 * i % 113) for i in range(64)]  # the drain burst samples 4 x 8 of them


def _profile(tmp_path: Path, overhead_ms: float = 40.0) -> Path:
    fit = Fit(18.0, 0.05, 0.3, 1.2, 0.0, 0.005, overhead_ms, 262144, 8, {"serving": {"rate": 1.0}})
    path = tmp_path / "profile.json"
    write_profile(fit, path, name="cpu", description="test", cold_start_s=60.0)
    return path


@pytest.mark.parametrize("faster", [0.5, 1.7])
def test_the_profile_at_speed_drains_the_burst_at_the_engines_rate(tmp_path: Path, faster: float) -> None:
    path = _profile(tmp_path)
    before = load_profile(path)
    shapes = _drain_shapes(MIX, before.max_num_seqs)
    engines_rps = faster * simulated_throughput(before, shapes)
    out, k = at_speed(path, engines_rps, MIX, tmp_path / "at-speed.json")
    after = load_profile(out)
    assert simulated_throughput(after, shapes) == pytest.approx(engines_rps, rel=0.02)
    assert k == pytest.approx(1 / faster, rel=0.02)
    # one factor on every step time and on the API server's time; the shape of the model is untouched
    for field in ("c_ms", "d_ms", "e_ms", "b_ms", "g_ms", "ttft_overhead_ms"):
        assert getattr(after, field) == pytest.approx(getattr(before, field) * k), field
    assert (after.max_num_seqs, after.kv_tokens) == (before.max_num_seqs, before.kv_tokens)
    assert "fit_points" not in json.loads(out.read_text())
    assert "fit_points" in json.loads(path.read_text())  # the calibrated profile itself is left as it was


def test_the_speed_check_before_a_load_is_the_mean_of_its_engines_and_absent_checks_give_none() -> None:
    result = {
        "speed": [
            {"at": "after calibrate", "real_rps": [9.0, 9.0]},
            {"at": "before 2 x 0.5 x knee", "real_rps": [4.0, 6.0]},
            {"at": "before 2 x 0.9 x knee", "real_rps": [3.0, 0.0]},  # an engine that completed nothing
        ]
    }
    assert speed_check_before(result, {"engines": 2, "load": 0.5}) == 5.0
    assert speed_check_before(result, {"engines": 2, "load": 0.9}) == 3.0
    assert speed_check_before(result, {"engines": 2, "load": 1.3}) is None
    assert speed_check_before({}, {"engines": 2, "load": 0.5}) is None


def test_the_bound_is_added_only_to_loads_with_a_speed_check_and_a_slower_engine_queues_longer(
    tmp_path: Path,
) -> None:
    path = _profile(tmp_path, overhead_ms=0.0)
    rps = simulated_throughput(load_profile(path), _drain_shapes(MIX, 8))
    arrivals = load_arrivals(0.6 * rps, 60.0, 1, 0, MIX)
    slow, fast, unchecked = ({"engines": 1, "load": x} for x in (0.5, 0.9, 1.3))
    result = {
        "speed": [
            {"at": "before 1 x 0.5 x knee", "real_rps": [0.5 * rps]},
            {"at": "before 1 x 0.9 x knee", "real_rps": [2.0 * rps]},
        ]
    }
    add_at_speed(result, path, MIX, [(slow, arrivals), (fast, arrivals), (unchecked, arrivals)])
    assert "sim_at_speed" not in unchecked
    assert slow["sim_at_speed"]["step_factor"] == pytest.approx(2.0, rel=0.02)
    assert fast["sim_at_speed"]["step_factor"] == pytest.approx(0.5, rel=0.02)
    # the same arrivals at 1.2 x what the slow engine drains queue; at 0.3 x the fast one's they do not
    assert slow["sim_at_speed"]["ttft_p50_s"] > 3 * fast["sim_at_speed"]["ttft_p50_s"]
    assert slow["sim_at_speed"]["attainment"] < fast["sim_at_speed"]["attainment"]
    assert slow["sim_at_speed"]["requests"] == len(arrivals)
