"""Hand-checkable cases for the independent reference fleet model (keda_llm_scaler/testing/refsim.py)."""

from __future__ import annotations

import math
import random

import pytest

from keda_llm_scaler.testing.refsim import PROFILES, Profile, nearest_rank, simulate_static

C, B, D, E, F = 12.0, 0.042, 0.03, 0.035, 1.47e-6  # 70b-h100x4, ms


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def test_profiles_are_the_centre_values() -> None:
    p = PROFILES["70b-h100x4"]
    assert (p.c, p.b, p.d, p.e, p.f, p.kv_tokens) == (C, B, D, E, F, 691_000)
    assert PROFILES["8b-h100"].kv_blocks == 418_000 // 16
    assert PROFILES["70b-h200x2"].step_ms(0, 0, 0, 0.0) == 15.0


def test_single_request_prefill_then_decodes() -> None:
    res = simulate_static([(0.0, 1000, 10)], replicas=1, audit=True)
    ttft = (C + B * 1000 + F * 1000 * 500) / 1000  # one step, D = 0, K = 0
    assert rel(res.ttft[0], ttft) < 1e-9
    # 9 decode steps; the k-th reads the KV of 1000 + k - 1 stored tokens
    decode = sum(C + D + E * (1000 + k - 1) / 1000 for k in range(1, 10)) / 1000
    assert rel(res.finish_s[0], ttft + decode) < 1e-9
    assert res.steps == 10 and res.preemptions == 0 and res.completed == 1
    assert res.slo_attainment == 1.0 and res.ttft_p50_s == res.ttft_p99_s == res.ttft[0]


def test_long_prompt_is_chunked_with_prefix_attention() -> None:
    res = simulate_static([(0.0, 20_000, 1)], replicas=1, audit=True)
    chunks = [(8192, 0), (8192, 8192), (20_000 - 2 * 8192, 2 * 8192)]  # (p, q)
    ttft = sum(C + B * p + F * p * (q + p / 2) for p, q in chunks) / 1000
    assert rel(res.ttft[0], ttft) < 1e-9
    assert res.steps == 3
    assert res.finish_s[0] == res.ttft[0]  # one output token: done at the first token


def test_simultaneous_arrivals_share_a_step() -> None:
    res = simulate_static([(0.0, 100, 1), (0.0, 100, 1)], replicas=1, routing="round-robin")
    step = (C + B * 200 + F * 2 * 100 * 50) / 1000
    assert rel(res.ttft[0], step) < 1e-9 and rel(res.ttft[1], step) < 1e-9
    assert res.steps == 1


def test_arrival_mid_step_waits_for_the_next_step() -> None:
    res = simulate_static([(0.0, 1000, 10), (0.01, 100, 1)], replicas=1, audit=True)
    first = (C + B * 1000 + F * 1000 * 500) / 1000
    assert first > 0.01
    second = (C + B * 100 + D + E * 1.0 + F * 100 * 50) / 1000  # request 0 decodes (K = 1000) next to the prefill
    assert rel(res.ttft[1], first + second - 0.01) < 1e-9


def test_decodes_reduce_the_prefill_budget() -> None:
    # step 1: ten 16-token prompts, then the 16,400-token prompt gets the rest of the budget (8032 tokens);
    # step 2: the ten decode, so it gets 8192 - 10 tokens; step 3: the last 186 tokens
    res = simulate_static([(0.0, 16, 100)] * 10 + [(0.0, 16_400, 1)], replicas=1, audit=True)
    t1 = C + B * 8192 + F * (10 * 16 * 8 + 8032 * 4016)
    t2 = C + B * 8182 + D * 10 + E * 0.160 + F * 8182 * (8032 + 8182 / 2)
    t3 = C + B * 186 + D * 10 + E * 0.170 + F * 186 * (8032 + 8182 + 93)
    assert rel(res.ttft[0], t1 / 1000) < 1e-9
    assert rel(res.ttft[10], (t1 + t2 + t3) / 1000) < 1e-9
    assert res.completed == 11


def test_preemption_by_hand() -> None:
    """KV of 4 blocks, two 16-token prompts with 40 output tokens each.

    Step 1 prefills both (1 block each) and emits their first tokens; step 2 each takes a 2nd block; at step 18 both
    need a 3rd block with none free, so B (admitted last) is preempted with 17 generated tokens. A finishes at step 40
    (its 4th block at step 34). B waits for 3 blocks, re-prefills 16 + 17 = 33 tokens in step 41 (token 18) and
    decodes 22 more steps (its 4th block at step 57): 63 steps in all.
    """
    tiny = Profile("tiny", C, B, D, E, F, kv_tokens=64)
    res = simulate_static([(0.0, 16, 40), (0.0, 16, 40)], replicas=1, profile=tiny, audit=True)
    assert res.preemptions == 1 and res.steps == 63 and res.completed == 2
    t1 = C + B * 32 + F * 2 * 16 * 8
    assert rel(res.ttft[0], t1 / 1000) < 1e-9
    assert res.ttft[1] == res.ttft[0]  # the first-token time survives the preemption
    # A stores 15 + s - 1 tokens at step s, B the same until it is preempted at step 18
    a_steps = [C + 2 * D + E * 2 * (14 + s) / 1000 for s in range(2, 18)]
    a_steps += [C + D + E * (14 + s) / 1000 for s in range(18, 41)]
    assert rel(res.finish_s[0], (t1 + sum(a_steps)) / 1000) < 1e-9
    b_steps = [C + B * 33 + F * 33 * 16.5] + [C + D + E * (s - 9) / 1000 for s in range(42, 64)]
    assert rel(res.finish_s[1], res.finish_s[0] + sum(b_steps) / 1000) < 1e-9


def test_max_num_seqs_caps_the_running_set() -> None:
    res = simulate_static([(0.0, 1, 5)] * 1100, replicas=1, audit=True)
    t1 = C + B * 1024 + F * 1024 * 0.5  # 1024 admitted, 76 wait although budget and KV would allow them
    decodes = sum(C + D * 1024 + E * 1024 * (s - 1) / 1000 for s in range(2, 6))
    t6 = C + B * 76 + F * 76 * 0.5  # the first 1024 finished at the end of step 5
    assert rel(res.ttft[0], t1 / 1000) < 1e-9 and rel(res.ttft[1023], t1 / 1000) < 1e-9
    assert rel(res.ttft[1024], (t1 + decodes + t6) / 1000) < 1e-9
    assert res.completed == 1100


def test_least_loaded_routing() -> None:
    reqs = [(0.0, 100, 500), (0.0, 100, 500), (0.001, 100, 500), (0.001, 100, 500), (0.002, 100, 500)]
    res = simulate_static(reqs, replicas=3)
    assert res.replica == [0, 1, 2, 0, 1]  # fewest in flight, ties to the lowest index
    # once everything finished, all replicas are empty again: back to replica 0
    res = simulate_static([(0.0, 100, 2), (0.0, 100, 2), (30.0, 100, 2)], replicas=2)
    assert res.replica == [0, 1, 0]
    # a replica emptied by a finish gets the next request
    res = simulate_static([(0.0, 100, 2), (0.0, 100, 5000), (30.0, 100, 2), (30.0, 100, 2)], replicas=2)
    assert res.replica == [0, 1, 0, 0]


def test_round_robin_cycles() -> None:
    res = simulate_static([(0.1 * i, 100, 2) for i in range(7)], replicas=3, routing="round-robin")
    assert res.replica == [0, 1, 2, 0, 1, 2, 0]


def test_random_routing_is_seeded() -> None:
    reqs = [(0.05 * i, 200, 20) for i in range(200)]
    a = simulate_static(reqs, replicas=4, routing="random", seed=7)
    b = simulate_static(reqs, replicas=4, routing="random", seed=7)
    c = simulate_static(reqs, replicas=4, routing="random", seed=8)
    rng = random.Random(7)
    assert a.replica == [rng.randrange(4) for _ in reqs]
    assert a.replica == b.replica and a.ttft == b.ttft
    assert a.replica != c.replica
    assert set(a.replica) == {0, 1, 2, 3}


def test_kv_exhaustion_preempts_and_everything_finishes() -> None:
    # 400 x (1000 + 1000) tokens needs ~800k tokens of KV; 8b-h100 has 418k
    reqs = [(0.0, 1000, 1000)] * 400
    res = simulate_static(reqs, replicas=1, profile="8b-h100", audit=True)
    assert res.preemptions > 0
    assert res.completed == 400
    assert all(math.isfinite(x) for x in res.finish_s)
    assert all(math.isfinite(x) for x in res.ttft)
    # the same load with enough KV (two replicas) does not preempt
    two = simulate_static(reqs, replicas=2, profile="8b-h100")
    assert two.preemptions == 0 and two.completed == 400


def test_poisson_load_audited() -> None:
    rng = random.Random(3)
    t, reqs = 0.0, []
    for _ in range(1500):
        t += rng.expovariate(40.0)
        reqs.append((t, max(1, int(rng.lognormvariate(6.5, 1.0))), max(1, int(rng.lognormvariate(4.8, 1.0)))))
    res = simulate_static(reqs, replicas=2, profile="8b-h100", audit=True)
    assert res.completed == len(reqs)
    assert res.ttft_p50_s <= res.ttft_p95_s <= res.ttft_p99_s < math.inf
    assert all(f >= a + x for (a, _, _), x, f in zip(reqs, res.ttft, res.finish_s, strict=True))


def test_unfinished_by_the_drain_deadline() -> None:
    res = simulate_static([(0.0, 20_000, 5), (0.0, 50, 1)], replicas=1, drain_s=0.1, slo_ttft_s=10.0)
    assert res.ttft == [math.inf, math.inf]  # the first step (8192 + 50 tokens) ends after 0.1 s
    assert res.slo_attainment == 0.0 and res.ttft_p50_s == math.inf
    assert res.completed == 0 and res.steps == 0


def test_nearest_rank() -> None:
    xs = [float(i) for i in range(1, 101)]
    assert nearest_rank(xs, 0.5) == 50.0
    assert nearest_rank(xs, 0.95) == 95.0
    assert nearest_rank(xs, 0.99) == 99.0
    assert nearest_rank([3.0, math.inf, 1.0], 0.99) == math.inf
    assert nearest_rank([3.0, math.inf, 1.0], 0.5) == 3.0


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="profile"):
        simulate_static([], 1, profile="nope")
    with pytest.raises(ValueError, match="routing"):
        simulate_static([], 1, routing="nope")
    with pytest.raises(ValueError, match="sorted"):
        simulate_static([(1.0, 10, 10), (0.0, 10, 10)], 1)
