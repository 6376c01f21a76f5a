#!/usr/bin/env python3
"""Where a real engine's TTFT goes beside N decodes: lone probe prompts, sent one at a time while N long
answers stream from the same engine, read three ways on the same requests: the engine core's own queue
and prefill means, vLLM's ``time_to_first_token_seconds`` mean (the frontend's), and the client's TTFT.
What the client sees beyond the frontend's reading is the API server's streaming path, which the
simulator's ``ttft_overhead_ms`` (measured by calibrate beside almost no decodes) stands for. Run inside
``scripts/engine run 1`` with the configuration to read:

    scripts/engine run 1 --cpus 0.8 --max-num-seqs 12 --layers 10 -- \
        python benchmarks/engine_ttft_split.py --beside 0,1,3,6 --prompt 256 --rounds 3

``--serving 0.9,1.6`` adds, each round, a minute of Poisson arrivals of the loads' token mix at each
rate: the same split under serving, where a request arrives beside prefills as well as answers.

One JSON line per point, on stdout; the engine's CFS throttling over the point (throttled / periods) when
its cgroup (``kls-engine-*-0``) is found.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from keda_llm_scaler.enginelab.calibrate import _mean_delta_ms, _scrape
from keda_llm_scaler.enginelab.loadgen import Arrival, run_load

LONG_PROMPT, LONG_OUTPUT = 16, 1900  # the answers beside: they stream through every probe
FIRST_PROBE_S, PROBE_GAP_S = 3.0, 1.5  # probes start once the answers beside stream, one at a time


def _throttling() -> tuple[int, int] | None:
    groups = sorted(Path("/sys/fs/cgroup/cpu").glob("kls-engine-*-0"))
    if not groups:
        return None
    fields = dict(line.split() for line in (groups[-1] / "cpu.stat").read_text().splitlines())
    return int(fields["nr_periods"]), int(fields["nr_throttled"])


_ELSEWHERE = """
import asyncio, sys
from keda_llm_scaler.enginelab.loadgen import Arrival, run_load
url, model, n, prompt, output = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
asyncio.run(run_load([url], [Arrival(0.0, prompt, output) for _ in range(n)], model, timeout_s=300))
"""


def _split(
    before: dict[str, Any], after: dict[str, Any], cfs0: tuple[int, int] | None, cfs1: tuple[int, int] | None, load: Any
) -> dict[str, Any]:
    """The engine's own means between two scrapes, the client's TTFT over ``load``'s answered requests
    (and how many), and the CFS periods throttled between the two cgroup readings."""
    ttfts = sorted(1000 * r.ttft_s for r in load.records if r.error is None and r.ttft_s is not None)
    return {
        "engine_queue_ms": _mean_delta_ms(before, after, "vllm:request_queue_time_seconds"),
        "engine_prefill_ms": _mean_delta_ms(before, after, "vllm:request_prefill_time_seconds"),
        "frontend_ttft_ms": _mean_delta_ms(before, after, "vllm:time_to_first_token_seconds"),
        "engine_itl_ms": _mean_delta_ms(before, after, "vllm:inter_token_latency_seconds"),
        "client_ttft_mean_ms": round(statistics.fmean(ttfts), 2) if ttfts else None,
        "client_ttft_p50_ms": round(ttfts[len(ttfts) // 2], 2) if ttfts else None,
        "answered": len(ttfts),
        "throttled": None if cfs0 is None or cfs1 is None else f"{cfs1[1] - cfs0[1]}/{cfs1[0] - cfs0[0]}",
    }


async def point(url: str, model: str, beside: int, prompt: int, probes: int, elsewhere: bool) -> dict[str, Any]:
    shots = [Arrival(FIRST_PROBE_S + PROBE_GAP_S * i, prompt, 1) for i in range(probes)]
    answers = [Arrival(0.0, LONG_PROMPT, LONG_OUTPUT) for _ in range(beside)]
    before, cfs0 = _scrape(url), _throttling()
    jobs: list[Any] = [run_load([url], shots, model, timeout_s=300)]
    other = None
    if beside and elsewhere:  # the answers' streams in another client process: this one reads only the probes
        argv = [sys.executable, "-c", _ELSEWHERE, url, model, str(beside), str(LONG_PROMPT), str(LONG_OUTPUT)]
        other = await asyncio.create_subprocess_exec(*argv)
    elif beside:
        jobs.append(run_load([url], answers, model, timeout_s=300))
    try:
        probed = (await asyncio.gather(*jobs))[0]
    finally:
        if other is not None:
            await other.wait()
    after, cfs1 = _scrape(url), _throttling()
    split = _split(before, after, cfs0, cfs1, probed)
    # the engine's means count the answers' own 16-token prefills too: small
    head = {"beside": beside, "beside_elsewhere": bool(beside and elsewhere), "prompt": prompt}
    probes = split.pop("answered")
    return {**head, **split, "probes": probes}


async def serving(url: str, model: str, rate: float, seconds: float, seed: int) -> dict[str, Any]:
    """The same split under serving: Poisson arrivals of sim_to_real's token mix at ``rate`` req/s."""
    from keda_llm_scaler.enginelab.sweep import poisson_arrivals
    from keda_llm_scaler.sim.trace import BUNDLED_TRACE, load_trace

    mix = [(min(r.prompt, 512), min(r.output, 128)) for r in load_trace(BUNDLED_TRACE)[:4000]]
    arrivals = poisson_arrivals(rate, seconds, 0, 0, seed=seed, mix=mix)
    before, cfs0 = _scrape(url), _throttling()
    result = await run_load([url], arrivals, model, timeout_s=600)
    after, cfs1 = _scrape(url), _throttling()
    split = _split(before, after, cfs0, cfs1, result)
    del split["answered"]
    return {"serving_rps": rate, "requests": len(arrivals), **split}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--beside", default="0,1,3", help="comma-separated numbers of answers streaming beside")
    ap.add_argument("--prompt", type=int, default=256, help="the probes' prompt tokens")
    ap.add_argument("--probes", type=int, default=12, help="probes per point")
    ap.add_argument("--rounds", type=int, default=2, help="every point this many times, interleaved")
    ap.add_argument(
        "--elsewhere",
        action="store_true",
        help="also each point with the answers beside streamed to another client process: "
        "what moves in this one then is not its own streams",
    )
    ap.add_argument(
        "--serving",
        default="",
        help="also, each round, Poisson arrivals of sim_to_real's token mix at these req/s (comma-separated) "
        "for --serving-seconds: the split under serving, beside the probes'",
    )
    ap.add_argument("--serving-seconds", type=float, default=60.0)
    args = ap.parse_args()
    url = os.environ["KLS_ENGINE_URLS"].split(",")[0]
    model = os.environ["KLS_ENGINE_MODEL"]
    besides = [int(b) for b in args.beside.split(",")]
    start = time.monotonic()
    points: list[tuple[int, bool] | float] = [
        (b, e) for b in besides for e in ((False, True) if args.elsewhere and b else (False,))
    ]
    points += [float(r) for r in args.serving.split(",") if r]
    for round_ in range(args.rounds):
        for i, what in enumerate(points):
            if isinstance(what, float):
                row = asyncio.run(serving(url, model, what, args.serving_seconds, seed=round_))
            else:
                row = asyncio.run(point(url, model, what[0], args.prompt, args.probes, what[1]))
            print(json.dumps({"round": round_, **row}), flush=True)
            done = round_ * len(points) + i + 1
            print(f"{done}/{args.rounds * len(points)} points, {time.monotonic() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
