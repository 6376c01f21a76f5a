"""One replay: a workload through a simulated fleet under one policy and the HPA. Deterministic per seed.

Requests stream through: they are made from the workload as the clock reaches them and forgotten once
finished, so memory holds what is in flight plus fixed-size accumulators (a fine log histogram of
TTFT for the quantiles, coarse ones per 10 s for the timeline). ``keep_requests`` keeps them all.
"""

from __future__ import annotations

import bisect
import functools
import math
import random
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from keda_llm_scaler.sim.fleet import DRAINING, READY, STARTING, ScaleDown, SimulatedFleet
from keda_llm_scaler.sim.hpa import BEHAVIORS, Hpa
from keda_llm_scaler.sim.oracle import oracle_schedule
from keda_llm_scaler.sim.policies import CompositePolicy, OraclePolicy, Policy, make_policy
from keda_llm_scaler.sim.profiles import Profile, get_profile
from keda_llm_scaler.sim.ranker import Ranker
from keda_llm_scaler.sim.replica import REJECTED, Request, SimReplica
from keda_llm_scaler.sim.trace import TraceRequest
from keda_llm_scaler.sim.workload import TraceWorkload, Workload

__all__ = [
    "RunConfig",
    "RunResult",
    "TtftHistogram",
    "add_ttft_p95",
    "capacity_at_slo",
    "idle_ttfts",
    "percentile",
    "scale_down_summary",
    "simulate",
]

TICK_S: Final = 1.0
TIMELINE_EVERY_S: Final = 10.0
# a scaler pod replaced (killed, rescheduled, ready): KEDA's calls fail meanwhile and the HPA holds
RESTART_OUTAGE_S: Final = 10.0
RESTART_WINDOW_S: Final = 900.0  # after_restart: the requests that arrived within this of the restart
# capacity: the rate at which a replica still serves this share of the requests an idle replica serves in
# time. Mixes with a sharp knee (the conversation mix: 100 % at 14 req/s, 0 % at 15) give the same rate
# as a 99.9 % rule within 2 %; mixes with head-of-line blocking (long prompts: attainment falls a point
# per 0.05 req/s from zero load) give their knee instead of a near-zero rate.
ATTAINMENT_OF_REACHABLE: Final = 0.95
MIN_MEASURED: Final = 2000  # requests per capacity probe, however low the rate


@dataclass(frozen=True)
class RunConfig:
    policy: str = "composite"
    knob: float | None = None
    profile: str = "70b-h100x4"
    slo_ttft_s: float = 2.0
    # the decode SLO: a request meets it when its mean gap between tokens (its TPOT) is at most this; None:
    # not measured against one (the per-request gaps are still reported)
    slo_itl_s: float | None = None
    min_replicas: int = 1
    max_replicas: int = 64
    initial_replicas: int | None = None  # None: what the first five minutes need at SLO capacity
    cold_start_s: float | None = None  # mean; None = the profile's warm-node default
    grace_s: float = 30.0
    max_queue: int | None = None
    hpa_sync_s: float = 15.0
    hpa_behavior: str = "default"  # a key of BEHAVIORS; kaito keeps its own ±1 policies
    routing: str = "least-loaded"
    victims: str = "random"  # scale-down victims: random (the ReplicaSet alone) or ranked (pod-deletion-cost)
    warm_nodes: int | None = None  # None: every pod finds a node at once
    node_provision_s: float = 0.0
    seed: int = 0
    # the composite is given slo_ttft_s as ttftSloSeconds (and slo_itl_s as itlSloSeconds), as a user with
    # an SLO would
    composite_slo: bool = True
    keep_requests: bool = False
    # attainment, GPU-hours (and cost) are also counted from this time on (``after_warmup``): the fleet
    # runs through it, but a start that no policy could know about does not count against it
    warmup_s: float = 0.0
    # the scaler restarts at this time (composite only): its memory is lost, and it is out for
    # RESTART_OUTAGE_S (the HPA holds, as on a metric it cannot read); with ``forget_state`` the new process
    # starts cold, else it reads what the old one persisted
    restart_at_s: float | None = None
    forget_state: bool = False


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


@functools.lru_cache(maxsize=8)
def _log_bounds(resolution: float, floor_s: float, top_s: float) -> tuple[float, ...]:
    n = math.ceil(math.log(top_s / floor_s) / math.log1p(resolution))
    return tuple(floor_s * (1 + resolution) ** k for k in range(n + 1))


class TtftHistogram:
    """TTFT counts in log buckets (ratio ``1 + resolution``, 0.1 ms to 3 h); quantiles within resolution/2,
    a request without a first token counts as +inf."""

    def __init__(self, resolution: float = 0.01, floor_s: float = 1e-4, top_s: float = 1e4) -> None:
        self._bounds = _log_bounds(resolution, floor_s, top_s)
        self.counts = [0] * (len(self._bounds) + 1)
        self.total = 0

    def add(self, ttft: float | None) -> None:
        self.total += 1
        self.counts[len(self._bounds) if ttft is None else bisect.bisect_left(self._bounds, ttft)] += 1

    @property
    def misses(self) -> int:
        return self.counts[-1]

    def merge(self, other: TtftHistogram) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.total += other.total

    def quantile(self, q: float) -> float | None:
        """Nearest rank, as ``percentile``; +inf when the rank falls among the misses."""
        if self.total == 0:
            return None
        rank = min(self.total, max(1, math.ceil(q * self.total)))
        seen = 0
        bounds = self._bounds
        for k, c in enumerate(self.counts):
            seen += c
            if seen >= rank:
                if k >= len(bounds):
                    return math.inf
                lower = bounds[k - 1] if k > 0 else 0.0
                return math.sqrt(lower * bounds[k]) if lower > 0 else bounds[k]  # the bucket's middle
        return math.inf


def idle_ttfts(profile: Profile, mix: Iterable[tuple[int, int]]) -> list[float]:
    """Each request's TTFT alone on an idle replica: the floor no scaling can improve."""
    out = []
    for p, o in mix:
        if p + o > profile.kv_tokens:
            out.append(math.inf)  # vLLM refuses it (longer than the model's context fits)
            continue
        rep = SimReplica(profile)
        req = Request(0, 0.0, p, o)
        rep.submit([req])
        horizon = 1.0
        while req.first_token_at is None:
            rep.advance(horizon)
            horizon *= 2
        out.append(req.first_token_at)
    return out


@functools.lru_cache(maxsize=64)
def _capacity_cached(
    profile: Profile, mix: tuple[tuple[int, int], ...], slo_ttft_s: float, duration_s: float, seed: int
) -> float:
    floor = idle_ttfts(profile, mix)
    reachable = [ttft <= slo_ttft_s for ttft in floor]
    if not any(reachable):
        raise ValueError(
            f"no request of this token mix has a first token within {slo_ttft_s:g} s even on an "
            f"idle {profile.name} replica: the SLO cannot be met"
        )

    def attained(rate: float) -> bool:
        rng = random.Random(seed + 1)
        rep = SimReplica(profile)
        t = 0.0
        reqs: list[Request] = []
        horizon = max(duration_s, MIN_MEASURED / rate)  # enough requests to judge, even at 0.1 req/s
        while t < horizon:
            t += rng.expovariate(rate)
            p, o = mix[len(reqs) % len(mix)]
            reqs.append(Request(len(reqs), t, p, o))
        rep.submit(reqs)
        rep.advance(horizon + 120)
        # judge the second half only: a KV pool fills slowly, and collapse shows late; judge only the
        # requests an idle replica serves in time (some prompts miss the SLO even alone)
        measured = [r for i, r in enumerate(reqs) if r.arrival > horizon * 0.5 and reachable[i % len(mix)]]
        ok = sum(1 for r in measured if r.ttft is not None and r.ttft <= slo_ttft_s)
        return ok >= ATTAINMENT_OF_REACHABLE * len(measured)

    lo, hi = 0.0, 1.0
    while attained(hi) and hi < 1e4:
        lo, hi = hi, hi * 2
    while lo == 0.0 and hi > 1e-3 and not attained(hi / 2):
        hi /= 2  # heavy mixes: below 0.5 req/s
    if lo == 0.0:
        lo = hi / 2
    for _ in range(10):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if attained(mid) else (lo, mid)
    return lo


def capacity_at_slo(
    profile: Profile,
    mix: Sequence[tuple[int, int]] | Sequence[TraceRequest],
    slo_ttft_s: float,
    *,
    duration_s: float = 900.0,
    seed: int = 0,
) -> float:
    """The highest Poisson arrival rate (req/s) at which one replica serves >= 95 % of the requests that an
    idle replica would serve within the SLO within it (see ATTAINMENT_OF_REACHABLE), on this token mix
    (bisection over short single-replica runs; cached). Measuring against what an idle replica reaches keeps the figure
    meaningful on mixes where some prompts miss the SLO even alone (long prompts)."""
    pairs = tuple((r.prompt, r.output) if isinstance(r, TraceRequest) else (int(r[0]), int(r[1])) for r in mix)
    if not pairs:
        raise ValueError("capacity needs a token mix")
    return _capacity_cached(profile, pairs, slo_ttft_s, duration_s, seed)


class _Counted:
    """The judged requests of a stretch of the run: how many, within the SLOs, their TTFT and gaps."""

    def __init__(self, slo_ttft_s: float, slo_itl_s: float | None) -> None:
        self.slo, self.slo_itl = slo_ttft_s, slo_itl_s
        self.ttft = TtftHistogram()
        # each streamed request's mean gap between tokens (TPOT); one that never finished its answer (cut,
        # refused, failed) counts as +inf: it did not get its tokens in time
        self.itl = TtftHistogram()
        self.met = self.itl_met = self.failed = self.rejected = 0

    def add(self, r: Request) -> None:
        self.ttft.add(r.ttft)
        if r.output > 1:  # a one-token answer has no gap
            tpot = request_tpot(r)
            self.itl.add(tpot)
            self.itl_met += tpot is not None and (self.slo_itl is None or tpot <= self.slo_itl)
        if r.ttft is None:
            self.failed += 1
            self.rejected += r.state == REJECTED
        elif r.ttft <= self.slo:
            self.met += 1

    def summary(self) -> dict[str, Any]:
        n = self.ttft.total
        return {
            "requests": n,
            "slo_attainment": self.met / n if n else 1.0,
            "ttft_p95_s": self.ttft.quantile(0.95),
            "itl_attainment": self.itl_met / self.itl.total if self.itl.total and self.slo_itl is not None else None,
            "failed": self.failed,
        }


class _Accumulator(_Counted):
    """What a finished request leaves behind: counts, TTFT histograms (whole run, per 10 s of arrival), and
    the same counts over the requests that arrived after the warm-up (``after``)."""

    def __init__(
        self,
        slo_ttft_s: float,
        keep: bool,
        slo_itl_s: float | None = None,
        warmup_s: float = 0.0,
        restart_at_s: float | None = None,
    ) -> None:
        super().__init__(slo_ttft_s, slo_itl_s)
        self.warmup_s = warmup_s
        self.after = _Counted(slo_ttft_s, slo_itl_s)
        self.restart_at_s = restart_at_s
        # the requests that arrived in the RESTART_WINDOW_S after a scaler restart
        self.around_restart = None if restart_at_s is None else _Counted(slo_ttft_s, slo_itl_s)
        self.by_bin: dict[int, TtftHistogram] = {}  # by 10 s of arrival, until no point needs it
        self.arrived: dict[int, int] = {}
        self._waiting_points: deque[dict[str, float | None]] = deque()
        self.kept: list[Request] | None = [] if keep else None

    def arrive(self, batch: Sequence[Request]) -> None:
        for r in batch:
            b = int(r.arrival // TIMELINE_EVERY_S)
            self.arrived[b] = self.arrived.get(b, 0) + 1

    def point(self, point: dict[str, float | None]) -> None:
        """A timeline point gets its TTFT p95 once every request of its minute has an answer."""
        self._waiting_points.append(point)
        self.settle()

    def _window(self, point: dict[str, float | None]) -> range:
        last = math.ceil(float(point["t"] or 0.0) / TIMELINE_EVERY_S) - 1
        return range(last - int(60 / TIMELINE_EVERY_S) + 1, last + 1)

    def settle(self, final: bool = False) -> None:
        while self._waiting_points:
            point = self._waiting_points[0]
            bins = self._window(point)
            if not final and any(
                self.by_bin[b].total < n if b in self.by_bin else n > 0 for b in bins if (n := self.arrived.get(b, 0))
            ):
                return
            window = TtftHistogram(resolution=0.05)
            for b in bins:
                if b in self.by_bin:
                    window.merge(self.by_bin[b])
            point["ttft_p95_s"] = window.quantile(0.95)
            self._waiting_points.popleft()
            # the next point's minute starts one bin later than this one's
            keep_from = self._window(self._waiting_points[0]).start if self._waiting_points else bins.start + 1
            for b in [b for b in self.by_bin if b < keep_from]:
                del self.by_bin[b]
                self.arrived.pop(b, None)

    def add(self, r: Request) -> None:
        super().add(r)
        if r.arrival >= self.warmup_s:
            self.after.add(r)
        start = self.restart_at_s
        if self.around_restart is not None and start is not None and start <= r.arrival < start + RESTART_WINDOW_S:
            self.around_restart.add(r)
        b = int(r.arrival // TIMELINE_EVERY_S)
        hist = self.by_bin.get(b)
        if hist is None:
            hist = self.by_bin[b] = TtftHistogram(resolution=0.05)
        hist.add(r.ttft)
        if self.kept is not None:
            self.kept.append(r)


def request_tpot(r: Request) -> float | None:
    """A finished request's mean gap between two of its tokens (None: it never finished its answer)."""
    if r.finished_at is None or r.first_token_at is None or r.output <= 1 or r.generated < r.output:
        return None
    return max(0.0, r.finished_at - r.first_token_at) / (r.output - 1)


def _arrivals(workload: Workload) -> Iterator[Request]:
    for rid, (t, p, o) in enumerate(workload.rows()):
        yield Request(rid, t, p, o)


def simulate(
    workload: Workload | Sequence[TraceRequest], cfg: RunConfig, progress: Callable[[float], None] | None = None
) -> RunResult:
    if not isinstance(workload, Workload):
        workload = TraceWorkload("trace", workload)
    profile = get_profile(cfg.profile)
    policy: Policy = make_policy(
        cfg.policy,
        cfg.knob,
        ttft_slo_s=cfg.slo_ttft_s if cfg.composite_slo else None,
        itl_slo_s=cfg.slo_itl_s if cfg.composite_slo else None,
    )
    end = workload.duration_s
    if cfg.restart_at_s is not None:
        if not isinstance(policy, CompositePolicy):
            raise ValueError(f"--restart-at: the {cfg.policy} policy keeps no learned state; only composite does")
        if not 0 < cfg.restart_at_s < end:
            raise ValueError(f"--restart-at {cfg.restart_at_s:g} s: not inside the replay (0-{end:g} s)")
    if cfg.warmup_s > 0 and cfg.warmup_s >= end:
        raise ValueError(f"--warmup {cfg.warmup_s:g} s is not shorter than the replay ({end:g} s): nothing would count")
    cold_mean = profile.cold_start_mean_s if cfg.cold_start_s is None else cfg.cold_start_s
    cold_p90 = cold_mean * profile.cold_start_p90_s / profile.cold_start_mean_s
    oracle = isinstance(policy, OraclePolicy)
    mix = tuple(workload.token_mix(4000, cfg.seed))
    cap = capacity_at_slo(profile, mix, cfg.slo_ttft_s, seed=cfg.seed)
    if isinstance(policy, OraclePolicy):
        cold_mean = cold_p90 = 0.0  # the bound: replicas are there the moment they are wanted
        policy.schedule = oracle_schedule(
            workload.requests(),
            end,
            cap * policy.knob,
            cfg.slo_ttft_s,
            window_s=policy.window_s,
            min_replicas=cfg.min_replicas,
            max_replicas=cfg.max_replicas,
        )
    fleet = SimulatedFleet(
        profile,
        cold_mean,
        cold_p90,
        grace_s=cfg.grace_s,
        max_queue=cfg.max_queue,
        seed=cfg.seed,
        routing=cfg.routing,
        warm_nodes=None if oracle else cfg.warm_nodes,
        node_provision_s=cfg.node_provision_s,
        victims=cfg.victims,
    )
    ranker = Ranker() if cfg.victims == "ranked" else None
    if cfg.policy != "kaito":
        policy.behavior = BEHAVIORS[cfg.hpa_behavior]
    hpa = Hpa(cfg.min_replicas, cfg.max_replicas, policy.behavior)
    initial = policy.fixed_replicas(0.0) or cfg.initial_replicas
    if initial is None:  # every policy starts from the same steady state
        first = sum(1 for r in _take_until(workload.requests(), 300.0))
        initial = math.ceil(first / min(300.0, end or 1.0) / cap)
    initial = max(cfg.min_replicas, min(cfg.max_replicas, initial))
    for _ in range(initial):
        fleet.add(0.0, ready=True)
    hpa.warm_start(0.0, initial)

    acc = _Accumulator(cfg.slo_ttft_s, cfg.keep_requests, cfg.slo_itl_s, cfg.warmup_s, cfg.restart_at_s)
    scaler_down_until: float | None = None
    gpu_seconds_at_warmup: float | None = 0.0 if cfg.warmup_s <= 0 else None
    arrivals = _arrivals(workload)
    upcoming = next(arrivals, None)
    recent: deque[int] = deque(maxlen=int(60 / TIMELINE_EVERY_S))  # arrivals per 10 s, the last minute
    bin_count = 0
    timeline: list[dict[str, float | None]] = []
    scale_events = 0
    scale_downs = 0
    max_spec = fleet.spec_replicas
    replica_seconds = 0.0
    requests_total = 0
    next_sync = cfg.hpa_sync_s
    next_sample = TIMELINE_EVERY_S
    next_progress = 0.0
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
        fleet.step(t_next, t_next - t, batch)
        for r in fleet.finished:
            acc.add(r)
        fleet.finished.clear()
        acc.settle()
        replica_seconds += len(fleet.live()) * (t_next - t)
        t = t_next
        if gpu_seconds_at_warmup is None and t >= cfg.warmup_s:
            gpu_seconds_at_warmup = fleet.gpu_seconds
        if cfg.restart_at_s is not None and scaler_down_until is None and t >= cfg.restart_at_s:
            assert isinstance(policy, CompositePolicy)
            policy.restart(t, keep_state=not cfg.forget_state)
            scaler_down_until = t + RESTART_OUTAGE_S
        scaler_up = scaler_down_until is None or t >= scaler_down_until
        if scaler_up:
            policy.observe(t, fleet)
        if ranker is not None:
            ranker.observe(t, fleet, policy.demand_replicas)
        desired = fleet.spec_replicas
        fixed = policy.fixed_replicas(t)
        if fixed is not None:
            desired = max(cfg.min_replicas, min(cfg.max_replicas, fixed))
        elif t + 1e-9 >= next_sync:
            next_sync += cfg.hpa_sync_s
            reading = policy.reading() if scaler_up else None  # out: KEDA's call fails, the HPA holds
            desired = hpa.decide(t, fleet.spec_replicas, fleet.count(READY), reading)
        if desired != fleet.spec_replicas:
            scale_events += 1
            scale_downs += desired < fleet.spec_replicas
            if oracle:
                for _ in range(desired - fleet.spec_replicas):
                    fleet.add(t, ready=True)
                if desired < fleet.spec_replicas:
                    fleet.scale_to(desired, t)
            else:
                fleet.scale_to(desired, t)
        max_spec = max(max_spec, fleet.spec_replicas)
        if t + 1e-9 >= next_sample or t >= end:
            next_sample += TIMELINE_EVERY_S
            recent.append(bin_count)
            bin_count = 0
            ready = fleet.count(READY)
            timeline.append(
                point := {
                    "t": t,
                    "load_rps": sum(recent) / min(60.0, max(t, 1.0)),
                    "ready": float(ready),
                    "starting": float(fleet.count(STARTING)),
                    "provisioning": float(fleet.provisioning(t)),
                    "draining": float(fleet.count(DRAINING)),
                    "desired": float(fleet.spec_replicas),
                    "metric": policy.value,
                    "metric_replicas": policy.demand_replicas(ready, fleet.spec_replicas),
                    **policy.explain(),
                }
            )
            acc.point(point)
        if progress is not None and t >= next_progress:
            next_progress += end / 50
            progress(t / end)
    gpu_hours = fleet.gpu_seconds / 3600.0
    # Let what is in flight finish (not billed), so late requests are judged on their TTFT.
    tail = end
    while tail < end + 600 and any(p.replica.in_flight() for p in fleet.live()):
        tail += 5.0
        fleet.advance(tail, 5.0)
    leftovers = [*fleet.finished, *fleet.take_backlog()]
    for pod in fleet.live():
        leftovers.extend(pod.replica.cut_all(tail))  # never finished: judged on what they got
    for r in leftovers:
        acc.add(r)
    fleet.finished.clear()
    acc.settle(final=True)
    if progress is not None:
        progress(1.0)
    summary = {
        "policy": cfg.policy,
        "knob": policy.knob_name,
        "knob_value": policy.knob,
        "profile": cfg.profile,
        "routing": cfg.routing,
        "requests": requests_total,
        "slo_ttft_s": cfg.slo_ttft_s,
        "slo_attainment": acc.met / requests_total if requests_total else 1.0,
        "ttft_p50_s": acc.ttft.quantile(0.50),
        "ttft_p95_s": acc.ttft.quantile(0.95),
        "ttft_p99_s": acc.ttft.quantile(0.99),
        # the decode side: each streamed request's mean gap between tokens, and the share within slo_itl_s
        "slo_itl_s": cfg.slo_itl_s,
        "itl_attainment": acc.itl_met / acc.itl.total if acc.itl.total and cfg.slo_itl_s is not None else None,
        "itl_p50_s": acc.itl.quantile(0.50),
        "itl_p95_s": acc.itl.quantile(0.95),
        "failed": acc.failed,
        "rejected": acc.rejected,
        "gpu_hours": gpu_hours,
        "mean_replicas": replica_seconds / end if end else 0.0,
        "max_replicas": max_spec,
        "scale_events": scale_events,
        "scale_downs": scale_downs,
        "streams_cut": fleet.streams_cut,
        "tokens_lost": fleet.tokens_lost,
        **scale_down_summary(fleet.scale_downs, cfg.victims, ranker),
        "preemptions": sum(p.replica.preemptions_total for p in fleet.pods),
        "capacity_rps": cap,
        "cold_start_s": cold_mean,
        "duration_s": end,
        **workload.describe(),
        "after_warmup": after_warmup(acc, cfg.warmup_s, end, gpu_hours * 3600.0, gpu_seconds_at_warmup),
        **(
            {}
            if acc.around_restart is None or cfg.restart_at_s is None
            else {
                "after_restart": {
                    "restart_at_s": cfg.restart_at_s,
                    "kept_state": not cfg.forget_state,
                    "window_s": RESTART_WINDOW_S,
                    **acc.around_restart.summary(),
                }
            }
        ),
        "config": {k: v for k, v in asdict(cfg).items() if k != "keep_requests"},
    }
    return RunResult(summary, timeline, acc.kept or [])


def after_warmup(
    acc: _Accumulator, warmup_s: float, end: float, gpu_seconds: float, gpu_seconds_at_warmup: float | None
) -> dict[str, Any]:
    """The run's figures over the requests that arrived after the warm-up, and the GPU-hours from then on."""
    if gpu_seconds_at_warmup is None:  # the run ended inside its warm-up
        gpu_seconds_at_warmup = gpu_seconds
    return {
        "warmup_s": warmup_s,
        "duration_s": max(0.0, end - warmup_s),
        **acc.after.summary(),
        "gpu_hours": (gpu_seconds - gpu_seconds_at_warmup) / 3600.0,
    }


def scale_down_summary(events: Sequence[ScaleDown], victims: str, ranker: Ranker | None) -> dict[str, Any]:
    """What the scale-downs cost: per event (a ``scale_to`` that removed pods), the streams cut on its
    victims and their tokens; and the annotations the victim ranker wrote."""
    n = len(events)
    cut = sum(e.streams_cut for e in events)
    lost = sum(e.tokens_lost for e in events)
    return {
        "victims": victims,
        "scale_down_events": n,
        "victims_removed": sum(e.removed for e in events),
        "victims_idle": sum(e.idle for e in events),
        "streams_cut_per_scale_down": cut / n if n else 0.0,
        "streams_cut_max_per_scale_down": max((e.streams_cut for e in events), default=0),
        "tokens_lost_per_scale_down": lost / n if n else 0.0,
        "deletion_cost_writes": ranker.writes if ranker is not None else 0,
        "deletion_cost_passes": ranker.passes if ranker is not None else 0,
    }


def _take_until(requests: Iterator[TraceRequest], t_end: float) -> Iterator[TraceRequest]:
    for r in requests:
        if r.t >= t_end:
            return
        yield r


def add_ttft_p95(timeline: list[dict[str, float | None]], requests: Sequence[Request]) -> None:
    """For callers that hold their requests (the demo): p95 TTFT of the arrivals of the minute before each
    point (a miss without a first token counts as +inf)."""
    arrivals = [r.arrival for r in requests]
    for point in timeline:
        t = float(point["t"] or 0.0)
        lo, hi = bisect.bisect_left(arrivals, t - 60.0), bisect.bisect_left(arrivals, t)
        window = [r.ttft if r.ttft is not None else math.inf for r in requests[lo:hi]]
        point["ttft_p95_s"] = percentile(window, 0.95)
