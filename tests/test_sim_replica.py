"""The simulated replica against the perf model's calibration points (REPLICA-PERF-MODEL.md §2), within 15 %."""

from __future__ import annotations

import dataclasses
import random

import pytest

from keda_llm_scaler.sim.profiles import PROFILES
from keda_llm_scaler.sim.replica import Request, SimReplica


def closed_loop(profile: str, concurrency: int, prompt: int, output: int, seconds: float = 120.0):
    """Keep `concurrency` requests in flight; measure the second half."""
    rep = SimReplica(PROFILES[profile])
    rid = 0
    rep.submit(Request(i, 0.0, prompt, output) for i in range(concurrency))
    rid = concurrency
    done: list[Request] = []
    t = 0.0
    while t < seconds:
        t += 0.05
        rep.advance(t)
        finished, rep.finished = rep.finished, []
        done += finished
        rep.submit(Request(rid + k, rep.clock, prompt, output) for k in range(len(finished)))
        rid += len(finished)
    measured = [r for r in done if r.finished_at is not None and r.finished_at > seconds / 2]
    req_s = len(measured) / (seconds / 2)
    itl_ms = 1000 * sum((r.finished_at - r.first_token_at) / (r.output - 1) for r in measured) / len(measured)
    return req_s, req_s * output, itl_ms


def open_loop(profile: str, rate: float, prompt: int, output: int, seconds: float = 60.0):
    rng = random.Random(1)
    rep = SimReplica(PROFILES[profile])
    t, reqs = 0.0, []
    while t < seconds:
        t += rng.expovariate(rate)
        reqs.append(Request(len(reqs), t, prompt, output))
    rep.submit(reqs)
    rep.advance(seconds + 60)
    ttft = sum(r.ttft for r in reqs) / len(reqs) * 1000
    itl = sum((r.finished_at - r.first_token_at) / (r.output - 1) for r in reqs) / len(reqs) * 1000
    return ttft, itl


def test_p1_throughput_at_128_concurrent_azure_mix() -> None:
    # §2.4: at 128 sequences of 1155 in / 211 out, ~28 ms/step => ~4.6k output tok/s ~ 21 req/s
    req_s, tok_s, itl_ms = closed_loop("8b-h100", 128, 1155, 211)
    assert req_s == pytest.approx(21, rel=0.15)
    assert tok_s == pytest.approx(4600, rel=0.15)
    assert itl_ms == pytest.approx(28, rel=0.15)


def test_p1_itl_at_15_concurrent() -> None:
    # §2.3: 6.0 + 15*0.006 + 7*0.055 ~ 6.5 ms at about 15 concurrent
    _, _, itl_ms = closed_loop("8b-h100", 15, 354, 215)
    assert itl_ms == pytest.approx(6.5, rel=0.15)


def test_p1_matches_real_vllm_golden_run() -> None:
    # BLIS golden dataset, real vLLM 8B on 1xH100 at 10 req/s, 284 cached + 70 new in, 215 out:
    # TTFT mean 9.4 ms, ITL mean 6.87 ms (prefix caching: only the 70 new tokens are prefilled)
    ttft_ms, itl_ms = open_loop("8b-h100", 10.0, 70, 215)
    assert itl_ms == pytest.approx(6.87, rel=0.15)
    assert ttft_ms == pytest.approx(9.4, rel=0.15)


def test_p3_single_request_matches_nim() -> None:
    # §2.4: P3 decode floor = NIM 2xH100 TP2 FP8 ITL 18.6 ms / 1.2 ~ 15.5 ms; 5000-token TTFT:
    # NIM 407 ms includes ~30 ms API overhead => ~377 ms of engine time on the same FLOPs
    rep = SimReplica(PROFILES["70b-h200x2"])
    req = Request(0, 0.0, 5000, 500)
    rep.submit([req])
    rep.advance(100.0)
    assert req.ttft is not None and req.finished_at is not None and req.first_token_at is not None
    assert 1000 * req.ttft == pytest.approx(377, rel=0.15)
    assert 1000 * (req.finished_at - req.first_token_at) / 499 == pytest.approx(15.5, rel=0.15)


def test_steps_take_the_profiles_step_time() -> None:
    """The engine runs Profile.step_ms: a prompt chunked over two steps, then decode-only steps whose
    context grows by a token each (advanced in one go, as an arithmetic series)."""
    p = PROFILES["70b-h100x4"]
    rep = SimReplica(p)
    req = Request(0, 0.0, 10_000, 50)
    rep.submit([req])
    rep.advance(100.0)
    chunks = [(8192, 0), (10_000 - 8192, 8192)]  # (tokens, prefix before them)
    ttft_ms = sum(p.step_ms(n, 0, 0, n * (q + n / 2)) for n, q in chunks)
    decode_ms = sum(p.step_ms(0, 1, 10_001 + k) for k in range(49))
    assert req.ttft is not None and req.finished_at is not None
    assert 1000 * req.ttft == pytest.approx(ttft_ms, rel=1e-12)
    assert 1000 * req.finished_at == pytest.approx(ttft_ms + decode_ms, rel=1e-12)
    assert rep.steps == 2 + 49


def test_a_prefill_beside_decodes_costs_g_per_token_and_decode() -> None:
    """A calibrated CPU profile's g·P·D: the step that prefills a prompt beside running decodes lasts
    g x its prefill tokens x those decodes longer, and a step without either is unchanged."""
    base = dataclasses.replace(PROFILES["8b-h100"], max_num_batched_tokens=2048)
    assert base.g_ms == 0.0
    mixed = dataclasses.replace(base, g_ms=0.002)
    assert mixed.step_ms(512, 6, 4000, 0.0) == pytest.approx(base.step_ms(512, 6, 4000, 0.0) + 0.002 * 512 * 6)
    assert mixed.step_ms(0, 6, 4000) == base.step_ms(0, 6, 4000)
    assert mixed.step_ms(512, 0, 0, 0.0) == base.step_ms(512, 0, 0, 0.0)
    ttft = {}
    for name, p in (("base", base), ("mixed", mixed)):
        rep = SimReplica(p)
        rep.submit([Request(i, 0.0, 16, 400) for i in range(6)])  # six decodes running
        late = Request(99, 1.0, 1000, 4)  # then one prompt of 1,000 tokens, in one chunk
        rep.submit([late])
        rep.advance(100.0)
        ttft[name] = late.ttft
    assert ttft["base"] is not None and ttft["mixed"] is not None
    # the prompt's step, plus the wait for the step under way (a decode step, the same in both)
    assert 1000 * (ttft["mixed"] - ttft["base"]) == pytest.approx(0.002 * 1000 * 6, rel=0.02)


def test_kv_exhaustion_preempts_and_recovers() -> None:
    profile = PROFILES["8b-h100"]
    rep = SimReplica(profile)
    # 400 requests of 1000 + 1000 tokens need 800k KV tokens: twice the pool
    reqs = [Request(i, 0.0, 1000, 1000) for i in range(400)]
    rep.submit(reqs)
    peak_kv = 0.0
    for step in range(1, 400):
        rep.advance(step * 0.5)
        peak_kv = max(peak_kv, rep.kv_usage)
        assert rep.kv_used <= profile.kv_tokens + 1
    assert rep.preemptions_total > 0
    assert peak_kv > 0.95
    assert all(r.finished_at is not None for r in reqs)  # everything completes, recomputed or not
    assert rep.finished_total == 400


def test_admission_limit_rejects_with_a_counter() -> None:
    rep = SimReplica(PROFILES["70b-h100x4"], max_queue=10)
    rep.submit(Request(i, 0.0, 8000, 50) for i in range(200))
    rep.advance(1.0)
    assert rep.rejects_total > 0
    sig = rep.signals()
    assert sig.rejects_total == rep.rejects_total
    assert sig.waiting <= 10


def test_signals_look_like_a_vllm_scrape() -> None:
    rep = SimReplica(PROFILES["8b-h100"])
    reqs = [Request(i, i * 0.005, 500, 400) for i in range(100)]
    rep.submit(reqs)
    rep.advance(1.0)  # all arrived, none finished (400 tokens take > 2 s)
    s = rep.signals()
    assert s.engine == "vllm" and s.waiting + s.running == 100 == rep.in_flight()
    assert 0 < s.kv_usage < 1
    assert s.ttft is not None
    assert s.ttft.count == sum(1 for r in reqs if r.first_token_at is not None) > 0
    assert s.ttft.buckets[-1][1] == s.ttft.count


def test_the_inter_token_histogram_counts_each_streams_gap_per_step() -> None:
    """Every step a stream decodes in is one gap of that step's length (vLLM observes one per stream per
    step); a run of decode-only steps is counted in closed form, and must agree with the steps one by one."""
    from keda_llm_scaler.sim.replica import ITL_BUCKETS

    rep = SimReplica(PROFILES["70b-h100x2"])
    rep.submit(Request(i, 0.0, 200, 400) for i in range(12))
    rep.advance(60.0)
    itl = rep.signals().itl
    assert itl is not None and itl.buckets[-1][0] == float("inf")
    done = rep.finished
    assert len(done) == 12
    # each request gave output - 1 gaps (its first token is no gap)
    assert itl.count == sum(r.output - 1 for r in done)
    mean_gap = itl.sum / itl.count
    assert mean_gap == pytest.approx(sum(r.finished_at - r.first_token_at for r in done) / itl.count, rel=0.05)
    # closed form against brute force on a run of growing steps
    fresh = SimReplica(PROFILES["8b-h100"])
    n, d, a, b = 500, 7, 9.0, 0.03
    fresh._observe_decode_gaps(n, d, a, b, (n * a + b * n * (n - 1) / 2) / 1000)
    brute = [0] * len(ITL_BUCKETS)
    from bisect import bisect_left

    for j in range(n):
        brute[bisect_left(ITL_BUCKETS, (a + b * j) / 1000)] += d
    assert fresh._itl_counts == brute
