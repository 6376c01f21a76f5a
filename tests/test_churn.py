"""Churn: metadata that changes, targets that come and go, bounded memory and /metrics."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import generate_latest

from keda_llm_scaler.errors import BadMetadata
from keda_llm_scaler.metadata import parse_trigger
from keda_llm_scaler.registry import MAX_METADATA_BYTES, TargetRegistry
from keda_llm_scaler.scrape import Scraper, ScrapeResult
from keda_llm_scaler.sim.keda import KedaEmulator
from keda_llm_scaler.telemetry import ScalerMetrics
from keda_llm_scaler.testing.payloads import EngineLoad, vllm_v1
from keda_llm_scaler.testing.replicas import Replica
from keda_llm_scaler.testing.scalerproc import channel_to, running_scaler
from tests.test_server_keda import eventually

DEAD = "http://127.0.0.1:9"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_superseded_trigger_retires_promptly_and_live_siblings_stay() -> None:
    clock = Clock()
    scraper = Scraper()
    reg = TargetRegistry(scraper, idle_ttl_s=600.0, clock=clock)
    try:
        old = reg.ensure(reg.config_for("serving", "llm", {"endpoints": DEAD}))
        sibling_a = reg.ensure(reg.config_for("serving", "two", {"endpoints": DEAD}))
        sibling_b = reg.ensure(reg.config_for("serving", "two", {"endpoints": DEAD, "activationThreshold": "1"}))
        clock.now += 30.0
        # the endpoint list of `llm` changed: KEDA now asks with the new metadata every 30 s
        new = reg.ensure(reg.config_for("serving", "llm", {"endpoints": DEAD + ",http://127.0.0.1:10"}))
        for _ in range(5):
            clock.now += 30.0
            for t in (new, sibling_a, sibling_b):
                t.touch()  # a ScaledObject with two triggers: both asked on every poll
        assert await reg.evict_idle() == 1  # 180 s unused, superseded: not the 600 s idle TTL
        assert set(reg.targets()) == {new, sibling_a, sibling_b}
        assert old not in reg.targets()
    finally:
        await reg.aclose()


async def test_a_superseded_target_asked_often_retires_within_seconds() -> None:
    # KEDA's HPA path and the operator ask the new metadata many times a minute: the old target must not
    # keep scraping its fleet for half a minute
    clock = Clock()
    reg = TargetRegistry(Scraper(), idle_ttl_s=600.0, clock=clock)
    try:
        old = reg.ensure(reg.config_for("serving", "llm", {"endpoints": DEAD}))
        clock.now += 2.0
        new = reg.ensure(reg.config_for("serving", "llm", {"endpoints": DEAD + ",http://127.0.0.1:10"}))
        for _ in range(3):
            clock.now += 1.5
            new.touch()
        assert await reg.evict_idle() == 0  # 4.5 s since the old one was asked: kept
        clock.now += 6.0
        new.touch()
        assert await reg.evict_idle() == 1 and old not in reg.targets()  # 10.5 s: retired
    finally:
        await reg.aclose()


async def test_a_superseded_target_retires_even_when_its_successor_is_asked_without_pause() -> None:
    # a caller that asks every 100 ms (a dashboard, a load test, the soak) never leaves a one-second gap:
    # before, its calls all counted as one poll and the replaced target scraped on for the 600 s idle TTL
    clock = Clock()
    reg = TargetRegistry(Scraper(), idle_ttl_s=600.0, clock=clock)
    try:
        old = reg.ensure(reg.config_for("serving", "llm", {"endpoints": DEAD}))
        clock.now += 0.1
        new = reg.ensure(reg.config_for("serving", "llm", {"endpoints": DEAD + ",http://127.0.0.1:10"}))
        for _ in range(110):  # 11 s of calls every 100 ms, on the new metadata only
            clock.now += 0.1
            new.touch()
        assert await reg.evict_idle() == 1 and reg.targets() == [new]
        assert old not in reg.targets()
    finally:
        await reg.aclose()


async def test_two_triggers_of_one_scaled_object_polled_together_both_stay() -> None:
    # KEDA asks each trigger of a ScaledObject on every poll (pollingInterval 30 s): neither replaces
    # the other, however long the pause between polls
    clock = Clock()
    reg = TargetRegistry(Scraper(), idle_ttl_s=600.0, clock=clock)
    try:
        a = reg.ensure(reg.config_for("serving", "llm", {"endpoints": DEAD}))
        b = reg.ensure(reg.config_for("serving", "llm", {"endpoints": DEAD + ",http://127.0.0.1:10"}))
        for _ in range(6):
            clock.now += 30.0
            a.touch()
            clock.now += 0.01
            b.touch()
            assert await reg.evict_idle() == 0
        assert set(reg.targets()) == {a, b}
    finally:
        await reg.aclose()


def test_metadata_size_is_checked_before_parsing() -> None:
    reg = TargetRegistry(Scraper.__new__(Scraper))  # no scraping here: config_for only
    huge = ",".join(f"http://10.0.{i // 250}.{i % 250}:8000" for i in range(20_000))
    assert len(huge) > MAX_METADATA_BYTES
    with pytest.raises(BadMetadata, match="endpoints") as err:
        reg.config_for("serving", "llm", {"endpoints": huge})
    assert "at most" in str(err.value)
    # under the budget, the usual per-key limits still apply (1000 endpoints)
    with pytest.raises(BadMetadata, match="at most 1000"):
        parse_trigger(
            "serving", "llm", {"endpoints": ",".join(f"http://10.0.0.{i % 250}:{8000 + i}" for i in range(1500))}
        )


def test_the_parse_cache_holds_a_byte_budget_not_just_a_count(monkeypatch: pytest.MonkeyPatch) -> None:
    # before: 1,024 entries whatever their size: distinct 256 KiB endpoint lists could hold ~250 MB
    monkeypatch.setattr("keda_llm_scaler.registry.PARSE_CACHE_BYTES", 200_000)
    reg = TargetRegistry(Scraper.__new__(Scraper))

    def meta(n: int) -> dict[str, str]:  # ~40 KB of endpoints each
        return {"endpoints": ",".join(f"http://10.{n}.{i // 250}.{i % 250}:8000" for i in range(900))}

    first = [reg.config_for("serving", f"so{n}", meta(n)) for n in range(10)]
    assert reg.config_for("serving", "so9", meta(9)) is first[9]  # the newest are still cached
    assert reg.config_for("serving", "so0", meta(0)) is not first[0]  # the oldest went, and parse again
    assert reg.config_for("serving", "so0", meta(0)) == first[0]
    assert reg._parsed_bytes <= 200_000


def test_series_of_a_forgotten_scaledobject_leave_metrics() -> None:
    metrics = ScalerMetrics(lambda: [])
    cfg = parse_trigger("serving", "gone", {"endpoints": DEAD})
    keep = parse_trigger("serving", "stays", {"endpoints": DEAD})
    for c in (cfg, keep):
        metrics.scrape_done(c, ScrapeResult(DEAD, None, "connect_error", "refused", 0.01, 0))
        metrics.scrape_done(c, ScrapeResult(DEAD, None, "timeout", "slow", 0.01, 0))
    text = generate_latest(metrics.registry).decode()
    assert 'scaledobject="gone"' in text
    metrics.forget("serving", "gone")
    text = generate_latest(metrics.registry).decode()
    assert 'scaledobject="gone"' not in text and 'scaledobject="stays"' in text


async def test_an_evicted_scaledobject_leaves_no_series_when_its_fleet_is_shared() -> None:
    # before: a fleet two ScaledObjects read kept observing its scrapes under the first one's name, so
    # that name's histograms came back after it was evicted (310 lines left after three rounds)
    replica = Replica(vllm_v1([EngineLoad(waiting=0, running=1, kv=0.1)]))
    try:
        async with running_scaler(target_idle_ttl=2.0) as server, channel_to(server) as ch:
            meta = {"endpoints": replica.url, "scrapeInterval": "0.5"}
            first = KedaEmulator(ch, "first", "serving", meta)
            second = KedaEmulator(ch, "second", "serving", meta)
            await first.poll()
            await second.poll()
            assert len({t.worker.key for t in server.registry.targets()}) == 1  # one shared fleet

            def text() -> str:
                return generate_latest(server.metrics.registry).decode()

            async def first_gone() -> bool:
                await second.poll()  # only the second is still asked
                return [t.cfg.name for t in server.registry.targets()] == ["second"]

            assert 'scaledobject="first"' in text()
            await eventually(first_gone, timeout=30.0)
            for _ in range(4):  # scrape cycles after the eviction must not bring the name back
                await second.poll()
                await asyncio.sleep(0.5)
            assert 'scaledobject="first"' not in text()
            assert 'scaledobject="second"' in text()
    finally:
        replica.close()
