"""vLLM/SGLang-shaped /metrics payloads rendered by prometheus_client, the library both engines use,
so the text format (label order, float repr, `_created` families, counters' `_total`) is theirs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from keda_llm_scaler.sim.replica import TTFT_BUCKETS as VLLM_V1_TTFT_BUCKETS

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
# vLLM V1's layout, as the simulated replica exports it (prometheus_client adds +Inf itself)
TTFT_BUCKETS = tuple(b for b in VLLM_V1_TTFT_BUCKETS if b != math.inf)
# vLLM's request-latency histograms (e2e, queue, inference, prefill, decode) share these bounds
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


@dataclass
class EngineLoad:
    waiting: float = 0.0
    running: float = 0.0
    kv: float = 0.0


def vllm_v1(
    engines: Sequence[EngineLoad] = (EngineLoad(),),
    *,
    model: str = MODEL,
    http_2xx: float = 0.0,
    http_5xx: float | None = None,
    success: float = 0.0,
    preemptions: float = 0.0,
    ttft_observations: Sequence[float] = (),
    ttft_per_engine: Sequence[Sequence[float]] = (),  # each engine's own observations, added to the above
    kv_names: Sequence[str] = ("vllm:kv_cache_usage_perc",),
    hold_observations: Sequence[float] = (),  # how long requests held a batch slot, on every engine
) -> str:
    reg = CollectorRegistry()
    labels = ["model_name", "engine"]
    running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", labels, registry=reg)
    waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels, registry=reg)
    kvs = [Gauge(n, "KV-cache usage. 1 means 100 percent usage.", labels, registry=reg) for n in kv_names]
    pre = Counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", labels, registry=reg)
    ok = Counter(
        "vllm:request_success", "Count of successfully processed requests.", [*labels, "finished_reason"], registry=reg
    )
    ttft = Histogram(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        labels,
        buckets=TTFT_BUCKETS,
        registry=reg,
    )
    queue = Histogram(
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        labels,
        buckets=(0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0),
        registry=reg,
    )
    hold = Histogram(
        "vllm:request_inference_time_seconds",
        "Histogram of time spent in RUNNING phase for request.",
        labels,
        buckets=REQUEST_LATENCY_BUCKETS,
        registry=reg,
    )
    for i, e in enumerate(engines):
        rank = str(i)
        hold.labels(model, rank)  # exported at zero before any request finished, as vLLM does
        for obs in hold_observations:
            hold.labels(model, rank).observe(obs)
        running.labels(model, rank).set(e.running)
        waiting.labels(model, rank).set(e.waiting)
        for g in kvs:
            g.labels(model, rank).set(e.kv)
        pre.labels(model, rank).inc(preemptions / len(engines))
        ok.labels(model, rank, "stop").inc(success / len(engines))
        ok.labels(model, rank, "abort")
        for obs in (*ttft_observations, *(ttft_per_engine[i] if i < len(ttft_per_engine) else ())):
            ttft.labels(model, rank).observe(obs)
            queue.labels(model, rank).observe(obs / 2)
    http = Counter(
        "http_requests",
        "Total number of requests by method, status and handler.",
        ["handler", "method", "status"],
        registry=reg,
    )
    http.labels("/v1/chat/completions", "POST", "2xx").inc(http_2xx)
    if http_5xx is not None:
        http.labels("/v1/chat/completions", "POST", "5xx").inc(http_5xx)
    http.labels("/metrics", "GET", "5xx").inc(1000)  # not a generation handler: never a reject
    return generate_latest(reg).decode()


def sglang(
    ranks: Sequence[EngineLoad] = (EngineLoad(),),
    *,
    model: str = MODEL,
    tp_ranks: int = 1,
    finished: float = 0.0,
) -> str:
    reg = CollectorRegistry()
    labels = ["model_name", "engine_type", "tp_rank", "pp_rank", "dp_rank"]
    queue = Gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue", labels, registry=reg)
    running = Gauge("sglang:num_running_reqs", "The number of running requests", labels, registry=reg)
    usage = Gauge("sglang:token_usage", "The token usage", labels, registry=reg)
    done = Counter("sglang:num_requests", "Number of requests processed", ["model_name"], registry=reg)
    done.labels(model).inc(finished)
    for dp, e in enumerate(ranks):
        for tp in range(tp_ranks):  # --enable-metrics-for-all-schedulers: every TP rank repeats its scheduler
            lab = (model, "unified", str(tp), "0", str(dp))
            queue.labels(*lab).set(e.waiting)
            running.labels(*lab).set(e.running)
            usage.labels(*lab).set(e.kv)
    return generate_latest(reg).decode()
