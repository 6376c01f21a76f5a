"""The HorizontalPodAutoscaler's arithmetic, as Kubernetes implements it (replica_calculator.go and
horizontal.go): proposal from the metric, tolerance, stabilization windows, scaling policies, bounds.

Two metric shapes cover the policies compared here:

* ``AverageValue`` (KEDA's default for external metrics): usage is a total; ratio =
  usage / (target x current replicas); outside tolerance, proposal = ceil(usage / target).
* ``Utilization`` / averaged ``Value`` over pods: the metric is a per-pod average; ratio =
  average / target; outside tolerance, proposal = ceil(ratio x ready pods).

Behavior defaults (Kubernetes ``defaults.go``): scale-up stabilization 0 s with policies
``Pods 4 / 15 s`` and ``Percent 100 / 15 s`` (select Max); scale-down stabilization 300 s with
``Percent 100 / 15 s``. Tolerance 0.1. Sync every 15 s.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Final

__all__ = ["AVERAGE_VALUE", "BEHAVIORS", "UTILIZATION", "Behavior", "Hpa", "MetricReading", "ScalingPolicy"]

AVERAGE_VALUE: Final = "AverageValue"
UTILIZATION: Final = "Utilization"


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    kind: str  # "Pods" | "Percent"
    value: float
    period_s: float


@dataclass(frozen=True, slots=True)
class Behavior:
    up_stabilization_s: float = 0.0
    up_policies: tuple[ScalingPolicy, ...] = (ScalingPolicy("Pods", 4, 15), ScalingPolicy("Percent", 100, 15))
    down_stabilization_s: float = 300.0
    down_policies: tuple[ScalingPolicy, ...] = (ScalingPolicy("Percent", 100, 15),)
    tolerance: float = 0.1


# `default`: Kubernetes' own. `llm`: what the README's ScaledObject examples set for replicas that take
# minutes to start: scale up by at most 4 pods a minute, scale down one pod every two minutes after a
# 10-minute stabilization window, so a fleet walks down to its fixed point instead of jumping below it.
BEHAVIORS: Final[dict[str, Behavior]] = {
    "default": Behavior(),
    "llm": Behavior(
        up_stabilization_s=0.0,
        up_policies=(ScalingPolicy("Pods", 4, 60),),
        down_stabilization_s=600.0,
        down_policies=(ScalingPolicy("Pods", 1, 120),),
    ),
}


@dataclass(frozen=True, slots=True)
class MetricReading:
    kind: str  # AVERAGE_VALUE | UTILIZATION
    value: float  # total usage (AverageValue) or per-pod average (Utilization)
    target: float


def proposal(reading: MetricReading, current: int, ready: int, tolerance: float) -> int:
    """replica_calculator.go: the raw recommendation before behavior is applied."""
    if reading.kind == AVERAGE_VALUE:
        ratio = reading.value / (reading.target * current) if current > 0 else math.inf
        if abs(ratio - 1.0) <= tolerance:
            return current
        return math.ceil(reading.value / reading.target)
    ratio = reading.value / reading.target
    if abs(ratio - 1.0) <= tolerance:
        return current
    return math.ceil(ratio * ready)


@dataclass
class Hpa:
    min_replicas: int = 1
    max_replicas: int = 100
    behavior: Behavior = field(default_factory=Behavior)
    _recommendations: deque[tuple[float, int]] = field(default_factory=deque)
    _events: deque[tuple[float, int]] = field(default_factory=deque)  # (time, replica change)

    def _stabilize(self, now: float, recommended: int, current: int) -> int:
        b = self.behavior
        self._recommendations.append((now, recommended))
        longest = max(b.up_stabilization_s, b.down_stabilization_s)
        while self._recommendations and self._recommendations[0][0] < now - longest:
            self._recommendations.popleft()
        up = min(r for t, r in self._recommendations if t >= now - b.up_stabilization_s)
        down = max(r for t, r in self._recommendations if t >= now - b.down_stabilization_s)
        if current < up:
            return up
        if current > down:
            return down
        return current

    def _limit(self, now: float, desired: int, current: int) -> int:
        b = self.behavior
        if desired > current:
            limits: list[int] = []
            for p in b.up_policies:
                added = sum(c for t, c in self._events if c > 0 and t > now - p.period_s)
                start = current - added  # replicas at the start of the period
                limits.append(start + int(p.value) if p.kind == "Pods" else math.ceil(start * (1 + p.value / 100)))
            return min(desired, max(limits))
        if desired < current:
            limits = []
            for p in b.down_policies:
                removed = -sum(c for t, c in self._events if c < 0 and t > now - p.period_s)
                start = current + removed
                limits.append(start - int(p.value) if p.kind == "Pods" else math.floor(start * (1 - p.value / 100)))
            return max(desired, min(limits))
        return current

    def warm_start(self, now: float, replicas: int) -> None:
        """Behave as an HPA that has been holding ``replicas`` for a while (fills the stabilization
        window), instead of one created this instant with an empty history."""
        longest = max(self.behavior.up_stabilization_s, self.behavior.down_stabilization_s)
        self._recommendations.extend((now - longest + k, replicas) for k in range(0, int(longest) + 1, 15))

    def decide(self, now: float, current: int, ready: int, reading: MetricReading | None) -> int:
        """One sync: the new replica count. No reading (metric unavailable) keeps the current count."""
        if reading is None:
            return current
        recommended = proposal(reading, current, ready, self.behavior.tolerance)
        desired = self._stabilize(now, recommended, current)
        desired = self._limit(now, desired, current)
        desired = max(self.min_replicas, min(self.max_replicas, desired))
        if desired != current:
            self._events.append((now, desired - current))
        while self._events and self._events[0][0] < now - 1800:
            self._events.popleft()
        return desired
