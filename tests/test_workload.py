"""Workloads for replay: rate scaling at every time scale, the bundled bursty hour, diurnal days from
rate curves (deterministic, window means kept, streamed), node provisioning, capacity on long prompts."""

from __future__ import annotations

import itertools
import math
import tracemalloc
from pathlib import Path

import pytest

from keda_llm_scaler.sim.fleet import READY, STARTING, SimulatedFleet
from keda_llm_scaler.sim.profiles import PROFILES
from keda_llm_scaler.sim.run import RunConfig, TtftHistogram, capacity_at_slo, percentile, simulate
from keda_llm_scaler.sim.trace import BUNDLED_TRACE, BURSTY_TRACE, TraceRequest, load_trace, peak_to_mean, scale_rate
from keda_llm_scaler.sim.workload import BUNDLED_CURVE, CurveWorkload, TraceWorkload, load_curve, parse_hours


@pytest.mark.parametrize("trace_path", [BUNDLED_TRACE, BURSTY_TRACE])
@pytest.mark.parametrize("factor", [2.5, 12.0])
def test_rate_scaling_keeps_the_burst_shape(trace_path: Path, factor: float) -> None:
    trace = load_trace(trace_path)
    span = trace[-1].t
    scaled = scale_rate(trace, factor)
    assert len(scaled) == pytest.approx(factor * len(trace), rel=0.01)
    for window in (10.0, 60.0):
        base = peak_to_mean([r.t for r in trace], window, span)
        assert peak_to_mean([r.t for r in scaled], window, span) == pytest.approx(base, rel=0.10), window
    # the token mix is the trace's: same multiset of prompts for whole factors
    if factor == int(factor):
        assert sorted(r.prompt for r in scaled) == sorted(r.prompt for r in trace for _ in range(int(factor)))


def test_rate_scaling_does_not_send_copies_of_one_prompt_together() -> None:
    trace = load_trace(BUNDLED_TRACE)[:2000]
    scaled = scale_rate(trace, 8)
    runs = sum(1 for a, b in itertools.pairwise(scaled) if a.prompt == b.prompt)
    assert runs < 0.2 * len(scaled)


def test_the_bundled_bursty_hour() -> None:
    conv, bursty = load_trace(BUNDLED_TRACE), load_trace(BURSTY_TRACE)
    assert len(bursty) > 1.3 * len(conv)
    assert peak_to_mean([r.t for r in bursty], 10) > 2.5 * peak_to_mean([r.t for r in conv], 10)
    # four bursts of 3-5x, each shorter than a 240 s cold start: the per-10 s rate against the median
    bins = [0] * 360
    for r in bursty:
        bins[min(359, int(r.t // 10))] += 1
    median = sorted(bins)[180]
    hot = [i for i, c in enumerate(bins) if c > 2.2 * median]
    runs = [list(g) for g in _runs(hot)]
    assert len(runs) == 4 and all(len(run) * 10 <= 240 for run in runs)


def _runs(indices: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for i in indices:
        if out and i - out[-1][-1] <= 5:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def test_curve_parsing_and_errors(tmp_path: Path) -> None:
    rates, window = load_curve(BUNDLED_CURVE, "m-small")
    assert window == 600 and len(rates) == 2016 and max(rates) > 1000
    with pytest.raises(ValueError, match="--curve-model"):
        load_curve(BUNDLED_CURVE)
    with pytest.raises(ValueError, match="no model 'nope'"):
        load_curve(BUNDLED_CURVE, "nope")
    client = tmp_path / "client.csv"
    client.write_text("0,1.5,2.0,Gamma,0.5,3\n600,0,0,,0,0\n1200,3.0,1.0,Weibull,0.4,0.2\n")
    assert load_curve(client) == ([1.5, 0.0, 3.0], 600.0)
    client.write_text("0,1.5\n600,-1\n")
    with pytest.raises(ValueError, match=":2: rate must be"):
        load_curve(client)
    client.write_text("0,1\n600,1\n1500,1\n")
    with pytest.raises(ValueError, match="evenly spaced"):
        load_curve(client)
    assert parse_hours("2:14") == (2.0, 14.0)
    for bad in ("14:2", "x", "1:inf", "-1:3"):
        with pytest.raises(ValueError, match="--hours"):
            parse_hours(bad)


def test_a_day_from_a_curve_is_deterministic_and_keeps_each_window_mean() -> None:
    day = CurveWorkload.build(BUNDLED_CURVE, BUNDLED_TRACE, model="m-small", hours=(17, 23), peak_rate=40, seed=3)
    assert day.duration_s == 6 * 3600 and max(day.rates) == pytest.approx(40)
    rows = list(day.rows())
    assert rows == list(day.rows())  # re-iterable, same stream
    assert rows != list(
        CurveWorkload.build(BUNDLED_CURVE, BUNDLED_TRACE, model="m-small", hours=(17, 23), peak_rate=40, seed=4).rows()
    )
    assert all(a[0] <= b[0] for a, b in itertools.pairwise(rows))
    # the count in each hour matches the integral of the interpolated rate within Poisson noise
    for h in range(6):
        expected = sum(day.rate_at(h * 3600 + s + 0.5) for s in range(3600))
        got = sum(1 for r in rows if h * 3600 <= r[0] < (h + 1) * 3600)
        assert abs(got - expected) < 5 * math.sqrt(expected), h
    # and tokens come from the trace's mix
    mix = {(r.prompt, r.output) for r in load_trace(BUNDLED_TRACE)}
    assert all((p, o) in mix for _, p, o in rows[:5000])
    with pytest.raises(ValueError, match="beyond"):
        CurveWorkload.build(BUNDLED_CURVE, BUNDLED_TRACE, model="deepseek-r1", hours=(20, 30))


def test_replay_memory_does_not_grow_with_the_day() -> None:
    """Requests stream through: two more hours of day add only their timeline points (one per 10 s),
    far less than any per-request record (a Request alone is ~200 bytes)."""

    def peak(hours: int) -> tuple[int, int]:
        day = CurveWorkload.build(
            BUNDLED_CURVE, BUNDLED_TRACE, model="m-small", hours=(2, 2 + hours), peak_rate=3, seed=0
        )
        capacity_at_slo(PROFILES["8b-h100"], day.token_mix(4000, 0), 2.0)  # cached: measured outside the trace
        tracemalloc.start()
        summary = simulate(day, RunConfig(policy="static", knob=1, profile="8b-h100")).summary
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert summary["requests"] > 7_000 * hours
        return top, summary["requests"]

    (one, n_one), (three, n_three) = peak(1), peak(3)
    assert (three - one) / (n_three - n_one) < 40, (one, three)


def test_ttft_histogram_quantiles_match_exact_ones() -> None:
    import random

    rnd = random.Random(5)
    values = [rnd.lognormvariate(-1, 1.2) for _ in range(20000)] + [math.inf] * 300
    hist = TtftHistogram()
    for v in values:
        hist.add(None if math.isinf(v) else v)
    for q in (0.5, 0.95, 0.99):
        exact = percentile(values, q)
        assert exact is not None
        assert hist.quantile(q) == pytest.approx(exact, rel=0.01)
    assert hist.quantile(0.999) == math.inf


def test_pods_beyond_the_warm_node_pool_wait_for_a_node() -> None:
    fleet = SimulatedFleet(
        PROFILES["8b-h100"], 60.0, 60.0 * 1.0001, warm_nodes=2, node_provision_s=300.0, node_idle_s=600.0
    )
    fleet.add(0.0, ready=True)
    fleet.advance(10.0, 10.0)
    fleet.scale_to(4, 10.0)  # one more fits the warm pool, two need new nodes
    starting = sorted(fleet.with_state(STARTING), key=lambda p: p.node_at)
    assert [p.node_at for p in starting] == [10.0, 310.0, 310.0]
    assert fleet.provisioning(100.0) == 2
    fleet.advance(340.0, 330.0)
    assert fleet.count(READY) == 2 and fleet.provisioning(340.0) == 0  # on a node, still in cold start
    fleet.advance(500.0, 160.0)
    assert fleet.count(READY) == 4
    gpu_s = fleet.gpu_seconds
    assert gpu_s == pytest.approx(500.0 + 3 * 490.0)  # billed from creation, provisioning included
    # a node freed by a scale-down serves the next pod at once (the cluster autoscaler keeps it 10 min)
    fleet.scale_to(3, 500.0)
    fleet.advance(600.0, 100.0)
    fleet.scale_to(4, 600.0)
    newest = max(fleet.live(), key=lambda p: p.created)
    assert newest.node_at == 600.0


def test_a_freed_node_goes_to_the_pod_waiting_longest_for_one() -> None:
    fleet = SimulatedFleet(PROFILES["8b-h100"], 60.0, 60.0 * 1.0001, warm_nodes=2, node_provision_s=300.0, grace_s=0.0)
    fleet.add(0.0, ready=True)
    fleet.add(0.0, ready=True)
    fleet.advance(5.0, 5.0)
    fleet.scale_to(3, 5.0)  # the third pod needs a new node: there at 305
    waiting = max(fleet.live(), key=lambda p: p.created)
    assert waiting.node_at == 305.0
    fleet.scale_to(2, 6.0)  # the scale-down removes the pod still without a node (ReplicaSet order)
    assert waiting not in fleet.live()
    fleet.scale_to(3, 7.0)  # its node, still on its way, is reused: no second provisioning
    again = max(fleet.live(), key=lambda p: p.created)
    assert again.node_at == 305.0
    # a ready pod leaving hands its node to the pod waiting for one, at once
    ready = fleet.with_state(READY)[0]
    ready.state = "draining"
    fleet._ready.remove(ready)
    fleet._gone(ready, 10.0)
    assert again.node_at == 10.0 and again.ready_at == pytest.approx(10.0 + again.cold_s)


def test_node_provisioning_shows_in_the_figures() -> None:
    trace = scale_rate(load_trace(BURSTY_TRACE), 4)
    fast = simulate(trace, RunConfig(policy="composite", knob=0.2, hpa_behavior="llm")).summary
    slow = simulate(
        trace, RunConfig(policy="composite", knob=0.2, hpa_behavior="llm", warm_nodes=3, node_provision_s=420.0)
    ).summary
    assert slow["slo_attainment"] < fast["slo_attainment"]
    assert slow["config"]["warm_nodes"] == 3


def test_capacity_on_long_prompts_is_the_knee_not_a_floor() -> None:
    """Prompts ten times the conversation mix: some miss a 2 s SLO even alone, and head-of-line blocking
    makes any load cost attainment. The capacity is the knee, and the fleets size from it."""
    base = load_trace(BUNDLED_TRACE)
    long = [TraceRequest(r.t, min(120_000, r.prompt * 10), r.output) for r in base if r.t < 1200]
    cap = capacity_at_slo(PROFILES["70b-h100x4"], long, 2.0)
    assert 0.1 < cap < 1.0
    workload = TraceWorkload("long", long)
    oracle = simulate(workload, RunConfig(policy="oracle")).summary
    composite = simulate(workload, RunConfig(policy="composite")).summary
    assert oracle["max_replicas"] < 64 and composite["max_replicas"] < 64
    first_minutes = sum(1 for r in long if r.t < 300) / 300
    assert composite["config"]["initial_replicas"] is None
    assert math.ceil(first_minutes / cap) < 32


def test_prompts_larger_than_the_kv_pool_are_refused_not_hung(tmp_path: Path) -> None:
    from keda_llm_scaler.sim.replica import REJECTED, Request, SimReplica

    rep = SimReplica(PROFILES["8b-h100"])
    huge, small = Request(0, 0.0, 5_000_000, 10), Request(1, 0.1, 100, 10)
    rep.submit([huge, small])
    rep.advance(5.0)
    assert huge.state == REJECTED and rep.too_long_total == 1
    assert small.first_token_at is not None  # the queue behind it moves
    # short probes: the point is that the bisection ends (a too-long prompt once blocked every probe)
    assert capacity_at_slo(PROFILES["8b-h100"], [(5_000_000, 10), (100, 10)] * 50, 2.0, duration_s=60.0) > 0


def test_timestamps_with_mixed_offsets_compare_in_utc(tmp_path: Path) -> None:
    path = tmp_path / "tz.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-12 00:00:10+00:00,10,5\n"
        "2024-05-12 02:00:05.5+02:00,20,5\n2024-05-12T00:00:20.0011Z,30,5\n"
    )
    trace = load_trace(path)
    assert [r.prompt for r in trace] == [20, 10, 30]
    assert [r.t for r in trace] == pytest.approx([0.0, 4.5, 14.5011])
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-12 00:00:10,-1,5\n")
    with pytest.raises(ValueError, match=":2: token counts"):
        load_trace(path)


def test_static_fleets_keep_the_hpa_bounds() -> None:
    trace = load_trace(BUNDLED_TRACE)[:500]
    s = simulate(trace, RunConfig(policy="static", knob=8, max_replicas=4)).summary
    assert s["max_replicas"] == 4 and s["scale_events"] == 0


def test_the_oracle_check_uses_the_oracles_own_front() -> None:
    from keda_llm_scaler.sim.replay import oracle_violations

    runs = [
        {"policy": "oracle", "knob_value": 0.8, "slo_attainment": 1.0, "gpu_hours": 3.0},
        {"policy": "oracle", "knob_value": 0.9, "slo_attainment": 1.0, "gpu_hours": 2.6},
        {"policy": "static", "knob_value": 7, "slo_attainment": 1.0, "gpu_hours": 2.8},
    ]
    assert oracle_violations(runs) == []  # 0.8 is beaten by the oracle itself
    runs.append({"policy": "static", "knob_value": 6, "slo_attainment": 1.0, "gpu_hours": 2.5})
    assert [(o["knob_value"], r["knob_value"]) for o, r in oracle_violations(runs)] == [(0.9, 6)]


def test_the_oracle_adds_replicas_in_the_calmest_seconds_before_they_are_needed() -> None:
    """A new replica is flooded by least-loaded routing: the oracle brings it in during the quietest
    10 seconds of the minute before the one that needs it, not on the minute boundary (where a burst may
    land on it), and removes replicas on the boundary once no later window within the hold wants them."""
    from keda_llm_scaler.sim.oracle import HOLD_WINDOWS, oracle_schedule

    busy = 2 + HOLD_WINDOWS  # the minute at 40 req/s; the hold brings its fleet in HOLD_WINDOWS earlier
    reqs = [TraceRequest(t + 0.5, 100, 10) for t in range(60 * busy) if not 80 <= t < 90]  # 1 req/s
    reqs += [TraceRequest(60.0 * busy + i / 40, 100, 10) for i in range(40 * 60)]
    reqs += [TraceRequest(60.0 * (busy + 1) + t + 0.5, 100, 10) for t in range(60 * (HOLD_WINDOWS + 2))]
    end = reqs[-1].t + 1
    steps = oracle_schedule(reqs, end, capacity_rps=10.0, slo_ttft_s=2.0)
    assert steps[0] == (0.0, 1) and steps == sorted(steps)
    up = [(t, n) for (t, n), (_, before) in zip(steps[1:], steps, strict=False) if n > before]
    assert up == [(80.0, 4)]  # the silent 10 s inside minute 1, before minute 2 must hold the busy fleet
    down = [(t, n) for (t, n), (_, before) in zip(steps[1:], steps, strict=False) if n < before]
    assert down and all(t % 60 == 0 for t, _ in down) and down[0][0] == 60.0 * (busy + 1)
