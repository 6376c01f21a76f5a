"""Fetch and read one replica's /metrics. A failure is data (ScrapeResult.reason), never an exception.

Each replica (scrape URL) has its own small httpcore connection pool, so its keep-alive connection is reused
cycle after cycle and a request never walks the other replicas' connections. One shared httpx pool did
both wrong at fleet scale: with more replicas than pooled connections nothing was ever reused (a TCP
connect per scrape), and httpcore scans every pooled connection on each request and each release —
38 % of the scaler's CPU at 1,000 replicas (issue #11's profile). httpcore is httpx's own transport
layer: the same connection, TLS and timeout code, without a client's per-request model.

Every scrape has a hard deadline covering the wait for a concurrency slot (the fleet's, the namespace's,
then the process-wide one), connect, headers and body, so neither a replica that drips bytes slowly nor a
fleet of hung replicas can hold a cycle past ``scrapeTimeout`` or take every slot from other fleets.
Bodies are capped in size while streaming; large ones are parsed in a worker thread, so a
multi-megabyte payload does not stall the scrape loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import httpcore
import httpx  # only for its TLS defaults (certifi), as the scrape client had them before

from keda_llm_scaler.addresses import GuardedBackend
from keda_llm_scaler.engines import read_replica
from keda_llm_scaler.errors import ReplicaError
from keda_llm_scaler.promtext import TextFormatError
from keda_llm_scaler.signals import ReplicaSignals

if TYPE_CHECKING:
    from keda_llm_scaler.workers import ScrapeWorkers

__all__ = ["DEFAULT_MAX_BYTES", "ScrapeResult", "Scraper"]

DEFAULT_MAX_BYTES: Final = 8 * 1024 * 1024  # a DP=8 vLLM pod serves ~0.36 MB; 20x headroom
USER_AGENT: Final = "keda-llm-scaler/0.1"
PER_FLEET_CONCURRENCY: Final = 16  # at most this many of one fleet's scrapes in flight...
PER_FLEET_SHARE: Final = 0.25  # ...and at most this share of the process-wide slots (16 of the default 64)
PER_NAMESPACE_SHARE: Final = 0.5  # all fleets of one namespace (tenant) together: half the process's slots
THREAD_PARSE_BYTES: Final = 64 * 1024  # above this a parse takes milliseconds: do it off the event loop
KEEPALIVE_S: Final = 120.0  # longer than the longest scrapeInterval (60 s): one connection lives across cycles
URL_IDLE_S: Final = 300.0  # a replica not scraped for this long (churned away) loses its pool
_REQUEST_HEADERS: Final = [(b"User-Agent", USER_AGENT.encode()), (b"Accept", b"text/plain;version=0.0.4")]


@dataclass(frozen=True, slots=True)
class ScrapeResult:
    url: str
    signals: ReplicaSignals | None
    reason: str | None  # None on success; a short machine-readable cause otherwise
    detail: str
    duration_s: float  # the scrape itself: connect, request, body, parse (not the wait for a slot)
    size: int
    wait_s: float = 0.0  # waiting for the fleet's, namespace's and process's scrape slots


class _TooLarge(Exception):
    pass


class _PastDeadline(Exception):
    pass


# what a request sent on a connection the server had just closed fails with, before any answer
_SENT_ON_A_CLOSED_CONNECTION: Final = (httpcore.RemoteProtocolError, httpcore.ReadError, httpcore.WriteError)


class _HttpStatus(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


class Scraper:
    def __init__(
        self,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_concurrency: int = 64,
        keepalive_budget: int = 4096,
        workers: ScrapeWorkers | None = None,
    ) -> None:
        """``workers``: fetch and parse in worker processes (``serve``); else on this event loop."""
        self.max_bytes = max_bytes
        self.workers = workers
        self.max_concurrency = max_concurrency
        # open keep-alive connections allowed in all (one per replica); past it, connections close after
        # each scrape, so a huge fleet cannot exhaust the process's file descriptors
        self.keepalive_budget = keepalive_budget
        self._namespaces: dict[str, asyncio.Semaphore] = {}
        self._sem = asyncio.Semaphore(max_concurrency)
        # every connection goes through the address guard: resolve, check, connect to what was checked
        self._backend = GuardedBackend()
        self._ssl = httpx.create_ssl_context()
        self._pools: dict[str, httpcore.AsyncConnectionPool] = {}
        self._used: dict[str, float] = {}
        self._kept_alive = 0
        self._last_sweep = 0.0
        self._closing: set[asyncio.Task[None]] = set()

    async def aclose(self) -> None:
        if self.workers is not None:
            await self.workers.aclose()
        pools, self._pools = list(self._pools.values()), {}
        self._used.clear()
        self._kept_alive = 0
        await asyncio.gather(*(p.aclose() for p in pools), return_exceptions=True)

    def _pool(self, url: str, now: float) -> httpcore.AsyncConnectionPool:
        # keyed by the scrape URL, not the origin: replicas behind one address on different paths (a
        # gateway, a test fleet) each get a connection instead of queueing for one
        pool = self._pools.get(url)
        if pool is None:
            keep = self._kept_alive < self.keepalive_budget
            self._kept_alive += keep
            pool = self._pools[url] = httpcore.AsyncConnectionPool(
                ssl_context=self._ssl,
                max_connections=2,  # two fleets with other intervals may scrape one replica at once
                max_keepalive_connections=1 if keep else 0,
                keepalive_expiry=KEEPALIVE_S,
                network_backend=self._backend,
            )
        self._used[url] = now
        if now - self._last_sweep > URL_IDLE_S / 10:
            self._sweep(now)
        return pool

    def _sweep(self, now: float) -> None:
        """Forget replicas not scraped for URL_IDLE_S (churned away): their pools close."""
        self._last_sweep = now
        for url in [u for u, t in self._used.items() if now - t > URL_IDLE_S]:
            pool = self._pools.pop(url)
            del self._used[url]
            if pool._max_keepalive_connections:
                self._kept_alive -= 1
            closing = asyncio.get_running_loop().create_task(pool.aclose())
            self._closing.add(closing)  # the loop holds tasks weakly
            closing.add_done_callback(self._closing.discard)

    @property
    def pooled_urls(self) -> int:
        return len(self._pools)

    async def _fetch(self, url: str, deadline: float) -> bytes:
        """The body, by ``deadline`` (loop time). httpcore's own timeouts (each at most the time left) end a
        stalled connect or a silent server; a body dripping in under the read timeout is cut when the
        deadline passes. Never by cancelling a request mid-flight: a request cancelled while connecting
        leaves its connection in the pool as CONNECTING for good, and enough of those exhaust the pool
        (found by the soak: every scrape then waits, with the CPU idle)."""
        loop = asyncio.get_running_loop()
        pool = self._pool(url, loop.time())
        # A server may close a kept-alive connection just as the next scrape is sent on it (uvicorn, under
        # vLLM and SGLang, closes idle ones after 5 s: a 5 s scrapeInterval meets that edge). Like Go's
        # HTTP client does for idempotent requests, a GET that failed on a reused connection
        # is sent once more, on a new connection, within the same deadline (a GET can be repeated).
        reused = any(c.is_idle() for c in pool.connections)
        try:
            return await self._fetch_once(pool, url, deadline)
        except _SENT_ON_A_CLOSED_CONNECTION:
            if not reused or loop.time() >= deadline:
                raise
            return await self._fetch_once(pool, url, deadline)

    async def _fetch_once(self, pool: httpcore.AsyncConnectionPool, url: str, deadline: float) -> bytes:
        loop = asyncio.get_running_loop()
        left = max(0.001, deadline - loop.time())
        timeouts = {"connect": left, "read": left, "write": left, "pool": left}
        async with pool.stream("GET", url, headers=_REQUEST_HEADERS, extensions={"timeout": timeouts}) as resp:
            if resp.status != 200:
                raise _HttpStatus(resp.status)
            for name, value in resp.headers:
                if name.lower() == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                    raise _TooLarge(f"Content-Length {value.decode()} > {self.max_bytes}")
            chunks, size = [], 0
            async for chunk in resp.aiter_stream():
                size += len(chunk)
                if size > self.max_bytes:
                    raise _TooLarge(f"body over {self.max_bytes} bytes")
                if loop.time() > deadline:
                    raise _PastDeadline
                chunks.append(chunk)
            return b"".join(chunks)

    def namespace_limit(self, namespace: str) -> asyncio.Semaphore:
        """The slots all fleets of one namespace share: one tenant's silent endpoints cannot take them all."""
        sem = self._namespaces.get(namespace)
        if sem is None:
            sem = self._namespaces[namespace] = asyncio.Semaphore(
                max(1, int(self.max_concurrency * PER_NAMESPACE_SHARE))
            )
        return sem

    def fleet_limit(self) -> asyncio.Semaphore:
        """A fleet's own concurrency limit (taken before the process-wide one)."""
        return asyncio.Semaphore(max(1, min(PER_FLEET_CONCURRENCY, int(self.max_concurrency * PER_FLEET_SHARE))))

    async def scrape(
        self,
        url: str,
        *,
        timeout: float,
        engine: str,
        model: str | None,
        limits: Sequence[asyncio.Semaphore] = (),
    ) -> ScrapeResult:
        """``limits``: the fleet's and the namespace's slots, taken (in order, then the process-wide one)
        inside the deadline. With ``workers``, the fetch and the parse run in a worker process."""
        start = time.perf_counter()
        slots = contextlib.AsyncExitStack()
        try:
            try:
                # only the wait for a slot is cancelled at the deadline (safe: nothing is in flight yet)
                async with asyncio.timeout(timeout):
                    for sem in (*limits, self._sem):
                        await slots.enter_async_context(sem)
            except TimeoutError:
                waited = time.perf_counter() - start
                detail = f"no free scrape slot within {timeout:g}s (fleet or process limit)"
                return ScrapeResult(url, None, "throttled", detail, 0.0, 0, waited)
            waited = time.perf_counter() - start
            left = max(0.001, timeout - waited)
            if self.workers is not None:
                result = await self.workers.fetch_and_read(url, left, engine, model)
            else:
                result = await self.fetch_and_read(url, left, engine, model, release=slots.aclose)
        finally:
            await slots.aclose()
        return dataclasses.replace(result, wait_s=waited)

    async def fetch_and_read(
        self,
        url: str,
        timeout: float,
        engine: str,
        model: str | None,
        release: Callable[[], Awaitable[None]] | None = None,
    ) -> ScrapeResult:
        """One replica's body within ``timeout``, read into signals. ``release``: called once the body is
        in, before the parse (the caller's scrape slots: parsing holds no connection)."""
        start = time.perf_counter()
        body = b""

        def result(signals: ReplicaSignals | None, reason: str | None, detail: str = "") -> ScrapeResult:
            return ScrapeResult(url, signals, reason, detail, time.perf_counter() - start, len(body))

        deadline = asyncio.get_running_loop().time() + timeout
        try:
            body = await self._fetch(url, deadline)
        except _PastDeadline:
            return result(None, "timeout", f"no complete answer within {timeout:g}s")
        except _HttpStatus as exc:
            return result(None, f"http_{exc.status}", str(exc))
        except _TooLarge as exc:
            return result(None, "too_large", str(exc))
        except httpcore.TimeoutException:
            return result(None, "timeout", f"no complete answer within {timeout:g}s")
        except (httpcore.ConnectError, ConnectionError) as exc:
            if str(exc).startswith("refused: "):  # the address guard (keda_llm_scaler.addresses)
                return result(None, "refused_address", str(exc).removeprefix("refused: "))
            return result(None, "connect_error", str(exc) or type(exc).__name__)
        except (httpcore.ProtocolError, httpcore.NetworkError, httpcore.UnsupportedProtocol, OSError) as exc:
            return result(None, "http_error", f"{type(exc).__name__}: {exc}")
        finally:
            if release is not None:
                await release()
        try:
            text = body.decode("utf-8", errors="replace")
            if len(body) > THREAD_PARSE_BYTES:
                signals = await asyncio.to_thread(read_replica, text, engine, model)
            else:
                signals = read_replica(text, engine, model)
        except TextFormatError as exc:
            return result(None, "parse_error", str(exc))
        except ReplicaError as exc:
            return result(None, exc.reason, str(exc))
        if not body.endswith(b"\n"):
            # the text format ends every line with a newline: a readable body without one was cut (a
            # close-delimited answer that dropped), and its last value may be a prefix ("0.95" as "0.")
            return result(None, "parse_error", "body does not end in a newline: cut short")
        return result(signals, None)
