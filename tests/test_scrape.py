"""Scraping real loopback replicas: every failure mode is a reason on that replica, never a crash."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from keda_llm_scaler import __version__
from keda_llm_scaler.addresses import AddressPolicy
from keda_llm_scaler.scrape import Scraper
from keda_llm_scaler.testing.payloads import EngineLoad, vllm_v1
from keda_llm_scaler.testing.replicas import Replica, dead_port, replicas
from keda_llm_scaler.workers import ScrapeWorkers

GOOD = vllm_v1([EngineLoad(2, 10, 0.5)])


@pytest.fixture(params=["in-process", "workers"])
async def scraper(request: pytest.FixtureRequest):
    """Every failure mode holds both where `serve` scrapes (worker processes) and in process (`inspect`)."""
    workers = None
    if request.param == "workers":
        workers = ScrapeWorkers(2, max_bytes=256 * 1024, keepalive_budget=64, policy=AddressPolicy())
        await workers.start()
    s = Scraper(max_bytes=256 * 1024, workers=workers)
    yield s
    await s.aclose()


async def test_good_replica(scraper: Scraper) -> None:
    with replicas(GOOD) as (r,):
        res = await scraper.scrape(r.url + "/metrics", timeout=2, engine="auto", model=None)
    assert res.reason is None and res.signals is not None
    assert (res.signals.waiting, res.signals.running, res.signals.kv_usage) == (2, 10, 0.5)
    assert res.size > 0


async def test_scrapes_say_which_release_is_asking(scraper: Scraper) -> None:
    # one version source: the package metadata (pyproject.toml), as --version and llm_scaler_build_info
    with replicas(GOOD) as (r,):
        await scraper.scrape(r.url + "/metrics", timeout=2, engine="auto", model=None)
    assert r.user_agent == f"keda-llm-scaler/{__version__}" and __version__ != "0+unknown"


@pytest.mark.parametrize(
    ("behaviour", "reason"),
    [
        ({"status": 503}, "http_503"),
        ({"status": 404}, "http_404"),
        ({"garbage": True}, "unrecognized_payload"),
        ({"payload": 'vllm:num_requests_waiting{engine="0" 1\n'}, "parse_error"),
        ({"payload": "# engine still starting\n"}, "unrecognized_payload"),
        ({"huge_bytes": 1024 * 1024}, "too_large"),
        ({"delay_s": 6.0}, "timeout"),
        ({"drip_s": 0.2}, "timeout"),
        ({"hang_up": True}, "http_error"),
    ],
    ids=["503", "404", "garbage", "malformed", "empty", "huge", "slow-headers", "slow-body", "hang-up"],
)
async def test_failures_are_reasons(scraper: Scraper, behaviour: dict[str, object], reason: str) -> None:
    with replicas(GOOD) as (r,):
        r.set(**behaviour)
        start = time.perf_counter()
        res = await scraper.scrape(r.url + "/metrics", timeout=1.0, engine="auto", model=None)
        elapsed = time.perf_counter() - start
    assert res.signals is None
    assert res.reason == reason, res.detail
    if reason == "timeout":
        # the deadline is what is tested: it covers headers and body, so the call ends at the 1 s deadline,
        # not when the slow replica would answer (6 s of delay, or a body dripped 64 bytes per 0.2 s: more
        # than 6 s too); measured against that, not a clock
        assert elapsed < 6.0 / 2


async def test_nothing_listening(scraper: Scraper) -> None:
    res = await scraper.scrape(f"http://127.0.0.1:{dead_port()}/metrics", timeout=1, engine="auto", model=None)
    assert res.reason == "connect_error"


async def test_one_slow_replica_does_not_delay_the_others(scraper: Scraper) -> None:
    with replicas(GOOD, GOOD, GOOD) as fleet:
        fleet[0].set(delay_s=6.0)
        start = time.perf_counter()
        results = await asyncio.gather(
            *(scraper.scrape(r.url + "/metrics", timeout=1.0, engine="auto", model=None) for r in fleet)
        )
        # bounded by the 1 s deadline, not by the slow replica's 6 s (generous room for a loaded machine)
        assert time.perf_counter() - start < 3.0
    assert [r.reason for r in results] == ["timeout", None, None]


async def test_redirects_are_not_followed(scraper: Scraper) -> None:
    r = Replica(GOOD)
    try:
        r.set(status=302)
        res = await scraper.scrape(r.url + "/metrics", timeout=1, engine="auto", model=None)
        assert res.reason == "http_302"
    finally:
        r.close()


async def test_a_large_payload_is_parsed_off_the_event_loop() -> None:
    # A valid vLLM payload padded to ~6 MiB with series the reader skips (an 8 MiB body is allowed).
    from keda_llm_scaler.engines import read_replica

    padding = "".join(
        f'vllm:request_success_total{{model_name="m",finished_reason="r{i}"}} {i}\n' for i in range(90_000)
    )
    payload = GOOD + padding
    assert len(payload) > 5 * 1024 * 1024
    t0 = time.perf_counter()
    read_replica(payload, "auto", None)
    inline_s = time.perf_counter() - t0  # what the loop would stall for if it parsed this itself
    s = Scraper(max_bytes=8 * 1024 * 1024)
    try:
        with replicas(payload) as (r,):
            gaps: list[float] = []
            done = asyncio.Event()

            async def ticker() -> None:  # the event loop's responsiveness while the scrape runs
                last = time.perf_counter()
                while not done.is_set():
                    await asyncio.sleep(0.001)
                    now = time.perf_counter()
                    gaps.append(now - last)
                    last = now

            tick = asyncio.create_task(ticker())
            res = await s.scrape(r.url + "/metrics", timeout=30, engine="auto", model=None)
            done.set()
            await tick
    finally:
        await s.aclose()
    assert res.reason is None and res.signals is not None and res.signals.running == 10
    # the loop kept turning: its longest pause is a small fraction of the inline parse (ratio, same run)
    assert max(gaps) < 0.5 * inline_s, (max(gaps), inline_s)


async def test_a_body_cut_mid_line_is_a_parse_error_not_a_smaller_value(scraper: Scraper) -> None:
    # "0.95" cut after "0." would parse as 0: the text format ends every line with a newline
    cut = GOOD[: GOOD.index("vllm:kv_cache_usage_perc{")]
    cut += GOOD[len(cut) :].split("\n", 1)[0][:-2]
    assert not cut.endswith("\n")
    with replicas(cut) as (r,):
        res = await scraper.scrape(r.url + "/metrics", timeout=2, engine="auto", model=None)
    assert res.signals is None and res.reason == "parse_error" and "newline" in res.detail


async def test_garbage_gauges_fail_the_replica_with_a_reason(scraper: Scraper) -> None:
    inf_kv = "".join(
        (ln.rsplit(" ", 1)[0] + " +Inf" if ln.startswith("vllm:kv_cache_usage_perc{") else ln) + "\n"
        for ln in vllm_v1([EngineLoad(0, 0, 0.0)]).splitlines()
    )
    with replicas(inf_kv) as (r,):
        res = await scraper.scrape(r.url + "/metrics", timeout=2, engine="auto", model=None)
    assert res.signals is None and res.reason == "invalid_signal" and "kv_cache_usage_perc" in res.detail


async def test_a_replica_is_scraped_over_one_kept_alive_connection() -> None:
    # before: one shared pool with as many connections as scrape slots; with more replicas than that
    # (here 3 replicas, 2 slots), every scrape opened a new TCP connection (issue #11: accepts = requests)
    s = Scraper(max_concurrency=2)
    try:
        with replicas(GOOD, GOOD, GOOD) as fleet:
            for _ in range(4):
                results = await asyncio.gather(
                    *(s.scrape(r.url + "/metrics", timeout=2.0, engine="auto", model=None) for r in fleet)
                )
                assert all(res.reason is None for res in results), [res.detail for res in results]
            assert [r.requests for r in fleet] == [4, 4, 4]
            assert [r.connections for r in fleet] == [1, 1, 1]
    finally:
        await s.aclose()


async def test_a_failed_scrape_does_not_poison_the_replicas_connection(scraper: Scraper) -> None:
    with replicas(GOOD) as (r,):
        assert (await scraper.scrape(r.url + "/metrics", timeout=1.0, engine="auto", model=None)).reason is None
        r.set(hang_up=True)
        assert (await scraper.scrape(r.url + "/metrics", timeout=1.0, engine="auto", model=None)).reason is not None
        r.set(hang_up=False, delay_s=2.0)  # times out mid-request: that connection must not be reused
        assert (await scraper.scrape(r.url + "/metrics", timeout=0.5, engine="auto", model=None)).reason == "timeout"
        r.set(delay_s=0.0)
        res = await scraper.scrape(r.url + "/metrics", timeout=2.0, engine="auto", model=None)
        assert res.reason is None and res.signals is not None


async def test_keepalive_budget_bounds_open_connections() -> None:
    s = Scraper(keepalive_budget=1)
    try:
        with replicas(GOOD, GOOD) as fleet:
            for _ in range(3):
                for r in fleet:
                    assert (await s.scrape(r.url + "/metrics", timeout=2.0, engine="auto", model=None)).reason is None
            # the first replica keeps its connection, the second (past the budget) reconnects each time
            assert [r.connections for r in fleet] == [1, 3]
    finally:
        await s.aclose()


async def test_replicas_gone_from_the_fleet_lose_their_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    # churn: a replica no longer scraped must not keep a pool and a socket for good
    monkeypatch.setattr("keda_llm_scaler.scrape.URL_IDLE_S", 0.3)
    monkeypatch.setattr("keda_llm_scaler.scrape.KEEPALIVE_S", 0.3)
    s = Scraper()
    try:
        with replicas(GOOD, GOOD) as (old, new):
            assert (await s.scrape(old.url + "/metrics", timeout=2.0, engine="auto", model=None)).reason is None
            assert s.fetcher is not None and s.fetcher.kept_alive_origins == 1 and old.open_connections == 1
            for _ in range(12):  # ~1.2 s of scraping only the new replica, four times the idle limit
                assert (await s.scrape(new.url + "/metrics", timeout=2.0, engine="auto", model=None)).reason is None
                await asyncio.sleep(0.1)
            assert s.fetcher.kept_alive_origins == 1  # only the replica still scraped
            assert old.open_connections == 0 and new.open_connections == 1
    finally:
        await s.aclose()


async def test_a_kept_alive_connection_the_server_just_closed_is_retried_once() -> None:
    # uvicorn closes idle keep-alive connections after 5 s; a scrape sent at that moment reads EOF. This
    # server answers the first request on each connection and hangs up on the second, without answering.
    body = GOOD.encode()
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            await reader.readuntil(b"\r\n\r\n")
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/metrics"
    s = Scraper()
    try:
        for _ in range(3):
            res = await s.scrape(url, timeout=2.0, engine="auto", model=None)
            assert res.reason is None, res.detail  # before: http_error on every second scrape
        assert connections == 3
    finally:
        await s.aclose()
        server.close()


async def test_the_wait_for_a_slot_is_measured_apart_from_the_scrape() -> None:
    # before: the duration's clock started before the wait for a slot, so queueing read as slow replicas
    s = Scraper(max_concurrency=1)
    try:
        with replicas(GOOD, GOOD) as (slow, fast):
            slow.set(delay_s=1.0)
            held = asyncio.ensure_future(s.scrape(slow.url + "/metrics", timeout=5.0, engine="auto", model=None))
            await asyncio.sleep(0.2)  # the slow scrape holds the only slot
            queued = await s.scrape(fast.url + "/metrics", timeout=5.0, engine="auto", model=None)
            first = await held
        assert first.reason is None and queued.reason is None
        assert queued.wait_s > 0.5 * (first.duration_s - 0.2)  # it waited for most of the slow scrape
        assert queued.duration_s < queued.wait_s  # and its own scrape is the quick part
        assert first.wait_s < first.duration_s
    finally:
        await s.aclose()
