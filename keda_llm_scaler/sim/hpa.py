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

Checked against the real controller (``tests/e2e/test_hpa_emulation.py``, docs/e2e.md) and its source
(``pkg/controller/podautoscaler/horizontal.go`` of v1.36): a policy's period starts from the replicas
before *every* change in it, up and down (``periodStartReplicas = current - added + deleted``); a limit
never moves the count the other way; the first sync records the current count as a recommendation;
stabilization windows take recommendations strictly newer than their cutoff.
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

    def scaled(self, factor: float) -> Behavior:
        """Every window and period times ``factor`` (whole seconds, at least 1: what the API accepts),
        for an end-to-end run that plays a long scenario in a short time."""

        def sec(s: float) -> float:
            return float(max(1, round(s * factor))) if s > 0 else 0.0

        def pols(ps: tuple[ScalingPolicy, ...]) -> tuple[ScalingPolicy, ...]:
            return tuple(ScalingPolicy(p.kind, p.value, sec(p.period_s)) for p in ps)

        return Behavior(sec(self.up_stabilization_s), pols(self.up_policies), sec(self.down_stabilization_s),
                        pols(self.down_policies), self.tolerance)  # fmt: skip

    def to_kubernetes(self) -> dict[str, object]:
        """The HPA ``spec.behavior`` (ScaledObject ``advanced.horizontalPodAutoscalerConfig.behavior``) that
        means this behavior; the tolerance is the controller's default and not part of it."""

        def rules(stabilization: float, ps: tuple[ScalingPolicy, ...]) -> dict[str, object]:
            policies = [{"type": p.kind, "value": int(p.value), "periodSeconds": int(p.period_s)} for p in ps]
            return {"stabilizationWindowSeconds": int(stabilization), "selectPolicy": "Max", "policies": policies}

        return {"scaleUp": rules(self.up_stabilization_s, self.up_policies),
                "scaleDown": rules(self.down_stabilization_s, self.down_policies)}  # fmt: skip


# `default`: Kubernetes' own. `llm`: what the README's ScaledObject examples set for replicas that take
# minutes to start: scale up by at most 4 pods a minute, scale down one pod every two minutes after the
# 5-minute stabilization window, so a fleet walks down to its fixed point instead of jumping below it.
# 600 s was the 0.1 examples' window: it held every peak of the composite for 10 minutes, half to two
# thirds of the GPU-hours above the oracle's (docs/replay.md, issue #20).
BEHAVIORS: Final[dict[str, Behavior]] = {
    "default": Behavior(),
    "llm": Behavior(
        up_stabilization_s=0.0,
        up_policies=(ScalingPolicy("Pods", 4, 60),),
        down_stabilization_s=300.0,
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
        """horizontal.go ``stabilizeRecommendationWithBehaviors``: the count moves up only to the lowest
        recommendation of the up window and down only to the highest of the down window (both include
        this one); then this recommendation is recorded."""
        b = self.behavior
        up_cutoff, down_cutoff = now - b.up_stabilization_s, now - b.down_stabilization_s
        up = min((r for t, r in self._recommendations if t > up_cutoff), default=recommended)
        down = max((r for t, r in self._recommendations if t > down_cutoff), default=recommended)
        up, down = min(up, recommended), max(down, recommended)
        self._recommendations.append((now, recommended))
        while self._recommendations and self._recommendations[0][0] <= min(up_cutoff, down_cutoff):
            self._recommendations.popleft()
        return min(max(current, up), down)

    def _changed_since(self, now: float, period_s: float) -> tuple[int, int]:
        """(replicas added, replicas removed) by this HPA in the last ``period_s``."""
        added = sum(c for t, c in self._events if c > 0 and t > now - period_s)
        removed = -sum(c for t, c in self._events if c < 0 and t > now - period_s)
        return added, removed

    def _limit(self, now: float, desired: int, current: int) -> int:
        """horizontal.go ``convertDesiredReplicasWithBehaviorRate``: each policy's limit from the count at
        the start of its period (every change in the period undone), the largest change of the policies
        (selectPolicy Max); a limit past the current count holds it."""
        b = self.behavior
        if desired > current:
            limits: list[int] = []
            for p in b.up_policies:
                added, removed = self._changed_since(now, p.period_s)
                start = current - added + removed
                limits.append(start + int(p.value) if p.kind == "Pods" else math.ceil(start * (1 + p.value / 100)))
            return min(desired, max(current, max(limits)))
        if desired < current:
            limits = []
            for p in b.down_policies:
                added, removed = self._changed_since(now, p.period_s)
                start = current - added + removed
                limits.append(start - int(p.value) if p.kind == "Pods" else math.floor(start * (1 - p.value / 100)))
            return max(desired, min(current, min(limits)))
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
        if not self._recommendations:  # horizontal.go recordInitialRecommendation
            self._recommendations.append((now, current))
        recommended = proposal(reading, current, ready, self.behavior.tolerance)
        desired = self._stabilize(now, recommended, current)
        desired = self._limit(now, desired, current)
        desired = max(self.min_replicas, min(self.max_replicas, desired))
        if desired != current:
            self._events.append((now, desired - current))
        while self._events and self._events[0][0] < now - 1800:
            self._events.popleft()
        return desired
