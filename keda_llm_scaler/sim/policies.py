"""The scaling policies compared by ``replay``: ours and the ones teams use today.

Each policy samples the fleet at its own cadence (as its metrics pipeline would) and hands the HPA a
reading at every sync. ``composite`` runs the scaler's own scoring code (``keda_llm_scaler.fleet.FleetState`` and
``keda_llm_scaler.policy``) on the replicas' signals, exactly as the server does after a scrape.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Final

from keda_llm_scaler.demand import DemandConfig
from keda_llm_scaler.fleet import RESTORED, FleetState, Observation
from keda_llm_scaler.learned import FleetRecord, aged, decode, encode
from keda_llm_scaler.policy import Composite, ScoringParams
from keda_llm_scaler.sim.fleet import READY, STARTING, SimulatedFleet
from keda_llm_scaler.sim.hpa import AVERAGE_VALUE, UTILIZATION, Behavior, MetricReading, ScalingPolicy

__all__ = ["POLICIES", "Policy", "make_policy"]

PROMETHEUS_SCRAPE_S: Final = 15.0
STATE_INTERVAL_S: Final = 10.0  # serve's --state-interval default: a crash loses up to this much learning


@dataclass
class Policy:
    """Base: a metric sampled every ``interval_s`` and read by the HPA at each sync."""

    name: str
    knob: float
    knob_name: str
    interval_s: float = PROMETHEUS_SCRAPE_S
    behavior: Behavior = field(default_factory=Behavior)
    value: float | None = None  # the latest metric value (plotted)
    _next: float = 0.0

    def observe(self, now: float, fleet: SimulatedFleet) -> None:
        if now + 1e-9 >= self._next:
            self._next = now + self.interval_s
            self.sample(now, fleet)

    def sample(self, now: float, fleet: SimulatedFleet) -> None:
        raise NotImplementedError

    def reading(self) -> MetricReading | None:
        raise NotImplementedError

    def fixed_replicas(self, now: float) -> int | None:
        """Policies that bypass the HPA (static, oracle) say how many replicas to run."""
        return None

    def explain(self) -> dict[str, float | None]:
        """Extra timeline fields that say why the policy asked for what it did (plotted when present)."""
        return {}

    def demand_replicas(self, ready: int, current: int) -> float | None:
        """The latest reading in replica units, before tolerance and bounds (for plots): what the HPA's
        proposal would be."""
        reading = self.reading()
        if reading is None:
            return None
        if reading.kind == AVERAGE_VALUE:
            return reading.value / reading.target
        return reading.value / reading.target * ready


def _ready(fleet: SimulatedFleet) -> list:  # type: ignore[type-arg]
    return fleet.with_state(READY)


@dataclass
class CompositePolicy(Policy):
    """Ours: the scaler scrapes ready endpoints every scrapeInterval; KEDA serves the composite to the
    HPA as an AverageValue external metric with target 1."""

    scrape_interval_s: float = 5.0
    params: ScoringParams = field(default_factory=ScoringParams)  # the defaults; the knob sets utilization
    demand: DemandConfig | None = None
    stale_after_s: float = 15.0

    def __post_init__(self) -> None:
        self.interval_s = self.scrape_interval_s
        self.params = dataclasses.replace(self.params, target_utilization=self.knob)
        self._state = FleetState(self.params, self.stale_after_s, self.scrape_interval_s, self.demand)
        self._composite: float | None = None
        self.last: Composite | None = None  # the latest scoring, whole
        self._capacity: tuple[float, str] | None = None  # the latest capacity known (value, source)
        self._persisted: FleetRecord | None = None  # the learned state as last written (restart)
        # after a restart on kept state: how often the standing view changed, and how long the restored one
        # stood (scrape intervals), as `serve` logs `state_view` on each change
        self._view: str | None = None
        self._view_changes = 0
        self._restored_s = 0.0

    def restart(self, now: float, keep_state: bool) -> None:
        """The scaler process restarts at ``now``: everything in memory is lost. ``keep_state``: the new process
        reads what the old one persisted (``serve --state-dir``; ``keda_llm_scaler.learned``) before its first
        cycle, as ``serve`` does; else it starts cold, as every release before 0.3.0 did."""
        kept = self._persisted if keep_state else None
        self._state = FleetState(self.params, self.stale_after_s, self.scrape_interval_s, self.demand)
        if kept is not None:
            # what the last periodic write held (up to STATE_INTERVAL_S before a crash), through the format
            # serve writes and its checks, as a new process reads it
            records, _ = decode(json.loads(json.dumps(encode({"fleet": kept}, "sim"))), "sim", kept.written_at)
            record = records.get("fleet")  # refused by the checks: the new process starts cold, as serve's does
            if record is not None and record.basis == self._state.demand.basis():
                self._state.demand.adopt(aged(record.state, now - record.written_at), now)
        self._persisted = None
        self._view = None
        self._composite = self.value = None
        self.last = None
        self._capacity = None
        self._next = now

    def _persist(self, now: float) -> None:
        """Every STATE_INTERVAL_S, what ``serve`` would write (``--state-interval``); the replay's clock
        stands for the wall clock."""
        if self._persisted is None or now - self._persisted.written_at >= STATE_INTERVAL_S:
            d = self._state.demand
            self._persisted = FleetRecord("sim", d.basis(), now, d.learned(now))

    def sample(self, now: float, fleet: SimulatedFleet) -> None:
        self._persist(now)
        starting = len(fleet.with_state(STARTING))
        self._state.update(now, (Observation(p.name, p.replica.signals()) for p in _ready(fleet)), starting)
        evaluation = self._state.evaluate(now, starting)  # starting pods: capacity on the way
        c = evaluation.composite
        self._composite = None if c is None else c.value
        self.value = self._composite
        self.last = c
        self._capacity = evaluation.capacity  # what the scaler exports: known before the load is
        view = evaluation.state_view
        if view is not None and view != self._view:
            self._view_changes += self._view is not None  # the first view after the restart is no change
            self._view = view
        if view == RESTORED:
            self._restored_s += self.interval_s

    def explain(self) -> dict[str, float | None]:
        c = self.last
        if c is None:
            return {}
        d = c.demand
        cap = None if self._capacity is None else self._capacity[0]
        return {
            "offered_rps": d.offered_rps if d is not None else None,
            "need_rps": d.need_rps if d is not None else None,
            "capacity_rps": cap,
            "rate_replicas": c.rate,
            "pressure_replicas": c.pressure,
            "state_view_changes": float(self._view_changes),
            "restored_view_s": self._restored_s,
        }

    def reading(self) -> MetricReading | None:
        return None if self._composite is None else MetricReading(AVERAGE_VALUE, self._composite, 1.0)


@dataclass
class QueuePolicy(Policy):
    """KEDA Prometheus scaler: sum(vllm:num_requests_waiting), threshold 5 (AverageValue), seen
    through a 15 s Prometheus scrape."""

    def sample(self, now: float, fleet: SimulatedFleet) -> None:
        self.value = float(sum(len(p.replica.waiting) for p in _ready(fleet)))

    def reading(self) -> MetricReading | None:
        return None if self.value is None else MetricReading(AVERAGE_VALUE, self.value, self.knob)


@dataclass
class AveragePolicy(Policy):
    """A per-pod average against a utilization target: mean KV usage, GPU busy, or CPU."""

    signal: str = "kv"
    _busy: dict[str, tuple[float, float]] = field(default_factory=dict)

    def _busy_fraction(self, now: float, pod_name: str, busy_s: float) -> float:
        last = self._busy.get(pod_name)
        self._busy[pod_name] = (now, busy_s)
        if last is None or now <= last[0]:
            return 0.0
        return min(1.0, (busy_s - last[1]) / (now - last[0]))

    def sample(self, now: float, fleet: SimulatedFleet) -> None:
        pods = _ready(fleet)
        if not pods:
            self.value = None
            return
        values = []
        for p in pods:
            if self.signal == "kv":
                values.append(p.replica.kv_usage)
            else:
                # DCGM's GPU utilization is the fraction of time a kernel runs: ~1 whenever a batch runs.
                busy = self._busy_fraction(now, p.name, p.replica.busy_s)
                # The serving pod's CPU is tokenizer and HTTP work: 5-20 % of a core under load.
                values.append(busy if self.signal == "gpu" else 0.05 + 0.15 * busy)
        self.value = sum(values) / len(values)

    def reading(self) -> MetricReading | None:
        return None if self.value is None else MetricReading(UTILIZATION, self.value, self.knob)


@dataclass
class KaitoPolicy(Policy):
    """keda-kaito-scaler: a scalingModifiers formula with AND logic and hysteresis —
    ``(all ready && all > up) ? 2 : (all < down ? 0.5 : 1)`` as a Value metric with target 1 — and HPA
    policies of one pod per 300 s in each direction. Signal: each pod's KV usage."""

    down: float = 0.4

    def __post_init__(self) -> None:
        self.behavior = Behavior(
            up_stabilization_s=60.0,
            up_policies=(ScalingPolicy("Pods", 1, 300),),
            down_stabilization_s=60.0,
            down_policies=(ScalingPolicy("Pods", 1, 300),),
        )
        self.down = min(self.down, self.knob * 0.5)

    def sample(self, now: float, fleet: SimulatedFleet) -> None:
        pods = _ready(fleet)
        if not pods:
            self.value = None
            return
        kv = [p.replica.kv_usage for p in pods]
        all_ready = len(pods) == fleet.spec_replicas  # the readiness gate
        if all_ready and all(v > self.knob for v in kv):
            self.value = 2.0
        elif all(v < self.down for v in kv):
            self.value = 0.5
        else:
            self.value = 1.0

    def reading(self) -> MetricReading | None:
        return None if self.value is None else MetricReading(UTILIZATION, self.value, 1.0)


@dataclass
class StaticPolicy(Policy):
    def sample(self, now: float, fleet: SimulatedFleet) -> None:
        self.value = float(self.knob)

    def reading(self) -> MetricReading | None:
        return None

    def fixed_replicas(self, now: float) -> int | None:
        return int(self.knob)

    def demand_replicas(self, ready: int, current: int) -> float | None:
        return float(self.knob)


@dataclass
class OraclePolicy(Policy):
    """A lower bound: perfect foresight of every arrival, no cold start, and per minute the fewest
    replicas a fluid model of the fleet says keep it within the SLO (``keda_llm_scaler.sim.oracle``; the runner
    fills ``schedule`` from the workload and a single-replica capacity measurement)."""

    schedule: list[tuple[float, int]] = field(default_factory=list)  # (from_s, replicas), sorted
    window_s: float = 60.0

    def sample(self, now: float, fleet: SimulatedFleet) -> None:
        self.value = float(self.fixed_replicas(now) or 0)

    def reading(self) -> MetricReading | None:
        return None

    def demand_replicas(self, ready: int, current: int) -> float | None:
        return self.value

    def fixed_replicas(self, now: float) -> int | None:
        if not self.schedule:
            return None
        return self.schedule[max(0, bisect.bisect_right(self.schedule, (now, math.inf)) - 1)][1]


# name -> (knob name, default knob, sweep values, factory)
POLICIES: Final[dict[str, tuple[str, float, tuple[float, ...]]]] = {
    "composite": ("targetUtilization", 0.9, (0.6, 0.7, 0.8, 0.9, 1.0)),
    "queue": ("threshold", 5.0, (1.0, 2.0, 5.0, 10.0, 20.0)),
    "kv": ("target", 0.8, (0.1, 0.15, 0.2, 0.3, 0.5, 0.8)),
    "gpu-util": ("target", 0.8, (0.6, 0.7, 0.8, 0.9)),
    "cpu": ("target", 0.7, (0.1, 0.15, 0.3, 0.5, 0.7)),
    "kaito": ("up", 0.8, (0.1, 0.2, 0.3, 0.5, 0.8)),
    "static": ("replicas", 8.0, (5.0, 6.0, 7.0, 8.0, 10.0, 12.0)),
    "oracle": ("utilisation", 1.0, (0.7, 0.8, 0.9, 0.95, 1.0)),  # the fluid model holds up to 1
}


def make_policy(
    name: str,
    knob: float | None = None,
    ttft_slo_s: float | None = None,
    ttft_slo_quantile: float | None = None,
    itl_slo_s: float | None = None,
) -> Policy:
    """``ttft_slo_s``/``ttft_slo_quantile``/``itl_slo_s``: the composite's ``ttftSloSeconds``/
    ``ttftSloQuantile``/``itlSloSeconds`` (None: the scaler's default; the other policies know no SLO)."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    knob_name, default, _ = POLICIES[name]
    value = default if knob is None else knob
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}: {knob_name} must be > 0")
    if name == "composite":
        params = dataclasses.replace(ScoringParams(), ttft_slo_s=ttft_slo_s, itl_slo_s=itl_slo_s)
        if ttft_slo_quantile is not None:
            params = dataclasses.replace(params, ttft_slo_quantile=ttft_slo_quantile)
        return CompositePolicy(name, value, knob_name, params=params)
    if name == "queue":
        return QueuePolicy(name, value, knob_name)
    if name in ("kv", "gpu-util", "cpu"):
        return AveragePolicy(name, value, knob_name, signal={"kv": "kv", "gpu-util": "gpu", "cpu": "cpu"}[name])
    if name == "kaito":
        return KaitoPolicy(name, value, knob_name)
    if name == "static":
        return StaticPolicy(name, value, knob_name)
    return OraclePolicy(name, value, knob_name)
