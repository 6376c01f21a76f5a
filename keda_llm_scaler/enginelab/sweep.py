"""One engine's capacity at a TTFT SLO, measured by a static rate sweep of open-loop Poisson load.

The capacity is the highest arrival rate at which at least ``attainment`` of the requests get their first
token within the SLO: found by growing the rate by half until a point misses, then bisecting, and
interpolating linearly between the last point that met it and the first that missed.
"""

from __future__ import annotations

import asyncio
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from keda_llm_scaler.enginelab.loadgen import Arrival, run_load, summarize

__all__ = ["SweepPoint", "burst_throughput", "capacity_at_slo", "poisson_arrivals", "saturated_throughput"]


def poisson_arrivals(
    rate: float, duration_s: float, prompt: int, output: int, seed: int = 0, mix: Sequence[tuple[int, int]] = ()
) -> list[Arrival]:
    """Poisson arrivals at ``rate``; each (prompt, output) drawn from ``mix`` when given, else fixed."""
    rng = random.Random(seed)
    t, out = 0.0, list[Arrival]()
    while True:
        t += rng.expovariate(rate)
        if t >= duration_s:
            return out
        p, o = rng.choice(mix) if mix else (prompt, output)
        out.append(Arrival(t, p, o))


@dataclass(frozen=True)
class SweepPoint:
    rate: float
    attainment: float
    summary: dict[str, Any]


def _point(
    url: str,
    model: str,
    rate: float,
    duration_s: float,
    prompt: int,
    output: int,
    slo: float,
    mix: Sequence[tuple[int, int]],
) -> SweepPoint:
    arrivals = poisson_arrivals(rate, duration_s, prompt, output, seed=round(rate * 1000), mix=mix)
    result = asyncio.run(run_load([url], arrivals, model))
    summary = summarize(result, slo)
    att = float(summary["slo_attainment"] or 0.0)
    print(
        f"sweep: {rate:6.2f} req/s  attainment {100 * att:5.1f} %  TTFT p50 {summary['ttft_p50_s']:.3f} s",
        file=sys.stderr,
        flush=True,
    )
    return SweepPoint(rate, att, summary)


def capacity_at_slo(
    url: str,
    model: str,
    *,
    slo_s: float,
    prompt: int,
    output: int,
    start_rate: float = 1.0,
    attainment: float = 0.95,
    duration_s: float = 40.0,
    bisections: int = 3,
    mix: Sequence[tuple[int, int]] = (),
) -> tuple[float, list[SweepPoint]]:
    points: list[SweepPoint] = []
    lo: SweepPoint | None = None
    rate = start_rate
    while True:
        p = _point(url, model, rate, duration_s, prompt, output, slo_s, mix)
        points.append(p)
        if p.attainment < attainment:
            hi = p
            break
        lo = p
        rate *= 1.5
    if lo is None:  # even the first rate missed: go down until one meets it
        while hi.rate > 0.05:
            p = _point(url, model, hi.rate / 2, duration_s, prompt, output, slo_s, mix)
            points.append(p)
            if p.attainment >= attainment:
                lo = p
                break
            hi = p
        if lo is None:
            return 0.0, points
    for _ in range(bisections):
        p = _point(url, model, (lo.rate + hi.rate) / 2, duration_s, prompt, output, slo_s, mix)
        points.append(p)
        if p.attainment >= attainment:
            lo = p
        else:
            hi = p
    return _interpolate(lo, hi, attainment), points


def _interpolate(lo: SweepPoint, hi: SweepPoint, attainment: float) -> float:
    drop = lo.attainment - hi.attainment
    if drop <= 0:
        return lo.rate
    return lo.rate + (hi.rate - lo.rate) * (lo.attainment - attainment) / drop


def burst_throughput(completions: Sequence[float]) -> float:
    """Requests per second a burst completed at: the count over the time from its first completion to its
    last (the first batch's own latency left out); 0 when that cannot be told."""
    done = sorted(completions)
    if len(done) < 2 or done[-1] <= done[0]:
        return 0.0
    return (len(done) - 1) / (done[-1] - done[0])


def saturated_throughput(url: str, model: str, n: int, prompt: int, output: int) -> float:
    """Requests per second one engine completes when it never runs dry: ``n`` requests sent at once, the
    count over the time from the first completion to the last (the first batch's own latency left out)."""
    result = asyncio.run(run_load([url], [Arrival(0.0, prompt, output) for _ in range(n)], model, timeout_s=900))
    rate = burst_throughput([r.sent + r.e2e_s for r in result.records if r.error is None and r.e2e_s is not None])
    print(f"sweep: saturated throughput {rate:.2f} req/s ({n} requests at once)", file=sys.stderr, flush=True)
    return rate
