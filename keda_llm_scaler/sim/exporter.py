"""Serve a simulated replica's state as a vLLM V1 ``/metrics`` endpoint over real HTTP.

Families, names and labels are vLLM V1's (``model_name`` and ``engine`` labels, counters with
``_total``, the V1 bucket layouts), rendered by prometheus_client as vLLM does, so the scaler reads a
simulated pod exactly as it reads a real one.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from keda_llm_scaler.signals import Histogram
from keda_llm_scaler.sim.replica import SimReplica

__all__ = ["MODEL", "ReplicaExporter"]

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
_LABELS = ["model_name", "engine"]


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


class _VllmCollector(Collector):
    def __init__(self, replica: SimReplica, lock: threading.Lock) -> None:
        self._replica = replica
        self._lock = lock

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            r = self._replica
            s = r.signals()
            finished, rejected = r.finished_total, r.rejects_total
            preemptions = r.preemptions_total
            prompt_tokens, generation_tokens = r.prompt_tokens_total, r.generation_tokens_total
        labels = [MODEL, "0"]
        for name, doc, value in (
            ("vllm:num_requests_running", "Number of requests in model execution batches.", s.running),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", s.waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.kv_usage),
        ):
            g = GaugeMetricFamily(name, doc, labels=_LABELS)
            g.add_metric(labels, value)
            yield g
        for name, doc, value in (
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", preemptions),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", prompt_tokens),
            ("vllm:generation_tokens", "Number of generation tokens processed.", generation_tokens),
        ):
            c = CounterMetricFamily(name, doc, labels=_LABELS)
            c.add_metric(labels, value)
            yield c
        ok = CounterMetricFamily(
            "vllm:request_success", "Count of successfully processed requests.", labels=[*_LABELS, "finished_reason"]
        )
        ok.add_metric([*labels, "stop"], finished)
        ok.add_metric([*labels, "abort"], 0.0)
        yield ok
        http = CounterMetricFamily(
            "http_requests",
            "Total number of requests by method, status and handler.",
            labels=["handler", "method", "status"],
        )
        http.add_metric(["/v1/chat/completions", "POST", "2xx"], finished)
        http.add_metric(["/v1/chat/completions", "POST", "5xx"], rejected)  # admission 503s
        yield http
        for name, doc, hist in (
            ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", s.ttft),
            ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", s.queue_time),
        ):
            if hist is not None:
                yield _histogram(name, doc, hist, labels)


def _histogram(name: str, doc: str, hist: Histogram, labels: list[str]) -> Metric:
    h = HistogramMetricFamily(name, doc, labels=_LABELS)
    h.add_metric(labels, [(_le(le), count) for le, count in hist.buckets], hist.sum)
    return h


class ReplicaExporter:
    """One simulated pod's /metrics on ``host`` (a free port unless ``port`` is given); reads the replica
    under ``lock``. ``failing`` set to an HTTP status makes every scrape answer it (a broken pod)."""

    def __init__(self, replica: SimReplica, lock: threading.Lock, host: str = "127.0.0.1", port: int = 0) -> None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_VllmCollector(replica, lock))
        self.failing: int | None = None
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status = exporter.failing
                body = generate_latest(registry) if status is None else b"simulated failure\n"
                self.send_response(status or 200)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST if status is None else "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name=f"exporter-{host}")
        self._thread.start()
        self.host = host
        self.port: int = self._server.server_port

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
