"""Fetch and read one replica's /metrics. A failure is data (ScrapeResult.reason), never an exception.

One pooled httpx client for the whole process. Every scrape has a hard deadline covering the wait for
a concurrency slot (the fleet's own, then the process-wide one), connect, headers and body, so neither a
replica that drips bytes slowly nor a fleet of hung replicas can hold a cycle past ``scrapeTimeout`` or
take every slot from other fleets. Bodies are capped in size while streaming; large ones are parsed in a
worker thread, so a multi-megabyte payload does not stall the event loop that answers KEDA.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import httpcore
import httpx

from keda_llm_scaler.addresses import GuardedBackend
from keda_llm_scaler.engines import read_replica
from keda_llm_scaler.errors import ReplicaError
from keda_llm_scaler.promtext import TextFormatError
from keda_llm_scaler.signals import ReplicaSignals

__all__ = ["DEFAULT_MAX_BYTES", "ScrapeResult", "Scraper"]

DEFAULT_MAX_BYTES: Final = 8 * 1024 * 1024  # a DP=8 vLLM pod serves ~0.36 MB; 20x headroom
USER_AGENT: Final = "keda-llm-scaler/0.1"
PER_FLEET_CONCURRENCY: Final = 16  # at most this many of one fleet's scrapes in flight...
PER_FLEET_SHARE: Final = 0.25  # ...and at most this share of the process-wide slots (16 of the default 64)
PER_NAMESPACE_SHARE: Final = 0.5  # all fleets of one namespace (tenant) together: half the process's slots
THREAD_PARSE_BYTES: Final = 64 * 1024  # above this a parse takes milliseconds: do it off the event loop


@dataclass(frozen=True, slots=True)
class ScrapeResult:
    url: str
    signals: ReplicaSignals | None
    reason: str | None  # None on success; a short machine-readable cause otherwise
    detail: str
    duration_s: float
    size: int


class _TooLarge(Exception):
    pass


class _PastDeadline(Exception):
    pass


class Scraper:
    def __init__(self, *, max_bytes: int = DEFAULT_MAX_BYTES, max_concurrency: int = 64) -> None:
        self.max_bytes = max_bytes
        self.max_concurrency = max_concurrency
        self._namespaces: dict[str, asyncio.Semaphore] = {}
        self._sem = asyncio.Semaphore(max_concurrency)
        transport = httpx.AsyncHTTPTransport(
            limits=httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency)
        )
        # every connection goes through the address guard: resolve, check, connect to what was checked
        pool = transport._pool
        if not isinstance(pool, httpcore.AsyncConnectionPool) or not hasattr(pool, "_network_backend"):
            raise RuntimeError("httpx/httpcore changed: the scrape client cannot install its address guard")
        pool._network_backend = GuardedBackend()
        self._http = httpx.AsyncClient(
            headers={"User-Agent": USER_AGENT, "Accept": "text/plain;version=0.0.4"},
            follow_redirects=False,  # a redirect could point the scaler anywhere
            transport=transport,
            trust_env=False,  # never route replica scrapes through an environment proxy
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _fetch(self, url: str, deadline: float) -> bytes:
        """The body, by ``deadline`` (loop time). httpx's own timeouts (each at most the time left) end a
        stalled connect or a silent server; a body dripping in under the read timeout is cut when the
        deadline passes. Never by cancelling httpx mid-request: a request cancelled while connecting leaves
        its connection in the pool as CONNECTING for good, and enough of those exhaust the pool (found by the
        soak: every scrape then waits, with the CPU idle)."""
        loop = asyncio.get_running_loop()
        left = max(0.001, deadline - loop.time())
        async with self._http.stream("GET", url, timeout=httpx.Timeout(left)) as resp:
            if resp.status_code != 200:
                raise httpx.HTTPStatusError(f"HTTP {resp.status_code}", request=resp.request, response=resp)
            declared = resp.headers.get("content-length")
            if declared and declared.isascii() and declared.isdigit() and int(declared) > self.max_bytes:
                raise _TooLarge(f"Content-Length {declared} > {self.max_bytes}")
            chunks, size = [], 0
            async for chunk in resp.aiter_bytes():
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
        inside the deadline."""
        start = time.perf_counter()
        body = b""

        def result(signals: ReplicaSignals | None, reason: str | None, detail: str = "") -> ScrapeResult:
            return ScrapeResult(url, signals, reason, detail, time.perf_counter() - start, len(body))

        deadline = asyncio.get_running_loop().time() + timeout
        slots = contextlib.AsyncExitStack()
        try:
            try:
                # only the wait for a slot is cancelled at the deadline (safe: nothing is in flight yet)
                async with asyncio.timeout(timeout):
                    for sem in (*limits, self._sem):
                        await slots.enter_async_context(sem)
            except TimeoutError:
                return result(None, "throttled", f"no free scrape slot within {timeout:g}s (fleet or process limit)")
            body = await self._fetch(url, deadline)
        except _PastDeadline:
            return result(None, "timeout", f"no complete answer within {timeout:g}s")
        except httpx.HTTPStatusError as exc:
            return result(None, f"http_{exc.response.status_code}", str(exc))
        except _TooLarge as exc:
            return result(None, "too_large", str(exc))
        except httpx.TimeoutException:
            return result(None, "timeout", f"no complete answer within {timeout:g}s")
        except (httpx.ConnectError, ConnectionError) as exc:
            if str(exc).startswith("refused: "):  # the address guard (keda_llm_scaler.addresses)
                return result(None, "refused_address", str(exc).removeprefix("refused: "))
            return result(None, "connect_error", str(exc) or type(exc).__name__)
        except (httpx.HTTPError, OSError) as exc:
            return result(None, "http_error", f"{type(exc).__name__}: {exc}")
        finally:
            await slots.aclose()
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
