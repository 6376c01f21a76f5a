"""``keda-llm-scaler loadgen``: open-loop streaming OpenAI load against real engines, from a trace.

Arrivals come from a trace (the Azure CSV format, a bundled one, or a ServeGen rate curve), rescaled in
time to ``--rate`` requests/s on average: an arrival is sent at its time whatever the engines do (open
loop), so a slow fleet builds a queue as a real one would. Each request is a streaming
``/v1/completions`` call with token ids as the prompt (the prompt length is exact on any tokenizer) and
``ignore_eos`` with ``max_tokens`` (the output length is the trace's). Client-side it measures the time
to first token and the gaps between tokens, per request, and writes a summary (JSON) and a plot (PNG).

With several ``--url`` the generator is the gateway: each request goes to the engine with the fewest
requests in flight from it (ties in URL order), as an inference gateway's least-request routing does.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from keda_llm_scaler.sim.run import percentile  # the replay's quantile: the two are compared

__all__ = ["Arrival", "LoadResult", "RequestRecord", "Router", "rescale", "run_load", "stream_one", "summarize"]

PROMPT_ID_RANGE = (100, 1000)  # token ids every tokenizer of a real model has: no special ones
TIMELINE_S = 10.0


@dataclass(frozen=True, slots=True)
class Arrival:
    t: float  # seconds from the start of the run
    prompt_tokens: int
    output_tokens: int


@dataclass(slots=True)
class RequestRecord:
    t: float  # scheduled arrival (s from start)
    sent: float  # when it was sent (s from start): late only if this client fell behind
    url: str
    prompt_tokens: int
    output_tokens: int
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    e2e_s: float | None = None
    tokens: int = 0
    error: str | None = None
    finish_reason: str | None = None  # the engine's: "length" for a whole answer (ignore_eos), "abort" cut

    @property
    def complete(self) -> bool:
        """The whole answer came: every token asked for, ended by the engine, not cut or refused."""
        return self.error is None and self.finish_reason in ("length", "stop")


@dataclass
class LoadResult:
    records: list[RequestRecord]
    duration_s: float
    lag_s: float  # the latest any request was sent after its arrival time (this client's own delay)


def rescale(
    rows: Sequence[tuple[float, int, int]],
    rate: float | None,
    duration_s: float | None,
    *,
    max_prompt: int | None = None,
    max_output: int | None = None,
    prompt_tokens: int | None = None,
    output_tokens: int | None = None,
) -> list[Arrival]:
    """Arrivals from trace rows (time, prompt, output), compressed or stretched in time so that their mean
    rate over the run is ``rate`` (None: as in the trace), cut at ``duration_s``, with token counts fixed or
    clamped. The rate is the run's own: the first ``rate x duration`` arrivals fill the duration exactly,
    so a trace whose first minutes are quieter than its mean still sends what was asked for."""
    rows = sorted(rows)
    if not rows:
        return []
    t0 = rows[0][0]
    offsets = [t - t0 for t, _, _ in rows]
    factor = 1.0
    if rate is not None:
        span = offsets[-1] if offsets[-1] > 0 else 1e-9
        if duration_s is not None and 0 < round(rate * duration_s) < len(rows):
            # the arrival that ends the run lands on duration_s: that many arrivals in that long
            k = round(rate * duration_s)
            factor = duration_s / offsets[k] if offsets[k] > 0 else 1.0
        else:
            factor = (len(rows) / span) / rate
    out = []
    for at_trace, (_, p, o) in zip(offsets, rows, strict=True):
        at = at_trace * factor
        if duration_s is not None and at >= duration_s:
            break
        p = prompt_tokens if prompt_tokens is not None else min(p, max_prompt or p)
        o = output_tokens if output_tokens is not None else min(o, max_output or o)
        out.append(Arrival(at, max(1, int(p)), max(1, int(o))))
    return out


class Router:
    """Least in flight from this client, ties in URL order: what a gateway's least-request routing does.
    ``route(urls)`` changes where new requests go (a pod removed keeps its requests in flight)."""

    def __init__(self, urls: Sequence[str]) -> None:
        self.urls: list[str] = []
        self.in_flight: dict[str, int] = {}
        self.route(urls)

    def route(self, urls: Sequence[str]) -> None:
        self.urls = list(urls)
        for u in self.urls:
            self.in_flight.setdefault(u, 0)

    def pick(self) -> str:
        return min(self.urls, key=lambda u: self.in_flight[u])


async def stream_one(
    session: aiohttp.ClientSession,
    router: Router,
    model: str,
    a: Arrival,
    start: float,
    rng: random.Random,
    timeout_s: float,
) -> RequestRecord:
    url = router.pick()
    router.in_flight[url] += 1
    sent = time.monotonic()
    rec = RequestRecord(a.t, sent - start, url, a.prompt_tokens, a.output_tokens)
    body = {
        "model": model,
        "prompt": [rng.randrange(*PROMPT_ID_RANGE) for _ in range(a.prompt_tokens)],
        "max_tokens": a.output_tokens,
        "ignore_eos": True,
        "stream": True,
        "temperature": 0.0,
    }
    last: float | None = None
    try:
        async with session.post(
            url + "/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            if resp.status != 200:
                rec.error = f"http_{resp.status}"
                await resp.read()
                return rec
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                # one chunk per engine step that made a token, its text possibly empty (a byte-level token
                # that ends inside a UTF-8 character): the usage chunk at the end has no choices
                if not chunk.get("choices"):
                    continue
                rec.finish_reason = chunk["choices"][0].get("finish_reason") or rec.finish_reason
                now = time.monotonic()
                if last is None:
                    rec.ttft_s = now - sent
                else:
                    rec.itl_s.append(now - last)
                last = now
                rec.tokens += 1
        rec.e2e_s = time.monotonic() - sent
    except TimeoutError:
        rec.error = "timeout"
    except aiohttp.ClientError as exc:
        rec.error = type(exc).__name__
    finally:
        router.in_flight[url] -= 1
    return rec


async def run_load(
    urls: Sequence[str],
    arrivals: Sequence[Arrival],
    model: str,
    *,
    timeout_s: float = 300.0,
    seed: int | None = None,
    progress: Callable[[float, int, int, int], None] | None = None,
) -> LoadResult:
    """Send every arrival at its time (open loop) and wait for all answers.

    Prompts are random token ids, fresh on every call unless ``seed`` is given: vLLM caches prefixes, so
    a prompt sent again (a probe repeated, a rerun against the same engine) would skip most of its
    prefill and measure a faster engine than serving traffic sees."""
    router = Router(urls)
    rng = random.Random(seed)  # None: seeded from the OS
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    tasks: list[asyncio.Task[RequestRecord]] = []
    lag = 0.0
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.monotonic()
        next_report = start + TIMELINE_S
        for a in arrivals:
            delay = start + a.t - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            lag = max(lag, time.monotonic() - start - a.t)
            tasks.append(asyncio.create_task(stream_one(session, router, model, a, start, rng, timeout_s)))
            if progress is not None and time.monotonic() >= next_report:
                next_report += TIMELINE_S
                done = sum(1 for t in tasks if t.done())
                progress(time.monotonic() - start, len(tasks), done, sum(router.in_flight.values()))
        records = list(await asyncio.gather(*tasks))
        return LoadResult(records, time.monotonic() - start, lag)


def summarize(result: LoadResult, slo_ttft_s: float, *, skip_s: float = 0.0) -> dict[str, Any]:
    """The run's figures: TTFT and inter-token quantiles, SLO attainment (TTFT within ``slo_ttft_s``;
    a failed request misses), over requests arriving at or after ``skip_s``, and a 10 s timeline."""
    recs = [r for r in result.records if r.t >= skip_s]
    ok = [r for r in recs if r.error is None and r.ttft_s is not None]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    itls = [g for r in ok for g in r.itl_s]
    errors: dict[str, int] = {}
    for r in recs:
        if r.error is not None:
            errors[r.error] = errors.get(r.error, 0) + 1
    span = max((r.t for r in recs), default=0.0) - min((r.t for r in recs), default=0.0)
    timeline = []
    end = max((r.t for r in result.records), default=0.0)
    for k in range(int(end // TIMELINE_S) + 1):
        lo, hi = k * TIMELINE_S, (k + 1) * TIMELINE_S
        window = [r for r in result.records if lo <= r.t < hi]
        w_ttft = [r.ttft_s for r in window if r.ttft_s is not None and r.error is None]
        timeline.append(
            {
                "t": lo,
                "offered_rps": len(window) / TIMELINE_S,
                "ttft_p50_s": percentile(w_ttft, 0.5),
                "ttft_p95_s": percentile(w_ttft, 0.95),
                "failed": sum(1 for r in window if r.error is not None),
            }
        )
    per_url: dict[str, int] = {}
    for r in recs:
        per_url[r.url] = per_url.get(r.url, 0) + 1
    return {
        "requests": len(recs),
        "completed": len(ok),
        "failed": len(recs) - len(ok),
        "errors": errors,
        "offered_rps": len(recs) / span if span > 0 else None,
        "duration_s": result.duration_s,
        "client_lag_s": result.lag_s,
        "slo_ttft_s": slo_ttft_s,
        "slo_attainment": (sum(1 for t in ttfts if t <= slo_ttft_s) / len(recs)) if recs else None,
        "ttft_p50_s": percentile(ttfts, 0.5),
        "ttft_p95_s": percentile(ttfts, 0.95),
        "ttft_p99_s": percentile(ttfts, 0.99),
        "itl_p50_s": percentile(itls, 0.5),
        "itl_p95_s": percentile(itls, 0.95),
        "e2e_p50_s": percentile([r.e2e_s for r in ok if r.e2e_s is not None], 0.5),
        "output_tokens": sum(r.tokens for r in ok),
        "per_url": per_url,
        "skip_s": skip_s,
        "timeline": timeline,
    }


def plot(summary: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = summary["timeline"]
    t = [p["t"] / 60 for p in tl]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    ax1.step(t, [p["offered_rps"] for p in tl], where="post", label="offered req/s")
    ax1.set_ylabel("req/s")
    ax1.legend(loc="upper left")
    ax1.set_title(title)
    for key, label in (("ttft_p50_s", "TTFT p50"), ("ttft_p95_s", "TTFT p95")):
        ax2.plot(t, [p[key] if p[key] is not None else math.nan for p in tl], label=label)
    ax2.axhline(summary["slo_ttft_s"], color="red", linestyle="--", label="SLO")
    ax2.set_yscale("log")
    ax2.set_ylabel("seconds")
    ax2.set_xlabel("minutes")
    ax2.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


async def discover_model(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(url + "/v1/models", timeout=aiohttp.ClientTimeout(10)) as r:
        data = await r.json()
    return str(data["data"][0]["id"])


def progress_printer(total: int) -> Callable[[float, int, int, int], None]:
    def show(elapsed: float, sent: int, done: int, in_flight: int) -> None:
        print(
            f"loadgen: {elapsed:6.0f} s  sent {sent}/{total}  done {done}  in flight {in_flight}",
            file=sys.stderr,
            flush=True,
        )

    return show
