"""A fleet of pools through the simulator: one model on several Deployments (a reserved baseline and burst
pools, each of its own replica type), behind one gateway, each scaled by its own ScaledObject whose
composite is its share of the fleet's demand (``keda_llm_scaler.pools.split``, the scaler's own code).

Per pool: a ``SimulatedFleet`` of its profile, the composite scored on its own replicas (its own
``FleetState``: capacity is learned per pool), an HPA bounded by the pool's size (reserved) or max
(burst), and KEDA's activation for a pool that may sit at zero (``min: 0``, the burst default): the
first replica when its share turns positive (at KEDA's polling interval), zero after ``cooldownPeriod``
of a zero share. The gateway sends each request to the ready pod with the fewest requests in flight,
whatever its pool. A spot reclaim (``spotReclaimPerHour``, per replica) kills a pod at once, cutting
what it holds; its ReplicaSet recreates it, which waits for a new node (``nodeProvisionSeconds``)
and a cold start.

Cost: a reserved pool costs its size for the whole run, used or not; a burst pool costs the replicas
it runs, from creation (node provisioning and start-up included) until they are gone.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import yaml

from keda_llm_scaler.pools import BURST, RESERVED, PoolReading, PoolSpec, pool_reading, split
from keda_llm_scaler.sim.fleet import READY, STARTING, SimulatedFleet
from keda_llm_scaler.sim.hpa import AVERAGE_VALUE, BEHAVIORS, Hpa, MetricReading
from keda_llm_scaler.sim.policies import CompositePolicy, make_policy
from keda_llm_scaler.sim.profiles import Profile, get_profile
from keda_llm_scaler.sim.replica import Request
from keda_llm_scaler.sim.run import (
    TICK_S,
    TIMELINE_EVERY_S,
    RunConfig,
    RunResult,
    _Accumulator,
    _arrivals,
    capacity_at_slo,
)
from keda_llm_scaler.sim.workload import Workload

__all__ = ["PoolConfig", "load_pools", "plan_reserved", "simulate_pools"]

KEDA_POLLING_S: Final = 30.0  # pollingInterval: how often KEDA asks IsActive of a pool at zero
KEDA_COOLDOWN_S: Final = 300.0  # cooldownPeriod: inactive this long before a pool goes to zero
ROUTE_QUANTUM_S: Final = 0.05
_KEYS: Final = {
    "name",
    "profile",
    "tier",
    "size",
    "max",
    "min",
    "costPerHour",
    "coldStart",
    "nodeProvisionSeconds",
    "spotReclaimPerHour",
    "targetUtilization",
}


@dataclass(frozen=True)
class PoolConfig:
    name: str
    profile: str
    tier: int  # 0 reserved, >= 1 burst (filled in order)
    size: int  # reserved: its size; burst: its max
    cost_per_hour: float
    min_replicas: int | None = None  # None: a reserved pool runs whole (its size), a burst pool may sit at 0
    cold_start_s: float | None = None  # mean; None: the profile's
    node_provision_s: float | None = None  # None: a node is always there
    spot_reclaim_per_hour: float = 0.0  # per replica
    target_utilization: float | None = None  # the pool's trigger key; None: --knob, else the default

    @property
    def low(self) -> int:
        """The pool's minReplicaCount: a reservation is paid for whether it serves or not, so by default it
        runs whole; a burst pool may sit at zero. ``min`` lets a reserved pool scale (to free its GPUs)."""
        if self.min_replicas is not None:
            return min(self.min_replicas, self.size)
        return self.size if self.tier == 0 else 0

    @property
    def spec(self) -> PoolSpec:
        return PoolSpec("replay", self.name, self.tier, self.size, self.cost_per_hour)


def _number(item: dict[str, Any], key: str, where: str, *, integer: bool = False, default: Any = None) -> Any:
    raw = item.get(key, default)
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw) or raw < 0:
        raise ValueError(f"{where}: {key} must be a number >= 0, not {raw!r}")
    if integer and raw != int(raw):
        raise ValueError(f"{where}: {key} must be a whole number of replicas, not {raw!r}")
    return int(raw) if integer else float(raw)


def _utilization(item: dict[str, Any], where: str) -> float | None:
    raw = _number(item, "targetUtilization", where)
    if raw is not None and not 0.05 <= raw <= 1.0:
        raise ValueError(f"{where}: targetUtilization must be within [0.05, 1], not {raw!r}")
    return None if raw is None else float(raw)


def load_pools(path: Path) -> list[PoolConfig]:
    """The pools of a ``--pools`` file; ValueError naming the pool and key on anything wrong."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not YAML ({exc})") from None
    if isinstance(data, dict) and "pools" in data:
        data = data["pools"]
    if not isinstance(data, list) or not data:
        raise ValueError(f"{path}: want a list of pools")
    pools: list[PoolConfig] = []
    for k, item in enumerate(data):
        where = f"{path}: pool {k + 1}"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: want a mapping")
        unknown = sorted(set(item) - _KEYS)
        if unknown:
            raise ValueError(f"{where}: unknown keys {', '.join(unknown)} (known: {', '.join(sorted(_KEYS))})")
        name = str(item.get("name", "")).strip()
        if not name:
            raise ValueError(f"{where}: name is required")
        where = f"{path}: pool {name!r}"
        tier_raw = str(item.get("tier", "")).strip().lower()
        if tier_raw not in (RESERVED, BURST) and not tier_raw.isdigit():
            raise ValueError(f"{where}: tier must be reserved, burst or an order number, not {item.get('tier')!r}")
        tier = 0 if tier_raw == RESERVED else 1 if tier_raw == BURST else int(tier_raw)
        get_profile(str(item.get("profile", "")))  # ValueError naming the profile
        size_key = "size" if tier == 0 else "max"
        size = _number(item, size_key, where, integer=True)
        if size is None or size < 1:
            raise ValueError(f"{where}: {size_key} is required (a whole number >= 1) for a {tier_raw} pool")
        other = "max" if tier == 0 else "size"
        if other in item:
            raise ValueError(f"{where}: a {'reserved' if tier == 0 else 'burst'} pool takes {size_key}, not {other}")
        cost = _number(item, "costPerHour", where)
        if cost is None:
            raise ValueError(f"{where}: costPerHour is required")
        low = _number(item, "min", where, integer=True)
        if low is not None and low > size:
            raise ValueError(f"{where}: min {low} is above its {size_key} {size}")
        pools.append(
            PoolConfig(
                name=name,
                profile=str(item["profile"]),
                tier=tier,
                size=size,
                cost_per_hour=cost,
                min_replicas=low,
                cold_start_s=_number(item, "coldStart", where),
                node_provision_s=_number(item, "nodeProvisionSeconds", where),
                spot_reclaim_per_hour=_number(item, "spotReclaimPerHour", where, default=0.0),
                target_utilization=_utilization(item, where),
            )
        )
    names = [p.name for p in pools]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: pool names repeat")
    if sum(1 for p in pools if p.tier == 0) > 1:
        raise ValueError(f"{path}: at most one reserved pool")
    if not any(p.tier == 0 for p in pools) or len(pools) < 2:
        raise ValueError(f"{path}: want one reserved pool and at least one burst pool")
    return sorted(pools, key=lambda p: (p.tier, p.name))


@dataclass
class _Pool:
    cfg: PoolConfig
    profile: Profile
    fleet: SimulatedFleet
    policy: CompositePolicy
    hpa: Hpa
    capacity_rps: float  # at the SLO on the workload's mix: the initial sizing only, never the split's
    share: float | None = None
    inactive_since: float | None = None
    next_poll: float = 0.0
    max_spec: int = 0
    reclaims: int = 0
    gpu_seconds_at_warmup: float | None = None
    known_unit_rps: float | None = None
    rng: random.Random = field(default_factory=random.Random)

    def reading(self) -> PoolReading:
        c = self.policy.last
        reading = pool_reading(
            self.cfg.spec,
            c,
            self.policy.params.target_utilization,
            self.fleet.count(READY) + self.fleet.count(STARTING),  # members, as discovery counts them
            self.known_unit_rps,
        )
        if c is not None and c.demand is not None and c.demand.capacity_rps is not None:
            self.known_unit_rps = reading.unit_rps  # kept for when the pool is at zero (as the server keeps it)
        return reading


def _route(pools: Sequence[_Pool], backlog: deque[Request], t: float, dt: float, arrivals: Sequence[Request]) -> None:
    """The gateway: each request to the ready pod with the fewest in flight, across every pool (held while
    no pod is ready anywhere), in slices of ROUTE_QUANTUM_S with the pods advanced to each slice."""
    start = t - dt
    times = [r.arrival for r in arrivals]
    slices = max(1, math.ceil(dt / ROUTE_QUANTUM_S))
    lo = 0
    for s in range(1, slices + 1):
        edge = t if s == slices else start + s * dt / slices
        hi = bisect.bisect_left(times, edge, lo) if s < slices else len(arrivals)
        backlog.extend(arrivals[lo:hi])
        lo = hi
        ready = [pod for p in pools for pod in p.fleet.with_state(READY)]
        if not backlog or not ready:
            continue
        now = backlog[0].arrival
        for pod in ready:
            pod.replica.advance(now)
        heap = [(pod.replica.in_flight_at(now), k) for k, pod in enumerate(ready)]
        heapq.heapify(heap)
        per_pod: list[list[Request]] = [[] for _ in ready]
        while backlog:
            load, k = heap[0]
            per_pod[k].append(backlog.popleft())
            heapq.heapreplace(heap, (load + 1, k))
        for pod, batch in zip(ready, per_pod, strict=True):
            if batch:
                pod.replica.submit(batch)


def _initial(pools: Sequence[_Pool], first_rps: float) -> list[int]:
    """Each pool's starting size: the first five minutes' rate at SLO capacity, reserved pool first."""
    left = first_rps
    sizes = []
    for p in pools:
        n = min(p.cfg.size, math.ceil(left / p.capacity_rps - 1e-9)) if left > 0 else 0
        n = max(p.cfg.low, n)
        sizes.append(n)
        left = max(0.0, left - n * p.capacity_rps)
    return sizes


def _reclaim(p: _Pool, t: float, dt: float) -> None:
    rate = p.cfg.spot_reclaim_per_hour
    if rate <= 0:
        return
    chance = 1.0 - math.exp(-rate * dt / 3600.0)
    for pod in [pod for pod in p.fleet.live() if pod.state in (READY, STARTING)]:
        if p.rng.random() < chance:
            pod.node = None  # the node went with it
            p.fleet._gone(pod, t)
            p.fleet.add(t)  # the ReplicaSet makes another one, which needs a node again
            p.reclaims += 1


def simulate_pools(
    workload: Workload,
    pool_cfgs: Sequence[PoolConfig],
    cfg: RunConfig,
    progress: Callable[[float], None] | None = None,
) -> RunResult:
    mix = tuple(workload.token_mix(4000, cfg.seed))
    behavior = BEHAVIORS[cfg.hpa_behavior]
    pools: list[_Pool] = []
    for k, pc in enumerate(pool_cfgs):
        profile = get_profile(pc.profile)
        cold = profile.cold_start_mean_s if pc.cold_start_s is None else pc.cold_start_s
        fleet = SimulatedFleet(
            profile,
            cold,
            cold * profile.cold_start_p90_s / profile.cold_start_mean_s,
            grace_s=cfg.grace_s,
            max_queue=cfg.max_queue,
            seed=cfg.seed + 1009 * k,
            warm_nodes=None if pc.node_provision_s is None else 0,
            node_provision_s=pc.node_provision_s or 0.0,
        )
        policy = make_policy(
            "composite",
            pc.target_utilization if pc.target_utilization is not None else cfg.knob,
            ttft_slo_s=cfg.slo_ttft_s if cfg.composite_slo else None,
            itl_slo_s=cfg.slo_itl_s if cfg.composite_slo else None,
        )
        assert isinstance(policy, CompositePolicy)
        hpa = Hpa(max(1, pc.low), pc.size, behavior)
        cap = capacity_at_slo(profile, mix, cfg.slo_ttft_s, seed=cfg.seed)
        pools.append(_Pool(pc, profile, fleet, policy, hpa, cap, rng=random.Random(f"reclaim:{cfg.seed}:{pc.name}")))
    end = workload.duration_s
    if cfg.warmup_s >= end:
        raise ValueError(f"--warmup {cfg.warmup_s:g} s is not shorter than the replay ({end:g} s): nothing would count")
    first = sum(1 for r in workload.requests() if r.t < 300.0) / min(300.0, end or 1.0)
    for p, n in zip(pools, _initial(pools, first), strict=True):
        for _ in range(n):
            p.fleet.add(0.0, ready=True)
        if n:
            p.hpa.warm_start(0.0, n)
        p.max_spec = n
    acc = _Accumulator(cfg.slo_ttft_s, False, cfg.slo_itl_s, cfg.warmup_s)
    arrivals = _arrivals(workload)
    upcoming = next(arrivals, None)
    backlog: deque[Request] = deque()
    recent: deque[int] = deque(maxlen=int(60 / TIMELINE_EVERY_S))
    bin_count = requests_total = 0
    timeline: list[dict[str, float | None]] = []
    next_sync, next_sample, next_progress = cfg.hpa_sync_s, TIMELINE_EVERY_S, 0.0
    shares: dict[str, Any] = {}
    t = 0.0
    while t < end:
        t_next = min(end, t + TICK_S)
        batch: list[Request] = []
        while upcoming is not None and upcoming.arrival < t_next:
            batch.append(upcoming)
            upcoming = next(arrivals, None)
        requests_total += len(batch)
        bin_count += len(batch)
        acc.arrive(batch)
        _route(pools, backlog, t_next, t_next - t, batch)
        for p in pools:
            _reclaim(p, t_next, t_next - t)
            p.fleet.advance(t_next, t_next - t)
            for r in p.fleet.finished:
                acc.add(r)
            p.fleet.finished.clear()
        acc.settle()
        t = t_next
        sampled = False
        for p in pools:
            if p.gpu_seconds_at_warmup is None and t >= cfg.warmup_s:
                p.gpu_seconds_at_warmup = p.fleet.gpu_seconds
            before = p.policy._next
            p.policy.observe(t, p.fleet)
            sampled = sampled or p.policy._next != before
        if sampled:  # every pool's reading is its latest; the split is the scaler's, from all of them
            shares = split([p.reading() for p in pools])
            for p in pools:
                s = shares.get(p.cfg.name)
                p.share = None if s is None or not s.fresh else s.value
        _keda(pools, t)
        if t + 1e-9 >= next_sync:
            next_sync += cfg.hpa_sync_s
            for p in pools:
                current = p.fleet.spec_replicas
                if current == 0:
                    continue  # KEDA's activation decides (``_keda``)
                reading = None if p.share is None else MetricReading(AVERAGE_VALUE, p.share, 1.0)
                desired = p.hpa.decide(t, current, p.fleet.count(READY), reading)
                if p.cfg.low == 0 and p.inactive_since is not None and t - p.inactive_since >= KEDA_COOLDOWN_S:
                    desired = 0
                if desired != current:
                    p.fleet.scale_to(desired, t)
        for p in pools:
            p.max_spec = max(p.max_spec, p.fleet.spec_replicas)
        if t + 1e-9 >= next_sample or t >= end:
            next_sample += TIMELINE_EVERY_S
            recent.append(bin_count)
            bin_count = 0
            point: dict[str, float | None] = {
                "t": t,
                "load_rps": sum(recent) / min(60.0, max(t, 1.0)),
                "ready": float(sum(p.fleet.count(READY) for p in pools)),
                "desired": float(sum(p.fleet.spec_replicas for p in pools)),
            }
            for p in pools:
                point[f"ready:{p.cfg.name}"] = float(p.fleet.count(READY))
                point[f"desired:{p.cfg.name}"] = float(p.fleet.spec_replicas)
                point[f"share:{p.cfg.name}"] = p.share
            timeline.append(point)
            acc.point(point)
        if progress is not None and t >= next_progress:
            next_progress += end / 50
            progress(t / end)
    billed = {p.cfg.name: p.fleet.gpu_seconds for p in pools}  # letting what is in flight finish is not billed
    tail = end
    while tail < end + 600 and any(pod.replica.in_flight() for p in pools for pod in p.fleet.live()):
        tail += 5.0
        for p in pools:
            p.fleet.advance(tail, 5.0)
    leftovers: list[Request] = [*backlog]
    for p in pools:
        leftovers += [*p.fleet.finished, *p.fleet.take_backlog()]
        for pod in p.fleet.live():
            leftovers.extend(pod.replica.cut_all(tail))
    for r in leftovers:
        acc.add(r)
    acc.settle(final=True)
    if progress is not None:
        progress(1.0)
    return RunResult(_summary(pools, billed, acc, cfg, end, requests_total, workload), timeline)


def _keda(pools: Sequence[_Pool], t: float) -> None:
    """KEDA for pools that may sit at zero: activate on a positive share (polled), note when it went to 0."""
    for p in pools:
        active = p.share is not None and p.share > 0
        if active:
            p.inactive_since = None
        elif p.share is not None and p.inactive_since is None:
            p.inactive_since = t
        if p.fleet.spec_replicas == 0 and t + 1e-9 >= p.next_poll:
            p.next_poll = t + KEDA_POLLING_S
            if active:
                p.fleet.scale_to(1, t)
                p.hpa.warm_start(t, 1)


def _pool_cost(p: _Pool, gpu_seconds: float, hours: float) -> float:
    """A reserved pool: its size for every hour, used or not; a burst pool: the replica-hours it ran."""
    if p.cfg.tier == 0:
        return p.cfg.size * p.cfg.cost_per_hour * hours
    return gpu_seconds / p.profile.gpus / 3600.0 * p.cfg.cost_per_hour


def _summary(
    pools: Sequence[_Pool],
    billed: dict[str, float],
    acc: _Accumulator,
    cfg: RunConfig,
    end: float,
    requests_total: int,
    workload: Workload,
) -> dict[str, Any]:
    whole: dict[str, Any] = {}
    after: dict[str, Any] = {}
    for p in pools:
        gpu_s = billed[p.cfg.name]
        at_warmup = gpu_s if p.gpu_seconds_at_warmup is None else p.gpu_seconds_at_warmup
        whole[p.cfg.name] = {
            "tier": p.cfg.spec.tier_name,
            "profile": p.cfg.profile,
            "size" if p.cfg.tier == 0 else "max": p.cfg.size,
            "gpu_hours": gpu_s / 3600.0,
            "replica_hours": gpu_s / p.profile.gpus / 3600.0,
            "cost": _pool_cost(p, gpu_s, end / 3600.0),
            "max_replicas": p.max_spec,
            "streams_cut": p.fleet.streams_cut,
            "spot_reclaims": p.reclaims,
            "capacity_rps": p.capacity_rps,
        }
        after[p.cfg.name] = {
            "gpu_hours": (gpu_s - at_warmup) / 3600.0,
            "replica_hours": (gpu_s - at_warmup) / p.profile.gpus / 3600.0,
            "cost": _pool_cost(p, gpu_s - at_warmup, max(0.0, end - cfg.warmup_s) / 3600.0),
        }
    counted = acc.summary()
    return {
        "policy": "composite",
        "pools": whole,
        "cost": math.fsum(v["cost"] for v in whole.values()),
        "gpu_hours": math.fsum(v["gpu_hours"] for v in whole.values()),
        "requests": requests_total,
        "slo_ttft_s": cfg.slo_ttft_s,
        "slo_attainment": counted["slo_attainment"],
        "ttft_p50_s": acc.ttft.quantile(0.50),
        "ttft_p95_s": acc.ttft.quantile(0.95),
        "ttft_p99_s": acc.ttft.quantile(0.99),
        "slo_itl_s": cfg.slo_itl_s,
        "itl_attainment": counted["itl_attainment"],
        "failed": acc.failed,
        "rejected": acc.rejected,
        "streams_cut": sum(p.fleet.streams_cut for p in pools),
        "spot_reclaims": sum(p.reclaims for p in pools),
        "duration_s": end,
        "after_warmup": {
            "warmup_s": cfg.warmup_s,
            "duration_s": max(0.0, end - cfg.warmup_s),
            **acc.after.summary(),
            "gpu_hours": math.fsum(v["gpu_hours"] for v in after.values()),
            "cost": math.fsum(v["cost"] for v in after.values()),
            "pools": after,
        },
        **workload.describe(),
        "config": {k: v for k, v in asdict(cfg).items() if k != "keep_requests"},
    }


def _plan_job(job: tuple[Workload, list[PoolConfig], RunConfig, int]) -> dict[str, Any]:
    workload, pool_cfgs, cfg, size = job
    pools = [replace(p, size=size) if p.tier == 0 else p for p in pool_cfgs]
    s = simulate_pools(workload, pools, cfg).summary
    w = s["after_warmup"]
    return {
        "reserved_size": size,
        "slo_attainment": w["slo_attainment"],
        "cost": w["cost"],
        "gpu_hours": w["gpu_hours"],
        "pools": w["pools"],
        "whole_run": {"slo_attainment": s["slo_attainment"], "cost": s["cost"], "gpu_hours": s["gpu_hours"]},
    }


def plan_reserved(
    workload: Workload,
    pool_cfgs: Sequence[PoolConfig],
    cfg: RunConfig,
    sizes: tuple[int, int],
    target: float,
    *,
    workers: int = 2,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Replay the workload with the reserved pool at each size in ``sizes`` (inclusive): the cost curve
    after the warm-up, and ``reserved_size``, the cheapest size whose attainment after the warm-up reaches
    ``target`` (the smaller on a tie; None when none does). Each run is the same seed and day: only the
    reservation moves."""
    lo, hi = sizes
    if lo < 1:
        raise ValueError("--plan-reserved: the reserved pool's size starts at 1")
    jobs = [(workload, list(pool_cfgs), cfg, n) for n in range(lo, hi + 1)]
    rows: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max_workers=max(1, min(workers, len(jobs)))) as executor:
        futures = [executor.submit(_plan_job, job) for job in jobs]
        for n, future in enumerate(as_completed(futures), start=1):
            row = future.result()
            rows.append(row)
            if progress is not None:
                progress(
                    f"plan {n}/{len(jobs)}: reserved {row['reserved_size']} -> {row['slo_attainment']:.2%}, "
                    f"cost {row['cost']:.2f}"
                )
    rows.sort(key=lambda r: r["reserved_size"])
    meeting = [r for r in rows if r["slo_attainment"] >= target]
    best = min(meeting, key=lambda r: (r["cost"], r["reserved_size"])) if meeting else None
    return {
        "target_attainment": target,
        "warmup_s": cfg.warmup_s,
        "curve": rows,
        "reserved_size": None if best is None else best["reserved_size"],
        "cost": None if best is None else best["cost"],
    }
