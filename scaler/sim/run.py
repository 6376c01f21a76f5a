"""One replay: a trace through a simulated fleet under one policy and the HPA. Deterministic per seed."""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from scaler.sim.fleet import DRAINING, READY, STARTING, Fleet
from scaler.sim.hpa import BEHAVIORS, Hpa
from scaler.sim.policies import OraclePolicy, Policy, make_policy
from scaler.sim.profiles import PROFILES, Profile
from scaler.sim.replica import REJECTED, Request, SimReplica
from scaler.sim.trace import TraceRequest

__all__ = ["RunConfig", "RunResult", "add_ttft_p95", "capacity_at_slo", "percentile", "simulate"]

TICK_S = 1.0
TIMELINE_EVERY_S = 10.0


@dataclass(frozen=True)
class RunConfig:
    policy: str = "composite"
    knob: float | None = None
    profile: str = "70b-h100x4"
    slo_ttft_s: float = 2.0
    min_replicas: int = 1
    max_replicas: int = 64
    initial_replicas: int | None = None  # None: what the first five minutes need at SLO capacity
    cold_start_s: float | None = None  # mean; None = the profile's warm-node default
    grace_s: float = 30.0
    max_queue: int | None = None
    hpa_sync_s: float = 15.0
    hpa_behavior: str = "default"  # a key of BEHAVIORS; kaito keeps its own ±1 policies
    seed: int = 0


@dataclass
class RunResult:
    summary: dict[str, Any]
    timeline: list[dict[str, float | None]] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def capacity_at_slo(profile: Profile, trace: Sequence[TraceRequest], slo_ttft_s: float, *,
                    duration_s: float = 900.0, seed: int = 0) -> float:
    """The highest Poisson arrival rate (req/s) one replica serves with >= 99.9 % of TTFTs within the SLO,
    on this trace's token mix (bisection over short single-replica runs)."""
    rnd = random.Random(seed)
    mix = [(r.prompt, r.output) for r in rnd.sample(list(trace), min(len(trace), 4000))]

    def attained(rate: float) -> bool:
        rng = random.Random(seed + 1)
        rep = SimReplica(profile)
        t = 0.0
        reqs: list[Request] = []
        while t < duration_s:
            t += rng.expovariate(rate)
            p, o = mix[len(reqs) % len(mix)]
            reqs.append(Request(len(reqs), t, p, o))
        rep.submit(reqs)
        rep.advance(duration_s + 120)
        # judge the second half only: a KV pool fills slowly, and collapse shows late
        measured = [r for r in reqs if r.arrival > duration_s * 0.5]
        ok = sum(1 for r in measured if r.ttft is not None and r.ttft <= slo_ttft_s)
        return ok >= 0.999 * len(measured)

    lo, hi = 0.05, 1.0
    while attained(hi) and hi < 1e4:
        lo, hi = hi, hi * 2
    for _ in range(10):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if attained(mid) else (lo, mid)
    return lo


def _oracle_schedule(policy: OraclePolicy, trace: Sequence[TraceRequest], profile: Profile, cfg: RunConfig,
                     end: float) -> None:
    cap = capacity_at_slo(profile, trace, cfg.slo_ttft_s, seed=cfg.seed) * policy.knob
    # perfect foresight: each window gets enough replicas for its busiest 10 seconds
    fine = [0] * (int(end // 10.0) + 2)
    for r in trace:
        fine[int(r.t // 10.0)] += 1
    per_window = int(policy.window_s // 10.0)
    windows = math.ceil(end / policy.window_s) + 1
    policy.schedule = []
    for w in range(windows):
        peak = max(fine[w * per_window:(w + 1) * per_window] or [0]) / 10.0
        policy.schedule.append(max(cfg.min_replicas, min(cfg.max_replicas, math.ceil(peak / cap))))


def simulate(trace: Sequence[TraceRequest], cfg: RunConfig,
             progress: Callable[[float], None] | None = None) -> RunResult:
    profile = PROFILES[cfg.profile]
    policy: Policy = make_policy(cfg.policy, cfg.knob)
    end = trace[-1].t + 1.0 if trace else 0.0
    cold_mean = profile.cold_start_mean_s if cfg.cold_start_s is None else cfg.cold_start_s
    cold_p90 = cold_mean * profile.cold_start_p90_s / profile.cold_start_mean_s
    if isinstance(policy, OraclePolicy):
        cold_mean = cold_p90 = 0.0  # the bound: replicas are there the moment they are wanted
        _oracle_schedule(policy, trace, profile, cfg, end)
    fleet = Fleet(profile, cold_mean, cold_p90, grace_s=cfg.grace_s, max_queue=cfg.max_queue, seed=cfg.seed)
    if cfg.policy != "kaito":
        policy.behavior = BEHAVIORS[cfg.hpa_behavior]
    hpa = Hpa(cfg.min_replicas, cfg.max_replicas, policy.behavior)
    initial = policy.fixed_replicas(0.0) or cfg.initial_replicas
    if initial is None:  # every policy starts from the same steady state
        first = sum(1 for r in trace if r.t < 300.0) / min(300.0, end or 1.0)
        initial = math.ceil(first / capacity_at_slo(profile, trace, cfg.slo_ttft_s, seed=cfg.seed))
    initial = max(cfg.min_replicas, min(cfg.max_replicas, initial))
    for _ in range(initial):
        fleet.add(0.0, ready=True)
    hpa.warm_start(0.0, initial)

    requests = [Request(i, r.t, r.prompt, r.output) for i, r in enumerate(trace)]
    arrival_times = [r.arrival for r in requests]
    timeline: list[dict[str, float | None]] = []
    scale_events = 0
    max_spec = fleet.spec_replicas
    replica_seconds = 0.0
    next_sync = cfg.hpa_sync_s
    next_sample = 0.0
    next_progress = 0.0
    i = 0
    t = 0.0
    while t < end:
        t_next = min(end, t + TICK_S)
        j = bisect.bisect_left(arrival_times, t_next, lo=i)
        fleet.route(requests[i:j])
        i = j
        fleet.advance(t_next, t_next - t)
        replica_seconds += len(fleet.live()) * (t_next - t)
        t = t_next
        policy.observe(t, fleet)
        desired = fleet.spec_replicas
        fixed = policy.fixed_replicas(t)
        if fixed is not None:
            desired = fixed
        elif t + 1e-9 >= next_sync:
            next_sync += cfg.hpa_sync_s
            desired = hpa.decide(t, fleet.spec_replicas, len(fleet.with_state(READY)), policy.reading())
        if desired != fleet.spec_replicas:
            scale_events += 1
            if isinstance(policy, OraclePolicy):
                for _ in range(desired - fleet.spec_replicas):
                    fleet.add(t, ready=True)
                if desired < fleet.spec_replicas:
                    fleet.scale_to(desired, t)
            else:
                fleet.scale_to(desired, t)
        max_spec = max(max_spec, fleet.spec_replicas)
        if t + 1e-9 >= next_sample:
            next_sample += TIMELINE_EVERY_S
            lo = bisect.bisect_left(arrival_times, t - 60.0)
            timeline.append({
                "t": t,
                "load_rps": (bisect.bisect_left(arrival_times, t) - lo) / min(60.0, max(t, 1.0)),
                "ready": float(len(fleet.with_state(READY))),
                "starting": float(len(fleet.with_state(STARTING))),
                "draining": float(len(fleet.with_state(DRAINING))),
                "metric": policy.value,
            })
        if progress is not None and t >= next_progress:
            next_progress += end / 50
            progress(t / end)
    gpu_hours = fleet.gpu_seconds / 3600.0
    # Let what is in flight finish (not billed), so late requests are judged on their TTFT.
    tail = end
    while tail < end + 600 and any(p.replica.in_flight() for p in fleet.live()):
        tail += 5.0
        fleet.advance(tail, 5.0)
    with_ttft = [r.ttft for r in requests if r.ttft is not None]
    met = sum(1 for r in requests if r.ttft is not None and r.ttft <= cfg.slo_ttft_s)
    add_ttft_p95(timeline, requests)
    summary = {
        "policy": cfg.policy,
        "knob": policy.knob_name,
        "knob_value": policy.knob,
        "profile": cfg.profile,
        "requests": len(requests),
        "slo_ttft_s": cfg.slo_ttft_s,
        "slo_attainment": met / len(requests) if requests else 1.0,
        "ttft_p50_s": percentile(with_ttft, 0.50),
        "ttft_p95_s": percentile(with_ttft, 0.95),
        "ttft_p99_s": percentile(with_ttft, 0.99),
        "failed": sum(1 for r in requests if r.ttft is None),
        "rejected": sum(1 for r in requests if r.state == REJECTED),
        "gpu_hours": gpu_hours,
        "mean_replicas": replica_seconds / end if end else 0.0,
        "max_replicas": max_spec,
        "scale_events": scale_events,
        "streams_cut": len(fleet.cut),
        "preemptions": sum(p.replica.preemptions_total for p in fleet.pods),
        "duration_s": end,
        "config": asdict(cfg),
    }
    return RunResult(summary, timeline, requests)


def add_ttft_p95(timeline: list[dict[str, float | None]], requests: Sequence[Request]) -> None:
    """p95 TTFT of the requests that arrived in the minute before each timeline point (a miss without a
    first token counts as +inf)."""
    arrivals = [r.arrival for r in requests]
    for point in timeline:
        t = float(point["t"] or 0.0)
        lo, hi = bisect.bisect_left(arrivals, t - 60.0), bisect.bisect_left(arrivals, t)
        window = [r.ttft if r.ttft is not None else math.inf for r in requests[lo:hi]]
        point["ttft_p95_s"] = percentile(window, 0.95)
