"""The sim-to-real benchmark's bound (docs/sim-to-real.md): the calibrated profile held to the engines'
speed just before a load. The engines' side needs real engines and runs as the benchmark; what is tested
here is the arithmetic every reported bound rests on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.sim_to_real import (
    _drain_shapes,
    add_at_speed,
    add_speed_band,
    at_speed,
    load_arrivals,
    plot_bands,
    speed_band,
    speed_check_before,
    table,
    within_band,
)
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


def test_the_speed_band_spans_the_slowest_and_fastest_checks_of_the_run() -> None:
    result = {
        "speed": [
            {"at": "after calibrate", "real_rps": [2.0, 3.0]},  # 2.5
            {"at": "before 2 x 0.5 x knee", "real_rps": [3.0, 0.0]},  # an engine that completed nothing: 3.0
            {"at": "before 2 x 0.9 x knee", "real_rps": [2.2, 2.2]},
            {"at": "at the end (the drain)", "real_rps": []},
        ]
    }
    assert speed_band(result) == pytest.approx((2.2, 3.0))
    assert speed_band({"speed": result["speed"][:1]}) is None  # one check says nothing of how far it moves
    assert speed_band({}) is None


@pytest.mark.parametrize(
    ("attainment", "ttft", "inside"),
    [
        (0.50, 1.0, {"attainment": True, "ttft_p50": True}),
        (0.22, 1.0, {"attainment": True, "ttft_p50": True}),  # within the goal's 5 points of the slow end
        (0.19, 1.0, {"attainment": False, "ttft_p50": True}),
        (0.86, 0.31, {"attainment": False, "ttft_p50": True}),  # 0.31 >= 0.4 x 0.75
        (0.50, 0.29, {"attainment": True, "ttft_p50": False}),
        (0.50, 3.7, {"attainment": True, "ttft_p50": True}),  # 3.7 <= 3 x 1.25
        (0.50, 3.8, {"attainment": True, "ttft_p50": False}),
    ],
)
def test_a_run_is_within_the_band_widened_by_the_goals_tolerance(
    attainment: float, ttft: float, inside: dict[str, bool]
) -> None:
    slow = {"attainment": 0.25, "ttft_p50_s": 3.0}
    fast = {"attainment": 0.80, "ttft_p50_s": 0.4}
    assert within_band({"attainment": attainment, "ttft_p50_s": ttft}, (slow, fast)) == inside


def test_the_band_is_the_same_arrivals_at_the_slowest_and_fastest_speed_and_the_table_reads_it(
    tmp_path: Path,
) -> None:
    path = _profile(tmp_path, overhead_ms=0.0)
    rps = simulated_throughput(load_profile(path), _drain_shapes(MIX, 8))
    arrivals = load_arrivals(rps, 60.0, 1, 0, MIX)  # at the profile's own drain rate: past its knee
    real = {"attainment": 0.5, "ttft_p50_s": 1.0, "ttft_p95_s": 2.0, "itl_p50_s": 0.05}
    row = {"load": 1.3, "rate": rps, "engines": 1, "real": real, "sim": real}
    result = {
        "rows": [row],
        "speed": [
            {"at": "after calibrate", "real_rps": [0.8 * rps]},
            {"at": "before 1 x 1.3 x knee", "real_rps": [1.25 * rps]},
        ],
    }
    add_speed_band(result, path, MIX, [(row, arrivals)])
    slow, fast = row["sim_band"]["slow"], row["sim_band"]["fast"]
    assert (slow["rps"], fast["rps"]) == pytest.approx((0.8 * rps, 1.25 * rps))
    assert slow["step_factor"] == pytest.approx(1.25, rel=0.02)
    assert fast["step_factor"] == pytest.approx(0.8, rel=0.02)
    # the slow end queues the same arrivals far longer than the fast one
    assert slow["attainment"] < fast["attainment"]
    assert slow["ttft_p50_s"] > 2 * fast["ttft_p50_s"]
    assert row["within_band"] == [within_band(real, (slow, fast))]
    assert f"{100 * slow['attainment']:.1f} to {100 * fast['attainment']:.1f} %" in table(result)


def test_no_band_without_two_speed_checks(tmp_path: Path) -> None:
    path = _profile(tmp_path)
    row = {"load": 0.5, "rate": 1.0, "engines": 1}
    add_speed_band({"speed": [{"at": "after calibrate", "real_rps": [1.0]}]}, path, MIX, [(row, [])])
    assert "sim_band" not in row


def test_the_bands_plot_is_a_png_and_leaves_rows_without_a_band_out(tmp_path: Path) -> None:
    end = {"attainment": 0.4, "ttft_p50_s": 0.9}
    real = {"attainment": 0.5, "ttft_p50_s": 1.0}
    banded = {"load": 1.3, "real": real, "sim": real, "sim_band": {"slow": end, "fast": real}}
    runs = {"m": {"rows": [banded, {"load": 0.5, "real": real, "sim": real}]}, "n": {"rows": []}}
    plot_bands(runs, tmp_path / "bands.png")
    assert (tmp_path / "bands.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
