"""One engine's capacity at a TTFT SLO, measured by a static rate sweep of open-loop Poisson load.

The capacity is the highest arrival rate at which at least ``attainment`` of the requests get their first
token within the SLO: found by growing the rate by half until a point misses, then bisecting, and
interpolating linearly between the last point that met it and the first that missed.

Given several engines, each point loads every one of them at the rate at once, each with its own Poisson
stream (no routing between them), and counts the attainment over all their requests: one engine's capacity
as it runs in a fleet whose engines all work. Engines held to quotas on one machine share its caches,
memory bandwidth and (on some machines) the cores' other hyperthreads, so an engine measured alone beside
idle neighbours can serve more than it does once they are busy too, which is how the scaler sees it (on
a CI machine one engine swept alone met the SLO at 4.18 req/s, then took in about 3.5 req/s with its
neighbour busy; here the two read alike).
"""

from __future__ import annotations

import asyncio
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from keda_llm_scaler.enginelab.loadgen import Arrival, LoadResult, run_load, summarize

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
    urls: Sequence[str],
    model: str,
    rate: float,
    duration_s: float,
    prompt: int,
    output: int,
    slo: float,
    mix: Sequence[tuple[int, int]],
) -> SweepPoint:
    streams = [
        poisson_arrivals(rate, duration_s, prompt, output, seed=round(rate * 1000) + 7919 * i, mix=mix)
        for i in range(len(urls))
    ]
    result = _merge(asyncio.run(_each(urls, streams, model)))
    summary = summarize(result, slo)
    att = float(summary["slo_attainment"] or 0.0)
    print(
        f"sweep: {rate:6.2f} req/s{f' on each of {len(urls)} engines' if len(urls) > 1 else ''}  "
        f"attainment {100 * att:5.1f} %  TTFT p50 {summary['ttft_p50_s']:.3f} s  p95 {summary['ttft_p95_s']:.3f} s  "
        f"client lag {summary['client_lag_s']:.3f} s",
        file=sys.stderr,
        flush=True,
    )
    return SweepPoint(rate, att, summary)


async def _each(
    urls: Sequence[str], streams: Sequence[Sequence[Arrival]], model: str, timeout_s: float = 300.0
) -> list[LoadResult]:
    """One load per engine, all at once (each engine its own stream, as it would be in a busy fleet)."""
    loads = (run_load([u], a, model, timeout_s=timeout_s) for u, a in zip(urls, streams, strict=True))
    return list(await asyncio.gather(*loads))


def _merge(results: Sequence[LoadResult]) -> LoadResult:
    return LoadResult(
        [r for res in results for r in res.records],
        max(res.duration_s for res in results),
        max(res.lag_s for res in results),
    )


def _urls(url: str | Sequence[str]) -> list[str]:
    urls = [url] if isinstance(url, str) else list(url)
    if not urls:
        raise ValueError("no engine to measure")
    return urls


def capacity_at_slo(
    url: str | Sequence[str],
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
    warmup_s: float = 0.0,
) -> tuple[float, list[SweepPoint]]:
    """One engine's capacity at the SLO (req/s), and the points measured; ``url`` several engines: each
    point loads all of them at the rate (module docstring). ``warmup_s``: Poisson load at ``start_rate``
    first, not counted, so the first point does not take the engines straight from another regime (a burst
    just drained, or idle)."""
    urls = _urls(url)
    if warmup_s > 0:
        warm = [poisson_arrivals(start_rate, warmup_s, prompt, output, 104729 + i, mix) for i in range(len(urls))]
        asyncio.run(_each(urls, warm, model))
    points: list[SweepPoint] = []
    lo: SweepPoint | None = None
    rate = start_rate
    while True:
        p = _point(urls, model, rate, duration_s, prompt, output, slo_s, mix)
        points.append(p)
        if p.attainment < attainment:
            hi = p
            break
        lo = p
        rate *= 1.5
    if lo is None:  # even the first rate missed: go down until one meets it
        while hi.rate > 0.05:
            p = _point(urls, model, hi.rate / 2, duration_s, prompt, output, slo_s, mix)
            points.append(p)
            if p.attainment >= attainment:
                lo = p
                break
            hi = p
        if lo is None:
            return 0.0, points
    for _ in range(bisections):
        p = _point(urls, model, (lo.rate + hi.rate) / 2, duration_s, prompt, output, slo_s, mix)
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


def saturated_throughput(url: str | Sequence[str], model: str, n: int, prompt: int, output: int) -> float:
    """Requests per second one engine completes when it never runs dry: ``n`` requests sent at once, the
    count over the time from the first completion to the last (the first batch's own latency left out).
    Several engines: ``n`` to each at once, the mean of theirs."""
    urls = _urls(url)
    burst = [Arrival(0.0, prompt, output) for _ in range(n)]
    results = asyncio.run(_each(urls, [burst] * len(urls), model, timeout_s=900))
    rates = [
        burst_throughput([r.sent + r.e2e_s for r in res.records if r.error is None and r.e2e_s is not None])
        for res in results
    ]
    rate = sum(rates) / len(rates)
    each = f" (each of {len(urls)} engines: {', '.join(f'{x:.2f}' for x in rates)})" if len(urls) > 1 else ""
    print(f"sweep: saturated throughput {rate:.2f} req/s ({n} requests at once){each}", file=sys.stderr, flush=True)
    return rate
