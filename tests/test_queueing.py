"""The rate a replica serves within a wait, from its saturated throughput (keda_llm_scaler.queueing)."""

from __future__ import annotations

import math

import pytest

from keda_llm_scaler.queueing import MAX_SERVICE_SCV, erlang_c, rate_within_wait, service_scv


def test_erlang_c_matches_the_closed_forms() -> None:
    # one server: an arrival waits whenever the server is busy, i.e. with probability rho
    assert erlang_c(1, 0.3) == pytest.approx(0.3)
    # two servers at one erlang: (a^2 / 2!) (c / (c - a)) / (1 + a + (a^2 / 2!) (c / (c - a))) = 1/3
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    # textbook value: 10 servers at 8 erlangs wait 40.9 % of the time
    assert erlang_c(10, 8.0) == pytest.approx(0.4092, abs=5e-4)
    assert erlang_c(4, 0.0) == 0.0 and erlang_c(4, 4.0) == 1.0


def test_erlang_c_is_stable_for_large_batches() -> None:
    # a^c / c! overflows a float from c ~ 170: a GPU replica holds batches of hundreds
    p = erlang_c(1024, 1000.0)
    assert 0.0 < p < 1.0 and math.isfinite(p)
    assert erlang_c(1024, 900.0) < p


def test_one_slot_solves_the_m_m_1_tail() -> None:
    # M/M/1: P(W > t) = rho exp(-(mu - lambda) t); at the answer it equals 1 - quantile
    mu, t, q = 2.0, 0.5, 0.95
    rate = rate_within_wait(mu, 1, t, q)
    assert (rate / mu) * math.exp(-(mu - rate) * t) == pytest.approx(1 - q, rel=1e-6)


def test_few_long_slots_serve_well_below_their_throughput_and_many_close_to_it() -> None:
    # a vLLM CPU engine capped at 16 sequences of ~3 s each (issue #30): the capacity at a 1 s TTFT SLO
    # (half of it queued) was 0.57-0.81 of its saturated throughput in the sweeps
    few = rate_within_wait(5.3, 16, 0.5, 0.95) / 5.3
    assert 0.6 < few < 0.8
    many = rate_within_wait(30.0, 256, 1.0, 0.95) / 30.0
    assert many > 0.9 and many > few


def test_a_longer_wait_or_a_looser_quantile_serves_more() -> None:
    base = rate_within_wait(10.0, 32, 0.5, 0.95)
    assert rate_within_wait(10.0, 32, 2.0, 0.95) > base
    assert rate_within_wait(10.0, 32, 0.5, 0.9) > base
    assert rate_within_wait(10.0, 64, 0.5, 0.95) > base  # the same throughput over more, longer slots
    assert rate_within_wait(10.0, 32, 0.0, 0.95) < base  # no wait allowed at all: Erlang C alone


def test_nothing_served_reads_nothing_and_bad_input_is_refused() -> None:
    assert rate_within_wait(0.0, 16, 1.0, 0.95) == 0.0
    assert rate_within_wait(math.nan, 16, 1.0, 0.95) == 0.0
    assert rate_within_wait(5.0, 0, 1.0, 0.95) > 0.0  # an empty batch reading counts as one slot
    with pytest.raises(ValueError, match="quantile"):
        rate_within_wait(5.0, 16, 1.0, 1.0)
    with pytest.raises(ValueError, match="servers"):
        erlang_c(0, 1.0)


def test_answers_of_one_length_wait_about_half_as_long() -> None:
    """Allen-Cunneen: an M/G/c queue waits (1 + scv) / 2 times an M/M/c one's, so with no spread in hold
    times the rate within a wait is the exponential one's within twice that wait."""
    exponential = rate_within_wait(5.0, 16, 0.5, 0.95)
    assert rate_within_wait(5.0, 16, 0.5, 0.95, None) == exponential
    assert rate_within_wait(5.0, 16, 0.5, 0.95, 1.0) == pytest.approx(exponential)
    fixed = rate_within_wait(5.0, 16, 0.5, 0.95, 0.0)
    assert fixed == pytest.approx(rate_within_wait(5.0, 16, 1.0, 0.95))
    assert exponential < fixed < 5.0
    # a heavier tail than exponential waits longer; beyond MAX_SERVICE_SCV the bucket layout speaks
    heavy = rate_within_wait(5.0, 16, 0.5, 0.95, 3.0)
    assert heavy < exponential
    assert rate_within_wait(5.0, 16, 0.5, 0.95, 100.0) == rate_within_wait(5.0, 16, 0.5, 0.95, MAX_SERVICE_SCV)
    assert rate_within_wait(5.0, 16, 0.5, 0.95, -1.0) == fixed  # clamped, never a negative spread
    assert rate_within_wait(5.0, 16, 0.5, 0.95, math.nan) == exponential  # unknown: exponential


def test_the_spread_of_hold_times_from_histogram_buckets() -> None:
    inf = math.inf
    # all 100 in (2.5, 5]: uniform there, variance 2.5^2 / 12 over a mean of 3.75 squared
    one_bucket = [(1.0, 0.0), (2.5, 0.0), (5.0, 100.0), (inf, 100.0)]
    assert service_scv(one_bucket) == pytest.approx((2.5**2 / 12) / 3.75**2)
    # half in (0, 1], half in (1, 10]: means 0.5 and 5.5, second moments 1/3 and 37
    two = [(1.0, 50.0), (10.0, 100.0), (inf, 100.0)]
    mean, second = (0.5 + 5.5) / 2, (1 / 3 + 37.0) / 2
    assert service_scv(two) == pytest.approx((second - mean**2) / mean**2)
    # the +Inf bucket counts at the largest finite bound (never infinite)
    tail = service_scv([(1.0, 50.0), (inf, 100.0)])
    assert tail is not None and math.isfinite(tail)
    # too few observations, or none: no spread to tell
    assert service_scv([(5.0, 10.0), (inf, 10.0)]) is None
    assert service_scv([(5.0, 0.0), (inf, 0.0)]) is None
    assert service_scv([(inf, 100.0)]) is None
    assert service_scv([]) is None
