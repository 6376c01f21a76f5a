from __future__ import annotations

import math

import pytest

from keda_llm_scaler.rates import CounterWindow, HistogramWindow
from keda_llm_scaler.signals import Histogram, histogram_quantile


def test_first_sighting_has_no_rate() -> None:
    w = CounterWindow(30)
    w.observe(0, 1_000_000)
    assert w.rate() is None


def test_rate_over_window_and_counter_reset() -> None:
    w = CounterWindow(30)
    for t, v in [(0, 100), (5, 110), (10, 120), (15, 5), (20, 15)]:  # restart at t=15
        w.observe(t, v)
    # increases: 10 + 10 + 5 (since reset) + 10 = 35 over 20 s
    assert w.rate() == pytest.approx(35 / 20)


def test_window_slides() -> None:
    w = CounterWindow(10)
    for t in range(0, 61, 5):
        w.observe(t, 2.0 * t if t < 40 else 80)
    assert w.rate() == 0.0  # flat for the last 10+ seconds


def _hist(counts: list[float]) -> Histogram:
    les = [0.1, 0.5, 1.0, math.inf]
    return Histogram(tuple(zip(les, counts, strict=True)), counts[-1], 0.0)


def test_histogram_quantile_like_prometheus() -> None:
    h = _hist([10, 50, 90, 100])
    assert histogram_quantile(0.5, h) == pytest.approx(0.1 + (0.5 - 0.1) * (50 - 10) / 40)
    assert histogram_quantile(0.99, h) == 1.0  # falls in +Inf: the largest finite bound
    assert histogram_quantile(0.5, _hist([0, 0, 0, 0])) is None


def test_histogram_window_uses_deltas_and_survives_reset() -> None:
    w = HistogramWindow(30)
    w.observe(0, _hist([1000, 1000, 1000, 1000]))  # long history of fast requests
    w.observe(10, _hist([1000, 1000, 1010, 1010]))  # the last 10 s: all between 0.5 and 1 s
    assert 0.5 < (w.quantile(0.95) or 0) <= 1.0
    w.observe(20, _hist([0, 0, 0, 0]))  # restart
    assert w.quantile(0.95) is None


def test_series_counter_finds_resets_per_series() -> None:
    from keda_llm_scaler.rates import SeriesCounter

    c = SeriesCounter()
    assert c.observe({"engine=0": 1000.0, "engine=1": 3000.0}) == 4000.0
    # engine 1 restarted: its series starts over at 5; engine 0 moved by 5. The pod's sum fell to 1010.
    assert c.observe({"engine=0": 1005.0, "engine=1": 5.0}) == 4010.0
    assert c.observe({"engine=0": 1010.0, "engine=1": 10.0}) == 4020.0
    # a lazily created series (first event since the last scrape) counts from zero; a gone one is forgotten
    assert c.observe({"engine=0": 1010.0, "engine=1": 10.0, "status=5xx": 2.0}) == 4022.0
    assert c.observe({"engine=0": 1011.0}) == 4023.0
    assert c.observe({"engine=0": 1011.0, "engine=1": 4.0}) == 4027.0


def test_a_bucket_going_down_is_a_reset_even_when_the_total_grew() -> None:
    from keda_llm_scaler.signals import Histogram

    before = Histogram(((0.5, 100.0), (1.0, 150.0), (float("inf"), 200.0)), 200.0, 120.0)
    # engine 1 restarted (its fast buckets went back to 0) while engine 0 served 60 slow requests
    after = Histogram(((0.5, 80.0), (1.0, 140.0), (float("inf"), 210.0)), 210.0, 190.0)
    assert after.minus(before) is None  # no reading this window, never negative buckets
    grown = Histogram(((0.5, 110.0), (1.0, 170.0), (float("inf"), 230.0)), 230.0, 150.0)
    delta = grown.minus(before)
    assert delta is not None and delta.buckets == ((0.5, 10.0), (1.0, 20.0), (float("inf"), 30.0))
