"""Counters and histograms across scrapes: per-second rates and windowed quantiles. Pure, clock passed in.

Rules (the http-add-on's, which survive pod restarts): the first sighting gives no rate (a counter's
absolute value says nothing about now); a decrease is a reset, and the new value is the increase
since the reset; a window with a single point has no rate. Nothing here fabricates a value.
"""

from __future__ import annotations

from collections import deque
from typing import Final

from keda_llm_scaler.signals import Histogram, histogram_quantile

__all__ = ["DEFAULT_WINDOW_S", "CounterWindow", "HistogramWindow"]

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
