"""The scaler's victim ranker in the simulator: pod-deletion-cost annotations kept current as the server keeps
them (``keda_llm_scaler.deletion_cost.VictimRanker``), so a ``ranked`` fleet's ReplicaSet removes the least
busy pod first.

After every scrape (each ``scrape_interval_s``, the composite's scrapeInterval) the ranker considers a pass;
as on the server, a consideration less than ``interval_s`` after the last one does nothing, and one that
is due takes the slot whatever it then finds. A due pass goes on only if a scale-down is plausible
(``victims.scale_down_plausible``: the replicas the HPA's reading asks for, ceil(reading / 1), fewer
than the ready pods); it then reads every ready pod as the scrape did (running, waiting, KV usage), and
writes ``victims.plan(pods, burst)`` into the pods' annotations (at once: the API server's and the
informer's delay, well under a second, are not modelled). Each annotation written is one API patch, counted in
``writes``. A draining pod keeps its annotation; it is no longer a candidate.

In ``simulate`` the ranker runs on the composite's scrape ticks (1, 6, 11 ... s) and its passes fall on
1, 11, 21 ... s, the HPA's syncs on multiples of 15 s: at a scale-down the costs are 4 or 9 s old.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from keda_llm_scaler.sim.fleet import READY, SimulatedFleet
from keda_llm_scaler.victims import (
    ANNOTATION,
    DEFAULT_BURST,
    DEFAULT_INTERVAL_S,
    PodLoad,
    parse_cost,
    plan,
    scale_down_plausible,
)

__all__ = ["DEFAULT_BURST", "DEFAULT_INTERVAL_S", "NAMESPACE", "SCRAPE_INTERVAL_S", "Ranker"]

SCRAPE_INTERVAL_S: Final = 5.0  # the composite's scrapeInterval default
NAMESPACE: Final = "sim"


@dataclass
class Ranker:
    scrape_interval_s: float = SCRAPE_INTERVAL_S
    interval_s: float = DEFAULT_INTERVAL_S
    burst: int = DEFAULT_BURST
    writes: int = 0  # annotations written (API patches)
    passes: int = 0  # passes that found a scale-down plausible and planned
    considered: int = 0  # passes due (plausible or not)
    _next: float = 0.0
    _last_pass: float = -math.inf

    def observe(self, now: float, fleet: SimulatedFleet, demand_replicas: Callable[[int, int], float | None]) -> int:
        """Call after every tick, after the policy sampled: runs a pass when one is due. ``demand_replicas``
        is the policy's (ready, spec replicas) -> the HPA's reading in replicas. Returns the writes made."""
        if now + 1e-9 < self._next:
            return 0
        self._next = now + self.scrape_interval_s
        if now - self._last_pass < self.interval_s - 1e-9:
            return 0
        self._last_pass = now
        self.considered += 1
        ready = fleet.with_state(READY)
        if not scale_down_plausible([demand_replicas(len(ready), fleet.spec_replicas)], [1.0], len(ready)):
            return 0
        self.passes += 1
        by_name = {p.name: p for p in ready}
        loads = [
            PodLoad(
                NAMESPACE,
                p.name,
                p.uid,
                parse_cost(p.annotations.get(ANNOTATION)),
                float(p.replica.running),
                float(len(p.replica.waiting)),
                p.replica.kv_usage,
            )
            for p in ready
        ]
        changes = plan(loads, self.burst)
        for change in changes:
            by_name[change.pod.name].annotations[ANNOTATION] = str(change.cost)
        self.writes += len(changes)
        return len(changes)
