"""(d) Reading fidelity: the scaler's waiting, running and KV for each real engine equal the engine's own
/metrics at the same scrape (issue #30).

"The same scrape": each engine's scheduler and model processes are stopped (SIGSTOP) while it holds a
queue, so its gauges cannot move between the scaler's scrape and the test's own; its API server still
answers /metrics. The test reads the engine's text with prometheus_client's parser, not the scaler's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time

import pytest

from keda_llm_scaler.enginelab.loadgen import Arrival, run_load
from tests.engine.conftest import Engines
from tests.engine.scaler import fetch, samples, scaler


def _engine_reading(url: str) -> dict[str, float]:
    waiting = running = 0.0
    kv: list[float] = []
    for name, _labels, value in samples(fetch(url + "/metrics")):
        if name == "vllm:num_requests_waiting":
            waiting += value
        elif name == "vllm:num_requests_running":
            running += value
        elif name == "vllm:kv_cache_usage_perc":
            kv.append(value)
    return {"waiting": waiting, "running": running, "kv": sum(kv) / len(kv)}


def _eventually(check, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.5)


def test_the_scalers_readings_equal_each_engines_own(engines: Engines) -> None:
    # more than a batch on each engine, long outputs so the queue stays while the engines are stopped
    per_engine = engines.max_num_seqs * 3
    arrivals = [Arrival(0.05 * i, 400, 400) for i in range(per_engine * len(engines.urls))]
    loop_thread = threading.Thread(
        target=lambda: asyncio.run(run_load(engines.urls, arrivals, engines.model, timeout_s=600)), daemon=True
    )
    stopped: list[int] = []
    with scaler() as s:
        names = [f"engine{i}" for i in range(len(engines.urls))]
        triggers = [
            s.trigger(n, {"endpoints": u, "scrapeInterval": "1"}) for n, u in zip(names, engines.urls, strict=True)
        ]
        loop_thread.start()
        try:
            for url in engines.urls:
                _eventually(lambda u=url: _engine_reading(u)["waiting"] > 0, 120, f"a queue on {url}")
            for i in range(len(engines.urls)):
                for pid in engines.engine_core_pids(i):
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)
            assert stopped, "found no EngineCore/Worker processes in the engines' cgroups"
            time.sleep(3.5)  # past the last step's stats reaching the API server, then two scrapes at 1 s
            for trigger in triggers:
                trigger.value()
            time.sleep(2.5)
            for name, url in zip(names, engines.urls, strict=True):
                own = _engine_reading(url)
                seen = {
                    "waiting": s.gauge("llm_scaler_waiting_requests", name),
                    "running": s.gauge("llm_scaler_running_requests", name),
                    "kv": s.gauge("llm_scaler_kv_usage_ratio", name),
                }
                assert own["waiting"] > 0 and own["running"] > 0, own
                assert seen["waiting"] == own["waiting"], (name, seen, own)
                assert seen["running"] == own["running"], (name, seen, own)
                assert seen["kv"] == pytest.approx(own["kv"], abs=1e-9), (name, seen, own)
        finally:
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        loop_thread.join(timeout=600)
    # the engines went on serving once resumed: every request answered
    for url in engines.urls:
        _eventually(lambda u=url: _engine_reading(u)["waiting"] + _engine_reading(u)["running"] == 0, 120, "drained")
