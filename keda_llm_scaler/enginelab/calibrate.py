"""``keda-llm-scaler calibrate``: a replica profile for the simulator, fitted on a running engine.

It sends its own load in phases and reads the engine's own histograms (sum and count before and after
each phase, so only its own requests count) and its cache config:

- **prefill, under load**: for each of several prompt lengths, Poisson arrivals of requests with that
  prompt and ``PREFILL_OUTPUT`` tokens at ``PREFILL_RATE``, so prompts come while others decode, at
  random times, as in serving. The engine's ``request_prefill_time_seconds`` per request is that mixed
  step, ``c + b·P + d·B + e·K/1000 + f·P²/2`` with ``B`` the decodes beside it (Poisson arrivals see the
  time average: the running gauge's mean) and ``K`` their context, fitted for ``b`` and ``f`` once the
  decode terms are known. Lone prompts sent back to back beside two long decodes (the first version) read
  a 512-token prefill at 249 ms where the same engine under Poisson load spent 126-166 ms, and a simulator
  fitted on them served 0.92 req/s where the engine served 1.59; clients sending prompts in lockstep put
  several prompts in one step (537 ms). Every prompt is fresh: a repeated one is a prefix-cache hit,
  not a prefill;
- **decode**: batches of B concurrent requests with short prompts, at several B and two output lengths
  (so the context is not just a multiple of the batch); the engine's ``inter_token_latency_seconds``
  mean is ``c + d·B + e·K/1000`` with ``K`` the batch's mean context, fitted for ``c``, ``d`` and ``e``;
- **the engine serving**: ``SERVING_SECONDS`` of Poisson arrivals of calibrate's own mix
  (``SERVING_PROMPTS`` x ``SERVING_OUTPUTS``, fresh prompts) at ``SERVING_OF_STEADY`` of the rate the
  engine served steady overload at (below), which is below its knee; the engine's mean inter-token latency and mean
  prefill time over them against the fitted model's on the same arrivals. The decode side's coefficients
  (``c``, ``d``, ``e``) are multiplied by the factor that makes the model's mean the engine's, and the
  prefill time the engine spent beyond the probes' goes into ``g``, what a prefill token costs per
  decode beside it in its step (``serving_scales``, within ``STEP_SCALE_BOUNDS`` and
  ``INTERACTION_BOUND``). The probes above
  measure each term apart, on an engine mostly idle between steps; serving, a CPU engine's steps are
  slower than their sum: its prefills share steps with a full batch of decodes, and its quota with the
  API server streaming every answer. The first version scaled every coefficient by one factor from a
  saturated burst of 256/64-token requests sent at once, which the fitted model matched within 4 %; under
  Poisson load of longer requests the same engines' inter-token latency was 22-63 % above the model's, and
  the simulator held 83 % within the SLO past the knee where the engines held 7-10 %. One factor matched
  on the serving phase's inter-token latency (the second version) left prefills under load a third short
  (159 ms where the engine took 236) and TTFT p50 11-29 % low at every load; a factor on the prefill side
  as well (the third version) slowed every prefill alike, and TTFT p50 at half the knee read 16-41 % high
  on engines calibrated beside busy neighbours, since a light load puts few decodes beside a prefill
  (docs/sim-to-real.md). The phase runs twice: before the steady-overload phase, at
  ``FRESH_SERVING_LOAD`` of the rate the fitted model completes the mix at when it never runs dry (only
  to set that phase's rate), and after it, below the rate it measured; the second is fitted on. Fitted
  at the first one's rate (until 2026-12-06), it ran past the knee on every configuration from E to J,
  and the simulator's prefills below the knee read 24 % short on J. An engine that has served
  a queue serves slower below the knee than it did before (config G's engines: TTFT p50 +22 % and +8 %
  after 150 s of overload; an engine overloaded alone +30 % where its idle neighbour read +19 %, its
  prefill +49 % where the neighbour's held), and every engine in a fleet has served one: past the
  knee sweeps, the loads, and any production day. Fitted on fresh engines, the simulator's TTFT p50
  read 16-42 % low below the knee on configs A, E, G and H, and +2 % on F (docs/sim-to-real.md);
- **the engine under steady overload**: ``OVERLOAD_SECONDS`` of Poisson arrivals of the same mix at
  ``OVERLOAD_LOAD`` of the rate the serving-scaled model completes it at when it never runs dry; the
  engine's completions within ``OVERLOAD_WINDOW``, where it runs with a queue, are the rate a queue past
  the knee drains at. Every step coefficient takes the factor that makes the model's completions in the
  same window the engine's (``steady_scale``, within ``STEADY_SCALE_BOUNDS``). Config E's engines served
  steady overload 27 % below the rate they drained a burst at, and a simulator scaled below saturation
  queued half as long as they did past the knee (docs/sim-to-real.md);
- **the API server's own time per request**: what the client waits beyond the engine core's queue and
  prefill (tokenizing, the hand-off to the engine core and the wait for its current step, the first
  chunk's write behind the other answers' chunks and the cgroup's throttled periods), as the value that
  puts the final model's mean TTFT on the serving phase's arrivals at the client's (``serving_overhead_ms``).
  The simulator adds it to every TTFT. Measured on requests alone (the prefill probes' median, until
  2026-12-06) or beside N streaming answers (lone probes, on 2026-12-06) it read a third to a half of what
  clients of a serving engine wait there, and the simulator's TTFT p50 read 16-45 % low below the knee on
  configs A, E, G, H, I and J (docs/sim-to-real.md). The prefill probes' figures stay in the fit's points.

KV tokens come from ``vllm:cache_config_info`` (``kv_cache_size_tokens``, else blocks x block size);
``max_num_seqs`` is given or read as the most requests the engine ran at once under a batch larger than it.
The step-time model is the bundled profiles' (``keda_llm_scaler.sim.profiles``); the file it writes is
what ``replay --profile FILE`` reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import random
import statistics
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from keda_llm_scaler.enginelab.loadgen import Arrival, run_load
from keda_llm_scaler.enginelab.sweep import burst_throughput, poisson_arrivals
from keda_llm_scaler.sim.profiles import Profile
from keda_llm_scaler.sim.replica import Request, SimReplica

__all__ = [
    "Fit",
    "ServingScales",
    "calibrate",
    "fit_decode",
    "fit_prefill",
    "least_squares",
    "prefill_alone",
    "scaled",
    "serving_mix",
    "serving_overhead_ms",
    "serving_scales",
    "simulated_queue_ms",
    "simulated_serving",
    "simulated_throughput",
    "simulated_window_rate",
    "steady_scale",
]

# the serving phase: calibrate's own mix (not a workload it reports on), uniform over these ranges
SERVING_PROMPTS = (96, 768)
SERVING_OUTPUTS = (24, 192)
SERVING_SECONDS = 75.0
# the first serving phase, which only sets the overload's rate: of the fitted model's never-dry rate
FRESH_SERVING_LOAD = 0.8
# the serving phase fitted on: of the rate the engine served steady overload at, below the knee. At
# FRESH_SERVING_LOAD of the model's rate it ran past the knee on every configuration from E to J (1.15-1.64
# x the knee, queues of 0.4-3.7 s), so its scales were fitted on a full batch, not on the loads below it
SERVING_OF_STEADY = 0.6
SERVING_SEED = 31
SATURATION_BATCHES = 4  # the model's never-dry rate: this many x max_num_seqs of the mix at once
STEP_SCALE_BOUNDS = (0.5, 2.5)
# g x max_num_seqs / b at most: a prefill token beside a full batch of decodes costs at most 5x one alone
INTERACTION_BOUND = 4.0
SCALE_ROUNDS = 4  # the two sides matched in turn: each moves the other's mean a little
# the steady-overload phase: calibrate's mix sent faster than the serving-scaled model completes it when it
# never runs dry, so the engine runs with a queue from a few seconds in; its completions in the window are
# the rate it serves at under steady overload, which is what a queue past the knee drains at
OVERLOAD_LOAD = 1.5
OVERLOAD_SECONDS = 60.0
OVERLOAD_WINDOW = (15.0, 60.0)  # completions counted from here to there (s from the first arrival)
OVERLOAD_SEED = 37
STEADY_SCALE_BOUNDS = (0.67, 1.5)
PREFILL_PROMPTS = (64, 512, 1024)
PREFILL_RATE = 0.5  # req/s of Poisson arrivals per prompt length: prompts come while others decode
PREFILL_REQUESTS = 12
PREFILL_OUTPUT = 24
# (prompt, output, batch sizes): short and long contexts at each batch size, so K varies apart from B.
# The long contexts come from long outputs, not long prompts: B long prompts prefill in the first steps
# of the batch, and the inter-token latencies of the requests already decoding then carry those steps
# (prompts of 768 at B = 16 are six steps of 2,048 prefill tokens), which read as a context cost.
DECODE_SHAPES = ((16, 96, (1, 4, 8, 16, 32)), (16, 640, (1, 4, 8, 16)))


def _say(msg: str) -> None:
    print(f"calibrate: {msg}", file=sys.stderr, flush=True)


def _scrape(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, Any] = {"hist": {}, "gauge": {}, "info": {}}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith("_sum") or s.name.endswith("_count"):
                out["hist"][s.name] = out["hist"].get(s.name, 0.0) + s.value
            elif s.name == "vllm:cache_config_info":
                out["info"] = dict(s.labels)
            else:
                out["gauge"][s.name] = out["gauge"].get(s.name, 0.0) + s.value
    return out


def _mean_delta(before: dict[str, Any], after: dict[str, Any], family: str) -> float | None:
    n = after["hist"].get(family + "_count", 0.0) - before["hist"].get(family + "_count", 0.0)
    s = after["hist"].get(family + "_sum", 0.0) - before["hist"].get(family + "_sum", 0.0)
    return s / n if n > 0 else None


def _mean_delta_ms(before: dict[str, Any], after: dict[str, Any], family: str) -> float | None:
    """``_mean_delta`` of a histogram in seconds, as ms to 0.01 (None when nothing was observed)."""
    mean = _mean_delta(before, after, family)
    return None if mean is None else round(1000 * mean, 2)


def least_squares(rows: Sequence[Sequence[float]], ys: Sequence[float]) -> list[float]:
    """Ordinary least squares by the normal equations (a handful of unknowns), solved by Gaussian
    elimination with partial pivoting; a coefficient the data cannot tell apart comes out 0."""
    k = len(rows[0])
    a = [[sum(r[i] * r[j] for r in rows) for j in range(k)] + [sum(r[i] * y for r, y in zip(rows, ys, strict=True))]
         for i in range(k)]  # fmt: skip
    for col in range(k):
        pivot = max(range(col, k), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12:
            continue
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(k):
            if r != col:
                factor = a[r][col] / a[col][col]
                a[r] = [x - factor * y for x, y in zip(a[r], a[col], strict=True)]
    return [a[i][k] / a[i][i] if abs(a[i][i]) >= 1e-12 else 0.0 for i in range(k)]


@dataclass(frozen=True)
class Fit:
    c_ms: float
    b_ms: float
    d_ms: float
    e_ms: float
    f_ms: float
    g_ms: float
    ttft_overhead_ms: float
    kv_tokens: int
    max_num_seqs: int
    points: dict[str, Any]


def fit_decode(points: Sequence[tuple[int, float, float]]) -> tuple[float, float, float]:
    """(batch B, mean context K, mean ITL ms) -> c, d, e of ``ITL = c + d·B + e·K/1000``, each >= 0."""
    ys = [y for _, _, y in points]
    c, d, e = least_squares([(1.0, float(b), k / 1000.0) for b, k, _ in points], ys)
    # a negative cost is noise on a term the data barely moves: refit without it
    if d < 0 and e >= 0:
        (c, e), d = least_squares([(1.0, k / 1000.0) for _, k, _ in points], ys), 0.0
    elif e < 0 and d >= 0:
        (c, d), e = least_squares([(1.0, float(b)) for b, _, _ in points], ys), 0.0
    elif d < 0 and e < 0:
        c, d, e = statistics.fmean(ys), 0.0, 0.0
    return max(c, 0.1), max(d, 0.0), max(e, 0.0)


def simulated_throughput(profile: Profile, shapes: Sequence[tuple[int, int]]) -> float:
    """The rate the simulated replica completes requests of ``shapes`` (prompt, output) sent at once at,
    as ``burst_throughput``: what it serves when it never runs dry."""
    replica = SimReplica(profile)
    replica.submit([Request(i, 0.0, p, o) for i, (p, o) in enumerate(shapes)])
    replica.advance(24 * 3600.0)
    return burst_throughput([r.finished_at for r in replica.finished if r.finished_at is not None])


def scaled(profile: Profile, k_decode: float, k_prefill: float | None = None, g_ms: float | None = None) -> Profile:
    """The profile with the decode side's step coefficients (``c``, ``d``, ``e``) x ``k_decode``, the
    prefill side's (``b``, ``f``) x ``k_prefill`` (the same when not given), and the mixed step's ``g``
    set to ``g_ms`` (kept when not given)."""
    k_p = k_decode if k_prefill is None else k_prefill
    return dataclasses.replace(
        profile, c_ms=profile.c_ms * k_decode, d_ms=profile.d_ms * k_decode, e_ms=profile.e_ms * k_decode,
        b_ms=profile.b_ms * k_p, f_ms=profile.f_ms * k_p, g_ms=profile.g_ms if g_ms is None else g_ms,
    )  # fmt: skip


def serving_mix(n: int = 64, seed: int = SERVING_SEED) -> list[tuple[int, int]]:
    """The serving phase's (prompt, output) shapes: uniform over ``SERVING_PROMPTS`` x ``SERVING_OUTPUTS``."""
    rng = random.Random(seed)
    return [(rng.randint(*SERVING_PROMPTS), rng.randint(*SERVING_OUTPUTS)) for _ in range(n)]


def _served(profile: Profile, arrivals: Sequence[Arrival]) -> list[Request]:
    """``arrivals`` through one simulated replica to the end; its times are the engine's (the API
    server's own time is left out of the first token)."""
    replica = SimReplica(dataclasses.replace(profile, ttft_overhead_ms=0.0, ttft_overhead_by_streams=()))
    replica.submit([Request(i, a.t, a.prompt_tokens, a.output_tokens) for i, a in enumerate(arrivals)])
    replica.advance(24 * 3600.0)
    return replica.finished


def simulated_serving(profile: Profile, arrivals: Sequence[Arrival]) -> tuple[float | None, float | None]:
    """The mean inter-token latency and the mean prefill time (ms) the simulated replica gives
    ``arrivals``, as vLLM's histograms average them: every gap after a first token, over all of them (a
    request's last token less its first, summed, over the tokens after the first); and from being
    scheduled to the first token, per request. None where nothing was measured."""
    spans, prefills = [], []
    for r in _served(profile, arrivals):
        if r.first_token_at is None:
            continue
        if r.queued_at_admit is not None:
            prefills.append(r.first_token_at - r.arrival - r.queued_at_admit)
        if r.finished_at is not None and r.output > 1:
            spans.append((r.finished_at - r.first_token_at, r.output - 1))
    gaps = sum(n for _, n in spans)
    itl = 1000.0 * math.fsum(s for s, _ in spans) / gaps if gaps else None
    return itl, (1000.0 * math.fsum(prefills) / len(prefills) if prefills else None)


def simulated_queue_ms(profile: Profile, arrivals: Sequence[Arrival]) -> float | None:
    """The mean time (ms) the simulated replica keeps ``arrivals`` waiting before it schedules them."""
    waits = [r.queued_at_admit for r in _served(profile, arrivals) if r.queued_at_admit is not None]
    return 1000.0 * math.fsum(waits) / len(waits) if waits else None


def _matching(
    measure: Callable[[float], float], target: float, bounds: tuple[float, float] = STEP_SCALE_BOUNDS
) -> float:
    """The value within ``bounds`` at which ``measure(value)`` (rising with it) is ``target``, bisected; a
    bound where even it falls short or overshoots."""
    low, high = bounds
    if measure(high) <= target:
        return high
    if measure(low) >= target:
        return low
    for _ in range(30):
        mid = (low + high) / 2
        if measure(mid) < target:
            low = mid
        else:
            high = mid
    return (low + high) / 2


@dataclass(frozen=True, slots=True)
class ServingScales:
    """How the probes' fit is bent to the engine serving (``serving_scales``)."""

    k_decode: float  # x the decode side's coefficients (c, d, e)
    k_prefill: float  # x the prefill side's (b, f): 1 unless the engine's prefills were faster than the probes'
    g_ms: float  # a prefill token's extra cost per decoding sequence beside it

    def apply(self, profile: Profile) -> Profile:
        return scaled(profile, self.k_decode, self.k_prefill, self.g_ms)


def serving_scales(
    profile: Profile, arrivals: Sequence[Arrival], engine_itl_ms: float, engine_prefill_ms: float | None = None
) -> ServingScales:
    """What makes the model's mean inter-token latency and mean prefill time on ``arrivals`` the engine's.

    The decode side's coefficients take a factor within ``STEP_SCALE_BOUNDS``. A prefill slower than the
    probes' goes into ``g``, the cost a prefill token adds per decode beside it in its step, within
    ``INTERACTION_BOUND``: the probes measured prefills beside a few decodes, the serving beside many, and
    the difference is what the decodes beside them cost. One factor on ``b`` and ``f`` (the third
    version) matched the mean too, but slowed every prefill alike, and the simulated engines' TTFT p50
    at half their knee read 16-41 % above the real ones' (docs/sim-to-real.md). A prefill faster than the
    probes' takes a factor below 1 on ``b`` and ``f`` (nothing in the decodes beside it explains it).
    Past the bounds the probes measured something else than the serving did, and the fit is reported
    rather than bent that far. Each side moves both means (a prefill shares its step with the decodes,
    and longer steps fill the batch), so they are matched in turn until they settle. Without an engine
    prefill time one factor on every coefficient matches the inter-token latency; (1, 1, g as given)
    when that cannot be told either."""

    def known(x: float | None) -> bool:
        return x is not None and x > 0 and math.isfinite(x)

    unchanged = ServingScales(1.0, 1.0, profile.g_ms)
    model_itl, model_prefill = simulated_serving(profile, arrivals)
    if not known(engine_itl_ms) or not known(model_itl):
        return unchanged
    if not known(engine_prefill_ms) or not known(model_prefill):
        k = _matching(lambda x: simulated_serving(scaled(profile, x), arrivals)[0] or 0.0, engine_itl_ms)
        return ServingScales(k, k, profile.g_ms)
    target_prefill = float(engine_prefill_ms or 0.0)
    g_bound = INTERACTION_BOUND * profile.b_ms / max(1, profile.max_num_seqs)

    def itl(s: ServingScales) -> float:
        return simulated_serving(s.apply(profile), arrivals)[0] or 0.0

    def prefill(s: ServingScales) -> float:
        return simulated_serving(s.apply(profile), arrivals)[1] or 0.0

    def decode_matched(s: ServingScales) -> ServingScales:
        k = _matching(lambda k: itl(dataclasses.replace(s, k_decode=k)), engine_itl_ms)
        return dataclasses.replace(s, k_decode=k)

    def prefill_matched(s: ServingScales) -> ServingScales:
        plain = dataclasses.replace(s, k_prefill=1.0, g_ms=0.0)
        if prefill(plain) >= target_prefill or g_bound <= 0:
            low = STEP_SCALE_BOUNDS[0]
            k = _matching(lambda k: prefill(dataclasses.replace(plain, k_prefill=k)), target_prefill, (low, 1.0))
            return dataclasses.replace(plain, k_prefill=k)
        g = _matching(lambda g: prefill(dataclasses.replace(plain, g_ms=g)), target_prefill, (0.0, g_bound))
        return dataclasses.replace(plain, g_ms=g)

    s = ServingScales(1.0, 1.0, 0.0)
    for _ in range(SCALE_ROUNDS):
        s = prefill_matched(decode_matched(s))
    return s


def simulated_window_rate(profile: Profile, arrivals: Sequence[Arrival], window: tuple[float, float]) -> float:
    """Requests per second the simulated replica completes within ``window`` (s) of ``arrivals``."""
    start, end = window
    done = sum(1 for r in _served(profile, arrivals) if r.finished_at is not None and start <= r.finished_at < end)
    return done / (end - start)


def steady_scale(
    profile: Profile, arrivals: Sequence[Arrival], window: tuple[float, float], engine_rps: float
) -> float:
    """The factor on every step coefficient (``c``, ``b``, ``d``, ``e``, ``f``, ``g``) that makes the model
    complete ``arrivals`` within ``window`` at the engine's rate, within ``STEADY_SCALE_BOUNDS``; 1 when the
    engine's rate is unknown.

    Sent faster than either serves, the model and the engine both complete at their steady rate in the
    window, and the queue past the knee grows by the arrival rate less that one. A CPU engine held to a
    quota serves steady overload below the rate its steps add up to (config E's engines: 27 % below the
    rate they drain a burst at, throttled in every CFS period while their engine core and worker spin),
    and the serving phase below saturation does not see it. The same factor on every term keeps the
    serving phase's split between decode and prefill."""
    if not (engine_rps > 0 and math.isfinite(engine_rps)):
        return 1.0

    def slowness(k: float) -> float:  # rises with k: the model's completion time per request
        rate = simulated_window_rate(scaled(profile, k, k, profile.g_ms * k), arrivals, window)
        return 1.0 / rate if rate > 0 else math.inf

    return _matching(slowness, 1.0 / engine_rps, STEADY_SCALE_BOUNDS)


def serving_overhead_ms(
    profile: Profile, arrivals: Sequence[Arrival], client_ttft_mean_ms: float | None
) -> float | None:
    """The API server's time per first token (ms, >= 0) that puts the model's mean TTFT on ``arrivals``
    at the client's: the client's mean less the model's without it. None when either is unknown.

    It stands for all the client waits beyond the engine core's queue and prefill: tokenizing, the hand-off
    to the engine core, the first chunk's write behind the other answers' chunks and the cgroup's
    throttled periods. Below the knee that time was 45-54 ms on config J's engines and 80-85 ms on K's,
    in calibrate's serving phase and the loads alike, where the model's own wait for the current step is
    about half a step; the prefill probes, one request at a time beside almost no decodes, read 19 ms on J,
    and lone probes beside N streaming answers (calibrate on 2026-12-06) read 9-31 ms in the fleet and
    53-60 ms on a fresh engine: neither measured what a serving engine's clients wait. The mean, as the
    serving phase's other fits: matched at the p50, K's overhead came to 18 ms, since on calibrate's
    uniform prompts the engine's TTFT has a longer tail than the model's (mean 249 ms, p50 196), and the
    simulator's p50 read 26 % low on K's loads. Fitted last, on the final profile, it also takes what the
    steady-overload factor moves the model's TTFT below the knee by."""
    if client_ttft_mean_ms is None or not (client_ttft_mean_ms > 0 and math.isfinite(client_ttft_mean_ms)):
        return None
    ttfts = [r.ttft for r in _served(profile, arrivals) if r.ttft is not None]
    if not ttfts:
        return None
    return max(0.0, client_ttft_mean_ms - 1000.0 * statistics.fmean(ttfts))


def fit_prefill(points: Sequence[tuple[int, float]], c_ms: float) -> tuple[float, float]:
    """(prompt P, prefill ms) -> b, f of ``prefill = c + b·P + f·P²/2``, each >= 0."""
    b, f = least_squares([(float(p), p * p / 2.0) for p, _ in points], [y - c_ms for _, y in points])
    if f < 0:
        (b,) = least_squares([(float(p),) for p, _ in points], [y - c_ms for _, y in points])
        f = 0.0
    return max(b, 0.0), max(f, 0.0)


def prefill_alone(
    loaded: Sequence[tuple[int, float, float]], d_ms: float, e_ms: float, output: int
) -> list[tuple[int, float]]:
    """(P, prefill step ms, decodes beside it) -> (P, the step less those decodes' share): each beside
    decode costs ``d`` and its context (a prompt of the same length and half the output, on average)
    ``e`` per 1k tokens."""
    return [(p, ms - d_ms * beside - e_ms * beside * (p + output / 2) / 1000.0) for p, ms, beside in loaded]


async def _burst(url: str, model: str, n: int, prompt: int, output: int) -> list[Any]:
    result = await run_load([url], [Arrival(0.0, prompt, output) for _ in range(n)], model, timeout_s=600)
    failed = [r.error for r in result.records if r.error is not None]
    if failed:
        raise RuntimeError(f"{len(failed)} of {n} calibration requests failed: {failed[:3]}")
    return result.records


async def _sampled_load(
    url: str, model: str, arrivals: Sequence[Arrival], *, timeout_s: float, period_s: float
) -> tuple[Any, dict[str, Any], dict[str, Any], list[tuple[float, dict[str, float]]]]:
    """``arrivals`` sent to the engine, with its metrics scraped before and after and its gauges every
    ``period_s`` meanwhile: (the load's result, before, after, [(s from the start, gauges)])."""
    samples: list[tuple[float, dict[str, float]]] = []
    stop = asyncio.Event()
    start = time.monotonic()

    async def sample() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                gauges = (await asyncio.to_thread(_scrape, url))["gauge"]
                samples.append((time.monotonic() - start, gauges))
            await asyncio.sleep(period_s)

    before = await asyncio.to_thread(_scrape, url)
    sampler = asyncio.create_task(sample())
    try:
        result = await run_load([url], arrivals, model, timeout_s=timeout_s)
    finally:
        stop.set()
        await sampler
    after = await asyncio.to_thread(_scrape, url)
    return result, before, after, samples


async def _loaded_prefill(url: str, model: str, prompt: int, seed: int) -> tuple[float, float, float, float]:
    """Poisson arrivals of ``prompt``-token requests at ``PREFILL_RATE``: the engine's mean prefill and
    queue times (s), the mean requests running (sampled every 0.1 s), the client's mean TTFT (s)."""
    # the first PREFILL_REQUESTS of a Poisson stream (its span is long enough to hold them many times over)
    span = 100.0 * PREFILL_REQUESTS / PREFILL_RATE
    arrivals = poisson_arrivals(PREFILL_RATE, span, prompt, PREFILL_OUTPUT, seed=seed)[:PREFILL_REQUESTS]
    result, before, after, samples = await _sampled_load(url, model, arrivals, timeout_s=300, period_s=0.1)
    running = [g.get("vllm:num_requests_running", 0.0) for _, g in samples]
    failed = [r.error for r in result.records if r.error is not None or r.ttft_s is None]
    if failed:
        raise RuntimeError(f"{len(failed)} prefill probes of {prompt} tokens failed: {failed[:3]}")
    prefill = _mean_delta(before, after, "vllm:request_prefill_time_seconds")
    if prefill is None:
        raise RuntimeError("the engine's request_prefill_time_seconds did not move: is it vLLM V1?")
    queued = _mean_delta(before, after, "vllm:request_queue_time_seconds") or 0.0
    ttft = statistics.fmean(r.ttft_s for r in result.records if r.ttft_s is not None)
    return prefill, queued, statistics.fmean(running) if running else 0.0, ttft


async def _prefill_probes(
    url: str, model: str, max_model_len: int
) -> tuple[list[tuple[int, float, float]], list[float]]:
    """Per prompt length under load: (P, the engine's mean prefill ms, the decodes beside it), and the
    client's TTFT less the engine's queue and prefill times (ms) per length."""
    points: list[tuple[int, float, float]] = []
    overheads: list[float] = []
    for i, p in enumerate(PREFILL_PROMPTS):
        if p + PREFILL_OUTPUT > max_model_len:
            continue
        prefill, queued, beside, ttft = await _loaded_prefill(url, model, p, seed=i)
        points.append((p, prefill * 1000.0, beside))
        overheads.append((ttft - queued - prefill) * 1000.0)
        _say(
            f"prefill {p:5d} tokens: engine {prefill * 1000:7.1f} ms beside {beside:.1f} decodes, "
            f"queued {queued * 1000:5.1f} ms, client TTFT {ttft * 1000:7.1f} ms"
        )
    return points, overheads


def _running_peak(url: str, stop: list[bool], peak: list[float]) -> None:
    while not stop[0]:
        with contextlib.suppress(OSError):
            peak[0] = max(peak[0], _scrape(url)["gauge"].get("vllm:num_requests_running", 0.0))
        time.sleep(0.2)


def calibrate(url: str, model: str, *, max_num_seqs: int | None = None) -> Fit:
    import threading

    first = _scrape(url)
    info = first["info"]
    if not info:
        raise RuntimeError(f"{url}/metrics has no vllm:cache_config_info: calibrate reads vLLM V1 engines")
    kv_tokens = int(float(info.get("kv_cache_size_tokens") or 0)) or int(
        float(info.get("num_gpu_blocks", 0)) * float(info.get("block_size", 16))
    )
    asyncio.run(_burst(url, model, 2, 64, 8))  # warm: the first requests of an engine compile and allocate
    max_model_len = int(float(info.get("max_model_len", 1 << 30) or 1 << 30))

    decode_points: list[tuple[int, float, float]] = []  # (B, mean context per sequence, ITL ms)
    peak = [0.0]
    for prompt, output, batches in DECODE_SHAPES:
        for b in batches:
            if prompt + output > max_model_len:
                continue
            stop = [False]
            watcher = threading.Thread(target=_running_peak, args=(url, stop, peak), daemon=True)
            watcher.start()
            before = _scrape(url)
            asyncio.run(_burst(url, model, b, prompt, output))
            after = _scrape(url)
            stop[0] = True
            watcher.join()
            itl = _mean_delta(before, after, "vllm:inter_token_latency_seconds")
            if itl is None:
                raise RuntimeError("the engine's inter_token_latency_seconds did not move: is it vLLM V1?")
            decode_points.append((b, prompt + output / 2, itl * 1000.0))
            _say(
                f"decode batch {b:3d}, prompt {prompt:4d}, output {output:4d}: engine ITL {itl * 1000:7.2f} ms "
                f"(running at most {peak[0]:.0f})"
            )
    seqs_cap = max(1, max_num_seqs or int(peak[0]))
    # a batch above the cap runs as the cap; the mean context of a decode step is the prompt plus half the output
    decode_points = [(min(b, seqs_cap), min(b, seqs_cap) * ctx, y) for b, ctx, y in decode_points]
    c, d, e = fit_decode(decode_points)
    loaded, overheads = asyncio.run(_prefill_probes(url, model, max_model_len))
    b_ms, f_ms = fit_prefill(prefill_alone(loaded, d, e, PREFILL_OUTPUT), c)
    overhead = max(0.0, statistics.median(overheads)) if overheads else 0.0
    fitted = Profile(
        name="fit", description="", c_ms=c, b_ms=b_ms, d_ms=d, e_ms=e, f_ms=f_ms, kv_tokens=kv_tokens or 1 << 20,
        gpus=1, cold_start_mean_s=60.0, cold_start_p90_s=60.0, max_num_seqs=seqs_cap, max_num_batched_tokens=2048,
    )  # fmt: skip
    # the serving phase twice: the first, on an engine that has not yet queued, only sets the
    # steady-overload phase's rate; the second, after that phase and below the rate it measured, is fitted on
    fresh = asyncio.run(_serving(url, model, FRESH_SERVING_LOAD * _never_dry(fitted, max_model_len), max_model_len))
    fresh_scales = serving_scales(fitted, fresh.pop("arrivals"), fresh["engine_itl_ms"], fresh["engine_prefill_ms"])
    _say(
        f"serving, before any queue: the engine's ITL {fresh['engine_itl_ms']:.1f} ms and prefill "
        f"{fresh['engine_prefill_ms'] or 0:.1f} ms: decode steps x {fresh_scales.k_decode:.3f} "
        "(sets the overload's rate)"
    )
    steady = asyncio.run(_steady_overload(url, model, fresh_scales.apply(fitted), max_model_len))
    overload = steady.pop("arrivals")
    below_knee = SERVING_OF_STEADY * steady["engine_rps"]
    if not below_knee > 0:  # nothing completed in the window: the fresh phase's rate, as before
        below_knee = fresh["rate"]
    serving = asyncio.run(_serving(url, model, below_knee, max_model_len))
    arrivals = serving.pop("arrivals")
    serving["fresh"] = fresh
    scales = serving_scales(fitted, arrivals, serving["engine_itl_ms"], serving["engine_prefill_ms"])
    serving["model_itl_ms"], serving["model_prefill_ms"] = simulated_serving(fitted, arrivals)
    serving["scaled_itl_ms"], serving["scaled_prefill_ms"] = simulated_serving(scales.apply(fitted), arrivals)
    serving["scaled_queue_ms"] = simulated_queue_ms(scales.apply(fitted), arrivals)
    _say(
        f"serving {serving['rate']:.2f} req/s: the engine's ITL {serving['engine_itl_ms']:.1f} ms and prefill "
        f"{serving['engine_prefill_ms'] or 0:.1f} ms, the fitted model's {serving['model_itl_ms'] or 0:.1f} and "
        f"{serving['model_prefill_ms'] or 0:.1f}: decode steps x {scales.k_decode:.3f}, prefill x "
        f"{scales.k_prefill:.3f}, g {scales.g_ms * 1000:.3f} us per prefill token x decode beside it "
        f"(then {serving['scaled_itl_ms'] or 0:.1f} and {serving['scaled_prefill_ms'] or 0:.1f})"
    )
    served = scales.apply(fitted)
    k_steady = steady_scale(served, overload, OVERLOAD_WINDOW, steady["engine_rps"])
    final = scaled(served, k_steady, k_steady, served.g_ms * k_steady)
    probes_overhead = overhead
    fitted_overhead = serving_overhead_ms(final, arrivals, serving["client_ttft_mean_ms"])
    if fitted_overhead is not None:
        overhead = fitted_overhead
    steady["model_rps"] = simulated_window_rate(served, overload, OVERLOAD_WINDOW)
    steady["scaled_rps"] = simulated_window_rate(final, overload, OVERLOAD_WINDOW)
    steady["model_itl_ms"], steady["model_prefill_ms"] = simulated_serving(served, overload)
    steady["scaled_itl_ms"], steady["scaled_prefill_ms"] = simulated_serving(final, overload)
    serving["steady_itl_ms"], serving["steady_prefill_ms"] = simulated_serving(final, arrivals)
    _say(
        f"steady overload {steady['rate']:.2f} req/s: the engine served {steady['engine_rps']:.2f} req/s "
        f"(waiting {steady['engine_waiting_mean']:.1f}, running {steady['engine_running_mean']:.1f} on average), "
        f"the serving-scaled model {steady['model_rps']:.2f}: every step x {k_steady:.3f} "
        f"(then {steady['scaled_rps']:.2f} req/s; the serving phase's ITL {serving['steady_itl_ms'] or 0:.1f} ms "
        f"and prefill {serving['steady_prefill_ms'] or 0:.1f} ms)"
    )
    _say(
        f"API server: {overhead:.1f} ms per first token (the serving phase's client TTFT mean "
        f"{serving['client_ttft_mean_ms'] or 0:.1f} ms, the model's without it; the prefill probes read "
        f"{probes_overhead:.1f} ms beside almost no decodes)"
    )
    return Fit(
        c_ms=final.c_ms,
        b_ms=final.b_ms,
        d_ms=final.d_ms,
        e_ms=final.e_ms,
        f_ms=final.f_ms,
        g_ms=final.g_ms,
        ttft_overhead_ms=overhead,
        kv_tokens=kv_tokens,
        max_num_seqs=seqs_cap,
        points={
            "prefill": loaded,
            "decode": decode_points,
            "ttft_overhead_ms": overheads,  # the prefill probes' (their median was the overhead before 2026-12-06)
            "ttft_overhead_fitted_ms": fitted_overhead,
            "serving": serving,
            "step_scale": scales.k_decode,
            "prefill_scale": scales.k_prefill,
            "prefill_decode_g_ms": scales.g_ms,
            "steady": steady,
            "steady_scale": k_steady,
        },
    )


def _mix(max_model_len: int) -> list[tuple[int, int]]:
    """``serving_mix`` as the engine takes it: shapes longer than its ``max_model_len`` left out."""
    return [(p, o) for p, o in serving_mix() if p + o <= max_model_len] or [(64, 32)]


def _never_dry(profile: Profile, max_model_len: int) -> float:
    """The rate the model completes the serving mix at when it never runs dry (req/s)."""
    mix = _mix(max_model_len)
    return simulated_throughput(profile, [mix[i % len(mix)] for i in range(SATURATION_BATCHES * profile.max_num_seqs)])


async def _serving(url: str, model: str, rate: float, max_model_len: int) -> dict[str, Any]:
    """A serving phase: ``SERVING_SECONDS`` of Poisson arrivals of ``serving_mix`` at ``rate``; the engine's
    mean inter-token, prefill and queue times, and the client's TTFT p50 and mean."""
    rate = max(0.1, rate)
    arrivals = poisson_arrivals(rate, SERVING_SECONDS, 0, 0, seed=SERVING_SEED, mix=_mix(max_model_len))
    _say(f"serving: {len(arrivals)} requests over {SERVING_SECONDS:.0f} s at {rate:.2f} req/s")
    before = await asyncio.to_thread(_scrape, url)
    result = await run_load([url], arrivals, model, timeout_s=900)
    after = await asyncio.to_thread(_scrape, url)
    failed = [r.error for r in result.records if r.error is not None]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(arrivals)} serving requests failed: {failed[:3]}")
    itl = _mean_delta(before, after, "vllm:inter_token_latency_seconds")
    if itl is None:
        raise RuntimeError("the engine's inter_token_latency_seconds did not move: is it vLLM V1?")
    prefill = _mean_delta(before, after, "vllm:request_prefill_time_seconds")
    queued = _mean_delta(before, after, "vllm:request_queue_time_seconds")
    ttfts = [r.ttft_s for r in result.records if r.ttft_s is not None]
    return {
        "arrivals": arrivals,
        "rate": rate,
        "requests": len(arrivals),
        "engine_itl_ms": itl * 1000.0,
        "engine_prefill_ms": None if prefill is None else prefill * 1000.0,
        # not fitted on: whether the engine queued as the model does says if the two ran in one regime
        "engine_queue_ms": None if queued is None else queued * 1000.0,
        "client_ttft_p50_ms": 1000.0 * statistics.median(ttfts) if ttfts else None,
        "client_ttft_mean_ms": 1000.0 * statistics.fmean(ttfts) if ttfts else None,
    }


async def _steady_overload(url: str, model: str, served: Profile, max_model_len: int) -> dict[str, Any]:
    """The steady-overload phase: Poisson arrivals of ``serving_mix`` at ``OVERLOAD_LOAD`` of the rate the
    serving-scaled model completes the mix at when it never runs dry, for ``OVERLOAD_SECONDS``; the
    engine's completions within ``OVERLOAD_WINDOW`` (counted by this client as the answers end), and its
    waiting and running gauges over the window (a queue throughout says the rate is the engine's, not the
    arrivals'). The queue left at the end drains before the next use of the engine."""
    rate = max(0.1, OVERLOAD_LOAD * _never_dry(served, max_model_len))
    arrivals = poisson_arrivals(rate, OVERLOAD_SECONDS, 0, 0, seed=OVERLOAD_SEED, mix=_mix(max_model_len))
    _say(f"steady overload: {len(arrivals)} requests over {OVERLOAD_SECONDS:.0f} s at {rate:.2f} req/s")
    result, before, after, samples = await _sampled_load(url, model, arrivals, timeout_s=900, period_s=0.5)
    failed = [r.error for r in result.records if r.error is not None or r.e2e_s is None]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(arrivals)} overload requests failed: {failed[:3]}")
    low, high = OVERLOAD_WINDOW
    done = sum(1 for r in result.records if r.e2e_s is not None and low <= r.sent + r.e2e_s < high)
    inside = [
        (g.get("vllm:num_requests_waiting", 0.0), g.get("vllm:num_requests_running", 0.0))
        for t, g in samples
        if low <= t < high
    ]
    itl = _mean_delta(before, after, "vllm:inter_token_latency_seconds")
    prefill = _mean_delta(before, after, "vllm:request_prefill_time_seconds")
    return {
        "arrivals": arrivals,
        "rate": rate,
        "requests": len(arrivals),
        "window_s": list(OVERLOAD_WINDOW),
        "engine_rps": done / (high - low),
        "engine_waiting_mean": statistics.fmean(w for w, _ in inside) if inside else 0.0,
        "engine_running_mean": statistics.fmean(n for _, n in inside) if inside else 0.0,
        "engine_itl_ms": None if itl is None else itl * 1000.0,
        "engine_prefill_ms": None if prefill is None else prefill * 1000.0,
    }


def write_profile(fit: Fit, path: Path, *, name: str, description: str, cold_start_s: float) -> dict[str, Any]:
    profile = {
        "name": name,
        "description": description,
        "c_ms": round(fit.c_ms, 4),
        "b_ms": round(fit.b_ms, 6),
        "d_ms": round(fit.d_ms, 5),
        "e_ms": round(fit.e_ms, 5),
        "f_ms": float(f"{fit.f_ms:.4g}"),
        "g_ms": float(f"{fit.g_ms:.4g}"),
        "ttft_overhead_ms": round(fit.ttft_overhead_ms, 3),
        "kv_tokens": fit.kv_tokens,
        "gpus": 1,
        "cold_start_mean_s": cold_start_s,
        "cold_start_p90_s": cold_start_s,
        "max_num_seqs": fit.max_num_seqs,
        "max_num_batched_tokens": 2048,
    }
    path.write_text(json.dumps({**profile, "fit_points": fit.points}, indent=2) + "\n")
    return profile


def add_calibrate_arguments(p: Any) -> None:
    p.add_argument("--url", required=True, help="the engine's base URL (http://host:8000): vLLM V1")
    p.add_argument("--out", required=True, type=Path, help="the profile file to write (JSON)")
    p.add_argument("--model", default=None, help="the served model name (default: the first in /v1/models)")
    p.add_argument("--max-num-seqs", type=int, default=None, help="the engine's --max-num-seqs (default: measured)")
    p.add_argument(
        "--cold-start", type=float, default=60.0, metavar="S", help="seconds from pod created to ready (default 60)"
    )
    p.add_argument("--name", default=None, help="the profile's name (default: the file's stem)")


def calibrate_main(args: Any) -> int:
    from keda_llm_scaler.enginelab.loadgen import discover_model

    url = args.url.rstrip("/")
    try:
        model = args.model or asyncio.run(discover_model(url))
    except Exception as exc:  # any failure to reach the engine is the user's URL: say which
        print(f"keda-llm-scaler calibrate: cannot list models at {url}/v1/models: {exc}", file=sys.stderr)
        return 3
    t0 = time.monotonic()
    try:
        fit = calibrate(url, model, max_num_seqs=args.max_num_seqs)
    except (RuntimeError, OSError) as exc:
        print(f"keda-llm-scaler calibrate: {exc}", file=sys.stderr)
        return 1
    name = args.name or args.out.stem
    profile = write_profile(
        fit, args.out, name=name, description=f"calibrated on {url} ({model})", cold_start_s=args.cold_start
    )
    _say(f"wrote {args.out} in {time.monotonic() - t0:.0f} s: " + json.dumps(profile))
    return 0
