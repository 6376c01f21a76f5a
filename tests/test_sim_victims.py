"""Scale-down victims in the simulator: the ReplicaSet's order (``ActivePodsWithRanks.Less`` with
LogarithmicScaleDown), the victim ranker's pod-deletion-cost annotations, per-scale-down accounting, and
``replay --victims``."""

from __future__ import annotations

import argparse
import json
import math
import random

import pytest

from keda_llm_scaler.cli import main
from keda_llm_scaler.sim.fleet import DRAINING, READY, STARTING, Pod, SimulatedFleet, log2_bucket, lognormal_params
from keda_llm_scaler.sim.profiles import PROFILES
from keda_llm_scaler.sim.ranker import DEFAULT_BURST, DEFAULT_INTERVAL_S, Ranker
from keda_llm_scaler.sim.replay import add_replay_arguments, describe_setup, load_workload
from keda_llm_scaler.sim.replica import Request
from keda_llm_scaler.sim.run import RunConfig, simulate
from keda_llm_scaler.sim.trace import BUNDLED_TRACE, TraceRequest, load_trace
from keda_llm_scaler.victims import ANNOTATION, IDLE_COST

PROFILE = PROFILES["70b-h100x4"]
SUMMARY_KEYS = {
    "victims",
    "scale_down_events",
    "victims_removed",
    "victims_idle",
    "streams_cut",
    "tokens_lost",
    "streams_cut_per_scale_down",
    "streams_cut_max_per_scale_down",
    "tokens_lost_per_scale_down",
    "deletion_cost_writes",
}


def fleet_of(
    n: int, *, victims: str = "random", seed: int = 0, grace_s: float = 30.0, at: float = 0.0
) -> SimulatedFleet:
    fleet = SimulatedFleet(PROFILE, 0.0, 0.0, seed=seed, victims=victims, grace_s=grace_s)
    for _ in range(n):
        fleet.add(at, ready=True)
    return fleet


def busy(pod: Pod, n: int, now: float, output: int = 4000) -> None:
    """``n`` long requests on ``pod``, admitted and decoding by ``now + 5``."""
    pod.replica.submit([Request(1000 * int(pod.name.split("-")[1]) + k, now, 200, output) for k in range(n)])


def names(pods: list[Pod]) -> list[str]:
    return [p.name for p in pods]


# -- the ReplicaSet's order ---------------------------------------------------------------------------
def test_pods_without_a_node_then_not_ready_pods_go_before_ready_ones() -> None:
    fleet = SimulatedFleet(PROFILE, 60.0, 60.0 * 1.0001, warm_nodes=2, node_provision_s=300.0)
    old = fleet.add(0.0, ready=True)  # a warm node
    fleet.advance(10.0, 10.0)
    fleet.scale_to(3, 10.0)
    on_node, provisioning = sorted(fleet.with_state(STARTING), key=lambda p: p.node_at)
    assert provisioning.provisioning(10.0) and not on_node.provisioning(10.0)
    assert names(fleet.victim_order(10.0)) == [provisioning.name, on_node.name, old.name]
    event = fleet.scale_to(1, 10.0)
    assert event is not None and event.not_ready == 2 and event.removed == 0
    assert fleet.live() == [old] and old.state == READY


def test_a_lower_deletion_cost_goes_first_and_random_mode_reads_none() -> None:
    for victims in ("ranked", "random"):
        fleet = fleet_of(4, victims=victims)
        p1, p2, p3, p4 = fleet.pods
        p1.annotations[ANNOTATION] = "5"
        p3.annotations[ANNOTATION] = "-3"
        p4.annotations[ANNOTATION] = "not a number"  # reads as 0, as absent
        order = names(fleet.victim_order(100.0))
        if victims == "ranked":
            assert order[0] == p3.name and order[-1] == p1.name and set(order[1:3]) == {p2.name, p4.name}
        else:  # nobody's cost counts: the same order as a fleet without annotations
            assert order == names(fleet_of(4, victims="random").victim_order(100.0))


def test_log2_bucket_is_nanoseconds_since_a_whole_second_timestamp() -> None:
    edge = 2**40 / 1e9  # 1099.511627776 s
    assert log2_bucket(0.0, edge) == 40
    assert log2_bucket(0.0, edge - 1e-9) == 39  # one nanosecond short of the edge
    assert log2_bucket(0.9, edge) == 40  # the timestamp is truncated to its second (metav1.Time)
    assert log2_bucket(5.0, 5.0) == -1 and log2_bucket(7.0, 6.0) == -1


def test_the_younger_log2_bucket_goes_first_and_within_a_bucket_the_uid_decides() -> None:
    fleet = SimulatedFleet(PROFILE, 0.0, 0.0)
    a = fleet.add(0.0, ready=True)  # 2000 s ready at t=2000: bucket 40
    b = fleet.add(1000.0, ready=True)  # 1000 s: bucket 39
    c = fleet.add(1400.0, ready=True)  # 600 s: bucket 39 too ([550, 1100) s)
    d = fleet.add(1800.0, ready=True)  # 200 s: bucket 37
    now = 2000.0
    assert [log2_bucket(p.ready_at, now) for p in (a, b, c, d)] == [40, 39, 39, 37]
    order = fleet.victim_order(now)
    assert order[0] is d and order[-1] is a
    assert order[1:3] == sorted([b, c], key=lambda p: p.uid)  # not younger-first inside a bucket


def test_random_tie_break_is_deterministic_per_seed_and_varies_with_it() -> None:
    def first_victims(seed: int) -> list[str]:
        fleet = fleet_of(6, seed=seed)
        return names(fleet.victim_order(500.0))

    assert first_victims(3) == first_victims(3)
    orders = {tuple(first_victims(seed)) for seed in range(8)}
    assert len(orders) > 3
    assert len({order[0] for order in orders}) > 2  # the first victim itself moves, not just the tail


def test_pod_uids_leave_the_cold_start_stream_alone() -> None:
    fleet = SimulatedFleet(PROFILE, 240.0, 330.0, seed=4)
    for k in range(6):
        fleet.add(float(k))
    mu, sigma = lognormal_params(240.0, 330.0)
    rng = random.Random(4)
    assert [p.cold_s for p in fleet.pods] == [rng.lognormvariate(mu, sigma) for _ in range(6)]
    assert len({p.uid for p in fleet.pods}) == 6


def test_victims_is_validated() -> None:
    with pytest.raises(ValueError, match="victims must be one of random, ranked"):
        SimulatedFleet(PROFILE, 0.0, 0.0, victims="oldest")


# -- the ranker -----------------------------------------------------------------------------------
def scenario(victims: str, seed: int) -> tuple[SimulatedFleet, Ranker, Pod]:
    """Three ready pods of the same age: two hold 20 streams each, one is idle."""
    fleet = fleet_of(3, victims=victims, seed=seed)
    idle = fleet.pods[seed % 3]
    for pod in fleet.pods:
        if pod is not idle:
            busy(pod, 20, 0.0)
    ranker = Ranker()
    for t in range(1, 31):
        fleet.advance(float(t), 1.0)
        if victims == "ranked":
            ranker.observe(float(t), fleet, lambda ready, spec: 1.0)  # a scale-down is plausible
    return fleet, ranker, idle


def test_ranked_victims_remove_the_idle_pod_where_random_ones_often_do_not() -> None:
    random_busy = 0
    for seed in range(8):
        for victims in ("ranked", "random"):
            fleet, _, idle = scenario(victims, seed)
            event = fleet.scale_to(2, 30.0)
            assert event is not None and event.removed == 1
            victim = next(p for p in fleet.pods if p.state == DRAINING)
            if victims == "ranked":
                assert victim is idle and event.idle == 1
                assert idle.annotations.get(ANNOTATION) == str(IDLE_COST)  # idle: first, whatever the others
                assert all(p.deletion_cost > IDLE_COST for p in fleet.pods if p is not idle)
            else:
                random_busy += victim is not idle
                assert event.idle == (victim is idle) and not any(p.annotations for p in fleet.pods)
    assert 2 <= random_busy <= 7  # random: a busy pod in most seeds (2 in 3 on average), not always


def test_the_ranker_writes_only_while_a_scale_down_is_plausible() -> None:
    # 2.3 asks for 3 (the HPA's ceil), 3 and 4.5 for at least the 3 ready pods; None: no reading
    demands: tuple[float | None, ...] = (2.3, 3.0, 4.5, None)
    for demand in demands:
        fleet = fleet_of(3, victims="ranked")
        for pod in fleet.pods:
            busy(pod, 10, 0.0)
        ranker = Ranker()

        def reading(ready: int, spec: int, d: float | None = demand) -> float | None:
            return d

        for t in range(1, 60):
            fleet.advance(float(t), 1.0)
            ranker.observe(float(t), fleet, reading)
        assert ranker.writes == 0 and ranker.passes == 0 and ranker.considered == 6
        assert not any(p.annotations for p in fleet.pods)


def test_passes_are_at_most_one_per_interval_and_at_most_a_burst_of_writes() -> None:
    assert (DEFAULT_INTERVAL_S, DEFAULT_BURST) == (10.0, 16)
    fleet = fleet_of(20, victims="ranked")  # 20 idle pods: each one to mark
    ranker = Ranker()
    writes: dict[int, int] = {}
    for t in range(1, 33):
        fleet.advance(float(t), 1.0)
        if n := ranker.observe(float(t), fleet, lambda ready, spec: 10.0):
            writes[t] = n
    # scrapes at 1, 6, 11, ...; a pass on the first and then every other one (10 s); 16 then the other 4
    assert writes == {1: 16, 11: 4}
    assert ranker.considered == 4 and ranker.passes == 4 and ranker.writes == 20
    assert all(p.annotations[ANNOTATION] == str(IDLE_COST) for p in fleet.pods)


def test_a_draining_pod_keeps_its_annotation_and_is_no_candidate() -> None:
    fleet = fleet_of(3, victims="ranked")
    light, medium, heavy = fleet.pods
    for pod, n in ((light, 2), (medium, 10), (heavy, 30)):
        busy(pod, n, 0.0)
    ranker = Ranker()
    fleet.advance(1.0, 1.0)
    ranker.observe(1.0, fleet, lambda ready, spec: 1.0)
    costs = {p.name: p.deletion_cost for p in fleet.pods}  # relative to the median pod (medium): it reads 0
    assert costs[light.name] < costs[medium.name] < costs[heavy.name]
    fleet.scale_to(2, 1.0)
    assert light.state == DRAINING and names(fleet.victim_order(1.0)) == [medium.name, heavy.name]
    written = light.annotations.get(ANNOTATION)
    for pod in (medium, heavy):
        pod.replica.cut_all(1.0)  # their load changes: the next pass rewrites them, not the draining pod
    for t in range(2, 25):
        fleet.advance(float(t), 1.0)
        ranker.observe(float(t), fleet, lambda ready, spec: 1.0)
    assert light.state == DRAINING and light.annotations.get(ANNOTATION) == written
    assert medium.annotations[ANNOTATION] == heavy.annotations[ANNOTATION] == str(IDLE_COST)
    assert light not in fleet.victim_order(24.0)


# -- accounting ------------------------------------------------------------------------------------
def test_each_cut_stream_counts_on_the_scale_down_that_chose_its_pod() -> None:
    fleet = fleet_of(4, grace_s=0.0)
    for pod in fleet.pods:
        busy(pod, 3, 0.0, output=8000)
    for t in range(1, 21):
        fleet.advance(float(t), 1.0)
    first = fleet.scale_to(3, 20.0)
    for t in range(21, 41):
        fleet.advance(float(t), 1.0)
    second = fleet.scale_to(1, 40.0)
    assert first is not None and second is not None and fleet.scale_downs == [first, second]
    assert (first.removed, second.removed) == (1, 2)
    assert (first.streams_cut, second.streams_cut) == (3, 6)  # no grace: cut at once
    assert fleet.streams_cut == 9 and fleet.tokens_lost == first.tokens_lost + second.tokens_lost
    # what was decoded counts, not the one token the prefill sampled
    assert first.tokens_lost > 3 * 100 and second.tokens_lost > first.tokens_lost


def test_a_drain_that_runs_out_cuts_on_its_own_event() -> None:
    fleet = fleet_of(2, grace_s=10.0)
    busy(fleet.pods[0], 2, 0.0, output=4000)
    busy(fleet.pods[1], 2, 0.0, output=4000)
    for t in range(1, 6):
        fleet.advance(float(t), 1.0)
    event = fleet.scale_to(1, 5.0)
    assert event is not None and event.streams_cut == 0  # draining: still serving
    for t in range(6, 16):
        fleet.advance(float(t), 1.0)
    assert event.streams_cut == 2 == fleet.streams_cut and event.tokens_lost == fleet.tokens_lost > 2


@pytest.fixture(scope="module")
def step_down() -> list[TraceRequest]:
    """40 req/s for 5 minutes, then 4 req/s: the HPA scales a fleet of 4 down within 15 minutes."""
    base = load_trace(BUNDLED_TRACE)
    rng = random.Random(3)
    reqs: list[TraceRequest] = []
    t = 0.0
    while t < 900.0:
        t += rng.expovariate(40.0 if t < 300.0 else 4.0)
        b = base[len(reqs) % len(base)]
        reqs.append(TraceRequest(t, b.prompt, b.output))
    return reqs


@pytest.mark.parametrize("victims", ["random", "ranked"])
def test_the_summary_per_scale_down_sums_to_the_totals(step_down: list[TraceRequest], victims: str) -> None:
    s = simulate(step_down, RunConfig(victims=victims, grace_s=0.0)).summary
    assert set(s) >= SUMMARY_KEYS and s["victims"] == victims and s["config"]["victims"] == victims
    assert s["scale_down_events"] == s["scale_downs"] >= 1
    assert s["victims_removed"] >= 1 and 0 <= s["victims_idle"] <= s["victims_removed"]
    n = s["scale_down_events"]
    assert s["streams_cut_per_scale_down"] * n == pytest.approx(s["streams_cut"])
    assert s["tokens_lost_per_scale_down"] * n == pytest.approx(s["tokens_lost"])
    assert s["streams_cut_max_per_scale_down"] * n >= s["streams_cut"] >= s["streams_cut_max_per_scale_down"]
    assert s["streams_cut"] > 0  # no grace: a busy fleet loses streams
    assert (s["deletion_cost_writes"] > 0) == (victims == "ranked")


# -- replay --victims --------------------------------------------------------------------------------
TINY = ["replay", "--trace", "conv", "--hours", "0:0.03", "--rate-scale", "4", "--quiet"]


def test_replay_victims_ranked_prints_and_returns_the_new_fields(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*TINY, "--victims", "ranked", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert set(s) >= SUMMARY_KEYS and s["victims"] == "ranked" and s["config"]["victims"] == "ranked"
    assert all(v is None or math.isfinite(v) for v in s.values() if isinstance(v, float))
    assert main([*TINY, "--victims", "ranked"]) == 0
    line = capsys.readouterr().out
    assert "ranked victims:" in line and "streams cut per scale-down" in line and "deletion-cost writes" in line


def test_replay_refuses_an_unknown_victims_mode(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*TINY, "--victims", "oldest"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--victims" in err and "invalid choice: 'oldest'" in err and "'ranked'" in err


def test_the_setup_line_names_the_victims_mode() -> None:
    p = argparse.ArgumentParser()
    add_replay_arguments(p)
    for mode in ("random", "ranked"):
        args = p.parse_args(["--trace", "conv", "--hours", "0:0.03", "--victims", mode])
        assert f"{mode} victims" in describe_setup(args, load_workload(args))
    assert p.parse_args(["--trace", "conv"]).victims == "random"
