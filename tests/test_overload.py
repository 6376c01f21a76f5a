"""Sustained overload with no capacity arriving: the composite asks for what the arrivals need plus a
bounded drain of the backlog, never for the backlog in running batches (issue #30 (e)).

Found on a real vLLM: two engines held to half a core each, 30 req/s offered, the fleet unable to grow.
The queue grew by 10 req/s and the composite with it, 3.4 -> 43.7 in 150 s for a need of 3.3, because
the queue was counted as ``waiting / running`` batches. The simulator never showed it because its
replicas always arrived after the cold start; here ``maxReplicaCount`` is the fleet it has.
"""

from __future__ import annotations

import random

from keda_llm_scaler.sim.profiles import get_profile
from keda_llm_scaler.sim.run import RunConfig, capacity_at_slo, simulate
from keda_llm_scaler.sim.trace import TraceRequest


def _poisson(rate: float, duration_s: float, prompt: int, output: int, seed: int) -> list[TraceRequest]:
    rng = random.Random(seed)
    t, out = 0.0, []
    while True:
        t += rng.expovariate(rate)
        if t >= duration_s:
            return out
        out.append(TraceRequest(t, prompt, output))


def test_an_overload_the_fleet_cannot_grow_for_reads_its_need_not_its_backlog() -> None:
    profile = "8b-a100"
    capacity = capacity_at_slo(get_profile(profile), ((200, 50),), 2.0, seed=0)
    fleet = 2
    rate = 1.5 * fleet * capacity  # 1.5x what the fleet serves: the queue grows all run long
    need = rate / capacity
    run = simulate(
        _poisson(rate, 1200.0, 200, 50, seed=1),
        RunConfig(profile=profile, max_replicas=fleet, initial_replicas=fleet, hpa_behavior="llm"),
    )
    late = [p for p in run.timeline if p["t"] >= 300.0 and p["metric"] is not None]
    values = [float(p["metric"]) for p in late]  # type: ignore[arg-type]
    assert values, "no composite readings after the first five minutes"
    # the backlog grows for the whole 20 minutes (at 0.2.0 the composite passed 480 here) ...
    assert run.summary["ttft_p95_s"] > 60.0
    # ... yet the composite stays within 3x the need, and it does ask for more than the fleet has
    assert max(values) <= 3 * need, (max(values), need)
    assert min(values) > fleet
    # and it does not keep growing with the backlog's age: the last five minutes read like the five before
    last = [v for p, v in zip(late, values, strict=True) if p["t"] >= 900.0]
    before = [v for p, v in zip(late, values, strict=True) if 600.0 <= p["t"] < 900.0]
    assert max(last) <= 1.1 * max(before)
