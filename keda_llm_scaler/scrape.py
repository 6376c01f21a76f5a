"""Fetch and read one replica's /metrics. A failure is data (ScrapeResult.reason), never an exception.

One pooled httpx client for the whole process; a global semaphore bounds concurrent scrapes; every
scrape has a hard deadline covering connect, headers and body, so a replica that drips bytes slowly
cannot hold a cycle past ``scrapeTimeout``; bodies are capped in size while streaming.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Final

import httpx

from keda_llm_scaler.engines import read_replica
from keda_llm_scaler.errors import ReplicaError
from keda_llm_scaler.promtext import TextFormatError
from keda_llm_scaler.signals import ReplicaSignals

__all__ = ["DEFAULT_MAX_BYTES", "ScrapeResult", "Scraper"]

DEFAULT_MAX_BYTES: Final = 8 * 1024 * 1024  # a DP=8 vLLM pod serves ~0.36 MB; 20x headroom
USER_AGENT: Final = "keda-llm-scaler/0.1"


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


class Scraper:
    def __init__(self, *, max_bytes: int = DEFAULT_MAX_BYTES, max_concurrency: int = 64) -> None:
        self.max_bytes = max_bytes
        self._sem = asyncio.Semaphore(max_concurrency)
        self._http = httpx.AsyncClient(
            headers={"User-Agent": USER_AGENT, "Accept": "text/plain;version=0.0.4"},
            follow_redirects=False,  # a redirect could point the scaler anywhere
            limits=httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency),
            trust_env=False,  # never route replica scrapes through an environment proxy
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _fetch(self, url: str, timeout: float) -> bytes:
        async with self._http.stream("GET", url, timeout=httpx.Timeout(timeout)) as resp:
            if resp.status_code != 200:
                raise httpx.HTTPStatusError(f"HTTP {resp.status_code}", request=resp.request, response=resp)
            declared = resp.headers.get("content-length")
            if declared and declared.isdigit() and int(declared) > self.max_bytes:
                raise _TooLarge(f"Content-Length {declared} > {self.max_bytes}")
            chunks, size = [], 0
            async for chunk in resp.aiter_bytes():
                size += len(chunk)
                if size > self.max_bytes:
                    raise _TooLarge(f"body over {self.max_bytes} bytes")
                chunks.append(chunk)
            return b"".join(chunks)

    async def scrape(self, url: str, *, timeout: float, engine: str, model: str | None) -> ScrapeResult:
        start = time.perf_counter()
        body = b""

        def result(signals: ReplicaSignals | None, reason: str | None, detail: str = "") -> ScrapeResult:
            return ScrapeResult(url, signals, reason, detail, time.perf_counter() - start, len(body))

        async with self._sem:
            try:
                async with asyncio.timeout(timeout):
                    body = await self._fetch(url, timeout)
            except TimeoutError:
                return result(None, "timeout", f"no complete answer within {timeout:g}s")
            except httpx.HTTPStatusError as exc:
                return result(None, f"http_{exc.response.status_code}", str(exc))
            except _TooLarge as exc:
                return result(None, "too_large", str(exc))
            except httpx.TimeoutException:
                return result(None, "timeout", f"no complete answer within {timeout:g}s")
            except (httpx.ConnectError, ConnectionError) as exc:
                return result(None, "connect_error", str(exc) or type(exc).__name__)
            except (httpx.HTTPError, OSError) as exc:
                return result(None, "http_error", f"{type(exc).__name__}: {exc}")
        try:
            signals = read_replica(body.decode("utf-8", errors="replace"), engine, model)
        except TextFormatError as exc:
            return result(None, "parse_error", str(exc))
        except ReplicaError as exc:
            return result(None, exc.reason, str(exc))
        return result(signals, None)
