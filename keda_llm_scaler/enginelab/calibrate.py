"""``keda-llm-scaler calibrate``: a replica profile for the simulator, fitted on a running engine.

It sends its own load in two phases and reads the engine's own histograms (sum and count before and after
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
- **the engine at saturation**: ``SATURATION_BATCHES`` x ``max_num_seqs`` requests of
  ``SATURATION_PROMPT``/``SATURATION_OUTPUT`` tokens sent at once; the rate they complete at (first
  completion to last) against the rate the fitted model completes the same burst at. Every step
  coefficient is scaled by their ratio (``step_scale``, within 0.5-2), so the simulated engine serves
  what the real one does. The probes above measure each term apart, on an engine that is mostly idle
  between steps; on a CPU quota a busy engine's steps are not quite their sum (on config A the fitted
  model served 1.10 req/s at the SLO where the engine served 1.59);
- **the API server's own time per request** (tokenizing, the hand-off to the engine, the first chunk's
  write): the client's TTFT less the engine's queue and prefill times, the median over the prefill
  phase's lengths. The simulator adds it to every TTFT, not to the engine's steps (it models the wait
  for the current step and the queue itself).

KV tokens come from ``vllm:cache_config_info`` (``kv_cache_size_tokens``, else blocks x block size);
``max_num_seqs`` is given or read as the most requests the engine ran at once under a batch larger than it.
The step-time model is the bundled profiles' (``keda_llm_scaler.sim.profiles``); the file it writes is
what ``replay --profile FILE`` reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from keda_llm_scaler.enginelab.loadgen import Arrival, run_load
from keda_llm_scaler.enginelab.sweep import burst_throughput, poisson_arrivals, saturated_throughput
from keda_llm_scaler.sim.profiles import Profile
from keda_llm_scaler.sim.replica import Request, SimReplica

__all__ = [
    "Fit",
    "calibrate",
    "fit_decode",
    "fit_prefill",
    "least_squares",
    "prefill_alone",
    "simulated_throughput",
    "step_scale",
]

SATURATION_BATCHES = 4
SATURATION_PROMPT, SATURATION_OUTPUT = 256, 64
STEP_SCALE_BOUNDS = (0.5, 2.0)
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


def simulated_throughput(profile: Profile, n: int, prompt: int, output: int) -> float:
    """The rate the simulated replica completes ``n`` requests sent at once at, as ``burst_throughput``."""
    replica = SimReplica(profile)
    replica.submit([Request(i, 0.0, prompt, output) for i in range(n)])
    replica.advance(24 * 3600.0)
    return burst_throughput([r.finished_at for r in replica.finished if r.finished_at is not None])


def step_scale(simulated_rps: float, real_rps: float) -> float:
    """What every step coefficient is multiplied by so the model completes a burst at the engine's rate
    (a model that is too slow gets shorter steps), within ``STEP_SCALE_BOUNDS``: past them the probes
    measured something else than the burst did, and the fit is reported rather than bent that far."""
    if simulated_rps <= 0 or real_rps <= 0:
        return 1.0
    low, high = STEP_SCALE_BOUNDS
    return min(high, max(low, simulated_rps / real_rps))


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


async def _loaded_prefill(url: str, model: str, prompt: int, seed: int) -> tuple[float, float, float, float]:
    """Poisson arrivals of ``prompt``-token requests at ``PREFILL_RATE``: the engine's mean prefill and
    queue times (s), the mean requests running (sampled every 0.1 s), the client's mean TTFT (s)."""
    running: list[float] = []
    stop = asyncio.Event()

    async def sample() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                gauges = (await asyncio.to_thread(_scrape, url))["gauge"]
                running.append(gauges.get("vllm:num_requests_running", 0.0))
            await asyncio.sleep(0.1)

    # the first PREFILL_REQUESTS of a Poisson stream (its span is long enough to hold them many times over)
    span = 100.0 * PREFILL_REQUESTS / PREFILL_RATE
    arrivals = poisson_arrivals(PREFILL_RATE, span, prompt, PREFILL_OUTPUT, seed=seed)[:PREFILL_REQUESTS]
    before = await asyncio.to_thread(_scrape, url)
    sampler = asyncio.create_task(sample())
    try:
        result = await run_load([url], arrivals, model, timeout_s=300)
    finally:
        stop.set()
        await sampler
    after = await asyncio.to_thread(_scrape, url)
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
    n = SATURATION_BATCHES * seqs_cap
    real_rps = saturated_throughput(url, model, n, SATURATION_PROMPT, SATURATION_OUTPUT)
    fitted = Profile(
        name="fit", description="", c_ms=c, b_ms=b_ms, d_ms=d, e_ms=e, f_ms=f_ms, kv_tokens=kv_tokens or 1 << 20,
        gpus=1, cold_start_mean_s=60.0, cold_start_p90_s=60.0, max_num_seqs=seqs_cap, max_num_batched_tokens=2048,
    )  # fmt: skip
    sim_rps = simulated_throughput(fitted, n, SATURATION_PROMPT, SATURATION_OUTPUT)
    scale = step_scale(sim_rps, real_rps)
    _say(f"saturated: the engine {real_rps:.2f} req/s, the fitted model {sim_rps:.2f}: steps scaled by {scale:.3f}")
    return Fit(
        c_ms=c * scale,
        b_ms=b_ms * scale,
        d_ms=d * scale,
        e_ms=e * scale,
        f_ms=f_ms * scale,
        ttft_overhead_ms=overhead,
        kv_tokens=kv_tokens,
        max_num_seqs=seqs_cap,
        points={
            "prefill": loaded,
            "decode": decode_points,
            "ttft_overhead_ms": overheads,
            "saturated_rps": {"engine": real_rps, "fitted": sim_rps, "requests": n},
            "step_scale": scale,
        },
    )


def write_profile(fit: Fit, path: Path, *, name: str, description: str, cold_start_s: float) -> dict[str, Any]:
    profile = {
        "name": name,
        "description": description,
        "c_ms": round(fit.c_ms, 4),
        "b_ms": round(fit.b_ms, 6),
        "d_ms": round(fit.d_ms, 5),
        "e_ms": round(fit.e_ms, 5),
        "f_ms": float(f"{fit.f_ms:.4g}"),
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
