"""Fetch and read one replica's /metrics. A failure is data (ScrapeResult.reason), never an exception.

The client is aiohttp: one session per scraping loop, a kept-alive connection per replica (origin) reused
cycle after cycle, responses parsed by its C HTTP parser. Measured against the same nginx fleet, a GET of
the 41 KB vLLM payload cost 0.3-0.45 ms of CPU with aiohttp and 1.1-1.2 ms with httpcore (httpx's
transport), whose pure-Python HTTP/1.1 and anyio layers were most of a scrape's cost (issue #11). One
shared httpx pool was worse still: nothing reused past its size, and a walk over every pooled connection
on each request and release.

Two classes: ``Scraper`` is the gate (the concurrency slots) and fetches nothing itself; ``Fetcher`` fetches
and parses. Once a scrape has its slots, the Scraper hands it to its own Fetcher on this event loop, or to the
scrape worker processes (``keda_llm_scaler.workers``), each of which runs a Fetcher.

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
from typing import Final, Protocol

import aiohttp
import httpx  # only for its TLS defaults (certifi), as the scrape client had them before
import yarl

from keda_llm_scaler import __version__
from keda_llm_scaler.addresses import GuardedResolver, RefusedAddress, refusal
from keda_llm_scaler.engines import read_replica
from keda_llm_scaler.errors import ReplicaError
from keda_llm_scaler.gateway import GATEWAY_ENGINE, GatewaySpec, read_gateway
from keda_llm_scaler.promtext import TextFormatError
from keda_llm_scaler.signals import ReplicaSignals

__all__ = ["DEFAULT_MAX_BYTES", "Fetcher", "RemoteFetcher", "ScrapeResult", "Scraper"]

DEFAULT_MAX_BYTES: Final = 8 * 1024 * 1024  # a DP=8 vLLM pod serves ~0.36 MB; 20x headroom
USER_AGENT: Final = f"keda-llm-scaler/{__version__}"  # the package metadata: one version source
PER_FLEET_CONCURRENCY: Final = 16  # at most this many of one fleet's scrapes in flight...
PER_FLEET_SHARE: Final = 0.25  # ...and at most this share of the process-wide slots (16 of the default 64)
PER_NAMESPACE_SHARE: Final = 0.5  # all fleets of one namespace (tenant) together: half the process's slots
THREAD_PARSE_BYTES: Final = 64 * 1024  # above this a parse takes milliseconds: do it off the event loop
KEEPALIVE_S: Final = 120.0  # longer than the longest scrapeInterval (60 s): one connection lives across cycles
URL_IDLE_S: Final = 300.0  # a replica not scraped for this long (churned away) loses its pool
_REQUEST_HEADERS: Final = {"User-Agent": USER_AGENT, "Accept": "text/plain;version=0.0.4"}
_CLOSE: Final = {"Connection": "close"}


@dataclass(frozen=True, slots=True)
class ScrapeResult:
    url: str
    signals: ReplicaSignals | None
    reason: str | None  # None on success; a short machine-readable cause otherwise
    detail: str
    duration_s: float  # the scrape itself: connect, request, body, parse (not the wait for a slot)
    size: int
    wait_s: float = 0.0  # waiting for the fleet's, namespace's and process's scrape slots
    # a gateway's scrape (engine ``gateway.GATEWAY_ENGINE``): the requests it holds for the pool
    held: float | None = None


class _TooLarge(Exception):
    pass


class _PastDeadline(Exception):
    pass


class _HttpStatus(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


class Fetcher:
    """Fetches one replica's /metrics and reads it into signals: the HTTP client (one session, a kept-alive
    connection per replica while the budget lasts), the size cap, the parse. Takes no slots: a Scraper
    (or the scaler, for a worker process's Fetcher) has taken them."""

    def __init__(self, *, max_bytes: int = DEFAULT_MAX_BYTES, keepalive_budget: int = 4096) -> None:
        self.max_bytes = max_bytes
        # open keep-alive connections allowed in all (one per replica); past it, connections close after
        # each scrape, so a huge fleet cannot exhaust the process's file descriptors
        self.keepalive_budget = keepalive_budget
        self._ssl = httpx.create_ssl_context()  # certifi's roots, as the scrape client has always had
        self._session: aiohttp.ClientSession | None = None  # made on first use, on the loop that scrapes
        self._kept: dict[str, float] = {}  # origins allowed a kept-alive connection -> last scraped
        self._last_sweep = 0.0

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=0,  # the scrape slots bound concurrency (fleet, namespace, process)
                limit_per_host=0,
                keepalive_timeout=KEEPALIVE_S,  # outlives any scrapeInterval; churned replicas' connections go
                # every connection goes through the address guard: resolve, check, connect to what was checked
                resolver=GuardedResolver(),
                use_dns_cache=False,  # a name is checked each time it is connected to
                ssl=self._ssl,
                enable_cleanup_closed=False,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                headers=_REQUEST_HEADERS,
                auto_decompress=False,
                skip_auto_headers=("Accept-Encoding",),  # a replica's text, as it is: no gzip bombs
                cookie_jar=aiohttp.DummyCookieJar(),  # replicas do not set state on the scaler
                trust_env=False,  # no proxies from the environment between the scaler and its replicas
            )
        return self._session

    async def aclose(self) -> None:
        session, self._session = self._session, None
        self._kept.clear()
        if session is not None:
            await session.close()

    def _keep_alive(self, origin: str, now: float) -> bool:
        """Whether this origin's connection may stay open after the scrape: one per origin while the
        file-descriptor budget lasts; past it, connections close after each scrape."""
        if now - self._last_sweep > URL_IDLE_S / 10:
            self._last_sweep = now
            for gone in [o for o, t in self._kept.items() if now - t > URL_IDLE_S]:
                del self._kept[gone]  # churned away: its connection expired (KEEPALIVE_S), its budget is free
        if origin in self._kept or len(self._kept) < self.keepalive_budget:
            self._kept[origin] = now
            return True
        return False

    @property
    def kept_alive_origins(self) -> int:
        return len(self._kept)

    async def _fetch(self, url: str, deadline: float) -> bytes:
        """The body, by ``deadline`` (loop time): connect, headers and a body dripping in are all cut
        when it passes."""
        loop = asyncio.get_running_loop()
        # A server may close a kept-alive connection just as the next scrape is sent on it (uvicorn, under
        # vLLM and SGLang, closes idle ones after 5 s: a 5 s scrapeInterval meets that edge). Like Go's
        # HTTP client does for idempotent requests, a GET that failed before any answer is sent once
        # more within the same deadline (a GET can be repeated).
        try:
            return await self._fetch_once(url, deadline)
        except aiohttp.ServerDisconnectedError:
            if loop.time() >= deadline:
                raise
            return await self._fetch_once(url, deadline)

    async def _fetch_once(self, url: str, deadline: float) -> bytes:
        loop = asyncio.get_running_loop()
        parsed = yarl.URL(url)
        why = refusal(parsed.host or "")
        if why is not None:  # IP literals never reach the resolver: checked here
            raise RefusedAddress(why)
        keep = self._keep_alive(f"{parsed.scheme}://{parsed.host}:{parsed.port}", loop.time())
        left = max(0.001, deadline - loop.time())
        async with self._client().get(
            parsed,
            allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=left),
            headers=None if keep else _CLOSE,
        ) as resp:
            if resp.status != 200:
                raise _HttpStatus(resp.status)
            length = resp.content_length
            if length is not None and length > self.max_bytes:
                raise _TooLarge(f"Content-Length {length} > {self.max_bytes}")
            chunks, size = [], 0
            async for chunk in resp.content.iter_any():
                size += len(chunk)
                if size > self.max_bytes:
                    raise _TooLarge(f"body over {self.max_bytes} bytes")
                if loop.time() > deadline:
                    raise _PastDeadline
                chunks.append(chunk)
            return b"".join(chunks)

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

        def result(
            signals: ReplicaSignals | None, reason: str | None, detail: str = "", held: float | None = None
        ) -> ScrapeResult:
            return ScrapeResult(url, signals, reason, detail, time.perf_counter() - start, len(body), held=held)

        deadline = asyncio.get_running_loop().time() + timeout
        try:
            body = await self._fetch(url, deadline)
        except (_PastDeadline, TimeoutError):
            return result(None, "timeout", f"no complete answer within {timeout:g}s")
        except _HttpStatus as exc:
            return result(None, f"http_{exc.status}", str(exc))
        except _TooLarge as exc:
            return result(None, "too_large", str(exc))
        except RefusedAddress as exc:  # an IP literal (keda_llm_scaler.addresses)
            return result(None, "refused_address", str(exc))
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, RefusedAddress):  # from the resolver: a name, checked where it resolves
                return result(None, "refused_address", str(exc.os_error))
            return result(None, "connect_error", exc.os_error.strerror or str(exc.os_error) or type(exc).__name__)
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            return result(None, "http_error", f"{type(exc).__name__}: {exc}")
        finally:
            if release is not None:
                await release()
        held = None
        try:
            text = body.decode("utf-8", errors="replace")
            if engine == GATEWAY_ENGINE:  # a pool's gateway, not a replica: the requests it holds
                assert model is not None  # the spec's channel (GatewaySpec.channel)
                held, signals = read_gateway(text, GatewaySpec.from_channel(url, model)), None
            elif len(body) > THREAD_PARSE_BYTES:
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
        return result(signals, None, held=held)


class RemoteFetcher(Protocol):
    """Fetches and parses in other processes: ``keda_llm_scaler.workers.ScrapeWorkers``, each worker a Fetcher."""

    async def fetch_and_read(self, url: str, timeout: float, engine: str, model: str | None) -> ScrapeResult: ...

    async def aclose(self) -> None: ...


class Scraper:
    """The scrape slots: a scrape takes its fleet's, its namespace's and the process-wide slot, in that order
    and inside its deadline, then hands the fetch and the parse to the worker processes (``workers``) or to
    its own Fetcher on this event loop. Fetches nothing itself."""

    def __init__(
        self,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_concurrency: int = 64,
        keepalive_budget: int = 4096,
        workers: RemoteFetcher | None = None,
    ) -> None:
        """``workers``: fetch and parse in worker processes (``serve``); else in a Fetcher on this event loop,
        made with ``max_bytes`` and ``keepalive_budget`` (the workers' Fetchers have their own)."""
        self.workers = workers
        self.fetcher = None if workers is not None else Fetcher(max_bytes=max_bytes, keepalive_budget=keepalive_budget)
        self.max_concurrency = max_concurrency
        self._namespaces: dict[str, asyncio.Semaphore] = {}
        self._sem = asyncio.Semaphore(max_concurrency)

    async def aclose(self) -> None:
        if self.workers is not None:
            await self.workers.aclose()
        if self.fetcher is not None:
            await self.fetcher.aclose()

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
            if self.workers is not None:  # fetched and parsed in a worker: the slots are held until it answers
                result = await self.workers.fetch_and_read(url, left, engine, model)
            else:
                assert self.fetcher is not None  # made in __init__ whenever there are no workers
                # the Fetcher releases the slots once the body is in, before the parse
                result = await self.fetcher.fetch_and_read(url, left, engine, model, release=slots.aclose)
        finally:
            await slots.aclose()
        return dataclasses.replace(result, wait_s=waited)
