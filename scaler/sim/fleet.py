"""A Deployment of simulated replicas: cold starts, round-robin routing, draining on scale-down.

Pods are created STARTING and become READY after a cold start drawn from a lognormal with the
profile's mean and p90 (seeded). Scale-down picks victims as a ReplicaSet does: not-ready pods first,
then the newest; a victim stops receiving traffic at once (it leaves the Service endpoints), finishes
what it holds for up to ``grace_s`` (terminationGracePeriodSeconds), and whatever is still in flight
then is cut. A pod holds its GPUs, and is billed, from creation until it is gone.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from scaler.sim.profiles import Profile
from scaler.sim.replica import Request, SimReplica

__all__ = ["DRAINING", "READY", "STARTING", "Fleet", "Pod", "lognormal_params"]

STARTING: Final = "starting"
READY: Final = "ready"
DRAINING: Final = "draining"
GONE: Final = "gone"
_Z90: Final = 1.2815515655446004


def lognormal_params(mean: float, p90: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with this mean and 90th percentile."""
    ratio = max(p90 / mean, 1.0 + 1e-9)
    disc = _Z90**2 - 2 * math.log(ratio)
    sigma = _Z90 - math.sqrt(disc) if disc > 0 else _Z90
    return math.log(mean) - sigma**2 / 2, sigma


@dataclass
class Pod:
    name: str
    replica: SimReplica
    created: float
    ready_at: float
    state: str = STARTING
    drain_deadline: float = math.inf
    gone_at: float | None = None


@dataclass
class Fleet:
    profile: Profile
    cold_start_mean_s: float
    cold_start_p90_s: float
    grace_s: float = 30.0
    max_queue: int | None = None
    seed: int = 0
    pods: list[Pod] = field(default_factory=list)
    finished: list[Request] = field(default_factory=list)
    cut: list[Request] = field(default_factory=list)
    gpu_seconds: float = 0.0
    _backlog: deque[Request] = field(default_factory=deque)  # arrivals while no pod is ready (router holds them)
    _rr: int = 0
    _count: int = 0

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._mu, self._sigma = (lognormal_params(self.cold_start_mean_s, self.cold_start_p90_s)
                                 if self.cold_start_mean_s > 0 else (0.0, 0.0))

    # -- views -----------------------------------------------------------------------------------
    def live(self) -> list[Pod]:
        return [p for p in self.pods if p.state != GONE]

    def with_state(self, state: str) -> list[Pod]:
        return [p for p in self.pods if p.state == state]

    @property
    def spec_replicas(self) -> int:
        """What the Deployment asks for: starting and ready pods (draining ones are on their way out)."""
        return sum(1 for p in self.pods if p.state in (STARTING, READY))

    # -- control ---------------------------------------------------------------------------------
    def _cold_start(self) -> float:
        if self.cold_start_mean_s <= 0:
            return 0.0
        return self._rng.lognormvariate(self._mu, self._sigma)

    def add(self, now: float, *, ready: bool = False) -> Pod:
        self._count += 1
        delay = 0.0 if ready else self._cold_start()
        pod = Pod(f"pod-{self._count}", SimReplica(self.profile, name=f"pod-{self._count}",
                                                  max_queue=self.max_queue, start=now + delay),
                  created=now, ready_at=now + delay, state=READY if ready else STARTING)
        self.pods.append(pod)
        return pod

    def scale_to(self, n: int, now: float) -> None:
        current = self.spec_replicas
        for _ in range(n - current):
            self.add(now)
        if n < current:
            # ReplicaSet victim order: not-ready first, then the most recently created
            candidates = sorted((p for p in self.pods if p.state in (STARTING, READY)),
                                key=lambda p: (p.state == READY, p.created))
            for pod in candidates[: current - n]:
                if pod.state == STARTING:
                    self._gone(pod, now)
                else:
                    pod.state = DRAINING
                    pod.drain_deadline = now + self.grace_s

    def _gone(self, pod: Pod, now: float) -> None:
        self.cut.extend(pod.replica.cut_all(now))
        pod.state = GONE
        pod.gone_at = now

    # -- time ------------------------------------------------------------------------------------
    def route(self, requests: Sequence[Request]) -> None:
        """Round-robin over ready pods (a ClusterIP Service); held by the router while none is ready."""
        self._backlog.extend(requests)
        ready = self.with_state(READY)
        if not ready or not self._backlog:
            return
        per_pod: dict[str, list[Request]] = {p.name: [] for p in ready}
        while self._backlog:
            pod = ready[self._rr % len(ready)]
            self._rr += 1
            per_pod[pod.name].append(self._backlog.popleft())
        for pod in ready:
            pod.replica.submit(per_pod[pod.name])

    def advance(self, t: float, dt: float) -> None:
        """Move every pod to time ``t`` (the end of a tick of length ``dt``)."""
        for pod in self.pods:
            if pod.state == GONE:
                continue
            self.gpu_seconds += self.profile.gpus * (t - max(t - dt, pod.created))
            if pod.state == STARTING and pod.ready_at <= t:
                pod.state = READY
            if pod.state in (READY, DRAINING):
                pod.replica.advance(t)
                self.finished.extend(pod.replica.finished)
                pod.replica.finished = []
            if pod.state == DRAINING and (pod.replica.in_flight() == 0 or t >= pod.drain_deadline):
                self._gone(pod, t)
        if self._backlog:
            self.route([])
