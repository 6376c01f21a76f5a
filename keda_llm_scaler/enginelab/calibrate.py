"""``keda-llm-scaler calibrate``: a replica profile for the simulator, fitted on a running engine.

It sends its own load in two phases and reads the engine's own histograms (sum and count before and after
each phase, so only its own requests count) and its cache config:

- **prefill**: one request at a time with prompts of several lengths and one output token, while
  ``BACKGROUND_STREAMS`` long decodes keep the engine busy as serving does (an idle engine's prefill is
  faster than a serving one's: on a CPU quota the busy engine has spent its quota when a prompt comes,
  and its prompts share steps with decodes); the engine's ``request_prefill_time_seconds`` per request
  is that mixed step, ``c + b·P + d·D + e·K/1000 + f·P²/2``, fitted for ``b`` and ``f`` once the decode
  terms are known;
- **decode**: batches of B concurrent requests with long outputs, at several B and two prompt lengths
  (so the context is not just a multiple of the batch); the engine's ``inter_token_latency_seconds``
  mean is ``c + d·B + e·K/1000`` with ``K`` the batch's mean context, fitted for ``c``, ``d`` and ``e``;
- **the API server's own time per request** (tokenizing, the hand-off to the engine, the wait for the
  current step, the first chunk's write): the client's TTFT less the engine's prefill time, the median
  over the prefill phase. The simulator adds it to every TTFT, not to the engine's steps.

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

__all__ = ["Fit", "calibrate", "fit_decode", "fit_prefill", "least_squares"]

PREFILL_PROMPTS = (32, 256, 512, 1024, 1536)
PREFILL_REPEATS = 6
DECODE_BATCHES = (1, 4, 8, 16, 32)
DECODE_PROMPTS = (16, 768)  # short and long contexts at each batch size: K varies apart from B
DECODE_OUTPUT = 96
BACKGROUND_STREAMS = 2  # decodes running through the prefill probes
BACKGROUND_PROMPT, BACKGROUND_OUTPUT = 16, 1500


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


def fit_prefill(points: Sequence[tuple[int, float]], c_ms: float) -> tuple[float, float]:
    """(prompt P, prefill ms) -> b, f of ``prefill = c + b·P + f·P²/2``, each >= 0."""
    b, f = least_squares([(float(p), p * p / 2.0) for p, _ in points], [y - c_ms for _, y in points])
    if f < 0:
        (b,) = least_squares([(float(p),) for p, _ in points], [y - c_ms for _, y in points])
        f = 0.0
    return max(b, 0.0), max(f, 0.0)


async def _burst(url: str, model: str, n: int, prompt: int, output: int) -> list[Any]:
    result = await run_load([url], [Arrival(0.0, prompt, output) for _ in range(n)], model, timeout_s=600)
    failed = [r.error for r in result.records if r.error is not None]
    if failed:
        raise RuntimeError(f"{len(failed)} of {n} calibration requests failed: {failed[:3]}")
    return result.records


async def _prefill_probes(url: str, model: str, max_model_len: int) -> tuple[list[tuple[int, float]], list[float]]:
    """Prefill times per prompt length (engine-side) and client TTFT less them, with background decodes."""
    url_list = [url]
    streams = [Arrival(0.0, BACKGROUND_PROMPT, BACKGROUND_OUTPUT)] * BACKGROUND_STREAMS
    background = asyncio.create_task(run_load(url_list, streams, model))
    await asyncio.sleep(2.0)  # the background streams are decoding
    points: list[tuple[int, float]] = []
    overheads: list[float] = []
    try:
        for p in PREFILL_PROMPTS:
            if p + 1 > max_model_len:
                continue
            before = await asyncio.to_thread(_scrape, url)
            client: list[float] = []
            for _ in range(PREFILL_REPEATS):
                result = await run_load(url_list, [Arrival(0.0, p, 1)], model, timeout_s=300)
                rec = result.records[0]
                if rec.error is not None or rec.ttft_s is None:
                    raise RuntimeError(f"a prefill probe of {p} tokens failed: {rec.error}")
                client.append(rec.ttft_s * 1000.0)
            after = await asyncio.to_thread(_scrape, url)
            engine_ms = _mean_delta(before, after, "vllm:request_prefill_time_seconds")
            if engine_ms is None:
                raise RuntimeError("the engine's request_prefill_time_seconds did not move: is it vLLM V1?")
            engine_ms *= 1000.0
            points.append((p, engine_ms))
            overheads.append(statistics.median(client) - engine_ms)
            _say(f"prefill {p:5d} tokens: engine {engine_ms:7.1f} ms, client TTFT {statistics.median(client):7.1f} ms")
        if background.done():
            raise RuntimeError("the background decodes ended before the prefill probes did")
    finally:
        background.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await background
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

    decode_points: list[tuple[int, float, float]] = []
    peak = [0.0]
    for prompt in DECODE_PROMPTS:
        for b in DECODE_BATCHES:
            if prompt + DECODE_OUTPUT > max_model_len:
                continue
            stop = [False]
            watcher = threading.Thread(target=_running_peak, args=(url, stop, peak), daemon=True)
            watcher.start()
            before = _scrape(url)
            asyncio.run(_burst(url, model, b, prompt, DECODE_OUTPUT))
            after = _scrape(url)
            stop[0] = True
            watcher.join()
            itl = _mean_delta(before, after, "vllm:inter_token_latency_seconds")
            if itl is None:
                raise RuntimeError("the engine's inter_token_latency_seconds did not move: is it vLLM V1?")
            decode_points.append((b, float(prompt), itl * 1000.0))
            _say(
                f"decode batch {b:3d}, prompt {prompt:4d}: engine ITL {itl * 1000:7.2f} ms "
                f"(running at most {peak[0]:.0f})"
            )
    seqs_cap = max(1, max_num_seqs or int(peak[0]))
    # a batch above the cap runs as the cap; the mean context of a decode step is the prompt plus half the output
    decode_points = [(min(b, seqs_cap), min(b, seqs_cap) * (p + DECODE_OUTPUT / 2), y) for b, p, y in decode_points]
    c, d, e = fit_decode(decode_points)
    prefill_points, overheads = asyncio.run(_prefill_probes(url, model, max_model_len))
    # the probes' steps also carried the background decodes: their share of each step is known now
    background_ms = d * BACKGROUND_STREAMS + e * BACKGROUND_STREAMS * (BACKGROUND_PROMPT + BACKGROUND_OUTPUT / 4) / 1000
    b_ms, f_ms = fit_prefill(prefill_points, c + background_ms)
    overhead = max(0.0, statistics.median(overheads)) if overheads else 0.0
    return Fit(
        c_ms=c,
        b_ms=b_ms,
        d_ms=d,
        e_ms=e,
        f_ms=f_ms,
        ttft_overhead_ms=overhead,
        kv_tokens=kv_tokens,
        max_num_seqs=seqs_cap,
        points={"prefill": prefill_points, "decode": decode_points, "ttft_overhead_ms": overheads},
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
