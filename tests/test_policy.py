"""The composite's contract, property by property (issue #2, (a)-(h))."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from keda_llm_scaler.demand import DemandEstimate
from keda_llm_scaler.errors import NoFreshData
from keda_llm_scaler.policy import IN_FLIGHT_FLOOR, MAX_COMPOSITE, ReplicaInput, ScoringParams, composite

P = ScoringParams(target_kv_usage=0.85, target_queue_depth=5.0)


def fleet(n: int, **kw: float | bool | None) -> list[ReplicaInput]:
    return [ReplicaInput(**kw) for _ in range(n)]  # type: ignore[arg-type]


@pytest.mark.parametrize("n", [1, 2, 3, 8, 64])
@pytest.mark.parametrize("kv_target", [0.5, 0.8, 0.85, 0.9, 1.0])
def test_a_every_replica_at_target_equals_replica_count(n: int, kv_target: float) -> None:
    p = ScoringParams(target_kv_usage=kv_target)
    c = composite(fleet(n, waiting=0, running=30, kv_usage=kv_target, reject_rate=0, admitted_rate=5), p)
    assert c.value == pytest.approx(n, rel=0.01)


replica = st.builds(
    ReplicaInput,
    waiting=st.floats(0, 500),
    running=st.floats(0, 512),
    kv_usage=st.floats(0, 1),
    reject_rate=st.one_of(st.none(), st.floats(0, 100)),
    admitted_rate=st.one_of(st.none(), st.floats(0, 100)),
    expired=st.booleans(),
    asleep=st.booleans(),
)


@given(st.lists(replica, min_size=1, max_size=8), st.data())
def test_b_monotone_in_waiting_kv_and_rejects(replicas: list[ReplicaInput], data: st.DataObject) -> None:
    if all(r.expired for r in replicas):
        replicas[0] = ReplicaInput(**{**_fields(replicas[0]), "expired": False})
    base = composite(replicas, P).value
    i = data.draw(st.integers(0, len(replicas) - 1))
    field = data.draw(st.sampled_from(["waiting", "kv_usage", "reject_rate"]))
    old = getattr(replicas[i], field) or 0.0
    new = data.draw(st.floats(old, old + 100 if field != "kv_usage" else 1.0))
    bumped = list(replicas)
    bumped[i] = ReplicaInput(**{**_fields(replicas[i]), field: new})
    assert composite(bumped, P).value >= base


def _fields(r: ReplicaInput) -> dict[str, object]:
    return {f: getattr(r, f) for f in ReplicaInput.__dataclass_fields__}


@pytest.mark.parametrize("kv", [0.85, 0.9, 1.0])
def test_c_queue_draining_with_kv_at_target_keeps_replica_count(kv: float) -> None:
    n = 4
    values = [composite(fleet(n, waiting=w, running=40, kv_usage=kv), P).value for w in (40, 20, 5, 1, 0)]
    assert values == sorted(values, reverse=True)
    assert min(values) >= n


def test_d_many_running_with_low_kv_is_below_replica_count() -> None:
    c = composite(fleet(5, waiting=0, running=200, kv_usage=0.3, reject_rate=0.0, admitted_rate=20), P)
    assert 0 < c.value < 5
    assert math.ceil(c.value) < 5  # the HPA can scale down


@pytest.mark.parametrize("admitted", [None, 0.0, 2.0, 50.0])
def test_e_rejects_alone_push_above_replica_count(admitted: float | None) -> None:
    c = composite(fleet(3, waiting=0, running=4, kv_usage=0.1, reject_rate=1.5, admitted_rate=admitted), P)
    assert c.value > 3
    assert c.dominant == "reject"


def test_e_one_rejecting_replica_in_an_idle_fleet_still_adds_capacity() -> None:
    replicas = [ReplicaInput(waiting=0, running=1, kv_usage=0.05, reject_rate=0, admitted_rate=1)] * 3
    replicas.append(ReplicaInput(waiting=0, running=1, kv_usage=0.05, reject_rate=2, admitted_rate=4))
    assert composite(replicas, P).value > 4


def test_e_a_stray_error_is_not_a_reject_storm() -> None:
    busy = ReplicaInput(waiting=0, running=50, kv_usage=0.5, reject_rate=0.01, admitted_rate=20)
    assert composite([busy] * 2, P).value == composite([ReplicaInput(0, 50, 0.5, 0, 20)] * 2, P).value


def test_f_expired_replica_counts_at_least_at_target() -> None:
    fresh = ReplicaInput(waiting=0, running=10, kv_usage=0.17)
    never_seen = ReplicaInput(expired=True)
    last_good_idle = ReplicaInput(waiting=0, running=0, kv_usage=0.0, expired=True)
    last_good_busy = ReplicaInput(waiting=10, running=20, kv_usage=0.85, expired=True)
    assert composite([fresh, never_seen], P).value == pytest.approx(0.2 + 1.0)
    assert composite([fresh, last_good_idle], P).value == pytest.approx(0.2 + 1.0)
    assert composite([fresh, last_good_busy], P).value == pytest.approx(0.2 + 1.5)
    assert composite([fresh, never_seen], P).dominant == "assumed"


def test_f_no_fresh_replica_is_unavailable_and_empty_fleet_is_zero() -> None:
    with pytest.raises(NoFreshData):
        composite([ReplicaInput(expired=True)] * 3, P)
    c = composite([], P)
    assert c.value == 0 and not c.active(0.0)


@given(st.lists(replica, min_size=1, max_size=16))
def test_g_deterministic(replicas: list[ReplicaInput]) -> None:
    try:
        first = composite(replicas, P)
    except NoFreshData:
        return
    assert composite(list(replicas), P) == first
    assert first.value == round(first.value, 3) and first.value >= 0 and math.isfinite(first.value)


@pytest.mark.parametrize(("waiting", "running"), [(0, 1), (1, 0), (3, 7)])
def test_h_work_in_flight_is_never_inactive(waiting: float, running: float) -> None:
    c = composite([ReplicaInput(waiting=waiting, running=running, kv_usage=0.0)], P)
    assert c.value >= IN_FLIGHT_FLOOR
    assert c.active(0.0)


def test_idle_fleet_is_inactive() -> None:
    assert not composite(fleet(3, waiting=0, running=0, kv_usage=0.0), P).active(0.0)


def test_queue_counts_in_running_batches_up_to_one_replica() -> None:
    small = composite([ReplicaInput(waiting=4, running=2, kv_usage=0.0)], P)
    large = composite([ReplicaInput(waiting=10, running=200, kv_usage=0.0)], P)
    assert small.queue == pytest.approx(0.8)  # 4 / max(5, 2)
    assert large.queue == pytest.approx(0.05)  # 10 / 200
    # a backlog asks for one replica beside its own however old it is: 40 batches are not 40 replicas
    for waiting in (10, 200, 1e6):
        assert composite([ReplicaInput(waiting=waiting, running=5, kv_usage=0.0)], P).queue == 1.0


def test_hpa_asks_for_ceil_of_composite() -> None:
    # AverageValue with target 1: desired = ceil(sum / 1), whatever the current replica count.
    replicas = [ReplicaInput(waiting=4, running=5, kv_usage=0.85)] * 3
    c = composite(replicas, P)
    assert c.value == pytest.approx(3 * (1 + 4 / 5))
    assert math.ceil(c.value / 1.0) == 6


def test_starting_replicas_count_as_capacity_on_the_way() -> None:
    saturated = [ReplicaInput(waiting=400, running=100, kv_usage=1.0)] * 4  # each reads 1.18 + 1
    alone = composite(saturated, P).value
    with_two_starting = composite(saturated, P, incoming=2).value
    assert alone > 8
    assert with_two_starting == pytest.approx(alone - 2)  # the two on their way take two of the excess
    assert composite(saturated, P, incoming=3).value == pytest.approx(4 + max(alone - 4 - 3, 3))
    assert composite(saturated, P, incoming=50).value == alone  # more starting than needed: no discount
    # nothing changes while the fleet is within its ready replicas, and nothing ready holds the starting ones
    calm = [ReplicaInput(waiting=0, running=10, kv_usage=0.5)] * 3
    assert composite(calm, P, incoming=2).value == composite(calm, P).value
    assert composite([], P, incoming=3).value == 3 and composite([], P, incoming=3).active(0.0)


@given(st.lists(replica, min_size=1, max_size=6), st.integers(0, 8), st.data())
def test_incoming_keeps_monotonicity(replicas: list[ReplicaInput], incoming: int, data: st.DataObject) -> None:
    if all(r.expired for r in replicas):
        return
    base = composite(replicas, P, incoming).value
    i = data.draw(st.integers(0, len(replicas) - 1))
    bumped = list(replicas)
    bumped[i] = ReplicaInput(**{**_fields(replicas[i]), "waiting": (replicas[i].waiting or 0) + 50})
    assert composite(bumped, P, incoming).value >= base


def _estimate(need: float, capacity: float | None) -> DemandEstimate:
    return DemandEstimate(
        offered_rps=need,
        spread_rps=0.0,
        growth_rps=0.0,
        need_rps=need,
        capacity_rps=capacity,
        capacity_source="configured" if capacity else "unknown",
        capacity_samples=0,
        startup_s=180.0,
        startup_source="default",
    )


def test_an_absurd_demand_is_clamped_to_the_documented_maximum() -> None:
    # an arrival counter that jumped by 1e300 would overflow KEDA's int64 metricValue
    c = composite([ReplicaInput(waiting=3, running=4, kv_usage=0.5)], P, demand=_estimate(1e300, 1.0))
    assert c.value == MAX_COMPOSITE and c.dominant == "rate"


@given(
    st.lists(replica, min_size=1, max_size=8),
    st.floats(0, 1e4),
    st.floats(0, 1e4),
    st.one_of(st.none(), st.floats(0.1, 100)),
    st.floats(0.1, 1.0),
)
# found by a randomized CI run: the planned demand past the composite's documented maximum
@example([ReplicaInput(waiting=0.0, running=0.0, kv_usage=1.0)], 6251.0, 0.0, 0.125, 0.5)
def test_the_rate_term_only_raises_the_composite_and_is_monotone_in_offered_load(
    replicas: list[ReplicaInput], need: float, more: float, capacity: float | None, util: float
) -> None:
    """Successor of (b) and (f): the demand can never read a fleet lower than its pressure side (missing
    or low arrival counts never become low load), and more offered load never asks for fewer replicas.
    Once a capacity is known the queue counts as work (what a replica drains in a start-up, at most one
    replica each) instead of running batches; KV and rejects read exactly as without a demand."""
    if all(r.expired for r in replicas):
        replicas[0] = ReplicaInput(**{**_fields(replicas[0]), "expired": False})
    p = ScoringParams(target_utilization=util)
    without = composite(replicas, p)
    low = composite(replicas, p, demand=_estimate(need, capacity))
    high = composite(replicas, p, demand=_estimate(need + more, capacity))
    assert low.value >= round(min(low.pressure, MAX_COMPOSITE), 3) and high.value >= low.value
    assert low.load == pytest.approx(without.load) and low.reject == pytest.approx(without.reject)
    if capacity is None:
        assert low.value == without.value
    elif low.pressure > 0:
        # (clamped at the documented maximum: 6,251 req/s at 0.125 req/s per replica is 100,016 of them)
        backlog = sum(min(1.0, (r.waiting or 0.0) / (capacity * 180.0)) for r in replicas)
        assert low.queue == pytest.approx(backlog)
        assert low.value == round(min(max(low.pressure, need / (capacity * util) + backlog), MAX_COMPOSITE), 3)
    if without.pressure == 0:
        assert low.value == without.value  # an idle fleet stays idle: the last minutes' mean is not load now


def test_a_fleet_between_requests_reads_its_load_until_no_arrival_came_for_the_served_window() -> None:
    """At light load most scrapes fall between requests: nothing in flight is not idle while arrivals keep
    coming (a composite flickering to 0 lets KEDA scale a serving pool to zero); once none came for the
    served window (demandWindow / 10) the fleet reads idle as before."""
    empty = fleet(2, waiting=0, running=0, kv_usage=0.0)
    p = ScoringParams(target_utilization=0.5, demand_window_s=300.0)
    light = _estimate(0.6, 1.0)  # 0.6 req/s on replicas of 1 req/s at 50 %: 1.2 replicas

    def at(since_arrival_s: float | None) -> float:
        return composite(empty, p, demand=dataclasses.replace(light, since_arrival_s=since_arrival_s)).value

    assert at(0.0) == pytest.approx(1.2) and at(29.0) == pytest.approx(1.2)
    assert at(30.0) == 0.0 and at(600.0) == 0.0 and at(None) == 0.0
    assert not composite(empty, p, demand=dataclasses.replace(light, since_arrival_s=45.0)).active(0.0)
    # the served window follows demandWindow (the demo's 12x clock)
    short = ScoringParams(target_utilization=0.5, demand_window_s=60.0)
    assert composite(empty, short, demand=dataclasses.replace(light, since_arrival_s=5.0)).value == pytest.approx(1.2)
    assert composite(empty, short, demand=dataclasses.replace(light, since_arrival_s=6.0)).value == 0.0


def test_a_successor_planned_demand_at_n_capacities_reads_n() -> None:
    """(a) for the rate term: planned demand of exactly N replicas at target utilization reads N."""
    for n in (1, 3, 8, 64):
        quiet = [ReplicaInput(waiting=0, running=10, kv_usage=0.05) for _ in range(n)]
        c = composite(quiet, ScoringParams(target_utilization=0.9), demand=_estimate(n * 12.0 * 0.9, 12.0))
        assert c.value == pytest.approx(n) and c.dominant == "rate"


def test_replicas_asleep_are_woken_before_new_ones_are_asked_for() -> None:
    """Two awake replicas rejecting and two asleep (vLLM sleep mode, 0 waiting and 0 running): read as idle
    replicas, the asleep ones made the fleet look four strong and the reject floor asked for a fifth. Left
    out of the scores, the need is the awake two's plus their rejects, within the four: no new replica,
    one to wake."""
    busy = ReplicaInput(waiting=8, running=30, kv_usage=0.95, reject_rate=1.0, admitted_rate=10.0)
    asleep = ReplicaInput(waiting=0, running=0, kv_usage=0.0, reject_rate=0.0, admitted_rate=0.0, asleep=True)
    c = composite([busy, busy, asleep, asleep], P)
    assert (c.replicas, c.asleep) == (2, 2)
    assert 2 < c.value <= 4 and c.wake == math.ceil(c.value - 2)
    read_as_idle = dataclasses.replace(asleep, asleep=False)
    assert composite([busy, busy, read_as_idle, read_as_idle], P).value > 4  # before: a fifth replica
    # beyond the asleep ones, new replicas: the need counts every member the HPA counts
    heavy = dataclasses.replace(busy, reject_rate=20.0)
    c = composite([heavy, heavy, asleep], P)
    assert c.value > 3 and c.wake == 1


def test_a_fleet_all_asleep_without_demand_is_idle_and_asks_to_wake_none() -> None:
    asleep = ReplicaInput(waiting=0, running=0, kv_usage=0.0, reject_rate=0.0, admitted_rate=0.0, asleep=True)
    c = composite([asleep, asleep], P)
    assert (c.value, c.dominant, c.asleep, c.wake) == (0.0, "idle", 2, 0)
    # an expired replica's last reading said asleep: it counts at target for lack of data, as any expired one
    c = composite([dataclasses.replace(asleep, expired=True), ReplicaInput(waiting=0, running=4, kv_usage=0.4)], P)
    assert c.asleep == 0 and c.replicas == 2


def test_an_asleep_replica_is_never_where_the_need_goes_missing() -> None:
    """What an independent review found in the first cut: every member asleep read idle whatever the
    arrivals, an asleep replica beside expired ones made the fleet UNAVAILABLE, an asleep replica showing
    work was ignored, and starting replicas beside asleep ones let the composite fall below the members."""
    asleep = ReplicaInput(waiting=0, running=0, kv_usage=0.0, reject_rate=0.0, admitted_rate=0.0, asleep=True)
    # arrivals counted a second ago, 30 req/s against 12 per replica: the asleep members are asked to wake
    demand = dataclasses.replace(_estimate(30.0, 12.0), since_arrival_s=1.0)
    c = composite([asleep, asleep, asleep], P, demand=demand)
    assert c.value == pytest.approx(30.0 / (12.0 * 0.9), rel=1e-3) and c.wake == 3 and c.dominant == "rate"
    # one asleep replica that answers, beside one that stopped answering: data, not UNAVAILABLE
    assert composite([asleep, ReplicaInput(expired=True)], P).value >= 1.0
    # asleep but with work waiting (a wake under way): read as it shows
    busy_asleep = dataclasses.replace(asleep, waiting=20.0, reject_rate=5.0)
    assert composite([busy_asleep], P).value == composite([dataclasses.replace(busy_asleep, asleep=False)], P).value
    # saturated awake pair, two asleep, two starting: the HPA never asks for fewer than the six members
    sat = ReplicaInput(waiting=50, running=30, kv_usage=1.0, reject_rate=5.0, admitted_rate=10.0)
    assert math.ceil(composite([sat, sat, asleep, asleep], P, incoming=2).value) >= 6  # the HPA asks ceil


def test_a_busy_fleet_whose_rate_is_not_known_yet_holds_its_serving_replicas() -> None:
    # five replicas each running a few requests on light KV: the pressure side alone reads almost nothing
    busy = fleet(5, waiting=0, running=3, kv_usage=0.02, reject_rate=0.0, admitted_rate=2.0)
    cold = composite(busy, P, rate_pending=True)
    assert cold.value == 5.0 and cold.dominant == "hold"
    assert cold.active(0.0)
    # once the window could have a rate, a missing one is not a reason to hold (the pressure side reads)
    warm = composite(busy, P, rate_pending=False)
    assert warm.value < 1.0 and warm.dominant != "hold"
    # a rate from a restored window (no rate of its own yet) may ask for more, never for fewer
    restored = _estimate(need=4.0, capacity=2.0)
    assert composite(busy, P, demand=restored).value < 5.0
    assert composite(busy, P, demand=restored, rate_pending=True).value == 5.0
    more = _estimate(need=30.0, capacity=2.0)
    assert composite(busy, P, demand=more, rate_pending=True).value == composite(busy, P, demand=more).value > 5.0


def test_holding_keeps_every_awake_replica_of_a_fleet_serving_work_and_never_lowers_the_answer() -> None:
    # at light load some replicas are idle at any one scrape: the hold is the fleet, not that count
    mixed = [
        ReplicaInput(waiting=0, running=2, kv_usage=0.02, reject_rate=0.0, admitted_rate=1.0),
        ReplicaInput(waiting=0, running=0, kv_usage=0.0, reject_rate=0.0, admitted_rate=1.0),
        ReplicaInput(waiting=0, running=0, kv_usage=0.0, reject_rate=0.0, admitted_rate=0.0),
    ]
    held = composite(mixed, P, rate_pending=True)
    assert (held.value, held.hold, held.dominant) == (3.0, 3.0, "hold")
    assert composite(mixed, P).hold is None
    idle = fleet(3, waiting=0, running=0, kv_usage=0.0, reject_rate=0.0, admitted_rate=0.0)
    assert composite(idle, P, rate_pending=True).value == 0.0  # an idle fleet may still go to zero
    # pressure above the fleet's size: the pressure side stands
    queued = fleet(2, waiting=40, running=4, kv_usage=0.95, reject_rate=0.0, admitted_rate=2.0)
    assert composite(queued, P, rate_pending=True).value == composite(queued, P).value > 2.0


def test_a_hold_is_no_evidence_of_load_for_the_slo_guardrail() -> None:
    # four busy replicas on light KV, TTFT twice the SLO: the guardrail needs the signals to corroborate
    # a breach (long prompts, a slow node), and a held fleet's size is not a signal
    p = dataclasses.replace(P, ttft_slo_s=1.0)
    busy = fleet(4, waiting=0, running=3, kv_usage=0.02, reject_rate=0.0, admitted_rate=2.0)
    warm = composite(busy, p, ttft_quantile_s=2.0)
    cold = composite(busy, p, ttft_quantile_s=2.0, rate_pending=True)
    assert cold.value == max(4.0, warm.value)
    assert cold.slo_floor == warm.slo_floor
