"""The demand signal linear in load: requests offered to the fleet against a replica's capacity.

Pure: no I/O, the clock is passed in. ``FleetState`` feeds it every scrape; ``keda_llm_scaler.policy`` turns the
estimate into replica-equivalents.

Why requests offered and not KV or the queue: KV occupancy is convex in load (a 70B replica reaches its
knee with KV near 0.4, then fills within seconds), and the queue stays empty until the knee. Arrivals
are linear in load on both sides of the knee, and cost one counter and two gauges every engine has::

    arrived_total = finished_total + rejected_total + running + waiting

grows by exactly the requests that reached the replica (a request is in flight, finished or refused),
whatever the batch does. Counted as deltas: a restart is a counter going down (then all of it arrived
since); a request cancelled without being counted shrinks the batch and never makes arrivals negative;
a missing, negative or non-finite counter makes the bin unknown (no estimate), never low. A replica
whose scrape failed is made up by the ones that answered, per replica-second; a bin where no member
answered is unknown.

From the fleet's arrivals per bin of ``bin_s`` seconds (10 s at the default 5 s scrape interval):

    offered  = mean arrival rate over the calm window (300 s)
    spread   = the bins' spread over the calm window, as a robust standard deviation (1.4826 x the
               median absolute deviation): the everyday burstiness the SLO time scale sees — Poisson
               noise on a smooth day, second-scale clumps on chat traffic — which a rare burst of a
               few bins does not inflate; while the window's least-squares trend falls, the spread of
               its bin-to-bin steps (a falling load, or one that stepped down, is not spread; a rising
               one is kept in it: ``_spread``)
    growth   = the trend over the last 360 s (least squares), projected over one replica start-up,
               never negative and at most growth_cap (0.2) x offered, so noise cannot inflate it
    need     = offered + growth + headroom_sigmas (2) x spread                    (requests/s)

No burst term: adding a 30-120 s window's mean as max(offered + growth, recent) bought no attainment
on the bursty hour and cost 5-9 GPU-h, since a burst shorter than a start-up is over before the replicas
it asks for are ready, and the HPA then holds them. Bursts are answered within one scrape by the
pressure side of the composite (queue, KV, rejects).

A replica's capacity (requests/s it serves within the SLO), in order of precedence:

* configured (``replicaCapacity``);
* learned: a replica that keeps a queue while its KV pool is full or it preempts is past its knee, and
  the rate at which it takes requests into its batch then (finished + growth of the running batch) is
  what it can serve — on the engines' step model the knee is a cliff, and throughput past it is within
  3 % of the rate at the SLO. Not where a batch cap binds (a queue behind a batch at its largest, KV to
  spare: ``max_num_seqs``): requests queue for one of a few slots, and such a reading is taken as
  the rate those slots serve within the SLO (``_within_slo``, ``keda_llm_scaler.queueing``). The median of
  the last CAPACITY_SAMPLES such readings with requests
  finishing (a stuck engine teaches nothing), none older than SAMPLE_MAX_AGE_S; spread needs 3 bins of
  the calm window and growth 6 of the trend window;
* tipped: at the onset of each episode in which a replica went past its knee (none had for 30 s), the
  load per replica over about the 30 s before it (the fleet's arrivals per replica, or the tipping
  replica's own if higher); the median of three or more lifts the learned reading, up to SERVED_TRUST x
  the served rate (a burst that tips the fleet reads as the burst's rate);
* served, which lifts a learned reading and stands in for one before any: the highest rate one replica
  served healthily over 30 s, never above the tipped rate: a thrashing replica admits less than it
  served before, and on long answers a replica takes in for 30 s a rate its growing KV will not keep.
  It lifts a learned reading only as far as its count shows beyond luck (``beyond_luck``: less
  SERVED_LUCK_SIGMAS standard deviations of a Poisson count), since the highest of a day's windows is
  its luckiest;
* provisional, before any replica has been past its knee: the offered rate over the replicas' KV-read
  utilization (``kv_utilization``), on the calm window;
* unknown (an idle fleet): no rate term, the pressure side alone.

Start-up time is configured (``startupSeconds``) or learned from the fleet: each replica that appears in
the scrape set is matched with the oldest pending not-ready endpoint (FIFO), and the median of those
delays is the horizon (DEFAULT_STARTUP_S until one is seen).
"""

from __future__ import annotations

import heapq
import itertools
import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from keda_llm_scaler.learned import LearnedState
from keda_llm_scaler.queueing import rate_within_wait

__all__ = [
    "CAPACITY_SAMPLES",
    "DEFAULT_STARTUP_S",
    "DEMAND_WINDOW_S",
    "SERVED_WINDOW_PARTS",
    "TREND_WINDOW_SHARE",
    "DemandConfig",
    "DemandEstimate",
    "DemandTracker",
    "ReplicaCounters",
    "is_saturated",
]

BIN_S: Final = 10.0
CAPACITY_SAMPLES: Final = 32
MIN_CAPACITY_SAMPLES: Final = 3
STARTUP_SAMPLES: Final = 16
KV_KNEE_SHAPE: Final = 0.07  # b in u = kv (1 + b) / (kv + b): see kv_utilization
MIN_PROVISIONAL_UTILIZATION: Final = 0.2
DEFAULT_STARTUP_S: Final = 180.0  # until one start-up is seen: a 70B start on a warm node is 3-5 min
SATURATED_KV: Final = 0.9
BATCH_CAP_TOLERANCE: Final = 0.25  # within a quarter (or one request) of the largest batch it has held: at its cap
DEFAULT_TTFT_SLO_S: Final = 2.0  # without ttftSloSeconds: what an interactive endpoint is held to
DEFAULT_SLO_QUANTILE: Final = 0.95  # without ttftSloQuantile (ScoringParams' default)
DEFAULT_QUEUE_KNEE_S: Final = 1.0  # without a TTFT SLO: a second in the queue is past any chat knee
QUEUE_KNEE_SLO_SHARE: Final = 0.5  # with one: half the SLO spent waiting to be scheduled
MIX_TOLERANCE: Final = 0.3  # a capacity reading describes mixes within 30 % of its tokens per request
DEMAND_WINDOW_S: Final = 300.0  # the calm window by default (demandWindow; ScoringParams takes it from here)
TREND_WINDOW_SHARE: Final = 1.2  # the trend is read over 1.2x the calm window (360 s by default)
# Every window scales with the calm one, so a demand window shortened for a faster clock (the demo runs 12x)
# shortens them all: a replica's served rate is read over 0.1x it (30 s by default), and not in its first
# 0.4x (120 s: least-loaded routing floods a new pod); a tipping episode ends after 0.1x without one.
SERVED_WINDOW_PARTS: Final = 10  # the served window is the calm one over this (a division: 30.0 exactly)
SETTLE_SERVED_WINDOWS: Final = 4  # a new replica's settle, in served windows


@dataclass(frozen=True, slots=True)
class DemandConfig:
    """The estimator's windows and headroom (one set for every workload; docs/replay.md shows the sweeps)."""

    calm_window_s: float = DEMAND_WINDOW_S
    headroom_sigmas: float = 2.0
    growth_cap: float = 0.2

    @property
    def trend_window_s(self) -> float:
        """The growth's window, in proportion to the calm one (360 s at the default 300 s)."""
        return TREND_WINDOW_SHARE * self.calm_window_s

    @property
    def served_window_s(self) -> float:
        """A replica's served rate, and the load before a tipping, are read over this (30 s by default)."""
        return self.calm_window_s / SERVED_WINDOW_PARTS

    @property
    def settle_s(self) -> float:
        """A replica's first seconds teach no served rate (120 s by default)."""
        return SETTLE_SERVED_WINDOWS * self.served_window_s

    @property
    def history_s(self) -> float:
        return max(self.calm_window_s, self.trend_window_s)


@dataclass(frozen=True, slots=True)
class ReplicaCounters:
    """One replica's scrape, as the demand tracker needs it. None: the engine does not export it."""

    url: str
    finished_total: float | None
    rejected_total: float | None
    waiting: float
    running: float
    kv_usage_max: float
    preemptions_total: float | None = None
    queue_count: float | None = None  # requests that have left the queue (cumulative, queue-time histogram)
    queue_sum_s: float | None = None  # and the seconds they waited
    ttft_count: float | None = None  # requests that had their first token (cumulative, TTFT histogram)
    ttft_sum_s: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    # the spread of how long its requests held a batch slot, lately (squared coefficient of variation,
    # keda_llm_scaler.queueing.service_scv); None: not exported or too few to tell
    hold_time_scv: float | None = None
    # how long its requests took to a first token outside the queue, lately (mean TTFT less mean queue
    # wait: the prefill and the API server's own time); None: not exported or too few to tell
    first_token_s: float | None = None


@dataclass(frozen=True, slots=True)
class DemandEstimate:
    offered_rps: float
    spread_rps: float
    growth_rps: float
    need_rps: float
    capacity_rps: float | None
    capacity_source: str  # "configured" | "learned" | "served" | "provisional" | "unknown"
    capacity_samples: int
    startup_s: float
    startup_source: str  # "configured" | "learned" | "default"
    served_rps: float | None = None  # the highest rate one replica served healthily (a lower bound; its luckiest)
    # seconds since a scrape last counted an arrival anywhere in the fleet (None: none counted yet)
    since_arrival_s: float | None = None
    # tokens (prompt + generated) served per second over the calm window, at the replicas that count them
    # (None: none does); what a fleet's cost per million tokens divides by
    tokens_rps: float | None = None

    @property
    def knee_known(self) -> bool:
        """The capacity was configured or measured past a knee; else it is a prior (KV) or a lower bound."""
        return self.capacity_source in ("configured", "learned")

    def replicas(self, target_utilization: float) -> float | None:
        """Replica-equivalents the need asks for, each replica planned at ``target_utilization``; None
        when there is no usable capacity (never a division by zero or an infinite answer)."""
        return _ratio(self.need_rps, None if self.capacity_rps is None else self.capacity_rps * target_utilization)

    def beyond_served(self, target_utilization: float) -> float | None:
        """Replicas the need asks for with each replica planned at ``target_utilization`` of the highest rate
        one replica has been seen to serve healthily over 30 s (None: no such reading). Without a known knee
        the fleet is not grown past this: that rate sits above a steady load's mean by its own spread, so a
        fleet holding a steady load is not grown, while a load rising past it asks for replicas before any
        saturates."""
        return _ratio(self.need_rps, None if self.served_rps is None else self.served_rps * target_utilization)


def _spread(points: list[tuple[float, float]]) -> float:
    """The load's everyday spread over ``points`` (time, rate): the median absolute deviation, scaled to a
    standard deviation on normal noise, so a burst of a few bins does not read as the fleet's spread (0 with
    fewer than 3 points).

    A rising or flat load: around its median. A rise stays in the spread: growth is capped, and a rise is
    where headroom pays. A falling load: of its bin-to-bin steps (over sqrt 2: the difference of two bins
    holds the noise of both), not around its median nor around a fitted line. A load falling through the
    window is not burstiness, and neither is a step down (a load ending, a burst passing): around a line it
    leaves residuals of half the step on either side, read as spread the composite peaked just as the load
    ebbed (on real engines, 9.1 -> 12.9 replica-equivalents as an overload stopped), and the HPA then holds
    that peak for its scale-down window. The steps of a smooth fall are all alike, and a step down is one
    outlier among them: the median ignores both."""
    if len(points) < 3:
        return 0.0
    slope, _ = _slope(points)
    if slope < 0:
        steps = [b - a for (_, a), (_, b) in itertools.pairwise(points)]
        return _mad_sigma(steps) / math.sqrt(2.0)
    return _mad_sigma([r for _, r in points])


def _mad_sigma(values: list[float]) -> float:
    mid = statistics.median(values)
    return 1.4826 * statistics.median(abs(v - mid) for v in values)


def _slope(points: list[tuple[float, float]]) -> tuple[float, float]:
    """The least-squares slope of the rates over time (0 when all share one time), and the mean time."""
    mt = math.fsum(t for t, _ in points) / len(points)
    mr = math.fsum(r for _, r in points) / len(points)
    var = math.fsum((t - mt) ** 2 for t, _ in points)
    return (math.fsum((t - mt) * (r - mr) for t, r in points) / var if var > 0 else 0.0), mt


def _ratio(need: float, per_replica: float | None) -> float | None:
    if per_replica is None or not (math.isfinite(per_replica) and per_replica > 0):
        return None
    value = need / per_replica
    return value if math.isfinite(value) else None


def kv_utilization(kv: float) -> float:
    """The share of its capacity a replica serves, read from its KV occupancy before any capacity is known.

    In an engine whose decode step slows with the batch, the batch a rate needs grows like
    1 / (1 - rate/capacity), so KV occupancy follows ``a·u / (1 - (1 - a)·u)`` in the utilization u (full
    at u = 1), whose inverse is ``u = kv (1 + b) / (kv + b)`` with b = a / (1 - a). Fitted on the perf
    model's replicas
    (single-replica Poisson runs at 0.3-1.0 of capacity), b is 0.04-0.22 across token mixes and
    hardware; with b = 0.07 the capacity read from it is within 6 % on the 70B chat mix and 17 % low to
    5 % high on the others (3x outputs, 3x prompts, 8B, H200). Low is safe (a few more replicas); high
    runs replicas into their knee, where the capacity is then measured and replaces this reading.
    """
    kv = min(1.0, max(0.0, kv))
    return kv * (1 + KV_KNEE_SHAPE) / (kv + KV_KNEE_SHAPE)


def is_saturated(
    waiting: float,
    prev_waiting: float,
    running: float,
    kv_usage_max: float,
    preempted: bool,
    queue_wait_s: float | None = None,
    queue_knee_s: float = DEFAULT_QUEUE_KNEE_S,
) -> bool:
    """Past the knee: a queue kept across two scrapes while the KV pool is full, the engine preempts, or
    the requests that left the queue meanwhile waited ``queue_knee_s`` on average (half the TTFT SLO).

    The last is what a prefill-bound replica shows (long prompts: the token budget, not KV, is full, and
    KV reads 0.1); a sequence-capped one too (``max_num_seqs`` reached, KV half empty). A queue alone is
    not enough: below the knee a chunked-prefill budget makes requests wait a step or two, and a replica
    filling up after a burst finishes fewer requests than it will serve.
    """
    queued = waiting >= max(1.0, 0.05 * running) and prev_waiting >= 1.0
    waited = queue_wait_s is not None and queue_wait_s >= queue_knee_s
    return queued and (kv_usage_max >= SATURATED_KV or preempted or waited)


@dataclass
class _Last:
    t: float
    finished: float
    rejected: float
    in_flight: float
    waiting: float
    running: float
    preemptions: float | None
    queue_count: float | None = None
    queue_sum: float | None = None
    ttft_count: float | None = None
    ttft_sum: float | None = None


@dataclass
class _Bin:
    end: float
    span: float
    arrivals: float  # scaled to the whole fleet (see _add_arrivals)
    counted: float  # arrivals at the replicas counted, unscaled
    util_s: float  # sum over the counted replicas of kv_utilization x seconds
    replica_s: float  # counted replica-seconds
    complete: bool
    prompt_tokens: float = 0.0  # at the replicas that count tokens
    generation_tokens: float = 0.0
    token_requests: float = 0.0  # requests finished at those replicas

    @property
    def rate(self) -> float:
        return self.arrivals / self.span


def _count(x: float | None) -> float | None:
    """A counter's value, or None when it is missing, negative or not a number (never a 0 reading)."""
    return x if x is not None and math.isfinite(x) and x >= 0 else None


def nonneg(x: float | None) -> float:
    """A gauge's value, 0 when it is missing, negative or not a number (a gauge, not a counter)."""
    return x if x is not None and math.isfinite(x) and x > 0 else 0.0


def bin_seconds(scrape_interval: float) -> float:
    """The arrival bin at this scrape interval: 10 s at the default 5 s scrape; never shorter than a scrape,
    and a sub-second scrape (tests, demos) gets bins of four scrapes rather than a 10 s wait."""
    return max(scrape_interval, min(BIN_S, 4 * scrape_interval))


SAMPLE_MAX_AGE_S: Final = 3600.0  # without token counters: a capacity reading older than this is dropped
MIN_MIX_REQUESTS: Final = 20
FILLING_SHARE: Final = 1.1  # a running batch 10 % larger than a scrape ago is still filling
HEALTHY_TTFT_SHARE: Final = 0.25  # served healthily: first tokens within a quarter of the SLO on average
SERVED_SAMPLES: Final = 256
LEARNED_SERVED_KEPT: Final = 64  # of the served readings, the highest kept across a restart (the bound is a max)
RESTORED: Final = "(restored)"  # the replica a capacity reading kept across a restart is credited to
SERVED_TRUST: Final = 1.2  # a capacity read from KV or from a tipping is believed up to 1.2x the rate replicas served
# a served window's arrivals are a count, and the highest of a day's windows is partly luck: what it shows
# beyond luck is its rate less this many standard deviations of a Poisson count (a one-sided 97.7 % bound)
SERVED_LUCK_SIGMAS: Final = 2.0


def beyond_luck(rate: float, window_s: float, sigmas: float = SERVED_LUCK_SIGMAS) -> float:
    """The rate a window of ``window_s`` seconds that counted ``rate`` req/s shows beyond the luck of a
    Poisson count: (n - sigmas * sqrt(n)) / window_s for its n = rate * window_s arrivals, never below 0."""
    if not (math.isfinite(rate) and math.isfinite(window_s)) or rate <= 0 or window_s <= 0:
        return 0.0
    count = rate * window_s
    return max(0.0, (count - sigmas * math.sqrt(count)) / window_s)


@dataclass(frozen=True, slots=True, order=True)  # ordered: heap entries of equal rate and time compare it
class Mix:
    """Tokens per request the fleet served: what a capacity in requests/s is a capacity of."""

    prompt: float
    generated: float

    def near(self, other: Mix) -> bool:
        return all(
            abs(a - b) <= MIX_TOLERANCE * max(a, b, 1.0)
            for a, b in ((self.prompt, other.prompt), (self.generated, other.generated))
        )


def _describes(
    t: float, sample_mix: Mix | None, now: float | None, mix: Mix | None, restored_at: float | None = None
) -> bool:
    """A capacity reading describes the fleet while its mix holds (within MIX_TOLERANCE, however long
    ago it was taken); where tokens are not counted, for SAMPLE_MAX_AGE_S. A reading taken on a mix
    before a restart (``restored_at``) waits for the current mix to be known: never trusted blindly."""
    if sample_mix is not None and mix is not None:
        return sample_mix.near(mix)
    if sample_mix is not None and restored_at is not None and t <= restored_at:
        return False
    return now is None or t > now - SAMPLE_MAX_AGE_S


def _mean_wait(
    count: float | None, total: float | None, prev_count: float | None, prev_total: float | None
) -> float | None:
    """Mean queue time of the requests that left the queue between two scrapes (None: none did, or the
    engine exports no queue-time histogram, or it reset)."""
    if count is None or total is None or prev_count is None or prev_total is None:
        return None
    n, waited = count - prev_count, total - prev_total
    if n <= 0 or waited < 0:
        return None
    return waited / n


def _keep_covering(
    intervals: deque[tuple[float, float, float]] | deque[tuple[float, float, float, float]], since: float
) -> None:
    """Drop the oldest intervals (end, ..., length, ...) while the rest still cover everything from ``since``:
    the interval that straddles it stays, so real scrapes, which never land on exact ticks, fill a window
    (dropping every interval that starts before ``since`` left 25 of 30 s at a jittery 5 s scrape, and no
    served rate or tipping load was ever read outside the simulator's exact clock)."""
    while len(intervals) > 1 and intervals[1][0] - intervals[1][2] <= since + 1e-9:
        intervals.popleft()


class DemandTracker:
    def __init__(
        self,
        scrape_interval: float = 5.0,
        config: DemandConfig | None = None,
        retain_s: float | None = None,
        ttft_slo_s: float | None = None,
        ttft_slo_quantile: float = DEFAULT_SLO_QUANTILE,
    ) -> None:
        """``ttft_slo_s``: the trigger's TTFT SLO (ttftSloSeconds), which says how long a wait is too long:
        past a knee, half of it queued; healthy, a quarter of it to the first token on average.
        ``ttft_slo_quantile``: the share of requests held to it (ttftSloQuantile)."""
        self.config = config or DemandConfig()
        self._made_with = (scrape_interval, config, retain_s, ttft_slo_s, ttft_slo_quantile)
        self.slo_quantile = ttft_slo_quantile
        self.ttft_slo_s = ttft_slo_s
        self.queue_knee_s = QUEUE_KNEE_SLO_SHARE * ttft_slo_s if ttft_slo_s is not None else DEFAULT_QUEUE_KNEE_S
        self.healthy_ttft_s = (
            HEALTHY_TTFT_SHARE * ttft_slo_s if ttft_slo_s is not None else HEALTHY_TTFT_SHARE * DEFAULT_TTFT_SLO_S
        )
        # bins are kept for the longest window any reader asks for (triggers sharing one fleet)
        self.retain_s = max(retain_s or 0.0, self.config.history_s)
        self._measured_startups = False
        self.bin_s = bin_seconds(scrape_interval)
        self._last: dict[str, _Last] = {}
        self._bins: deque[_Bin] = deque()
        # (t, url, req/s within the SLO (_within_slo), the fleet's mix then: tokens per request or None)
        self._capacity: deque[tuple[float, str, float, Mix | None]] = deque(maxlen=CAPACITY_SAMPLES)
        self._peak_batch: dict[str, float] = {}  # the largest running batch each replica has shown
        self._startups: deque[float] = deque(maxlen=STARTUP_SAMPLES)
        self._pending_starts: deque[float] = deque()
        self._starting: int | None = None
        self._members: set[str] | None = None
        self._tokens: dict[str, tuple[float | None, float | None]] = {}
        self._mix_memo: tuple[float, int, Mix | None] | None = None  # (now, bins closed, mix)
        self._bins_closed = 0
        self._own_bins_closed = 0  # closed by this process (restored bins are not counted)
        self._first_seen: dict[str, float] = {}
        self._intervals: dict[str, deque[tuple[float, float, float, float]]] = {}  # (t, arrived, dt, util)
        self._last_tipped: float | None = None  # when a replica was last seen going past its knee
        self._own: dict[str, deque[tuple[float, float, float]]] = {}  # (t, arrived, dt) over the served window
        self._recent: deque[tuple[float, float, float]] = deque()  # (t, arrivals, replica-s) over the served window
        # (t, req/s, mix): the load per replica at each onset of an episode past the knee (_note_tipped)
        self._tipped: deque[tuple[float, float, Mix | None]] = deque(maxlen=CAPACITY_SAMPLES)
        self._served: list[tuple[float, float, Mix | None]] = []  # (req/s, t, mix): the highest SERVED_SAMPLES
        self._prev_t: float | None = None
        self._last_arrival_t: float | None = None
        self._open_t: float | None = None
        self._open = _Bin(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, True)
        self._open_member_s = 0.0
        self._restored_at: float | None = None  # when ``adopt`` took what a previous process learned
        self._restored_mix: Mix | None = None  # the mix the fleet was last seen on before the restart
        self._last_mix: Mix | None = None  # the last mix known (kept across a restart: ``learned``)
        # after ``adopt``: the tracker a start without the state would have, fed the same scrapes (twice the
        # tracker's work for a restored fleet): its answer stands unless what was kept asks for a whole
        # replica more (``cold_view``)
        self._cold: DemandTracker | None = None

    # -- input -----------------------------------------------------------------------------------
    def observe(
        self, now: float, members: Iterable[str], replicas: Iterable[ReplicaCounters], starting: int = 0
    ) -> None:
        """``members``: every replica of the fleet this cycle (scraped or not); ``replicas``: the ones
        scraped successfully; ``starting``: replicas not ready yet."""
        members = set(members)
        if self._cold is not None:
            replicas = list(replicas)
            self._cold.observe(now, members, replicas, starting)
        appeared = 0 if self._members is None else len(members - self._members)
        self._members = members
        if self._prev_t is not None and now <= self._prev_t:
            return  # the clock did not move: nothing to count over
        arrivals = util = covered_s = 0.0
        tipped_own = None  # the highest own arrival rate among the replicas going past their knee this cycle
        tokens = [0.0, 0.0, 0.0]  # prompt, generation, finished requests at replicas that count tokens
        seen: set[str] = set()
        for r in replicas:
            seen.add(r.url)
            finished, rejected = _count(r.finished_total), _count(r.rejected_total)
            if finished is None:
                # without a finished counter its arrivals cannot be told from its batch changing: the
                # fleet's offered load is unknown (not low) until the window holds no such bin
                self._open.complete = False
                continue
            rejected = rejected or 0.0
            waiting, running = nonneg(r.waiting), nonneg(r.running)
            in_flight = waiting + running
            last = self._last.get(r.url)
            self._last[r.url] = _Last(
                now,
                finished,
                rejected,
                in_flight,
                waiting,
                running,
                r.preemptions_total,
                r.queue_count,
                r.queue_sum_s,
                r.ttft_count,
                r.ttft_sum_s,
            )
            peak = self._peak_batch[r.url] = max(self._peak_batch.get(r.url, 0.0), running)
            prompt_tokens, generation_tokens = _count(r.prompt_tokens_total), _count(r.generation_tokens_total)
            if last is None:
                self._tokens[r.url] = (prompt_tokens, generation_tokens)
                continue
            prev_prompt, prev_gen = self._tokens.get(r.url, (None, None))
            self._tokens[r.url] = (prompt_tokens, generation_tokens)
            if (
                prompt_tokens is not None
                and generation_tokens is not None
                and prev_prompt is not None
                and prev_gen is not None
                and prompt_tokens >= prev_prompt
                and generation_tokens >= prev_gen
                and finished >= last.finished
            ):
                tokens[0] += prompt_tokens - prev_prompt
                tokens[1] += generation_tokens - prev_gen
                tokens[2] += finished - last.finished
            dt = now - last.t
            if finished < last.finished or rejected < last.rejected:
                came = finished + rejected + in_flight  # the engine restarted: all of it arrived since
            else:
                # a request cancelled without being counted shrinks the batch: never below zero
                came = max(0.0, finished - last.finished + rejected - last.rejected + in_flight - last.in_flight)
            arrivals += came
            covered_s += dt
            kv = r.kv_usage_max
            if kv is not None and math.isfinite(kv):
                util += kv_utilization(kv) * dt
            preempted = (
                r.preemptions_total is not None
                and last.preemptions is not None
                and r.preemptions_total > last.preemptions
            )
            took = finished - last.finished + running - last.running  # finished + growth of the batch
            wait = _mean_wait(r.queue_count, r.queue_sum_s, last.queue_count, last.queue_sum)
            ttft = _mean_wait(r.ttft_count, r.ttft_sum_s, last.ttft_count, last.ttft_sum)
            # near the largest batch it has held, not at it: vLLM's gauge is the last step's batch, which
            # requests of one length finishing together leave a few short (13-16 of 16 on a CPU engine)
            near_cap = peak - max(1.0, BATCH_CAP_TOLERANCE * peak)
            at_cap = running >= near_cap
            # a queue kept behind a batch at its cap, with KV to spare: the batch's slots (max_num_seqs) are
            # what binds, and requests queue for a free one (_within_slo)
            kept_queue = waiting >= 1.0 and last.waiting >= 1.0
            slot_bound = at_cap and kept_queue and not preempted and nonneg(kv) < SATURATED_KV
            # a replica still filling its batch (after a burst) takes in more than it can keep serving; a batch
            # refilling to its cap after some of it finished is not filling
            filling = running > FILLING_SHARE * max(last.running, 1.0) and not (at_cap and last.running >= near_cap)
            saturated = is_saturated(
                waiting, last.waiting, running, nonneg(kv), preempted, None if filling else wait, self.queue_knee_s
            )
            own = self._own.setdefault(r.url, deque())
            own.append((now, came, dt))
            _keep_covering(own, now - self.config.served_window_s)
            if finished > last.finished and saturated:
                reading = self._within_slo(
                    max(0.0, took) / dt, peak if slot_bound else None, r.hold_time_scv, r.first_token_s
                )
                self._capacity.append((now, r.url, reading, self.mix(now)))
                if not filling:
                    span = math.fsum(d for _, _, d in own)
                    rate = math.fsum(a for _, a, _ in own) / span if span >= self.config.served_window_s - 1e-9 else 0.0
                    tipped_own = max(tipped_own or 0.0, rate)
            healthy = not (
                saturated
                or preempted
                or rejected > last.rejected
                or nonneg(kv) >= SATURATED_KV
                or (waiting >= 1.0 and last.waiting >= 1.0)
                or (wait is not None and wait >= self.queue_knee_s)
                or (ttft is not None and ttft >= self.healthy_ttft_s)
            )
            self._note_served(now, r.url, came, dt, healthy, kv_utilization(nonneg(kv)))
        for gone in set(self._last) - seen:
            # gone, or this scrape failed: the next good one starts a new interval rather than dumping
            # the gap's arrivals into one bin (the bin's coverage scales for the replicas not counted)
            del self._last[gone]
            self._tokens.pop(gone, None)
            self._intervals.pop(gone, None)  # a failed scrape breaks the healthy run
            self._own.pop(gone, None)
            self._peak_batch.pop(gone, None)
        for left in set(self._first_seen) - members:
            del self._first_seen[left]
        if arrivals > 0:
            self._last_arrival_t = now
        self._note_tipped(now, arrivals, covered_s, tipped_own)
        self._track_startups(now, starting, appeared)
        self._open.prompt_tokens += tokens[0]
        self._open.generation_tokens += tokens[1]
        self._open.token_requests += tokens[2]
        self._add_arrivals(now, arrivals, util, covered_s, len(members))

    def _note_served(self, now: float, url: str, arrived: float, dt: float, healthy: bool, util: float) -> None:
        """A replica's arrivals over the last served window (30 s by default), every interval of it healthy
        (no kept queue, KV below SATURATED_KV, no preemption, reject or long wait), is a rate it served within
        its knee;
        counted only where it was busy (KV-read utilization at least MIN_PROVISIONAL_UTILIZATION), so
        that a fleet that never worked does not take its trickle for a capacity and stay up."""
        first = self._first_seen.setdefault(url, now - dt)
        runs = self._intervals.setdefault(url, deque())
        if not healthy:
            runs.clear()
            return
        runs.append((now, arrived, dt, util))
        _keep_covering(runs, now - self.config.served_window_s)
        span = math.fsum(d for _, _, d, _ in runs)
        busy = math.fsum(u * d for _, _, d, u in runs) >= MIN_PROVISIONAL_UTILIZATION * span
        if busy and span >= self.config.served_window_s - 1e-9 and now - span >= first + self.config.settle_s:
            reading = (math.fsum(a for _, a, _, _ in runs) / span, now, self.mix(now))
            # only the highest readings matter (the bound is their maximum on the mix): a min-heap of them
            if len(self._served) < SERVED_SAMPLES:
                heapq.heappush(self._served, reading)
            elif reading[0] > self._served[0][0]:
                heapq.heapreplace(self._served, reading)

    def _note_tipped(self, now: float, arrivals: float, covered_s: float, tipped_own: float | None) -> None:
        """At the onset of an episode past the knee (a replica going past it after a served window (30 s) with
        none that did), the load per replica that took it there: the fleet's arrivals per replica over
        the last served window, or the tipping replica's own if higher (least-loaded routing sends less
        to a full replica; affinity routing sends one replica more than the fleet's share)."""
        self._recent.append((now, arrivals, covered_s))
        while self._recent and self._recent[0][0] <= now - self.config.served_window_s - 1e-9:
            self._recent.popleft()
        if tipped_own is None:
            return
        onset = self._last_tipped is None or now - self._last_tipped > self.config.served_window_s
        self._last_tipped = now
        # within an episode a fleet kept past its knee reads its overload, and a failed scrape or a KV
        # reading flickering around SATURATED_KV must not start a new one
        replica_s = math.fsum(c for _, _, c in self._recent)
        if onset and replica_s > 0 and now - self._recent[0][0] >= self.config.served_window_s - self.bin_s:
            fleet = math.fsum(a for _, a, _ in self._recent) / replica_s
            if (rate := max(fleet, tipped_own)) > 0:
                self._tipped.append((now, rate, self.mix(now)))

    def served(self, now: float | None) -> float | None:
        """The highest rate one replica served healthily over the served window, on this mix (a lower bound
        of its capacity, however the knee is shaped, but its luckiest window: ``beyond_luck``), never above
        the rate replicas tipped over at (``tipped``, from the first onset); None before any such reading."""
        highest = self._highest_served(now)
        if highest is None:
            return None
        tipped = self.tipped(now, 1)  # lowering a capacity errs on the safe side: one onset is enough
        # the highest of hundreds of half-minute windows is partly luck: on long answers a replica takes
        # in for 30 s a rate its growing KV will not let it keep, and one such window sized a day's fleet
        return highest if tipped is None else min(highest, tipped)

    def _highest_served(self, now: float | None) -> float | None:
        mix = self._judging_mix(now)
        return max((r for r, t, m in self._served if _describes(t, m, now, mix, self._restored_at)), default=None)

    def _served_beyond_luck(self, now: float | None) -> float:
        """What lifts readings past the knee: the highest served window as far as its count shows beyond
        luck (its span is the served window or up to a scrape more: counted as the window, which errs low),
        never above the rate replicas tipped over at; 0 before any served reading."""
        highest = self._highest_served(now)
        if highest is None:
            return 0.0
        floor = beyond_luck(highest, self.config.served_window_s)
        tipped = self.tipped(now, 1)
        return floor if tipped is None else min(floor, tipped)

    def tipped(self, now: float | None, enough: int = MIN_CAPACITY_SAMPLES) -> float | None:
        """The median load per replica at the onset of an episode past the knee (``_note_tipped``), on this
        mix, from ``enough`` onsets; None before."""
        mix = self._judging_mix(now)
        rates = [r for t, r, m in self._tipped if _describes(t, m, now, mix, self._restored_at)]
        return statistics.median(rates) if rates and len(rates) >= enough else None

    def add_startup(self, seconds: float) -> None:
        """A start-up measured where discovery sees it (a pod's creation to Ready). Once one arrives, the
        scrape-side estimate (new replicas matched with pending endpoints) stops adding its own."""
        if self._cold is not None:
            self._cold.add_startup(seconds)
        if math.isfinite(seconds) and seconds >= 0:
            self._measured_startups = True
            self._startups.append(seconds)

    def _track_startups(self, now: float, starting: int, appeared: int) -> None:
        if self._measured_startups:
            return
        if self._starting is None:  # first cycle: those already starting began at an unknown time
            self._starting = starting
            return
        for _ in range(max(0, starting - self._starting)):
            self._pending_starts.append(now)
        for _ in range(appeared):
            if self._pending_starts:
                self._startups.append(now - self._pending_starts.popleft())
        # endpoints that vanished without becoming ready (scaled away while starting) are forgotten
        while len(self._pending_starts) > starting:
            self._pending_starts.pop()
        self._starting = starting

    def _add_arrivals(self, now: float, arrivals: float, util_s: float, covered_s: float, members: int) -> None:
        if self._open_t is None or self._prev_t is None:
            self._open_t = self._prev_t = now
            return  # the first scrape has no interval behind it
        dt, self._prev_t = now - self._prev_t, now
        b = self._open
        b.arrivals += arrivals
        b.counted += arrivals
        b.util_s += util_s
        b.replica_s += covered_s
        self._open_member_s += members * dt
        span = now - self._open_t
        if span < self.bin_s - 1e-9:
            return
        b.end, b.span = now, span
        if self._open_member_s > 0:
            if b.replica_s <= 0:
                b.complete = False  # members and not one counted interval: unknown, not idle
            else:
                # replicas whose scrape failed (or first seen) carry the load the counted ones show per
                # replica-second: a failing, overloaded replica must not read as no arrivals
                b.arrivals *= self._open_member_s / b.replica_s
        self._bins.append(b)
        self._bins_closed += 1
        self._own_bins_closed += 1
        self._open_t, self._open, self._open_member_s = now, _Bin(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, True), 0.0
        while self._bins and self._bins[0].end <= now - self.retain_s:
            self._bins.popleft()

    def provisional_capacity(self, now: float, config: DemandConfig | None = None) -> float | None:
        """Offered requests over the replicas' KV-read utilization-seconds (``kv_utilization``), on the
        calm window; None while the fleet is too idle for KV to say anything."""
        calm_s = (config or self.config).calm_window_s
        window = [b for b in self._bins if b.end > now - calm_s and b.complete]
        util_s = math.fsum(b.util_s for b in window)
        replica_s = math.fsum(b.replica_s for b in window)
        if replica_s <= 0 or util_s / replica_s < MIN_PROVISIONAL_UTILIZATION:
            return None
        counted = math.fsum(b.counted for b in window)
        if counted <= 0:
            return None  # KV in use and nothing arriving (a stuck engine): no reading, not a capacity of 0
        return counted / util_s

    def mix(self, now: float | None) -> Mix | None:
        """The fleet's tokens per request (prompt, generated) over the calm window; None while no replica
        counts tokens or too few requests finished to say (fewer than MIN_MIX_REQUESTS)."""
        if now is None:
            return None
        if self._mix_memo is not None and self._mix_memo[0] == now and self._mix_memo[1] == self._bins_closed:
            return self._mix_memo[2]  # asked per replica in a scrape cycle: the closed bins have not moved
        window = [b for b in self._bins if b.end > now - self.config.calm_window_s]
        n = math.fsum(b.token_requests for b in window)
        mix = None
        if n >= MIN_MIX_REQUESTS:
            mix = Mix(
                math.fsum(b.prompt_tokens for b in window) / n, math.fsum(b.generation_tokens for b in window) / n
            )
        self._mix_memo = (now, self._bins_closed, mix)
        if mix is not None:
            self._last_mix = mix
        return mix

    def _judging_mix(self, now: float | None) -> Mix | None:
        """The mix readings are judged against: the fleet's own, else (after a restart, until the fleet shows
        its mix again) the one it was last seen on before it. Readings of another mix drop out as soon as
        the fleet's own is known."""
        return self.mix(now) or self._restored_mix

    # -- kept across restarts (keda_llm_scaler.learned) --------------------------------------------
    def basis(self) -> tuple[tuple[str, float | None], ...]:
        """What this tracker's readings depend on beyond the fleet: a capacity is a rate within this SLO,
        and bins are this long."""
        return (
            ("bin_s", self.bin_s),
            ("calm_window_s", self.config.calm_window_s),
            ("ttft_slo_quantile", self.slo_quantile),
            ("ttft_slo_s", self.ttft_slo_s),
        )

    def learned(self, now: float) -> LearnedState:
        """What this tracker has learned, times as ages at ``now``: its readings, start-ups, and the bins of
        its demand window (``config.history_s``, not the longer retention)."""

        def tag(m: Mix | None) -> tuple[float, float] | None:
            return None if m is None else (m.prompt, m.generated)

        return LearnedState(
            capacity=tuple((now - t, c, tag(m)) for t, _, c, m in self._capacity),
            tipped=tuple((now - t, r, tag(m)) for t, r, m in self._tipped),
            served=tuple(
                (now - t, r, tag(m))
                for r, t, m in heapq.nlargest(LEARNED_SERVED_KEPT, self._served, key=lambda x: x[0])
            ),
            startups=tuple(self._startups),
            startups_measured=self._measured_startups,
            mix=tag(self.mix(now) or self._last_mix or self._restored_mix),
            bins=tuple(
                (
                    now - b.end,
                    b.span,
                    b.arrivals,
                    b.counted,
                    b.util_s,
                    b.replica_s,
                    b.complete,
                    b.prompt_tokens,
                    b.generation_tokens,
                    b.token_requests,
                )
                for b in self._bins
                if b.end > now - self.config.history_s
            ),
        )

    def adopt(self, state: LearnedState, now: float) -> None:
        """Take ``state`` (ages at ``now``) as what this new tracker knows. Readings tagged with a token mix are
        judged against the mix the fleet was last seen on (``state.mix``) until its own is known again, then
        against its own (``_judging_mix``): a restart answers with what it learned at once, and drops it
        as soon as the traffic shows another mix. Without a mix to judge by, tagged readings do not count
        (``_describes``). Bins older than the retention are dropped."""

        def mix(tag: tuple[float, float] | None) -> Mix | None:
            return None if tag is None else Mix(tag[0], tag[1])

        for age, rps, tag in state.capacity[-CAPACITY_SAMPLES:]:
            self._capacity.append((now - age, RESTORED, rps, mix(tag)))
        for age, rps, tag in state.tipped[-CAPACITY_SAMPLES:]:
            self._tipped.append((now - age, rps, mix(tag)))
        for age, rps, tag in state.served[:SERVED_SAMPLES]:
            reading = (rps, now - age, mix(tag))
            if len(self._served) < SERVED_SAMPLES:
                heapq.heappush(self._served, reading)
            elif rps > self._served[0][0]:
                heapq.heapreplace(self._served, reading)
        self._startups.extend(state.startups[-STARTUP_SAMPLES:])
        self._measured_startups = self._measured_startups or state.startups_measured
        restored = [
            _Bin(now - b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9])
            for b in sorted(state.bins, key=lambda b: -b[0])
            if b[0] < self.retain_s
        ]
        self._bins.extendleft(reversed(restored))
        self._bins_closed += len(restored)
        self._restored_at = now
        self._restored_mix = mix(state.mix)
        self._cold = DemandTracker(*self._made_with)

    # -- output ----------------------------------------------------------------------------------
    @property
    def cold_view(self) -> DemandTracker | None:
        """After a restart (``adopt``): the tracker a start without the state would have, fed the same
        scrapes since; None for a tracker that restored nothing. ``FleetState.evaluate`` answers with what
        it reads unless what was kept asks for a whole replica more."""
        return self._cold

    def capacity(
        self, configured: float | None, now: float | None = None, config: DemandConfig | None = None
    ) -> tuple[float | None, str]:
        """The capacity one replica serves within the SLO by this tracker's readings (kept ones included)."""
        if configured is not None:
            return configured, "configured"
        mix = self._judging_mix(now) if now is not None else None
        fresh = [c for t, _, c, m in self._capacity if _describes(t, m, now, mix, self._restored_at)]
        learned = statistics.median(fresh) if len(fresh) >= MIN_CAPACITY_SAMPLES else 0.0
        tipped, served = self.tipped(now), self.served(now)
        if tipped is not None and served is not None:  # readings are kept only when positive
            # the load per replica at which the fleet's replicas went past their knee is steadier than what
            # one replica admits once past it (on prefill-heavy 8b-a100 0.84-0.94x the capacity at the SLO,
            # against 1.00-1.07x); believed up to a step beyond what replicas served healthily, since a
            # burst that tips the fleet reads as the burst's rate (21 req/s on a 14 req/s replica)
            return max(learned, min(tipped, SERVED_TRUST * served)), "learned"
        if learned > 0:
            # a replica thrashing past a KV cliff takes in less than it served before it got there; but the
            # highest served window is the luckiest of hundreds, and where the readings past the knee say less
            # it lifts them only as far as its count shows beyond luck (15.8 req/s served for 30 s on a replica
            # of 14.2 at the SLO, whose readings past the knee said 14.1)
            return max(learned, self._served_beyond_luck(now)), "learned"
        prior = self.provisional_capacity(now, config) if now is not None else None
        if served is not None and prior is None:
            return served, "served"
        if served is not None and prior is not None and served >= prior:
            # the same luck where KV reads less than the highest served window: the window lifts the KV
            # reading only as far as its count shows beyond luck. A fleet sized on its own luckiest window
            # serves the next one a little faster, and the bound ratchets up with every hour it runs (on the
            # reference day 14.5 -> 15.2 req/s on a replica of 14.2, whose KV read 14.1-14.5); a scaler
            # restarted without its state read the KV and served the peak the kept one missed
            return max(prior, self._served_beyond_luck(now)), "served"
        if prior is not None and served is not None:
            # KV's knee depends on the mix (long prompts saturate at KV 0.1 and read as idle): a reading
            # above what replicas served is trusted only a step beyond it, never into unexplored load
            return min(prior, SERVED_TRUST * served), "provisional"
        if prior is not None:
            return prior, "provisional"
        return None, "unknown"

    def _within_slo(
        self,
        took_rps: float,
        capped_slots: float | None,
        hold_scv: float | None = None,
        first_token_s: float | None = None,
    ) -> float:
        """What a replica took in past its knee, as the rate it serves within the SLO (once, as it is read).

        Where a full KV pool or the prefill budget binds, the knee is a cliff and what a replica takes in
        past it is within a few percent of its rate at the SLO (the step model; docs/replay.md). Where a
        batch cap binds (a queue behind a batch at its largest, KV to spare: ``max_num_seqs``), a
        request waits for one of a few slots, each held for a whole answer: a vLLM CPU engine capped at 16
        sequences served 0.57-0.81 of its saturated throughput within a 1 s TTFT SLO (issue #30), and the
        raw reading sat 11-60 % above its capacity. Those readings are taken as the queue of that many
        slots at random arrivals, with the SLO's share of requests waiting at most what the SLO leaves
        once the first token's own time is paid (``first_token_s``: the prefill and the API server's
        time, lately; ``keda_llm_scaler.queueing``), and never less than the queue knee (half the TTFT
        SLO: what it was before that time was read, and what a replica whose prefill takes most of its
        SLO is still given, as more replicas would not shorten its prefill). Its waits are scaled by the
        spread of how long requests held a slot where the engine exports it (``hold_scv``; else read as
        exponential): answers of one length wait about half as long. ``capped_slots``: the cap where one
        binds, else None."""
        if capped_slots is None:
            return took_rps
        wait_s = self.queue_knee_s
        if self.ttft_slo_s is not None and first_token_s is not None and math.isfinite(first_token_s):
            wait_s = max(wait_s, self.ttft_slo_s - max(0.0, first_token_s))
        return rate_within_wait(took_rps, capped_slots, wait_s, self.slo_quantile, hold_scv)

    def startup(self, configured: float | None) -> tuple[float, str]:
        if configured is not None:
            return configured, "configured"
        if self._startups:
            return statistics.median(self._startups), "learned"
        return DEFAULT_STARTUP_S, "default"

    def rate_pending(self) -> bool:
        """No rate of its own yet: fewer than two bins closed by this process since it met the fleet (a
        scaler that just started, or a standby that just took over). Unknown, which is not low. Restored
        bins do not count: they may be too old for the reader's window, or read the load before a rise.
        Bounded in time whatever the counters say: two bins are about 9 s at a 1 s scrape, 25 s at 5 s."""
        return self._own_bins_closed < 2

    def estimate(
        self,
        now: float,
        capacity_rps: float | None = None,
        startup_s: float | None = None,
        config: DemandConfig | None = None,
    ) -> DemandEstimate | None:
        """None until two bins of arrivals are known (a rate needs an interval), and while the window holds
        a bin where some replica exported no finished counter. ``config``: this reader's windows (within
        ``retain_s``), else the tracker's own."""
        c = config or self.config
        window = [b for b in self._bins if b.end > now - c.history_s]
        if self._restored_at is not None:
            # bins kept across a restart bridge its first seconds (the load and the mix are known at once);
            # once two of its own are in, the rate is read from them alone, as a process that started cold
            # reads it: a window spanning the restart reacts to a load rising after it more slowly (the step
            # in tests/test_replay_restart.py: 55 % of requests within the SLO over the next 15 minutes,
            # against 61 % for a scaler that forgot everything)
            own = [b for b in window if b.end > self._restored_at]
            if len(own) >= 2:
                window = own
        if len(window) < 2 or not all(b.complete for b in window):
            return None
        rates = [(b.end, b.rate) for b in window]
        recent = [(t, r) for t, r in rates if t > now - c.calm_window_s] or [rates[-1]]
        offered = math.fsum(r for _, r in recent) / len(recent)
        calm = [b for b in window if b.end > now - c.calm_window_s] or [window[-1]]
        counted = [b for b in calm if b.token_requests > 0]
        tokens_rps = (
            math.fsum(b.prompt_tokens + b.generation_tokens for b in counted) / math.fsum(b.span for b in calm)
            if counted
            else None
        )
        spread = _spread(recent)
        horizon, horizon_source = self.startup(startup_s)
        trend = [(t, r) for t, r in rates if t > now - c.trend_window_s]
        growth = 0.0
        if len(trend) >= 6:
            slope, _ = _slope(trend)
            growth = min(c.growth_cap * offered, max(0.0, slope * horizon))
        cap, cap_source = self.capacity(capacity_rps, now, c)
        need = offered + growth + c.headroom_sigmas * spread
        return DemandEstimate(
            offered_rps=offered,
            spread_rps=spread,
            growth_rps=growth,
            need_rps=need,
            capacity_rps=cap,
            capacity_source=cap_source,
            capacity_samples=len(self._capacity),
            startup_s=horizon,
            startup_source=horizon_source,
            served_rps=self.served(now),
            since_arrival_s=None if self._last_arrival_t is None else max(0.0, now - self._last_arrival_t),
            tokens_rps=tokens_rps,
        )
