"""Scrape worker processes: the same answers as in-process scraping, one connection per replica, and a
worker that dies or wedges costs one failed scrape (never a zero), then comes back."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from keda_llm_scaler._proto import externalscaler_pb2 as pb
from keda_llm_scaler._proto import externalscaler_pb2_grpc as pb_grpc
from keda_llm_scaler.addresses import AddressPolicy, parse_networks
from keda_llm_scaler.config import Settings
from keda_llm_scaler.scrape import Scraper
from keda_llm_scaler.testing.payloads import EngineLoad, vllm_v1
from keda_llm_scaler.testing.replicas import replicas
from keda_llm_scaler.testing.scalerproc import channel_to, running_scaler
from keda_llm_scaler.workers import WORKER_FAILED, ScrapeWorkers, available_cpus, worker_count

PAYLOADS = [vllm_v1([EngineLoad(w, 10 + w, 0.1 * (w + 1))]) for w in range(4)]


async def _until(condition: Callable[[], bool], budget_s: float) -> None:
    """Wait for ``condition``; ``budget_s`` is room for a loaded machine, not a property of the code."""
    deadline = time.monotonic() + budget_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def _started(count: int = 2, policy: AddressPolicy | None = None) -> Scraper:
    workers = ScrapeWorkers(count, max_bytes=1 << 20, keepalive_budget=64, policy=policy or AddressPolicy())
    await workers.start()
    return Scraper(max_bytes=1 << 20, workers=workers)


async def _scrape(s: Scraper, url: str, timeout: float = 2.0):  # type: ignore[no-untyped-def]
    return await s.scrape(url, timeout=timeout, engine="auto", model=None)


async def test_workers_read_what_the_scaler_process_reads() -> None:
    inline, pooled = Scraper(max_bytes=1 << 20), await _started()
    try:
        with replicas(*PAYLOADS) as fleet:
            urls = [r.url + "/metrics" for r in fleet]
            here = await asyncio.gather(*(_scrape(inline, u) for u in urls))
            there = await asyncio.gather(*(_scrape(pooled, u) for u in urls))
        assert [r.reason for r in there] == [None] * 4
        assert [r.signals for r in there] == [r.signals for r in here]  # every field, histograms included
        assert [r.size for r in there] == [r.size for r in here]
        assert len(pooled.workers.pids()) == 2  # type: ignore[union-attr]
    finally:
        await inline.aclose()
        await pooled.aclose()


async def test_workers_run_this_install_whatever_directory_serve_starts_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # serve started inside another checkout (or any directory holding a keda_llm_scaler folder) must not
    # have its workers import that code instead of the scaler's own
    (tmp_path / "keda_llm_scaler").mkdir()
    (tmp_path / "keda_llm_scaler" / "__init__.py").write_text("raise ImportError('the wrong checkout')\n")
    monkeypatch.chdir(tmp_path)
    pooled = await _started()
    try:
        with replicas(PAYLOADS[0]) as (r,):
            result = await _scrape(pooled, r.url + "/metrics", timeout=10.0)
        assert result.reason is None and result.signals is not None
    finally:
        await pooled.aclose()


async def test_a_replica_keeps_one_connection_in_one_worker() -> None:
    s = await _started(count=3)
    try:
        with replicas(*PAYLOADS) as fleet:
            for _ in range(5):
                results = await asyncio.gather(*(_scrape(s, r.url + "/metrics") for r in fleet))
                assert all(res.reason is None for res in results), [res.detail for res in results]
            assert [r.requests for r in fleet] == [5] * 4
            assert [r.connections for r in fleet] == [1] * 4  # reused across cycles, never spread over workers
    finally:
        await s.aclose()


async def test_a_killed_worker_fails_its_scrapes_then_comes_back() -> None:
    s = await _started(count=1)
    workers = s.workers
    assert workers is not None
    try:
        with replicas(PAYLOADS[1]) as (r,):
            url = r.url + "/metrics"
            assert (await _scrape(s, url)).reason is None
            r.set(delay_s=3.0)  # in flight when the worker dies
            in_flight = asyncio.create_task(_scrape(s, url, timeout=5.0))
            await _until(lambda: r.requests >= 2, 10.0)
            (pid,) = workers.pids()
            os.kill(pid, signal.SIGKILL)
            failed = await in_flight
            assert failed.signals is None and failed.reason == WORKER_FAILED  # a failed scrape, never zero
            r.set(delay_s=0.0)
            await _until(lambda: len(workers.pids()) == 1 and workers.pids() != [pid], 20.0)
            ok = await eventually_ok(s, url)
            assert ok.signals is not None and ok.signals.waiting == 1
            assert workers.restarts == 1
    finally:
        await s.aclose()


async def eventually_ok(s: Scraper, url: str, budget_s: float = 20.0):  # type: ignore[no-untyped-def]
    """The first successful scrape within budget_s (a restarting worker answers scrape_worker_failed)."""
    deadline = time.monotonic() + budget_s
    while True:
        res = await _scrape(s, url)
        if res.reason is None or time.monotonic() > deadline:
            return res
        await asyncio.sleep(0.1)


async def test_a_wedged_worker_is_killed_and_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("keda_llm_scaler.workers.ANSWER_MARGIN_S", 0.5)
    s = await _started(count=1)
    workers = s.workers
    assert workers is not None
    try:
        with replicas(PAYLOADS[2]) as (r,):
            url = r.url + "/metrics"
            assert (await _scrape(s, url)).reason is None
            (pid,) = workers.pids()
            os.kill(pid, signal.SIGSTOP)  # alive, holds its socket, answers nothing
            res = await _scrape(s, url, timeout=0.5)
            assert res.signals is None and res.reason == WORKER_FAILED and "did not answer" in res.detail
            ok = await eventually_ok(s, url)
            assert ok.reason is None and workers.pids() != [pid]
    finally:
        await s.aclose()


async def test_the_address_policy_reaches_the_workers() -> None:
    s = await _started(policy=AddressPolicy(refuse=parse_networks("loopback", "--refuse-networks")))
    try:
        with replicas(PAYLOADS[0]) as (r,):
            res = await _scrape(s, r.url + "/metrics")
            localhost = await _scrape(s, r.url.replace("127.0.0.1", "localhost") + "/metrics")
        assert res.reason == "refused_address" and r.requests == 0
        assert localhost.reason == "refused_address"
    finally:
        await s.aclose()


async def test_workers_exit_when_the_scaler_goes() -> None:
    s = await _started()
    workers = s.workers
    assert workers is not None
    pids = workers.pids()
    await s.aclose()
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}")  # noqa: ASYNC240 - exited and reaped by aclose: no zombie


async def test_serve_with_workers_answers_keda_and_counts_them() -> None:
    with replicas(PAYLOADS[3], PAYLOADS[3]) as fleet:
        endpoints = ",".join(r.url + "/metrics" for r in fleet)
        async with running_scaler(scrape_workers="2", refuse_networks="") as server, channel_to(server) as ch:
            stub = pb_grpc.ExternalScalerStub(ch)
            ref = pb.ScaledObjectRef(name="llm", namespace="serving", scalerMetadata={"endpoints": endpoints})
            req = pb.GetMetricsRequest(scaledObjectRef=ref, metricName="llm_composite")

            async def value() -> float | None:
                try:
                    return (await stub.GetMetrics(req, timeout=5)).metricValues[0].metricValueFloat
                except grpc.aio.AioRpcError:
                    return None

            for _ in range(100):  # up to ~20 s: two workers starting on a loaded machine
                if (got := await value()) is not None:
                    break
                await asyncio.sleep(0.2)
            assert got is not None and got > 0
            assert all(r.requests >= 1 for r in fleet)
            text = (await asyncio.to_thread(_metrics, server.metrics_port)).splitlines()
            assert "llm_scaler_scrape_workers 2.0" in text
            assert "llm_scaler_scrape_worker_restarts_total 0.0" in text


def _metrics(port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return str(resp.read().decode())


def test_worker_count_follows_the_cpus_the_pod_may_use(tmp_path: Path) -> None:
    quota = tmp_path / "cpu.max"
    quota.write_text("150000 100000\n")  # a pod limit of 1.5 CPUs: two workers
    assert available_cpus(str(quota)) == min(2, len(os.sched_getaffinity(0)))
    quota.write_text("max 100000\n")
    assert available_cpus(str(quota)) == len(os.sched_getaffinity(0))
    assert available_cpus(str(tmp_path / "absent")) == len(os.sched_getaffinity(0))
    assert worker_count("0") == 0 and worker_count("3") == 3 and worker_count("auto") >= 1


@pytest.mark.parametrize("bad", ["-1", "lots", "1.5", "٣", "999"])
def test_a_bad_worker_count_is_refused_naming_the_flag(bad: str) -> None:
    with pytest.raises(ValueError, match="--scrape-workers") as err:
        Settings(scrape_workers=bad)
    assert "auto" in str(err.value)


async def test_a_worker_that_dies_before_its_hello_is_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    # A worker that never says hello (here: its config's networks do not parse; in life, a Ctrl-C in the
    # moment it was forked) must not hold the scaler's start-up for READY_WAIT_S: its end is the answer.
    monkeypatch.setattr("keda_llm_scaler.workers.READY_WAIT_S", 600.0)
    workers = ScrapeWorkers(1, max_bytes=1 << 20, keepalive_budget=64, policy=AddressPolicy())
    workers.config["refuse"] = ["not-a-network"]
    try:
        await asyncio.wait_for(workers.start(), 60)  # a budget for a loaded machine; it waited 600 s before
        await _until(lambda: workers.restarts >= 1, 20.0)  # and its reader restarts it, as any dead worker
    finally:
        await workers.aclose()
