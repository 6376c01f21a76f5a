"""The HPA emulation against Kubernetes' formulas, table-driven."""

from __future__ import annotations

import pytest

from keda_llm_scaler.sim.hpa import AVERAGE_VALUE, BEHAVIORS, UTILIZATION, Behavior, Hpa, MetricReading, proposal


@pytest.mark.parametrize(
    ("kind", "value", "target", "current", "ready", "expected"),
    [
        (AVERAGE_VALUE, 10.0, 1.0, 5, 5, 10),  # ceil(usage / target)
        (AVERAGE_VALUE, 5.4, 1.0, 5, 5, 5),  # ratio 1.08: inside the 10 % tolerance
        (AVERAGE_VALUE, 5.6, 1.0, 5, 5, 6),  # ratio 1.12: outside
        (AVERAGE_VALUE, 4.6, 1.0, 5, 5, 5),  # ratio 0.92: inside
        (AVERAGE_VALUE, 4.4, 1.0, 5, 5, 5),  # ratio 0.88: ceil(4.4) = 5
        (AVERAGE_VALUE, 3.2, 0.8, 2, 2, 4),  # ceil(3.2 / 0.8)
        (AVERAGE_VALUE, 9.0, 5.0, 4, 1, 2),  # readiness plays no part in AverageValue
        (UTILIZATION, 0.9, 0.6, 4, 4, 6),  # ceil(4 * 1.5)
        (UTILIZATION, 0.9, 0.6, 6, 4, 6),  # only ready pods count: ceil(4 * 1.5)
        (UTILIZATION, 0.3, 0.6, 4, 4, 2),
        (UTILIZATION, 0.62, 0.6, 4, 4, 4),  # tolerance
    ],
)
def test_proposal(kind: str, value: float, target: float, current: int, ready: int, expected: int) -> None:
    assert proposal(MetricReading(kind, value, target), current, ready, 0.1) == expected


def av(value: float) -> MetricReading:
    return MetricReading(AVERAGE_VALUE, value, 1.0)


@pytest.mark.parametrize(
    ("current", "usage", "expected"),
    [(5, 30.0, 10), (1, 30.0, 5), (2, 3.0, 3), (10, 100.0, 20), (3, 5.0, 5)],
    ids=["100%-wins", "4-pods-wins", "below-limits", "doubling", "within"],
)
def test_default_scale_up_limit_is_max_of_4_pods_and_100_percent(current: int, usage: float, expected: int) -> None:
    hpa = Hpa(1, 100)
    assert hpa.decide(0.0, current, current, av(usage)) == expected


def test_scale_up_limit_counts_earlier_changes_in_the_period() -> None:
    hpa = Hpa(1, 100, Behavior(up_policies=BEHAVIORS["llm"].up_policies))  # Pods 4 per 60 s
    assert hpa.decide(0.0, 2, 2, av(20.0)) == 6
    assert hpa.decide(15.0, 6, 2, av(20.0)) == 6  # the 60 s period still holds the +4
    assert hpa.decide(61.0, 6, 6, av(20.0)) == 10


def test_scale_down_waits_for_the_stabilization_window() -> None:
    hpa = Hpa(1, 100)
    assert hpa.decide(0.0, 10, 10, av(10.0)) == 10
    for t in range(15, 300, 15):
        assert hpa.decide(float(t), 10, 10, av(2.0)) == 10  # the max over 300 s is still 10
    assert hpa.decide(301.0, 10, 10, av(2.0)) == 2  # the default down policy allows 100 % per 15 s


def test_scale_down_policy_limits_the_step() -> None:
    hpa = Hpa(1, 100, BEHAVIORS["llm"])  # 300 s window, then one pod per 120 s
    hpa.decide(0.0, 10, 10, av(10.0))
    assert hpa.decide(299.0, 10, 10, av(2.0)) == 10
    assert hpa.decide(301.0, 10, 10, av(2.0)) == 9
    assert hpa.decide(316.0, 9, 9, av(2.0)) == 9
    assert hpa.decide(422.0, 9, 9, av(2.0)) == 8


def test_bounds_and_missing_metric() -> None:
    hpa = Hpa(2, 6)
    assert hpa.decide(0.0, 4, 4, av(100.0)) == 6
    assert hpa.decide(15.0, 4, 4, None) == 4  # a failed metric never scales
    hpa2 = Hpa(2, 6, Behavior(down_stabilization_s=0))
    assert hpa2.decide(0.0, 4, 4, av(0.0)) == 2


def test_warm_start_fills_the_window() -> None:
    hpa = Hpa(1, 100)
    hpa.warm_start(0.0, 8)
    assert hpa.decide(15.0, 8, 8, av(1.0)) == 8  # not an instant drop to 1
    assert hpa.decide(400.0, 8, 8, av(1.0)) == 1  # once the window has passed


def test_a_policy_period_starts_before_every_change_in_it() -> None:
    # horizontal.go: periodStartReplicas = current - added + deleted, over both directions. One pod
    # removed 15 s ago is given back on top of the 4 the up policy allows in its 60 s period.
    b = Behavior(up_policies=(BEHAVIORS["llm"].up_policies[0],), down_stabilization_s=0.0,
                 down_policies=BEHAVIORS["llm"].down_policies)  # fmt: skip
    hpa = Hpa(1, 100, b)
    assert hpa.decide(0.0, 6, 6, av(5.0)) == 5  # one pod down
    assert hpa.decide(15.0, 5, 5, av(20.0)) == 10  # start of the period: 6, plus 4


def test_an_up_limit_counts_the_downs_of_its_period() -> None:
    # +4 then -1 in one up period: the limit counts both, from the count before either
    b = Behavior(up_policies=(BEHAVIORS["llm"].up_policies[0],), down_stabilization_s=0.0,
                 down_policies=(BEHAVIORS["llm"].down_policies[0],))  # fmt: skip
    hpa = Hpa(1, 100, b)
    assert hpa.decide(0.0, 2, 2, av(6.0)) == 6
    assert hpa.decide(5.0, 6, 6, av(5.0)) == 5  # one down
    assert hpa.decide(10.0, 5, 5, av(30.0)) == 6  # up: period start 5 - 4 + 1 = 2, limit 2 + 4


def test_the_first_sync_records_the_current_count() -> None:
    # recordInitialRecommendation: an HPA created at 10 replicas with a low metric keeps 10 for the whole
    # down-stabilization window, as if it had recommended 10 at its first sync
    hpa = Hpa(1, 100)
    assert hpa.decide(0.0, 10, 10, av(2.0)) == 10
    assert hpa.decide(299.0, 10, 10, av(2.0)) == 10
    assert hpa.decide(301.0, 10, 10, av(2.0)) == 2
