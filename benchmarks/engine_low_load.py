#!/usr/bin/env python3
"""What an engine's latency below the knee is, against a calibrated profile on the same arrivals: engine 0's
own mean inter-token, prefill and queue times and the client's TTFT p50, at a partial load of the
sim-to-real loads' mix, beside an idle or a busy neighbour, and (``--age``) again after every engine has
served that many seconds of overload. Run inside ``scripts/engine run 2`` with the configuration the
profile was calibrated on:

    scripts/engine run 2 --cpus 0.85 --max-num-seqs 10 --layers 9 -- \
        python benchmarks/engine_low_load.py --profile docs/sim-to-real/g/profile.json --rates 0.86,1.55
    scripts/engine run 2 --cpus 0.85 --max-num-seqs 10 --layers 9 -- \
        python benchmarks/engine_low_load.py --profile docs/sim-to-real/g/profile.json --rates 0.86 \
        --busy-only --age 150 --rounds 2
    # the host's drift against aging: engine 1 aged alone, engine 0 idle meanwhile, both read at once
    scripts/engine run 2 --cpus 0.85 --max-num-seqs 10 --layers 9 -- \
        python benchmarks/engine_low_load.py --profile docs/sim-to-real/g/profile.json --rates 0.86 \
        --control --age-engines 1 --age 150 --rounds 2

One JSON line per measurement, on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from typing import Any

from keda_llm_scaler.enginelab.calibrate import _mean_delta_ms, _sampled_load, simulated_serving
from keda_llm_scaler.enginelab.loadgen import run_load, summarize
from keda_llm_scaler.enginelab.sweep import poisson_arrivals
from keda_llm_scaler.sim.profiles import Profile, get_profile
from keda_llm_scaler.sim.replica import Request, SimReplica
from keda_llm_scaler.sim.trace import BUNDLED_TRACE, load_trace

MAX_PROMPT, MAX_OUTPUT = 512, 128  # as benchmarks/sim_to_real.py
SECONDS, SEED = 90.0, 200


def _mix() -> list[tuple[int, int]]:
    return [(min(r.prompt, MAX_PROMPT), min(r.output, MAX_OUTPUT)) for r in load_trace(BUNDLED_TRACE)[:4000]]


async def measure(urls: list[str], model: str, profile: Profile, rate: float, busy: bool) -> dict[str, Any]:
    mix = _mix()
    arrivals = poisson_arrivals(rate, SECONDS, 0, 0, seed=SEED, mix=mix)
    jobs: list[Any] = [_sampled_load(urls[0], model, arrivals, timeout_s=900, period_s=0.25)]
    if busy:
        jobs.append(run_load(urls[1:], poisson_arrivals(rate, SECONDS, 0, 0, seed=SEED + 1, mix=mix), model))
    sampled = (await asyncio.gather(*jobs))[0]
    return {"rate": rate, "busy_neighbour": busy, **_reading(profile, arrivals, sampled)}


async def measure_each(urls: list[str], model: str, profile: Profile, rate: float) -> list[dict[str, Any]]:
    """Every engine at once, each on the same arrivals: a reading per engine, so an engine aged alone can be
    read against its neighbour that was not, at the same moment on the same host."""
    arrivals = poisson_arrivals(rate, SECONDS, 0, 0, seed=SEED, mix=_mix())
    sampled = await asyncio.gather(*(_sampled_load(u, model, arrivals, timeout_s=900, period_s=0.25) for u in urls))
    return [{"engine": i, "rate": rate, **_reading(profile, arrivals, s)} for i, s in enumerate(sampled)]


def _reading(profile: Profile, arrivals: list[Any], sampled: Any) -> dict[str, Any]:
    result, before, after, samples = sampled
    sim_itl, sim_prefill = simulated_serving(profile, arrivals)
    replica = SimReplica(profile)  # with the API server's time, flat or by answers streaming
    replica.submit([Request(i, a.t, a.prompt_tokens, a.output_tokens) for i, a in enumerate(arrivals)])
    replica.advance(24 * 3600.0)
    ttfts = sorted(r.first_token_at - r.arrival for r in replica.finished if r.first_token_at is not None)

    return {
        "running_mean": round(statistics.fmean(g.get("vllm:num_requests_running", 0.0) for _, g in samples), 2)
        if samples
        else None,
        "engine_itl_ms": _mean_delta_ms(before, after, "vllm:inter_token_latency_seconds"),
        "engine_prefill_ms": _mean_delta_ms(before, after, "vllm:request_prefill_time_seconds"),
        "engine_queue_ms": _mean_delta_ms(before, after, "vllm:request_queue_time_seconds"),
        "client_ttft_p50_ms": round(1000 * summarize(result, 1.0)["ttft_p50_s"], 2),
        "sim_itl_ms": None if sim_itl is None else round(sim_itl, 2),
        "sim_prefill_ms": None if sim_prefill is None else round(sim_prefill, 2),
        "sim_ttft_p50_ms": round(1000 * ttfts[len(ttfts) // 2], 2),
    }


async def age(urls: list[str], model: str, seconds: float, rate: float) -> None:
    """Each of ``urls`` at once: Poisson arrivals of the mix at ``rate`` req/s each."""
    mix = _mix()
    loads = [poisson_arrivals(rate, seconds, 0, 0, seed=900 + i, mix=mix) for i in range(len(urls))]
    t = time.monotonic()
    await asyncio.gather(*(run_load([u], a, model, timeout_s=900) for u, a in zip(urls, loads, strict=True)))
    print(f"aged: {sum(map(len, loads))} requests in {time.monotonic() - t:.0f} s", file=sys.stderr, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", required=True, help="the profile calibrated on this configuration")
    ap.add_argument("--rates", default="0.86", help="req/s to engine 0 (and to each neighbour when busy)")
    ap.add_argument("--busy-only", action="store_true", help="only beside busy neighbours")
    ap.add_argument("--age", type=float, default=0.0, help="seconds of overload between rounds (0: one round)")
    ap.add_argument(
        "--age-rate", type=float, default=3.2, help="req/s to each engine while aging (default 3.2: past G's knee)"
    )
    ap.add_argument("--rounds", type=int, default=0, help="rounds after the first, each after --age of overload")
    ap.add_argument(
        "--control",
        action="store_true",
        help="read every engine at once on the same arrivals, and age only --age-engines: "
        "the engines not aged are the control for the host's drift",
    )
    ap.add_argument("--age-engines", default="", help="with --control: comma-separated engine indices to age")
    args = ap.parse_args()
    urls = os.environ["KLS_ENGINE_URLS"].split(",")
    model = os.environ["KLS_ENGINE_MODEL"]
    profile = get_profile(args.profile)
    rates = [float(r) for r in args.rates.split(",")]
    aged = [urls[int(i)] for i in args.age_engines.split(",") if i] if args.control else urls
    for round_ in range(1 + args.rounds):
        if round_:
            asyncio.run(age(aged, model, args.age, args.age_rate))
        if args.control:
            for rate in rates:
                for row in asyncio.run(measure_each(urls, model, profile, rate)):
                    print(
                        json.dumps({"round": round_, "aged": urls[row["engine"]] in aged and round_ > 0, **row}),
                        flush=True,
                    )
            continue
        for rate in rates:
            for busy in (True,) if args.busy_only or len(urls) < 2 else (False, True):
                row = asyncio.run(measure(urls, model, profile, rate, busy and len(urls) > 1))
                print(json.dumps({"round": round_, **row}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
