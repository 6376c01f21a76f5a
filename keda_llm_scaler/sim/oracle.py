"""The oracle's schedule: a clairvoyant fleet size per window, built to be a lower bound on cost.

The oracle knows every arrival in advance and gets replicas the instant it asks (no cold start, no
node). For each window (60 s) it picks the fewest replicas that keep a fluid model of the fleet within
the SLO for every second of the window: a pooled queue fed by the trace's arrivals per second, served
at ``n x capacity x utilisation`` (capacity = the single-replica rate at the SLO, from
``capacity_at_slo``; utilisation = the oracle's knob, the share of it each replica is planned at); an
arrival's queueing delay is the backlog over the service rate, and it must stay below half the SLO
(the other half is the replica's own TTFT at that load). The backlog carries over from window to
window, so a burst can be absorbed by capacity already there instead of being met with more replicas
— which a static fleet gets for free and a busiest-10-seconds rule would never allow. Cheap: one pass
over the arrivals and a few hundred operations per window.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Final

from keda_llm_scaler.sim.trace import TraceRequest

__all__ = ["QUEUE_SHARE_OF_SLO", "oracle_schedule"]

QUEUE_SHARE_OF_SLO: Final = 0.5
HOLD_WINDOWS: Final = 3
CALM_S: Final = 10


def _fits(arrivals: list[int], backlog: float, service: float, budget: float) -> tuple[bool, float]:
    for a in arrivals:
        backlog = max(0.0, backlog + a - service)
        if backlog > budget * service:
            return False, backlog
    return True, backlog


def oracle_schedule(
    requests: Iterable[TraceRequest],
    end_s: float,
    capacity_rps: float,
    slo_ttft_s: float,
    *,
    window_s: float = 60.0,
    min_replicas: int = 1,
    max_replicas: int = 64,
) -> list[tuple[float, int]]:
    """The fleet size over time as steps ``(from_s, replicas)``, sorted, the first at 0."""
    if capacity_rps <= 0:
        raise ValueError("oracle: capacity must be > 0")
    seconds = [0] * (int(end_s) + 1)
    for r in requests:
        seconds[min(len(seconds) - 1, int(r.t))] += 1
    per_window = max(1, int(window_s))
    budget = QUEUE_SHARE_OF_SLO * slo_ttft_s
    schedule: list[int] = []
    backlog = 0.0
    for w in range(math.ceil(len(seconds) / per_window) + 1):
        arrivals = seconds[w * per_window : (w + 1) * per_window]
        lo = max(min_replicas, min(max_replicas, math.floor(sum(arrivals) / per_window / capacity_rps)))
        for n in range(lo, max_replicas + 1):
            ok, after = _fits(arrivals, backlog, n * capacity_rps, budget)
            if ok or n == max_replicas:
                schedule.append(n)
                backlog = after
                break
    # A clairvoyant fleet does not churn: a replica removed now and wanted again within HOLD_WINDOWS is
    # kept (each new replica is an empty pod that least-loaded routing floods until it catches up).
    held = [max(schedule[w : w + HOLD_WINDOWS + 1]) for w in range(len(schedule))]
    # A new replica is an empty pod, and least-loaded routing sends it everything until it holds as much
    # as the others: landing on a burst, that flood misses the SLO. Knowing the arrivals, the oracle adds
    # replicas during the previous window's calmest CALM_S seconds (the smaller fleet already fit there).
    steps: list[tuple[float, int]] = [(0.0, held[0])]
    for w in range(1, len(held)):
        start = w * per_window
        if held[w] > held[w - 1]:
            calm = min(range(start - per_window, start + 1), key=lambda s: (sum(seconds[s : s + CALM_S]), -s))
            steps.append((float(calm), held[w]))
        elif held[w] < held[w - 1]:
            steps.append((float(start), held[w]))
    return sorted(steps)
