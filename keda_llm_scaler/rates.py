"""Counters and histograms across scrapes: per-second rates and windowed quantiles. Pure, clock passed in.

Rules (the http-add-on's, which survive pod restarts): the first sighting gives no rate (a counter's
absolute value says nothing about now); a decrease is a reset, and the new value is the increase
since the reset; a window with a single point has no rate. Nothing here fabricates a value.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Final

from keda_llm_scaler.signals import Histogram, histogram_quantile

__all__ = ["DEFAULT_WINDOW_S", "CounterWindow", "HistogramWindow", "SeriesCounter", "SeriesHistogram"]

DEFAULT_WINDOW_S: Final = 30.0


class CounterWindow:
    """Samples of one cumulative counter over a sliding window."""

    __slots__ = ("_points", "window_s")

    def __init__(self, window_s: float = DEFAULT_WINDOW_S) -> None:
        self.window_s = window_s
        self._points: deque[tuple[float, float]] = deque()

    def observe(self, t: float, value: float) -> None:
        self._points.append((t, value))
        # Keep the newest point at or before the window start as the base, so the rate spans the window.
        while len(self._points) > 2 and self._points[1][0] <= t - self.window_s:
            self._points.popleft()

    def increase(self) -> float | None:
        if len(self._points) < 2:
            return None
        total = 0.0
        prev = self._points[0][1]
        for _, value in list(self._points)[1:]:
            total += value - prev if value >= prev else value
            prev = value
        return total

    def rate(self) -> float | None:
        inc = self.increase()
        if inc is None:
            return None
        span = self._points[-1][0] - self._points[0][0]
        return inc / span if span > 0 else None


class SeriesCounter:
    """A counter summed over its series, with resets found per series (as Prometheus' ``increase()``
    does): the result only moves up, by each series' increase, a reset series contributing its new
    value. On a data-parallel pod where one engine restarts, the pod's sum drops and rises again; read
    on the sum that reset looked like the whole pod's count arriving at once (a reject rate of 103.5/s
    for a true 2.5/s). A series first seen after the first scrape counts from zero (engines create some
    series lazily, at their first event); one that disappears is forgotten."""

    __slots__ = ("_last", "total")

    def __init__(self) -> None:
        self.total: float | None = None
        self._last: dict[str, float] = {}

    def observe(self, series: dict[str, float]) -> float:
        if self.total is None:
            self.total, self._last = math.fsum(series.values()), dict(series)
            return self.total
        increase = 0.0
        for key, value in series.items():
            prev = self._last.get(key)
            if prev is None or value < prev:
                increase += value  # new since the last scrape, or reset: all of it is new
            else:
                increase += value - prev
        self._last = dict(series)
        self.total += increase
        return self.total


class SeriesHistogram:
    """A histogram summed over its series with resets found per series, like ``SeriesCounter``: the
    total is cumulative and only grows, each series adding what it observed since the last scrape (a
    series that reset adds its new counts, a new series all of its counts). On a data-parallel pod one
    engine restarting then costs nothing: the pod's TTFT keeps its reading (read on the sum, a bucket
    going down voids the whole window). Series with another bucket layout than the first are left out
    until the layout is the same again."""

    __slots__ = ("_last", "total")

    def __init__(self) -> None:
        self.total: Histogram | None = None
        self._last: dict[str, Histogram] = {}

    def observe(self, series: dict[str, Histogram]) -> Histogram | None:
        if self.total is None:
            self.total = Histogram.merge(list(series.values()))
            self._last = dict(series) if self.total is not None else {}
            return self.total
        layout = [le for le, _ in self.total.buckets]
        if series and all([le for le, _ in h.buckets] != layout for h in series.values()):
            self.total = None  # every series changed its buckets (an engine upgrade): start over
            return self.observe(series)
        buckets = [c for _, c in self.total.buckets]
        count, total_sum = self.total.count, self.total.sum
        for key, hist in series.items():
            if [le for le, _ in hist.buckets] != layout:
                continue
            prev = self._last.get(key)
            increase = hist.minus(prev) if prev is not None else None
            if increase is None:  # new since the last scrape, or reset: all of it is new
                increase = hist
            for i, (_, c) in enumerate(increase.buckets):
                buckets[i] += c
            count, total_sum = count + increase.count, total_sum + increase.sum
        self._last = dict(series)
        self.total = Histogram(tuple(zip(layout, buckets, strict=True)), count, total_sum)
        return self.total


class HistogramWindow:
    """Snapshots of one cumulative histogram; quantiles of what was observed inside the window."""

    __slots__ = ("_points", "window_s")

    def __init__(self, window_s: float = DEFAULT_WINDOW_S) -> None:
        self.window_s = window_s
        self._points: deque[tuple[float, Histogram]] = deque()

    def observe(self, t: float, hist: Histogram) -> None:
        if self._points and hist.minus(self._points[-1][1]) is None:
            self._points.clear()  # reset or new bucket layout: start over rather than mix the two
        self._points.append((t, hist))
        while len(self._points) > 2 and self._points[1][0] <= t - self.window_s:
            self._points.popleft()

    def delta(self) -> Histogram | None:
        """Observations inside the window; None until two snapshots are known."""
        if len(self._points) < 2:
            return None
        return self._points[-1][1].minus(self._points[0][1])

    def quantile(self, q: float) -> float | None:
        delta = self.delta()
        return histogram_quantile(q, delta) if delta is not None else None
