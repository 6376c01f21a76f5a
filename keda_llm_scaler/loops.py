"""Where scrape work runs: a second event loop on its own thread, so KEDA's calls never queue behind it.

Every fleet's loop — discovery, scrapes, parsing, scoring — runs on the ``ScrapeLoop``; the gRPC server,
its streams and the evictor stay on the main loop and only read the snapshots the scrape loop publishes
(``Target.publish`` hands each one over with ``call_soon_threadsafe``). Before this, one event loop did
both: at the soak's load (500 replicas, 200 RPC/s) it was saturated and GetMetrics waited ~1 s behind
scrape callbacks. Python threads share one interpreter lock, so this isolates latency, not CPU: an RPC
now waits at most a few switch intervals for the lock instead of for every ready scrape callback.

``ScrapeLoop(threaded=False)`` runs everything on the caller's loop, for unit tests of one fleet.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import structlog

__all__ = ["ScrapeLoop", "Spawned"]

log = structlog.get_logger(__name__)

T = TypeVar("T")

Spawned = concurrent.futures.Future  # resolves to the asyncio.Task once it exists on the scrape loop


class ScrapeLoop:
    def __init__(self, threaded: bool = True, name: str = "scrape-loop") -> None:
        self.threaded = threaded
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:  # not started: the caller's loop (unit tests, in-line use)
            self._loop = asyncio.get_running_loop()
        return self._loop

    def start(self) -> None:
        if not self.threaded or self._thread is not None:
            return
        loop = asyncio.new_event_loop()
        started = threading.Event()

        def main() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(started.set)
            try:
                loop.run_forever()
            finally:
                pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
                for task in pending:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=main, name=self._name, daemon=True)
        self._thread.start()
        started.wait()

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> Spawned[asyncio.Task[None]]:
        """Start ``coro`` as a task on the scrape loop, from any thread."""
        spawned: Spawned[asyncio.Task[None]] = concurrent.futures.Future()
        loop = self.loop

        def create() -> None:
            spawned.set_result(loop.create_task(coro, name=name))

        if self._on_loop():
            create()
        else:
            loop.call_soon_threadsafe(create)
        return spawned

    async def cancel(self, spawned: Spawned[asyncio.Task[None]]) -> None:
        """Cancel a spawned task and wait until it has finished, from the caller's loop."""

        async def cancel_and_wait() -> None:
            task = spawned.result()  # call_soon callbacks run in order: it was created before this ran
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        await self.run(cancel_and_wait())

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the scrape loop (scrape-side resources are bound to it)."""
        if self._on_loop():
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def _on_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    async def aclose(self) -> None:
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        await asyncio.to_thread(thread.join, 10.0)
        if thread.is_alive():
            log.warning("scrape_loop_did_not_stop", timeout_s=10.0)
        self._thread = None
        self._loop = None
