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

Scale-down picks victims as a ReplicaSet does (``ActivePodsWithRanks.Less`` in Kubernetes'
``controller_utils.go``, with LogarithmicScaleDown, GA since 1.31), the first of these that differs:

1. a pod without a node (still provisioning) before one with a node;
2. (phase, Pending before Running: not modelled apart from 1 and 3);
3. a pod not ready (STARTING) before a ready one;
4. the lower ``controller.kubernetes.io/pod-deletion-cost`` (absent or invalid: 0);
5. (pods doubled up on a node: not modelled, each pod has its own node);
6. between ready pods whose ready times differ: the ready duration's log2 bucket,
   ``int(log2(nanoseconds since ready))``, younger bucket first; in the same bucket, by pod UID;
7. (container restarts: none here);
8. creation times that differ: the same log2 bucket of the age, then the UID. Pods alike in all of
   that are unordered in Kubernetes (the informer's listing order decides); here the UID decides too.

Timestamps are compared as the API stores them, in whole seconds (``metav1.Time`` drops the rest); the
present moment has nanoseconds. Each pod gets a random UID at creation, from an RNG of its own (seeded
from ``seed``: the cold start and routing streams do not move), so ties fall at random but the same way
for the same seed.

``victims`` says who writes the cost: ``random`` (the default) is the ReplicaSet's own semi-random choice,
nobody annotates pods, every cost reads 0, so the youngest log2 bucket loses a pod picked by UID, often one
holding live streams; ``ranked`` reads the costs in ``Pod.annotations``, which the scaler's victim ranker
keeps current from the scraped load (``keda_llm_scaler.sim.ranker``), so the least busy pod goes first.

A victim stops receiving traffic at once (it leaves the Service endpoints), finishes what it holds for up
to ``grace_s`` (terminationGracePeriodSeconds), and whatever is still in flight then is cut. Each
``scale_to`` that removes pods is one ``ScaleDown`` in ``scale_downs``; the streams cut on a victim and
their tokens are counted on the event that chose it. A pod holds its GPUs, and is billed, from creation
(node provisioning included) until it is gone.

Finished requests are handed to the caller through ``finished`` (drain it after each ``advance``):
the fleet keeps no per-request history.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import math
import random
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from keda_llm_scaler.sim.profiles import Profile
from keda_llm_scaler.sim.replica import Request, SimReplica
from keda_llm_scaler.victims import ANNOTATION, effective, parse_cost

__all__ = [
    "DRAINING",
    "READY",
    "ROUTINGS",
    "STARTING",
    "VICTIMS",
    "Pod",
    "ScaleDown",
    "SimulatedFleet",
    "log2_bucket",
    "lognormal_params",
    "replicaset_less",
]

STARTING: Final = "starting"
READY: Final = "ready"
DRAINING: Final = "draining"
GONE: Final = "gone"
ROUTINGS: Final = ("least-loaded", "round-robin", "random")
VICTIMS: Final = ("random", "ranked")
_NS: Final = 1_000_000_000
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
class ScaleDown:
    """One ``scale_to`` that removed pods, and what it cost the users."""

    at: float
    removed: int = 0  # ready pods sent to drain
    idle: int = 0  # of those, holding no request when chosen
    not_ready: int = 0  # starting pods deleted at once (they hold nothing)
    streams_cut: int = 0  # requests still on this event's victims when their grace ran out
    tokens_lost: int = 0


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
    uid: str = ""
    annotations: dict[str, str] = field(default_factory=dict)
    scale_down: ScaleDown | None = None  # the event that chose it as a victim

    def provisioning(self, now: float) -> bool:
        return self.state == STARTING and self.node_at > now

    @property
    def deletion_cost(self) -> int:
        """The pod-deletion-cost as the ReplicaSet reads it (absent or not an int32: 0)."""
        return effective(parse_cost(self.annotations.get(ANNOTATION)))


def log2_bucket(since_s: float, now: float) -> int:
    """Kubernetes' ``logarithmicRankDiff`` rank of a timestamp: ``int(log2(ns from it to now))``, -1 when
    not in the past. The timestamp is whole seconds (as the API stores it), ``now`` has nanoseconds."""
    d = round(now * _NS) - math.floor(since_s + 1e-9) * _NS
    return int(math.log2(d)) if d > 0 else -1


def replicaset_less(a: Pod, b: Pod, now: float, *, costs: bool = True) -> bool:
    """``ActivePodsWithRanks.Less``: whether the ReplicaSet removes ``a`` before ``b`` (module docstring).
    ``costs=False``: every pod-deletion-cost reads 0 (nobody annotates)."""
    a_node, b_node = not a.provisioning(now), not b.provisioning(now)
    if a_node != b_node:
        return not a_node
    a_ready, b_ready = a.state == READY, b.state == READY
    if a_ready != b_ready:
        return not a_ready
    if costs and (ca := a.deletion_cost) != (cb := b.deletion_cost):
        return ca < cb
    if a_ready and b_ready and math.floor(a.ready_at + 1e-9) != math.floor(b.ready_at + 1e-9):
        diff = log2_bucket(a.ready_at, now) - log2_bucket(b.ready_at, now)
        return a.uid < b.uid if diff == 0 else diff < 0
    if math.floor(a.created + 1e-9) != math.floor(b.created + 1e-9):
        diff = log2_bucket(a.created, now) - log2_bucket(b.created, now)
        return a.uid < b.uid if diff == 0 else diff < 0
    return a.uid < b.uid  # Kubernetes: unordered (the informer's listing decides)


@dataclass
class SimulatedFleet:
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
    victims: str = "random"  # random: nobody writes pod-deletion-cost; ranked: Pod.annotations hold it
    pods: list[Pod] = field(default_factory=list)
    finished: list[Request] = field(default_factory=list)
    streams_cut: int = 0
    tokens_lost: int = 0  # output tokens generated for cut requests (the user saw a truncated answer)
    scale_downs: list[ScaleDown] = field(default_factory=list)
    gpu_seconds: float = 0.0
    _backlog: deque[Request] = field(default_factory=deque)  # arrivals while no pod is ready (router holds them)
    _rr: int = 0
    _count: int = 0

    def __post_init__(self) -> None:
        if self.routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, not {self.routing!r}")
        if self.victims not in VICTIMS:
            raise ValueError(f"victims must be one of {', '.join(VICTIMS)}, not {self.victims!r}")
        self._rng = random.Random(self.seed)
        self._route_rng = random.Random(self.seed + 7919)
        self._uid_rng = random.Random(f"pod-uid:{self.seed}")  # its own stream: cold starts and routing keep theirs
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
            uid=str(uuid.UUID(int=self._uid_rng.getrandbits(128), version=4)),
        )
        self.pods.append(pod)
        self._live.append(pod)
        if ready:
            self._ready.append(pod)
        return pod

    def victim_order(self, now: float) -> list[Pod]:
        """The starting and ready pods in the order the ReplicaSet would remove them."""
        costs = self.victims == "ranked"

        def cmp(a: Pod, b: Pod) -> int:
            if replicaset_less(a, b, now, costs=costs):
                return -1
            return 1 if replicaset_less(b, a, now, costs=costs) else 0

        return sorted((p for p in self._live if p.state in (STARTING, READY)), key=functools.cmp_to_key(cmp))

    def scale_to(self, n: int, now: float) -> ScaleDown | None:
        """Scale the Deployment to ``n`` pods; a scale-down returns its event (also in ``scale_downs``)."""
        current = self.spec_replicas
        for _ in range(n - current):
            self.add(now)
        if n >= current:
            return None
        event = ScaleDown(now)
        self.scale_downs.append(event)
        for pod in self.victim_order(now)[: current - n]:
            pod.scale_down = event
            if pod.state == STARTING:
                event.not_ready += 1
                self._gone(pod, now)
            else:
                event.removed += 1
                event.idle += pod.replica.in_flight() == 0
                if self.grace_s <= 0:
                    self._gone(pod, now)  # no drain: SIGTERM cuts what it holds at once
                    continue
                pod.state = DRAINING
                pod.drain_deadline = now + self.grace_s
                self._ready.remove(pod)
        return event

    def _gone(self, pod: Pod, now: float) -> None:
        cut = pod.replica.cut_all(now)
        self.finished.extend(cut)
        self.streams_cut += len(cut)
        lost = sum(r.generated for r in cut)
        self.tokens_lost += lost
        if pod.scale_down is not None:
            pod.scale_down.streams_cut += len(cut)
            pod.scale_down.tokens_lost += lost
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
