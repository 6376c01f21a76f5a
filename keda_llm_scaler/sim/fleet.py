"""A Deployment of simulated replicas: nodes, cold starts, routing, draining on scale-down.

Pods are created STARTING and become READY after a cold start drawn from a lognormal with the
profile's mean and p90 (seeded). With a node pool (``warm_nodes``), a pod first needs a GPU node: one
of the ``warm_nodes`` kept ready, or one freed by a pod that left less than ``node_idle_s`` ago (the
cluster autoscaler's scale-down delay); otherwise a new node is provisioned, which takes
``node_provision_s`` before the pod's cold start even begins. Without a pool every pod has a node.

Routing (``routing``), per request at its arrival:
- ``random``: uniform over ready pods — a ClusterIP Service (kube-proxy iptables/IPVS picks a backend
  at random per connection);
- ``round-robin``: cyclic over ready pods — IPVS ``rr`` or a plain L7 proxy;
- ``least-loaded``: the ready pod with the fewest requests in flight (routed, not finished: waiting +
  running), ties to the lowest index — an inference gateway (Gateway API Inference Extension endpoint
  picker, llm-d, vLLM's router), which tracks what it sent.
Least-loaded needs each pod's state at the moment of arrival, so arrivals are routed in slices of
``route_quantum_s`` with the pods advanced to each slice first; the other two do not look at state.

Scale-down picks victims as a ReplicaSet does: pods without a node, then not-ready pods, then the
newest; a victim stops receiving traffic at once (it leaves the Service endpoints), finishes what it
holds for up to ``grace_s`` (terminationGracePeriodSeconds), and whatever is still in flight then is
cut. A pod holds its GPUs, and is billed, from creation (node provisioning included) until it is gone.

Finished requests are handed to the caller through ``finished`` (drain it after each ``advance``):
the fleet keeps no per-request history.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from keda_llm_scaler.sim.profiles import Profile
from keda_llm_scaler.sim.replica import Request, SimReplica

__all__ = ["DRAINING", "READY", "ROUTINGS", "STARTING", "Fleet", "Pod", "lognormal_params"]

STARTING: Final = "starting"
READY: Final = "ready"
DRAINING: Final = "draining"
GONE: Final = "gone"
ROUTINGS: Final = ("least-loaded", "round-robin", "random")
_Z90: Final = 1.2815515655446004


def lognormal_params(mean: float, p90: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with this mean and 90th percentile."""
    ratio = max(p90 / mean, 1.0 + 1e-9)
    disc = _Z90**2 - 2 * math.log(ratio)
    sigma = _Z90 - math.sqrt(disc) if disc > 0 else _Z90
    return math.log(mean) - sigma**2 / 2, sigma


@dataclass
class Node:
    """A GPU node of the pool: there from ``ready_at``; a warm one never goes away, another is removed
    ``node_idle_s`` after it last held a pod."""

    ready_at: float
    warm: bool = False
    idle_since: float | None = None  # None while a pod holds it


@dataclass
class Pod:
    name: str
    replica: SimReplica
    created: float
    ready_at: float
    node_at: float  # when its node is there (created, unless it waits for a new node)
    cold_s: float = 0.0  # its cold start once on a node
    node: Node | None = None
    state: str = STARTING
    drain_deadline: float = math.inf
    gone_at: float | None = None

    def provisioning(self, now: float) -> bool:
        return self.state == STARTING and self.node_at > now


@dataclass
class Fleet:
    profile: Profile
    cold_start_mean_s: float
    cold_start_p90_s: float
    grace_s: float = 30.0
    max_queue: int | None = None
    seed: int = 0
    routing: str = "round-robin"
    route_quantum_s: float = 0.05  # finer changes TTFT p95 by < 1 % against a per-arrival router
    warm_nodes: int | None = None  # None: a node is always there
    node_provision_s: float = 0.0
    node_idle_s: float = 600.0
    pods: list[Pod] = field(default_factory=list)
    finished: list[Request] = field(default_factory=list)
    streams_cut: int = 0
    tokens_lost: int = 0  # output tokens generated for cut requests (the user saw a truncated answer)
    gpu_seconds: float = 0.0
    _backlog: deque[Request] = field(default_factory=deque)  # arrivals while no pod is ready (router holds them)
    _rr: int = 0
    _count: int = 0

    def __post_init__(self) -> None:
        if self.routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, not {self.routing!r}")
        self._rng = random.Random(self.seed)
        self._route_rng = random.Random(self.seed + 7919)
        self._mu, self._sigma = (
            lognormal_params(self.cold_start_mean_s, self.cold_start_p90_s)
            if self.cold_start_mean_s > 0
            else (0.0, 0.0)
        )
        self._live: list[Pod] = []
        self._ready: list[Pod] = []
        self._nodes: list[Node] = [Node(0.0, warm=True, idle_since=0.0) for _ in range(self.warm_nodes or 0)]

    # -- views -----------------------------------------------------------------------------------
    def live(self) -> list[Pod]:
        return self._live

    def with_state(self, state: str) -> list[Pod]:
        if state == READY:
            return self._ready
        return [p for p in self._live if p.state == state]

    def count(self, state: str) -> int:
        return len(self._ready) if state == READY else sum(1 for p in self._live if p.state == state)

    def provisioning(self, now: float) -> int:
        """Pods still waiting for a node."""
        return sum(1 for p in self._live if p.provisioning(now))

    @property
    def spec_replicas(self) -> int:
        """What the Deployment asks for: starting and ready pods (draining ones are on their way out)."""
        return sum(1 for p in self._live if p.state in (STARTING, READY))

    # -- nodes -----------------------------------------------------------------------------------
    def _take_node(self, now: float) -> Node | None:
        """A node for a new pod: an idle one (ready first), else one on its way, else a new one."""
        if self.warm_nodes is None:
            return None
        self._nodes = [
            n for n in self._nodes if n.warm or n.idle_since is None or n.idle_since + self.node_idle_s >= now
        ]  # the cluster autoscaler removed the rest
        idle = [n for n in self._nodes if n.idle_since is not None]
        if idle:
            node = min(idle, key=lambda n: (n.ready_at > now, n.ready_at))
        else:
            node = Node(now + self.node_provision_s)
            self._nodes.append(node)
        node.idle_since = None
        return node

    def _release_node(self, pod: Pod, now: float) -> None:
        node = pod.node
        if node is None:
            return
        pod.node = None
        # a pod still waiting for a slower node takes this one (the scheduler binds it here)
        waiting = [
            p
            for p in self._live
            if p.provisioning(now) and p.node is not None and p.node.ready_at > max(now, node.ready_at)
        ]
        if waiting:
            taker = min(waiting, key=lambda p: p.created)
            slower = taker.node
            assert slower is not None  # filtered above
            taker.node = node
            taker.node_at = max(now, node.ready_at)
            taker.ready_at = taker.node_at + taker.cold_s
            taker.replica.clock = taker.ready_at
            node = slower
        node.idle_since = max(now, node.ready_at)

    # -- control ---------------------------------------------------------------------------------
    def _cold_start(self) -> float:
        if self.cold_start_mean_s <= 0:
            return 0.0
        return self._rng.lognormvariate(self._mu, self._sigma)

    def add(self, now: float, *, ready: bool = False) -> Pod:
        """A new pod; ``ready`` skips node and cold start (initial fleets, the oracle)."""
        self._count += 1
        node = self._take_node(now)
        if ready and node is not None:
            node.ready_at = min(node.ready_at, now)  # the initial fleet runs on nodes that are there
        node_at = now if node is None else max(now, node.ready_at)
        delay = 0.0 if ready else self._cold_start()
        ready_at = node_at + delay
        pod = Pod(
            f"pod-{self._count}",
            SimReplica(self.profile, name=f"pod-{self._count}", max_queue=self.max_queue, start=ready_at),
            created=now,
            ready_at=ready_at,
            node_at=node_at,
            cold_s=delay,
            node=node,
            state=READY if ready else STARTING,
        )
        self.pods.append(pod)
        self._live.append(pod)
        if ready:
            self._ready.append(pod)
        return pod

    def scale_to(self, n: int, now: float) -> None:
        current = self.spec_replicas
        for _ in range(n - current):
            self.add(now)
        if n < current:
            # ReplicaSet victim order: unscheduled, then not ready, then the most recently created
            candidates = sorted(
                (p for p in self._live if p.state in (STARTING, READY)),
                key=lambda p: (not p.provisioning(now), p.state == READY, -p.created),
            )
            for pod in candidates[: current - n]:
                if pod.state == STARTING:
                    self._gone(pod, now)
                else:
                    pod.state = DRAINING
                    pod.drain_deadline = now + self.grace_s
                    self._ready.remove(pod)

    def _gone(self, pod: Pod, now: float) -> None:
        cut = pod.replica.cut_all(now)
        self.finished.extend(cut)
        self.streams_cut += len(cut)
        self.tokens_lost += sum(r.generated for r in cut)
        if pod.state == READY:
            self._ready.remove(pod)
        pod.state = GONE
        pod.gone_at = now
        self._live.remove(pod)
        self._release_node(pod, now)

    def take_backlog(self) -> list[Request]:
        """What the router still holds (no pod was ever ready for it)."""
        held = list(self._backlog)
        self._backlog.clear()
        return held

    # -- routing ---------------------------------------------------------------------------------
    def _assign(self, requests: Sequence[Request]) -> None:
        now = requests[0].arrival if requests else 0.0
        ready = self._ready
        n = len(ready)
        if self.routing == "round-robin":
            per_pod: list[list[Request]] = [[] for _ in ready]
            for r in requests:
                per_pod[self._rr % n].append(r)
                self._rr += 1
        elif self.routing == "random":
            per_pod = [[] for _ in ready]
            rnd = self._route_rng.random
            for r in requests:
                per_pod[int(rnd() * n)].append(r)
        else:
            per_pod = [[] for _ in ready]
            # (in flight, index) heap: fewest in flight first, ties to the lowest index
            heap = [(p.replica.in_flight_at(now), k) for k, p in enumerate(ready)]
            heapq.heapify(heap)
            for r in requests:
                load, k = heap[0]
                per_pod[k].append(r)
                heapq.heapreplace(heap, (load + 1, k))
        for pod, batch in zip(ready, per_pod, strict=True):
            if batch:
                pod.replica.submit(batch)

    def route(self, requests: Sequence[Request]) -> None:
        """Hand arrivals to ready pods; held by the router while none is ready."""
        self._backlog.extend(requests)
        if self._ready and self._backlog:
            self._assign(self.take_backlog())

    # -- time ------------------------------------------------------------------------------------
    def step(self, t: float, dt: float, arrivals: Sequence[Request]) -> None:
        """Route ``arrivals`` (all in (t-dt, t]) and move every pod to ``t``."""
        if self.routing != "least-loaded" or not arrivals:
            self.route(arrivals)
            self.advance(t, dt)
            return
        # state-dependent routing: advance the ready pods to each slice before routing into it
        start = t - dt
        times = [r.arrival for r in arrivals]
        slices = max(1, math.ceil(dt / self.route_quantum_s))
        lo = 0
        for s in range(1, slices + 1):
            edge = t if s == slices else start + s * dt / slices
            hi = bisect.bisect_left(times, edge, lo) if s < slices else len(arrivals)
            if hi > lo:
                slice_start = times[lo]
                for pod in self._ready:
                    pod.replica.advance(slice_start)
                self.route(arrivals[lo:hi])
            lo = hi
        self.advance(t, dt)

    def advance(self, t: float, dt: float) -> None:
        """Move every pod to time ``t`` (the end of a tick of length ``dt``)."""
        for pod in list(self._live):
            self.gpu_seconds += self.profile.gpus * (t - max(t - dt, pod.created))
            if pod.state == STARTING and pod.ready_at <= t:
                pod.state = READY
                self._ready.append(pod)
            if pod.state in (READY, DRAINING):
                pod.replica.advance(t)
                if pod.replica.finished:
                    self.finished.extend(pod.replica.finished)
                    pod.replica.finished = []
            if pod.state == DRAINING and (pod.replica.in_flight() == 0 or t >= pod.drain_deadline):
                self._gone(pod, t)
        if self._backlog:
            self.route([])
