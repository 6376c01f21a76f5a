"""One simulated vLLM V1 engine: continuous batching on the calibrated step-time model.

Scheduler semantics follow vLLM V1 (REPLICA-PERF-MODEL.md §1): FCFS waiting queue; every step first
schedules the running requests (one token per decoding sequence, prefill chunks in progress), then
admits waiting requests while ``max_num_seqs`` and the ``max_num_batched_tokens`` budget allow, chunking
long prompts; the step that finishes a prompt emits the first token. KV is counted in tokens; when
decoding needs more than is free, the most recently admitted request is preempted (RECOMPUTE: its KV
is freed, it goes back to the front of the queue and is re-prefilled over prompt + generated tokens).
An optional admission limit rejects arrivals (HTTP 503) while the waiting queue is at its bound.

Speed: stretches of decode-only steps are advanced in one go (step times form an arithmetic series
because the context grows by D tokens per step), up to the next completion, arrival, KV exhaustion or
time limit; per-request work happens only at admission, prefill and completion.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable
from typing import Final

from keda_llm_scaler.signals import EngineSignals, Histogram, ReplicaSignals
from keda_llm_scaler.sim.profiles import Profile

__all__ = ["ITL_BUCKETS", "QUEUE_TIME_BUCKETS", "REJECTED", "TTFT_BUCKETS", "Request", "SimReplica"]

# vLLM V1 bucket layouts (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS: Final = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
    math.inf,
)
# the gap between two tokens of a stream: one decode step, as the engine observes it once per stream
ITL_BUCKETS: Final = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    math.inf,
)
QUEUE_TIME_BUCKETS: Final = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
    math.inf,
)

WAITING, PREFILL, DECODE, DONE, REJECTED, CUT = range(6)


class Request:
    __slots__ = (
        "arrival",
        "ctx_base",
        "decode_start",
        "finish_step",
        "finished_at",
        "first_token_at",
        "gen_base",
        "generated",
        "output",
        "prefilled",
        "prompt",
        "prompt_total",
        "queued_at_admit",
        "rid",
        "state",
    )

    def __init__(self, rid: int, arrival: float, prompt: int, output: int) -> None:
        self.rid = rid
        self.arrival = arrival
        self.prompt = max(1, prompt)
        self.output = max(1, output)
        self.prompt_total = self.prompt  # tokens to prefill: prompt, or prompt + generated after preemption
        self.prefilled = 0
        self.generated = 0
        self.state = WAITING
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self.queued_at_admit: float | None = None  # queue time, at first admission
        self.gen_base = 0
        self.ctx_base = 0
        self.decode_start = 0
        self.finish_step = 0

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.arrival


def _bucket_counts(bounds: tuple[float, ...]) -> list[int]:
    return [0] * len(bounds)


class SimReplica:
    def __init__(
        self, profile: Profile, *, name: str = "replica", max_queue: int | None = None, start: float = 0.0
    ) -> None:
        self.profile = profile
        self.name = name
        self.max_queue = max_queue
        self.clock = start
        self.busy_s = 0.0
        self._pending: deque[Request] = deque()  # routed here, arrival time not reached by the clock yet
        self.waiting: deque[Request] = deque()
        self.prefilling: list[Request] = []
        self._heap: list[tuple[int, int, Request]] = []
        # running requests in admission order, for LIFO preemption (a dict pops its last item; O(1) delete)
        self._admit_order: dict[int, Request] = {}
        self.step_no = 0
        self.decoding = 0  # D
        self.context = 0.0  # K: context tokens of the decoding sequences
        self.prefill_kv = 0.0  # KV tokens held by requests still in prefill
        self.steps = 0
        self.preemptions_total = 0
        self.rejects_total = 0
        self.too_long_total = 0  # refused: prompt + output larger than the KV pool (HTTP 400)
        self.finished_total = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self._ttft_counts = _bucket_counts(TTFT_BUCKETS)
        self._ttft_sum = 0.0
        self._queue_counts = _bucket_counts(QUEUE_TIME_BUCKETS)
        self._queue_sum = 0.0
        self._itl_counts = _bucket_counts(ITL_BUCKETS)
        self._itl_sum = 0.0
        self.finished: list[Request] = []  # drained by the fleet after each advance

    # -- what a scrape sees ----------------------------------------------------------------------
    @property
    def running(self) -> int:
        return len(self.prefilling) + self.decoding

    @property
    def kv_used(self) -> float:
        return self.context + self.prefill_kv

    @property
    def kv_usage(self) -> float:
        return min(1.0, self.kv_used / self.profile.kv_tokens)

    def in_flight(self) -> int:
        return len(self._pending) + len(self.waiting) + self.running

    def in_flight_at(self, t: float) -> int:
        """In flight as a router sees it at ``t``: the engine may have run a step past ``t`` already; what
        that step finished is still in flight until the step ends."""
        return self.in_flight() + sum(1 for r in self.finished if r.finished_at is not None and r.finished_at > t)

    def signals(self) -> ReplicaSignals:
        def hist(counts: list[int], bounds: tuple[float, ...], total: float) -> Histogram:
            cumulative, acc = [], 0.0
            for le, c in zip(bounds, counts, strict=True):
                acc += c
                cumulative.append((le, acc))
            return Histogram(tuple(cumulative), acc, total)

        kv = self.kv_usage
        return ReplicaSignals.from_engines(
            "vllm",
            [EngineSignals("0", float(len(self.waiting)), float(self.running), kv)],
            preemptions_total=float(self.preemptions_total),
            rejects_total=float(self.rejects_total),
            admitted_total=float(self.finished_total),
            prompt_tokens_total=float(self.prompt_tokens_total),
            generation_tokens_total=float(self.generation_tokens_total),
            ttft=hist(self._ttft_counts, TTFT_BUCKETS, self._ttft_sum),
            queue_time=hist(self._queue_counts, QUEUE_TIME_BUCKETS, self._queue_sum),
            itl=hist(self._itl_counts, ITL_BUCKETS, self._itl_sum),
        )

    # -- input -----------------------------------------------------------------------------------
    def submit(self, requests: Iterable[Request]) -> None:
        """Route requests here (sorted by arrival, not earlier than what was already submitted)."""
        self._pending.extend(requests)

    def _arrive(self) -> None:
        while self._pending and self._pending[0].arrival <= self.clock:
            r = self._pending.popleft()
            if r.prompt + r.output > self.profile.kv_tokens:
                # longer than the whole KV pool: vLLM answers 400 (beyond max_model_len); it would
                # otherwise block the queue forever
                r.state = REJECTED
                r.finished_at = r.arrival
                self.too_long_total += 1
                self.finished.append(r)
            elif self.max_queue is not None and len(self.waiting) >= self.max_queue:
                r.state = REJECTED
                r.finished_at = r.arrival
                self.rejects_total += 1
                self.finished.append(r)
            else:
                self.waiting.append(r)

    # -- the engine loop -------------------------------------------------------------------------
    def advance(self, t_end: float) -> None:
        """Run engine steps until the clock reaches ``t_end`` (a step in progress may overrun it)."""
        while True:
            self._arrive()
            if not self.waiting and not self.prefilling and self.decoding == 0:
                if self._pending and self._pending[0].arrival < t_end:
                    self.clock = max(self.clock, self._pending[0].arrival)
                    continue
                self.clock = max(self.clock, t_end)
                return
            if self.clock >= t_end:
                return
            if self.prefilling or (
                self.waiting
                and len(self.prefilling) + self.decoding < self.profile.max_num_seqs
                and self.context + self.prefill_kv < self.profile.kv_tokens
            ):
                self._mixed_step()
            else:
                limit = min(t_end, self._pending[0].arrival) if self._pending else t_end
                self._decode_steps(limit)

    def _preempt_for(self, need: float) -> bool:
        """Free KV by preempting the most recently admitted requests (vLLM V1 RECOMPUTE); True if any was."""
        cap = self.profile.kv_tokens
        preempted = False
        while self.context + self.prefill_kv + need > cap and self._admit_order:  # kv_used, inlined: every step
            _, r = self._admit_order.popitem()
            if r.state == DECODE:
                ctx = r.ctx_base + (self.step_no - r.decode_start)
                r.generated = r.gen_base + (self.step_no - r.decode_start)
                self.context -= ctx
                self.decoding -= 1
                r.prompt_total = r.prompt + r.generated
            elif r.state == PREFILL:
                self.prefill_kv -= r.prefilled
                self.prefilling.remove(r)
            else:
                continue  # stale entry
            r.prefilled = 0
            r.state = WAITING
            self.waiting.appendleft(r)
            self.preemptions_total += 1
            preempted = True
        return preempted

    def _mixed_step(self) -> None:
        p = self.profile
        # decoders each need one more KV token this step; as vLLM, a step that preempts admits nobody
        # (unless it emptied the batch), or the victim would be re-admitted at once and thrash
        preempted = self._preempt_for(self.decoding) and self.running > 0
        decoding = self.decoding
        budget = p.max_num_batched_tokens - decoding
        chunks: list[tuple[Request, int]] = []
        free = p.kv_tokens - self.context - self.prefill_kv - decoding
        prefill_tokens = 0
        attention = 0.0
        for r in self.prefilling:  # prefills in progress first, FCFS
            if budget <= 0:
                break
            chunk = int(min(r.prompt_total - r.prefilled, budget, free))
            if chunk <= 0:
                break
            chunks.append((r, chunk))
            budget -= chunk
            free -= chunk
            prefill_tokens += chunk
            attention += chunk * (r.prefilled + chunk / 2)
        if not preempted:
            waiting, running, max_seqs = self.waiting, len(self.prefilling) + self.decoding, p.max_num_seqs  # running
            while waiting and budget > 0 and running < max_seqs:
                r = waiting[0]
                # as vLLM's allocate_slots: the whole chunk must fit in free KV, else admission stops
                chunk = min(r.prompt_total - r.prefilled, budget)
                if chunk <= 0 or chunk > free:
                    break
                waiting.popleft()
                r.state = PREFILL
                if r.queued_at_admit is None:
                    queued = r.queued_at_admit = self.clock - r.arrival
                    self._queue_sum += queued
                    self._queue_counts[bisect_left(QUEUE_TIME_BUCKETS, queued)] += 1
                self.prefilling.append(r)
                self._admit_order[r.rid] = r
                running += 1
                chunks.append((r, chunk))
                budget -= chunk
                free -= chunk
                prefill_tokens += chunk
                attention += chunk * (r.prefilled + chunk / 2)
        dt = p.step_ms(prefill_tokens, decoding, self.context, attention) / 1000.0
        if decoding:  # each stream decoding waited this step for its next token
            self._itl_counts[bisect_left(ITL_BUCKETS, dt)] += decoding
            self._itl_sum += decoding * dt
        self.clock += dt
        self.busy_s += dt
        self.steps += 1
        self.generation_tokens_total += decoding
        self.step_no += 1
        self.context += decoding
        if self._heap and self._heap[0][0] <= self.step_no:
            self._finish_decoders()
        streams = self.decoding  # the answers streaming beside this step's first tokens, which go out together
        for r, chunk in chunks:
            r.prefilled += chunk
            self.prefill_kv += chunk
            if r.prefilled >= r.prompt_total:
                self._start_decoding(r, streams)

    def _start_decoding(self, r: Request, streams: int) -> None:
        """The step that finished the prompt sampled one token, with ``streams`` answers decoding beside."""
        self.prefilling.remove(r)
        self.prefill_kv -= r.prefilled
        r.generated += 1
        self.generation_tokens_total += 1
        if r.first_token_at is None:
            # the API server's own time per request reaches the client on top of the engine's, longer the
            # more answers it streams meanwhile
            r.first_token_at = self.clock + self.profile.first_token_overhead_ms(streams) / 1000.0
            self.prompt_tokens_total += r.prompt  # as vLLM V1 counts it: once, at the first token
            ttft = r.first_token_at - r.arrival
            self._ttft_sum += ttft
            self._ttft_counts[bisect_left(TTFT_BUCKETS, ttft)] += 1
        if r.generated >= r.output:
            self._complete(r)
            return
        r.state = DECODE
        r.gen_base = r.generated
        r.ctx_base = r.prompt_total + 1
        r.decode_start = self.step_no
        r.finish_step = self.step_no + (r.output - r.generated)
        self.context += r.ctx_base
        self.decoding += 1
        heapq.heappush(self._heap, (r.finish_step, r.rid, r))

    def _finish_decoders(self) -> None:
        heap = self._heap
        while heap and heap[0][0] <= self.step_no:
            step, _, r = heapq.heappop(heap)
            if r.state != DECODE or r.finish_step != step:
                continue  # preempted since: a stale entry
            self.context -= r.ctx_base + (self.step_no - r.decode_start)
            self.decoding -= 1
            r.generated = r.output
            self._complete(r)

    def _complete(self, r: Request) -> None:
        self._admit_order.pop(r.rid, None)
        r.state = DONE
        r.finished_at = self.clock
        self.finished_total += 1
        self.finished.append(r)

    def _decode_steps(self, limit: float) -> None:
        """Advance a run of identical decode-only steps in one go."""
        p = self.profile
        d = self.decoding
        free = p.kv_tokens - (self.context + self.prefill_kv)  # kv_used, inlined: every decode run
        if free < d:
            self._mixed_step()  # preempts first
            return
        n = int(free // d)
        while self._heap and (self._heap[0][2].state != DECODE or self._heap[0][2].finish_step != self._heap[0][0]):
            heapq.heappop(self._heap)
        if self._heap:
            n = min(n, self._heap[0][0] - self.step_no)
        # step j lasts a + b*j ms (the context grows by d tokens per step); steps until the clock passes `limit`
        a = p.step_ms(0, d, self.context)
        b = p.context_ms(d)
        budget_ms = max(0.0, (limit - self.clock) * 1000.0)
        if b > 0:
            n_time = math.ceil((-(2 * a - b) + math.sqrt((2 * a - b) ** 2 + 8 * b * budget_ms)) / (2 * b))
        else:
            n_time = math.ceil(budget_ms / a)
        n = max(1, min(n, n_time))
        dt = (n * a + b * n * (n - 1) / 2.0) / 1000.0
        self._observe_decode_gaps(n, d, a, b, dt)
        self.clock += dt
        self.busy_s += dt
        self.steps += n
        self.generation_tokens_total += n * d
        self.step_no += n
        self.context += n * d
        if self._heap and self._heap[0][0] <= self.step_no:
            self._finish_decoders()

    def _observe_decode_gaps(self, n: int, d: int, a_ms: float, b_ms: float, dt: float) -> None:
        """n steps of a + b*j ms (j = 0..n-1), each a gap for every one of the d streams: counted per
        bucket in closed form (the steps' lengths only grow, and a run mostly stays in one bucket), never
        step by step: this runs once per run of decode steps, the simulator's hottest path."""
        counts = self._itl_counts
        lo = bisect_left(ITL_BUCKETS, a_ms / 1000.0)
        hi = bisect_left(ITL_BUCKETS, (a_ms + b_ms * (n - 1)) / 1000.0)
        below = 0  # steps no longer than the previous bound
        for k in range(lo, hi):  # (only when the run crosses bounds; the last bucket takes the rest)
            upto = min(n, max(0, math.floor((ITL_BUCKETS[k] * 1000.0 - a_ms) / b_ms) + 1))
            counts[k] += d * (upto - below)
            below = upto
        counts[hi] += d * (n - below)
        self._itl_sum += d * dt

    # -- shutdown --------------------------------------------------------------------------------
    def cut_all(self, now: float) -> list[Request]:
        """The pod is killed: every request still here is cut, with the tokens it got so far (decoding
        requests advance in closed form and count their tokens only when they finish or are preempted)."""
        for step, _, r in self._heap:
            if r.state == DECODE and r.finish_step == step:
                r.generated = min(r.output, r.gen_base + (self.step_no - r.decode_start))
        cut = [*self._pending, *self.waiting, *self.prefilling, *(r for _, _, r in self._heap if r.state == DECODE)]
        seen: set[int] = set()
        out = []
        for r in cut:
            if r.rid in seen:
                continue
            seen.add(r.rid)
            r.state = CUT
            r.finished_at = now
            out.append(r)
        self._pending.clear()
        self.waiting.clear()
        self.prefilling.clear()
        self._heap.clear()
        self._admit_order.clear()
        self.decoding = 0
        self.context = 0.0
        self.prefill_kv = 0.0
        return out
