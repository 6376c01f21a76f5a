"""Independent step-level reference model of a *static* fleet of vLLM V1 replicas.

Written only from ``/work/shared/docs/REPLICA-PERF-MODEL.md`` §0 and §1, without importing or reading the project's own
simulator (``keda_llm_scaler.sim``), so that
tests can check the fast simulator against a second, separately written model.
Standard library only.

Model
-----
* Profiles are the centre values of §0 (:data:`PROFILES`). ``max_num_batched_tokens`` 8192, ``max_num_seqs`` 1024,
  ``block_size`` 16; KV capacity is ``kv_tokens // 16`` blocks. No prefix caching (the doc's assumption for Azure and
  BurstGPT traces), no speculative decoding, no watermark.
* Step time (ms): ``c + b·P + d·D + e·K/1000 + f·Σ p_i·(q_i + p_i/2)``. ``K`` sums, over the decoding sequences of the
  step, the tokens whose KV is already stored (vLLM's ``num_computed_tokens``): in its k-th decode step (k = 1, 2, ...)
  a request with prompt ``p`` contributes ``p + k - 1``.
* Scheduler, per replica and step, as in vLLM V1 ``Scheduler.schedule()`` with the brief's order:

  1. every running request is scheduled: all decoding sequences first (1 token each), then the running requests still
     in (re-)prefill, in admission order, each getting ``min(remaining prompt, remaining budget)`` tokens
     (budget = 8192 minus the decodes);
  2. if the running requests need more new KV blocks than are free, running requests are preempted from the tail of
     the running list (most recently admitted first) until the remaining ones fit. This is the minimal-suffix outcome of
     vLLM's "allocate, else pop ``running[-1]`` and retry" loop;
  3. only if nothing was preempted in this step (vLLM skips the waiting queue after a preemption), waiting requests are
     admitted FCFS while ``#running < 1024``, the token budget is > 0 and there are free blocks for the scheduled
     chunk (head-of-line blocking: the first request that does not fit stops admission). A prompt longer than the
     remaining budget is chunked. If a preemption emptied the running list, admission runs in the same instant (vLLM
     would run an empty step and schedule again).

  The step that processes a request's last prompt chunk emits its first token: TTFT = end of that step - arrival. A
  request with 1 output token finishes then; otherwise it decodes one token per step and finishes at the end of the
  step producing its last token (``output - 1`` decode steps after the first token).
* KV blocks are accounted **exactly per sequence**, without touching every sequence at every step: a request holds
  ``ceil(tokens / 16)`` blocks, ``tokens`` = computed prompt tokens during prefill, and ``p + g`` in a decode step
  that starts with ``g`` generated tokens (the slot of the token being processed is allocated in that step, as vLLM's
  ``allocate_slots`` does). A decoding sequence's token count is ``a + s`` at replica step ``s`` (a per-request
  constant ``a``), so it needs a new block exactly when ``(a + s) % 16 == 1``; the replica keeps a count of decoding
  sequences per residue ``a % 16`` and adds ``count[(1 - s) % 16]`` new blocks per step. Finished and preempted
  requests free their exact ``ceil(tokens / 16)``. ``audit=True`` recomputes all of this per sequence at every step and
  asserts it matches (slow; for tests).
* Preemption is RECOMPUTE: all the victim's blocks are freed, it goes to the *front* of the waiting queue (several
  victims of one step keep their admission order), and on re-admission it re-prefills ``prompt + generated`` tokens
  (chunked like any prompt); the step completing that re-prefill emits its next token. The first-token time of the
  first prefill is kept.
* Fleet: ``replicas`` replicas, all ready at t=0, in one discrete-event loop over arrivals and per-replica step ends.
  Events at the same instant are processed as: step ends first (tokens emitted, requests finished), then arrivals are
  routed, then every replica that is idle or just ended a step schedules its next step. So simultaneous arrivals share
  a step, and a request routed to a replica in the middle of a step can be admitted from the next step on.
* Routing per arrival: ``least-loaded`` = fewest in-flight requests (routed there and not finished: running +
  waiting, preempted included), ties to the lowest index; ``round-robin`` = 0, 1, ..., N-1, 0, ...; ``random`` =
  ``random.Random(seed).randrange(N)``.
* The run stops at ``last arrival + drain_s``: steps ending later are not executed, and a request without a first
  token by then has TTFT = inf (an SLO miss). A prompt needing more blocks than the whole replica has would block its
  replica's queue forever (vLLM rejects such prompts up front); it is not special-cased.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

BLOCK_SIZE = 16
MAX_NUM_BATCHED_TOKENS = 8192
MAX_NUM_SEQS = 1024

_WAITING, _PREFILL, _DECODE, _DONE = 0, 1, 2, 3


@dataclass(frozen=True)
class Profile:
    """Step-time coefficients (ms) and KV capacity of one replica (REPLICA-PERF-MODEL.md §0, centre values)."""

    name: str
    c: float  # fixed step cost, ms
    b: float  # prefill, ms per token
    d: float  # ms per decoding sequence
    e: float  # KV read, ms per 1000 context tokens of decoding sequences
    f: float  # prefill attention, ms per (token x context token)
    kv_tokens: int

    @property
    def kv_blocks(self) -> int:
        return self.kv_tokens // BLOCK_SIZE

    def step_ms(self, prefill_tokens: int, decodes: int, context_tokens: int, attention: float) -> float:
        """T_step of §0; ``attention`` is Σ p_i·(q_i + p_i/2) over the prefill chunks of the step."""
        return (
            self.c + self.b * prefill_tokens + self.d * decodes + self.e * (context_tokens / 1000) + self.f * attention
        )


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile("8b-h100", 6.0, 0.0173, 0.006, 0.055, 1.18e-6, 418_000),
        Profile("70b-h100x4", 12.0, 0.042, 0.03, 0.035, 1.47e-6, 691_000),
        Profile("70b-h200x2", 15.0, 0.068, 0.05, 0.049, 2.95e-6, 582_000),
    )
}

ROUTINGS = ("least-loaded", "round-robin", "random")


@dataclass
class RefResult:
    ttft: list[float]  # seconds per request, input order; math.inf when no first token before the end of the run
    slo_attainment: float  # fraction of requests with ttft <= slo_ttft_s
    ttft_p50_s: float
    ttft_p95_s: float
    ttft_p99_s: float
    preemptions: int
    steps: int  # engine steps executed, all replicas
    finish_s: list[float] = field(default_factory=list)  # absolute finish time per request, math.inf if unfinished
    replica: list[int] = field(default_factory=list)  # replica each request was routed to
    completed: int = 0  # requests that produced all their output tokens


def nearest_rank(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile: sorted(values)[ceil(q·n) - 1]; nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    k = math.ceil(round(q * len(ordered), 9))
    return ordered[min(max(k, 1), len(ordered)) - 1]


def _blocks(tokens: int) -> int:
    return -(-tokens // BLOCK_SIZE)


class _Req:
    __slots__ = (
        "a",
        "arrival",
        "chunk",
        "computed",
        "fin_step",
        "finish",
        "first",
        "idx",
        "out",
        "prompt",
        "rep",
        "state",
        "target",
    )

    def __init__(self, idx: int, arrival: float, prompt: int, out: int) -> None:
        self.idx = idx
        self.arrival = arrival
        self.prompt = prompt
        self.out = out
        self.state = _WAITING
        self.target = prompt  # tokens to (re-)prefill: prompt + tokens generated before the last preemption
        self.computed = 0  # prefilled tokens of the current (re-)prefill
        self.chunk = 0  # prefill tokens scheduled in the current step
        self.a = 0  # while decoding: tokens held (incl. the slot being written) at replica step s are a + s
        self.fin_step = -1
        self.first: float | None = None
        self.finish: float | None = None
        self.rep = -1


class _Replica:
    __slots__ = (
        "busy",
        "cnt",
        "fin_heap",
        "free",
        "kbase",
        "n_dec",
        "n_running",
        "pre_count",
        "prefilling",
        "prof",
        "push_seq",
        "running",
        "step",
        "total_blocks",
        "waiting",
    )

    def __init__(self, prof: Profile) -> None:
        self.prof = prof
        self.total_blocks = prof.kv_blocks
        self.free = prof.kv_blocks
        self.step = 0  # index of the last step started (steps are numbered from 1)
        self.busy = False
        self.waiting: deque[_Req] = deque()
        self.running: list[_Req] = []  # admission order; finished requests are removed lazily
        self.n_running = 0
        self.prefilling: list[_Req] = []  # running requests still in (re-)prefill, admission order
        self.cnt = [0] * BLOCK_SIZE  # decoding sequences per residue a % 16
        self.n_dec = 0  # D
        self.kbase = 0  # Σ a over decoding sequences: K at step s = kbase + D·(s - 1)
        self.fin_heap: list[tuple[int, int, _Req]] = []  # (step of last token, push order, request)
        self.push_seq = 0
        self.pre_count = 0

    # -- scheduling ---------------------------------------------------------------------------------------------

    def _preempt_tail(self, s: int) -> int:
        """Preempt the most recently admitted running request; return how many new blocks it needed in step s."""
        running = self.running
        r = running.pop()
        while r.state == _DONE:
            r = running.pop()
        need = 0
        if r.state == _DECODE:
            a = r.a
            self.free += _blocks(a + s - 1)
            if (a + s) % BLOCK_SIZE == 1:
                need = 1
            self.cnt[a % BLOCK_SIZE] -= 1
            self.kbase -= a
            self.n_dec -= 1
            r.target = a + s  # prompt + tokens generated so far
        else:
            self.free += _blocks(r.computed)
            self.prefilling.remove(r)
        r.computed = 0
        r.chunk = 0
        r.state = _WAITING
        self.waiting.appendleft(r)
        self.n_running -= 1
        self.pre_count += 1
        return need

    def start_step(self) -> float | None:
        """Schedule the next step; return its duration in seconds, or None if there is nothing to run."""
        s = self.step + 1
        need_dec = self.cnt[(1 - s) % BLOCK_SIZE]
        preempted = False
        while True:
            budget = MAX_NUM_BATCHED_TOKENS - self.n_dec
            need = need_dec
            for r in self.prefilling:
                if budget <= 0:
                    r.chunk = 0
                    continue
                ch = r.target - r.computed
                if ch > budget:
                    ch = budget
                r.chunk = ch
                budget -= ch
                need += _blocks(r.computed + ch) - _blocks(r.computed)
            if need <= self.free:
                break
            need_dec -= self._preempt_tail(s)
            preempted = True
        free = self.free - need
        if not preempted or self.n_running == 0:
            waiting = self.waiting
            running = self.running
            while waiting and budget > 0 and self.n_running < MAX_NUM_SEQS:
                r = waiting[0]
                ch = r.target if r.target < budget else budget
                nb = _blocks(ch)
                if nb > free:
                    break
                waiting.popleft()
                free -= nb
                budget -= ch
                r.state = _PREFILL
                r.computed = 0
                r.chunk = ch
                running.append(r)
                self.prefilling.append(r)
                self.n_running += 1
        self.free = free
        prefill = 0
        attention = 0.0
        for r in self.prefilling:
            ch = r.chunk
            if ch:
                prefill += ch
                attention += ch * (r.computed + ch / 2)
        decodes = self.n_dec
        if not prefill and not decodes:
            return None
        self.step = s
        return self.prof.step_ms(prefill, decodes, self.kbase + decodes * (s - 1), attention) / 1000.0

    def end_step(self, t: float, inflight: list[int]) -> list[_Req]:
        """Apply the step that ends at time t; return the requests that finished."""
        s = self.step
        done: list[_Req] = []
        if self.prefilling:
            keep = []
            for r in self.prefilling:
                ch = r.chunk
                if ch:
                    r.chunk = 0
                    r.computed += ch
                    if r.computed == r.target:  # last prompt chunk: this step emits a token
                        if r.first is None:
                            r.first = t
                        generated = r.target - r.prompt + 1
                        if generated >= r.out:
                            self.free += _blocks(r.target)
                            done.append(r)
                        else:
                            a = r.target - s
                            r.a = a
                            r.state = _DECODE
                            self.cnt[a % BLOCK_SIZE] += 1
                            self.kbase += a
                            self.n_dec += 1
                            r.fin_step = s + r.out - generated
                            self.push_seq += 1
                            heapq.heappush(self.fin_heap, (r.fin_step, self.push_seq, r))
                        continue
                keep.append(r)
            self.prefilling = keep
        heap = self.fin_heap
        while heap and heap[0][0] == s:
            r = heapq.heappop(heap)[2]
            if r.state != _DECODE or r.fin_step != s:
                continue  # stale entry of a preempted request
            a = r.a
            self.free += _blocks(a + s)
            self.cnt[a % BLOCK_SIZE] -= 1
            self.kbase -= a
            self.n_dec -= 1
            done.append(r)
        for r in done:
            r.state = _DONE
            r.finish = t
            inflight[r.rep] -= 1
        self.n_running -= len(done)
        if len(self.running) > 2 * self.n_running + 64:
            self.running = [r for r in self.running if r.state != _DONE]
        return done

    def audit(self) -> None:
        """Recompute the aggregates per sequence (after start_step) and check them."""
        s = self.step
        live = [r for r in self.running if r.state != _DONE]
        assert len(live) == self.n_running
        assert all(r.state in (_PREFILL, _DECODE) for r in live)
        dec = [r for r in live if r.state == _DECODE]
        assert self.n_dec == len(dec)
        assert self.kbase + len(dec) * (s - 1) == sum(r.a + s - 1 for r in dec)
        held = sum(_blocks(r.a + s) for r in dec)
        held += sum(_blocks(r.computed + r.chunk) for r in live if r.state == _PREFILL)
        assert held + self.free == self.total_blocks, (held, self.free, self.total_blocks)
        assert self.free >= 0
        assert [r for r in live if r.state == _PREFILL] == self.prefilling
        for r in dec:
            generated = r.a + s - r.prompt
            assert 1 <= generated < r.out and r.fin_step == s + r.out - generated - 1
        assert all(r.state == _WAITING and r.computed == 0 for r in self.waiting)


def simulate_static(
    requests: Sequence[tuple[float, int, int]],
    replicas: int,
    profile: str | Profile = "70b-h100x4",
    routing: str = "least-loaded",
    slo_ttft_s: float = 2.0,
    seed: int = 0,
    drain_s: float = 600.0,
    *,
    audit: bool = False,
) -> RefResult:
    """Run ``requests`` (arrival s, prompt tokens, output tokens; sorted by arrival) on a static fleet.

    ``profile`` is a name in :data:`PROFILES` or a :class:`Profile` (e.g. a tiny KV for hand-checked preemption).
    """
    if isinstance(profile, Profile):
        prof = profile
    elif profile in PROFILES:
        prof = PROFILES[profile]
    else:
        raise ValueError(f"unknown profile {profile!r}; known: {sorted(PROFILES)}")
    if routing not in ROUTINGS:
        raise ValueError(f"unknown routing {routing!r}; known: {ROUTINGS}")
    if replicas < 1:
        raise ValueError("replicas must be >= 1")
    reqs: list[_Req] = []
    last = -math.inf
    for i, (arrival, prompt, out) in enumerate(requests):
        if arrival < last:
            raise ValueError("requests must be sorted by arrival time")
        if prompt < 1 or out < 1:
            raise ValueError(f"request {i}: prompt and output tokens must be >= 1")
        last = arrival
        reqs.append(_Req(i, float(arrival), int(prompt), int(out)))
    n = len(reqs)
    reps = [_Replica(prof) for _ in range(replicas)]
    inflight = [0] * replicas
    rng = random.Random(seed)
    rr = 0
    deadline = (reqs[-1].arrival if reqs else 0.0) + drain_s
    ends: list[tuple[float, int]] = []  # (step end time, replica)
    steps = 0
    completed = 0
    ai = 0
    inf = math.inf
    pick = inflight.__getitem__
    indices = range(replicas)
    while True:
        t = ends[0][0] if ends else inf
        if ai < n and reqs[ai].arrival < t:
            t = reqs[ai].arrival
        if t == inf or t > deadline:
            break
        ready: list[int] = []
        while ends and ends[0][0] == t:
            k = heapq.heappop(ends)[1]
            rep = reps[k]
            completed += len(rep.end_step(t, inflight))
            rep.busy = False
            steps += 1
            ready.append(k)
        while ai < n and reqs[ai].arrival == t:
            r = reqs[ai]
            ai += 1
            if routing == "least-loaded":
                k = min(indices, key=pick)
            elif routing == "round-robin":
                k = rr
                rr = (rr + 1) % replicas
            else:
                k = rng.randrange(replicas)
            r.rep = k
            inflight[k] += 1
            reps[k].waiting.append(r)
            if not reps[k].busy:
                ready.append(k)
        for k in ready:
            rep = reps[k]
            if rep.busy:
                continue
            dt = rep.start_step()
            if audit:
                rep.audit()
            if dt is not None:
                rep.busy = True
                heapq.heappush(ends, (t + dt, k))
    ttft = [r.first - r.arrival if r.first is not None else inf for r in reqs]
    return RefResult(
        ttft=ttft,
        slo_attainment=(sum(1 for x in ttft if x <= slo_ttft_s) / n) if n else math.nan,
        ttft_p50_s=nearest_rank(ttft, 0.50),
        ttft_p95_s=nearest_rank(ttft, 0.95),
        ttft_p99_s=nearest_rank(ttft, 0.99),
        preemptions=sum(rep.pre_count for rep in reps),
        steps=steps,
        finish_s=[r.finish if r.finish is not None else inf for r in reqs],
        replica=[r.rep for r in reqs],
        completed=completed,
    )
