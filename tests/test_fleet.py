"""A fleet's state across scrapes (pure: the clock is passed in)."""

from __future__ import annotations

import math

import pytest

from keda_llm_scaler.fleet import EXPIRED, FRESH, FleetState, Observation
from keda_llm_scaler.policy import ScoringParams
from keda_llm_scaler.signals import EngineSignals, ReplicaSignals


def signals(rejects: float, admitted: float) -> ReplicaSignals:
    return ReplicaSignals.from_engines(
        "vllm", [EngineSignals("0", 0.0, 10.0, 0.3)], rejects_total=rejects, admitted_total=admitted
    )


def test_an_expired_replica_keeps_its_reject_share() -> None:
    # a replica that was rejecting, then stopped answering: it never counts for less than it did (property
    # f). Before issue #20 its rates were dropped at expiry and the fleet's reject floor fell by its share.
    fleet = FleetState(ScoringParams(), stale_after=15.0, scrape_interval=5.0)
    calm = Observation("calm", signals(0.0, 0.0))
    for t, rejects in ((0.0, 0.0), (5.0, 50.0), (10.0, 100.0)):
        fleet.update(t, [Observation("r", signals(rejects, 10 * t)), calm])
    live = fleet.evaluate(10.0)
    assert live.replicas[1].state == FRESH and (live.replicas[1].reject_rate or 0) > 0
    assert live.composite is not None and live.composite.reject > 0
    for t in (15.0, 20.0, 25.0, 30.0):
        fleet.update(t, [Observation("r", None, "timeout", "no answer"), calm])
    gone = fleet.evaluate(30.0)
    report = next(r for r in gone.replicas if r.url == "r")
    assert report.state == EXPIRED
    assert (report.reject_rate, report.admitted_rate) == (live.replicas[1].reject_rate, live.replicas[1].admitted_rate)
    assert gone.composite is not None and gone.composite.expired == 1
    assert gone.composite.reject == live.composite.reject
    assert gone.composite.value >= live.composite.value
    # it leaves the sum when it leaves the fleet
    fleet.update(35.0, [calm])
    left = fleet.evaluate(35.0)
    assert left.composite is not None and left.composite.reject == 0.0


def test_one_data_parallel_engine_restarting_keeps_the_pods_ttft_reading() -> None:
    # before: the histogram was diffed on the pod's sum; engine 1's reset sent buckets down and the pod
    # had no TTFT quantile that window (the SLO guardrail went blind exactly when an engine restarted)
    from keda_llm_scaler.engines import read_replica
    from keda_llm_scaler.testing.payloads import EngineLoad, vllm_v1

    def payload(engine0: list[float], engine1: list[float]) -> ReplicaSignals:
        return read_replica(
            vllm_v1([EngineLoad(0, 10, 0.3), EngineLoad(1, 10, 0.3)], ttft_per_engine=[engine0, engine1])
        )

    fast = [0.05] * 100
    fleet = FleetState(ScoringParams(), stale_after=15.0, scrape_interval=2.0)
    fleet.update(0.0, [Observation("pod", payload(fast, fast))])
    # engine 0 serves 10 slow first tokens; engine 1 restarts (its 100 are gone) and serves 2 slow ones
    fleet.update(2.0, [Observation("pod", payload([*fast, *[3.0] * 10], [3.0] * 2))])
    snap = fleet.evaluate(2.0)
    assert snap.ttft_p95_s is not None, "one engine's reset blinded the pod's TTFT"
    assert 2.5 <= snap.ttft_p95_s <= 5.0  # the 12 new observations, all slow, and nothing older
    more = [0.05] * 200
    fleet.update(4.0, [Observation("pod", payload([*fast, *[3.0] * 10, *more], [3.0] * 2 + more))])
    snap = fleet.evaluate(4.0)
    assert snap.ttft_p95_s is not None and snap.ttft_p95_s < 0.5  # the window: 400 fast, the same 12 slow


def _seen_by_demand(fleet: FleetState, field: str) -> list[float | None]:
    """What the demand tracker is handed for the first replica's ``field`` on each update, in order."""
    seen: list[float | None] = []
    observe = fleet.demand.observe

    def spy(now: float, urls: object, counters: object, starting: int = 0) -> None:
        counters = list(counters)  # type: ignore[call-overload]
        seen.append(getattr(counters[0], field))
        observe(now, urls, counters, starting)  # type: ignore[arg-type]

    fleet.demand.observe = spy  # type: ignore[method-assign]
    return seen


def test_the_spread_of_a_pods_recent_hold_times_reaches_the_demand() -> None:
    """How long a pod's requests held a batch slot, over the rate window only: 100 answers of every length
    long ago, then 200 of one length (2.6-2.9 s) lately. The demand reads the recent ones' narrow spread,
    not the old ones' wide one, and nothing for an engine that does not export the histogram."""
    from keda_llm_scaler.engines import read_replica
    from keda_llm_scaler.queueing import service_scv
    from keda_llm_scaler.testing.payloads import EngineLoad, vllm_v1

    fleet = FleetState(ScoringParams(), stale_after=15.0, scrape_interval=2.0)
    seen = _seen_by_demand(fleet, "hold_time_scv")
    spread = [0.4 * (k + 1) for k in range(100)]  # 0.4-40 s
    recent = [2.6 + 0.003 * k for k in range(200)]

    def at(t: float, holds: list[float]) -> None:
        fleet.update(t, [Observation("pod", read_replica(vllm_v1([EngineLoad(5, 16, 0.3)], hold_observations=holds)))])

    at(0.0, spread)
    at(100.0, spread)  # a window (60 s) later: nothing new
    at(102.0, [*spread, *recent])
    assert seen[0] is None  # one snapshot: no window yet
    assert seen[1] is None  # nothing finished in the window: too few to tell
    narrow = service_scv([(2.5, 0.0), (5.0, 200.0), (math.inf, 200.0)])
    assert seen[2] == pytest.approx(narrow) and seen[2] < 0.1
    assert service_scv(read_replica(vllm_v1(hold_observations=spread)).hold_time.buckets) > 0.2  # type: ignore[union-attr]


def test_a_pods_recent_time_to_a_first_token_outside_the_queue_reaches_the_demand() -> None:
    """The mean TTFT less the mean queue wait over the rate window: the prefill and the API server's time,
    which the SLO's wait budget is what is left of. Old slow first tokens are out of the window; a few
    are too few to tell (one long prompt is not the replica's prefill)."""
    from keda_llm_scaler.engines import read_replica
    from keda_llm_scaler.testing.payloads import vllm_v1

    fleet = FleetState(ScoringParams(), stale_after=15.0, scrape_interval=2.0)
    seen = _seen_by_demand(fleet, "first_token_s")
    old = [4.0] * 50  # the payload's queue wait is half of each TTFT: 2 s outside the queue
    few = [0.3] * 5
    recent = [0.24] * 40  # 0.12 s outside the queue

    def at(t: float, ttfts: list[float]) -> None:
        fleet.update(t, [Observation("pod", read_replica(vllm_v1(ttft_observations=ttfts)))])

    at(0.0, old)
    at(100.0, [*old, *few])
    at(102.0, [*old, *few, *recent])
    assert seen[0] is None and seen[1] is None  # no window yet; then five: too few
    assert seen[2] == pytest.approx(0.5 * (5 * 0.3 + 40 * 0.24) / 45)


def test_series_histogram_sums_increases_per_series() -> None:
    from keda_llm_scaler.rates import SeriesHistogram
    from keda_llm_scaler.signals import Histogram

    def h(fast: float, total: float) -> Histogram:
        return Histogram(((0.5, fast), (float("inf"), total)), total, total)

    acc = SeriesHistogram()
    assert acc.observe({"e0": h(10, 20), "e1": h(5, 5)}) == h(15, 25)
    # e1 reset to (1, 2): adds 2 observations; e0 grew by (2, 3); a new series e2 adds all of it
    got = acc.observe({"e0": h(12, 23), "e1": h(1, 2), "e2": h(1, 1)})
    assert got == h(15 + 2 + 1 + 1, 25 + 3 + 2 + 1)
    other = Histogram(((1.0, 1), (float("inf"), 1)), 1, 1)
    assert acc.observe({"e0": other}) == other  # every series changed layout: start over


def test_one_data_parallel_engine_restarting_is_not_a_burst_of_rejects() -> None:
    # before: resets were found on the pod's sum, and one engine restarting read as 103.5 rejects/s
    from keda_llm_scaler.engines import read_replica
    from keda_llm_scaler.testing.payloads import EngineLoad, vllm_v1

    def payload(rejects0: float, rejects1: float) -> ReplicaSignals:
        text = vllm_v1([EngineLoad(0, 10, 0.3), EngineLoad(1, 10, 0.3)])
        lines = []
        for n, value in ((0, rejects0), (1, rejects1)):
            lines.append(f'vllm:admission_rejections_total{{engine="{n}",model_name="m"}} {value}\n')
        return read_replica(text + "".join(lines))

    fleet = FleetState(ScoringParams(), stale_after=15.0, scrape_interval=2.0)
    fleet.update(0.0, [Observation("pod", payload(1000.0, 200.0))])
    fleet.update(2.0, [Observation("pod", payload(1002.5, 202.5))])  # 2.5/s per engine
    fleet.update(4.0, [Observation("pod", payload(1005.0, 0.0))])  # engine 1 restarts (its count lost)
    fleet.update(6.0, [Observation("pod", payload(1007.5, 2.5))])
    rate = fleet.evaluate(6.0).replicas[0].reject_rate
    assert rate is not None and rate == pytest.approx(((2.5 + 2.5) + 2.5 + (2.5 + 2.5)) / 6.0)


def _sglang_pod(finished: float, refused: float, aborted: float = 0.0) -> ReplicaSignals:
    """An SGLang 0.5 pod: its admitted count is its finished, less its 503s and its client aborts."""
    from keda_llm_scaler.engines import read_replica

    return read_replica(
        "sglang:num_queue_reqs 0\nsglang:num_running_reqs 8\nsglang:token_usage 0.4\n"
        f'sglang:num_requests_total{{model_name="m"}} {finished}\n'
        f'sglang:num_aborted_requests_total{{model_name="m"}} {aborted}\n'
        f'sglang:http_responses_total{{endpoint="/generate",method="POST",status_code="503"}} {refused}\n'
    )


def test_a_counter_made_of_others_that_dips_is_no_burst() -> None:
    """SGLang counts a refused request finished before its 503 is counted: scraped in between, finished
    less refused is one too high, then one lower. Read as a reset, that dip was the whole count arriving
    at once (10 000 admitted in 2 s); it is held at its high mark instead."""
    fleet = FleetState(ScoringParams(), stale_after=15.0, scrape_interval=2.0)
    for t, finished, refused in ((0.0, 10_000, 100), (2.0, 10_021, 100), (4.0, 10_021, 101), (6.0, 10_060, 101)):
        fleet.update(t, [Observation("pod", _sglang_pod(finished, refused))])
    report = fleet.evaluate(6.0).replicas[0]
    assert report.admitted_rate == pytest.approx((10_060 - 101 - (10_000 - 100)) / 6.0)
    assert report.reject_rate == pytest.approx(1 / 6.0)


def test_parts_taken_out_of_a_counter_stay_out_when_they_vanish() -> None:
    fleet = FleetState(ScoringParams(), stale_after=15.0, scrape_interval=2.0)
    fleet.update(0.0, [Observation("pod", _sglang_pod(1000, 50, 30))])
    fleet.update(2.0, [Observation("pod", _sglang_pod(1020, 50, 30))])
    gone = _sglang_pod(1040, 50, 30)  # the refusals' and aborts' series gone from the payload
    gone = ReplicaSignals.from_engines(
        "sglang",
        gone.engines,
        admitted_total=gone.admitted_total,
        counter_series=tuple(p for p in gone.counter_series if p[0] == "admitted"),
    )
    fleet.update(4.0, [Observation("pod", gone)])
    assert fleet.evaluate(4.0).replicas[0].admitted_rate == pytest.approx(40 / 4.0)  # not 40 + 80 at once


def test_a_counter_first_seen_after_a_good_scrape_counted_from_zero() -> None:
    """vLLM labels its refusals by reason at the first one, and Ray never exports a counter still at 0:
    absent from a good scrape, then 12, is 12 refusals since that scrape, not a first sighting without a
    rate."""
    from keda_llm_scaler.engines import read_replica

    base = "vllm:num_requests_waiting 3\nvllm:num_requests_running 8\nvllm:kv_cache_usage_perc 0.9\n"
    first = read_replica(base)
    later = read_replica(base + 'vllm:admission_rejections_total{model_name="m",reason="max_num_queued_reqs"} 12\n')
    assert first.rejects_total is None and later.rejects_total == 12
    fleet = FleetState(ScoringParams(), stale_after=15.0, scrape_interval=2.0)
    fleet.update(0.0, [Observation("pod", first)])
    fleet.update(2.0, [Observation("pod", later)])
    assert fleet.evaluate(2.0).replicas[0].reject_rate == pytest.approx(12 / 2.0)
    # on a pod's first scrape the same reading says nothing about now: no rate
    fresh = FleetState(ScoringParams(), stale_after=15.0, scrape_interval=2.0)
    fresh.update(0.0, [Observation("pod", later)])
    assert fresh.evaluate(0.0).replicas[0].reject_rate is None


def test_engine_faults_and_inter_token_latency_reach_the_evaluation() -> None:
    from keda_llm_scaler.engines import read_replica
    from tests.conftest import fixture_text

    text = fixture_text("sglang_v0.5.23_aborts-and-500s.txt")
    fleet = FleetState(ScoringParams(), stale_after=15.0, scrape_interval=2.0)
    fleet.update(0.0, [Observation("pod", read_replica(text))])
    later = text.replace('status_code="500"} 3.0', 'status_code="500"} 9.0')
    itl_twice = "\n".join(  # every inter-token observation made once more: the window sees the same spread
        ln.rsplit(" ", 1)[0] + f" {2 * float(ln.rsplit(' ', 1)[1])}" if ln.startswith("sglang:inter_token") else ln
        for ln in later.splitlines()
    )
    fleet.update(2.0, [Observation("pod", read_replica(itl_twice))])
    ev = fleet.evaluate(2.0)
    assert ev.fault_rate == pytest.approx(6 / 2.0)
    assert ev.itl_p95_s is not None and 0.0 < ev.itl_p95_s < 1.0


def test_the_demand_counts_aborted_and_errored_requests_as_arrived() -> None:
    """Admitted leaves out the requests a client gave up on and the ones that failed; the demand must not:
    they arrived, and under overload (when clients time out) most of all."""
    from keda_llm_scaler.engines import read_replica
    from tests.conftest import fixture_text

    text = fixture_text("vllm_v0.34.0_capacity-and-deferred.txt")  # 40 finished: 36 served, 2 aborted, 2 errored
    fleet = FleetState(ScoringParams(), stale_after=15.0, scrape_interval=2.0)
    seen = _seen_by_demand(fleet, "finished_total")
    fleet.update(0.0, [Observation("pod", read_replica(text))])
    assert seen == [40.0]
    sg = fixture_text("sglang_v0.5.23_aborts-and-500s.txt")  # 40 finished: 30 served, 2 refused, 3 failed, 5 aborted
    fleet = FleetState(ScoringParams(), stale_after=15.0, scrape_interval=2.0)
    seen = _seen_by_demand(fleet, "finished_total")
    fleet.update(0.0, [Observation("pod", read_replica(sg))])
    assert seen == [38.0]  # the refused are counted by the demand as refused, not twice


def test_a_counter_whose_series_are_gone_for_a_scrape_keeps_its_total() -> None:
    """An SGLang container restarts at the same address: its 503 series comes back only at the next 503, and
    meanwhile the family's presence reads 0 refusals. That raw 0 mixed with the running total read as a
    reset, and the next 51 as 51 new refusals (8.5/s for a true 0.17/s)."""
    fleet = FleetState(ScoringParams(), stale_after=15.0, scrape_interval=2.0)
    for t, finished, refused in ((0.0, 900, 50), (2.0, 910, 50)):
        fleet.update(t, [Observation("pod", _sglang_pod(finished, refused))])
    restarted = _sglang_pod(5, 0).__class__  # (the same class: a payload with no 503 series)
    from keda_llm_scaler.engines import read_replica

    no_503_yet = read_replica(
        "sglang:num_queue_reqs 0\nsglang:num_running_reqs 8\nsglang:token_usage 0.4\n"
        'sglang:num_requests_total{model_name="m"} 5\n'
        'sglang:http_responses_total{endpoint="/generate",method="POST",status_code="200"} 5\n'
    )
    assert isinstance(no_503_yet, restarted) and no_503_yet.rejects_total == 0.0
    fleet.update(4.0, [Observation("pod", no_503_yet)])
    fleet.update(6.0, [Observation("pod", _sglang_pod(12, 1))])
    rate = fleet.evaluate(6.0).replicas[0].reject_rate
    assert rate == pytest.approx(1 / 6.0)
