"""Scrape worker processes: fetching and parsing replicas' /metrics on every core the pod has.

Python threads share one interpreter lock, so a scrape thread isolates the gRPC loop's latency but not its
CPU: at 1,000 replicas every 5 s the one process sat at a core and GetMetrics got 44 % of a bare server's
throughput (issue #11). Fetching and parsing are most of a scrape's cost and need nothing but the URL, so
they run in worker processes; the scaler process keeps what needs the whole fleet (slots, discovery,
scoring, the gRPC server) and receives each replica's parsed signals, a few hundred bytes.

* A replica is always fetched by the same worker (its URL's hash), so its kept-alive connection lives in
  one place and is reused cycle after cycle.
* Each worker is ``python -m keda_llm_scaler.workers`` on one end of a socket pair: requests and results
  are length-prefixed pickles of our own tuples and dataclasses (never read from a replica: the worker
  parses the replica's text and pickles the signals it built).
* A worker that dies (OOM-killed, a crash) fails its in-flight scrapes as ``scrape_worker_failed`` (a
  failed scrape: the replica goes stale, never zero), is logged and started again; a worker that stops
  answering is treated the same way once a scrape waits past its deadline plus a margin.
* A worker exits when the scaler does: its end of the socket reads EOF.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Final

import structlog

from keda_llm_scaler.addresses import AddressPolicy, parse_networks, set_policy
from keda_llm_scaler.scrape import Fetcher, ScrapeResult

__all__ = ["WORKER_FAILED", "ScrapeWorkers", "available_cpus", "worker_count"]

log = structlog.get_logger(__name__)

WORKER_FAILED: Final = "scrape_worker_failed"
# A pod without a CPU limit sees every core of its node: 64 workers of ~50 MB each would not fit its memory
# limit, and four already scrape ~1,500 replicas a second (docs/performance.md)
AUTO_MAX_WORKERS: Final = 4
READY_WAIT_S: Final = 30.0
WORKER_NICENESS: Final = 10  # in the soak, workers at the scaler's priority took the gRPC p99 to 0.4-0.6 s
ANSWER_MARGIN_S: Final = 5.0  # a worker that has not answered by the deadline plus this is wedged
STARTUP_SIGNALS: Final = frozenset({signal.SIGINT, signal.SIGTERM})  # blocked across a worker's spawn
RESTART_BACKOFF_S: Final = (0.0, 0.5, 1.0, 2.0, 5.0)  # consecutive restarts of one worker wait this long
_HEADER: Final = struct.Struct("!I")
_MAX_FRAME: Final = 64 * 1024 * 1024


def available_cpus(cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """CPUs this process may use: its affinity mask, capped by a cgroup v2 CPU quota (a pod's CPU limit),
    rounded up."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    with contextlib.suppress(OSError, ValueError):
        with open(cpu_max) as f:
            quota, period = f.read().split()
        if quota != "max":
            cpus = min(cpus, max(1, -(-int(quota) // int(period))))
    return max(1, cpus)


def worker_count(setting: str) -> int:
    """``--scrape-workers``: ``auto`` (one per available CPU, at most AUTO_MAX_WORKERS), or a number (0: scrape
    in the scaler process)."""
    if setting.strip().lower() == "auto":
        return min(available_cpus(), AUTO_MAX_WORKERS)
    return int(setting)


async def _read_frame(reader: asyncio.StreamReader) -> Any:
    (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    if size > _MAX_FRAME:
        raise ValueError(f"frame of {size} bytes")
    return pickle.loads(await reader.readexactly(size))


def _frame(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    writer: asyncio.StreamWriter | None = None
    reader_task: asyncio.Task[None] | None = None
    pending: dict[int, tuple[asyncio.Future[ScrapeResult], str]] = field(default_factory=dict)
    restarts: int = 0
    started_at: float = 0.0
    ready: asyncio.Event = field(default_factory=asyncio.Event)


class ScrapeWorkers:
    """The scaler side: start ``count`` workers, hand each scrape to its URL's worker, restart the dead. A
    ``keda_llm_scaler.scrape.RemoteFetcher``: the scaler's Scraper takes the slots, then hands a scrape here."""

    def __init__(
        self,
        count: int,
        *,
        max_bytes: int,
        keepalive_budget: int,
        policy: AddressPolicy,
        log_level: str = "info",
        log_json: bool | None = None,
    ) -> None:
        if count < 1:
            raise ValueError("ScrapeWorkers needs at least one worker")
        per_worker = max(0, keepalive_budget // count)
        self.config = {
            "max_bytes": max_bytes,
            "keepalive_budget": per_worker,
            "refuse": [str(n) for n in policy.refuse],
            "allow": [str(n) for n in policy.allow],
            "log_level": log_level,
            "log_json": log_json,
        }
        self._workers = [_Worker(i) for i in range(count)]
        self._ids = 0
        self._closing = False
        self.restarts = 0  # all workers' restarts since start (a metric)

    @property
    def count(self) -> int:
        return len(self._workers)

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers if w.proc is not None and w.proc.poll() is None]

    async def start(self) -> None:
        """Start every worker (call on the loop that will scrape)."""
        await asyncio.gather(*(self._start(w) for w in self._workers))

    async def _start(self, worker: _Worker) -> None:
        parent, child = socket.socketpair()
        # Between fork and setpgid (microseconds) the child is still in the scaler's process group, with the
        # default dispositions, so a Ctrl-C to the group there killed it (exit -2, "scrape_worker_failed").
        # Blocked in this thread across the spawn, the two signals stay blocked in the child through setpgid
        # and exec (a signal mask survives exec); the worker discards what arrived meanwhile (_take_signals).
        # Sent to the scaler meanwhile, they reach it through a thread that does not block them, or at once
        # after, when this one unblocks them.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STARTUP_SIGNALS)
        try:
            worker.proc = subprocess.Popen(  # noqa: ASYNC220 - fork+exec returns at once; waits run in threads
                # -P: not the working directory first on the path, where another checkout would be imported
                [sys.executable, "-P", "-m", "keda_llm_scaler.workers", "--fd", str(child.fileno()),
                 "--config", json.dumps(self.config), "--index", str(worker.index)],
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
                # its own process group: a Ctrl-C in the terminal (sent to the whole group) is for the scaler,
                # which stops its workers itself; a worker hit by it would die mid-import with a traceback
                process_group=0,
            )  # fmt: skip
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            child.close()
        reader, writer = await asyncio.open_unix_connection(sock=parent)
        worker.writer = writer
        worker.started_at = time.monotonic()
        worker.ready = asyncio.Event()
        answered = asyncio.Event()  # its hello, or its end
        worker.reader_task = asyncio.get_running_loop().create_task(
            self._read_results(worker, reader, answered), name=f"scrape-worker-{worker.index}"
        )
        # its imports take a moment: wait for its hello, so the first scrapes' deadlines do not pay for them;
        # a worker that dies first (a Ctrl-C in the moment it was forked) is not waited for: its reader restarts it
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(answered.wait(), READY_WAIT_S)
        log.info("scrape_worker_started", worker=worker.index, pid=worker.proc.pid, ready=worker.ready.is_set())

    async def _read_results(self, worker: _Worker, reader: asyncio.StreamReader, answered: asyncio.Event) -> None:
        try:
            while True:
                request_id, result = await _read_frame(reader)
                if request_id == 0:  # the worker's hello: it has imported everything and listens
                    worker.ready.set()
                    answered.set()
                    continue
                entry = worker.pending.pop(request_id, None)
                if entry is not None and not entry[0].done():
                    entry[0].set_result(result)
        except (asyncio.IncompleteReadError, ConnectionError, OSError, ValueError, pickle.UnpicklingError) as exc:
            answered.set()  # before the restart, which waits for the next worker's hello
            if not self._closing:
                await self._restart(worker, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        finally:
            answered.set()

    async def _restart(self, worker: _Worker, why: str) -> None:
        """Fail what the worker had in flight, then start it again (after a back-off if it keeps dying)."""
        proc, writer = worker.proc, worker.writer
        worker.writer = None
        for future, url in worker.pending.values():
            if not future.done():
                future.set_result(ScrapeResult(url, None, WORKER_FAILED, f"scrape worker stopped: {why}", 0.0, 0))
        worker.pending.clear()
        if writer is not None:
            writer.close()
        code = None
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            code = await asyncio.to_thread(proc.wait)
        if self._closing:
            return
        lived = time.monotonic() - worker.started_at
        worker.restarts = 0 if lived > 60 else worker.restarts + 1
        self.restarts += 1
        log.error("scrape_worker_failed", worker=worker.index, exit_code=code, reason=why, lived_s=round(lived, 1))
        await asyncio.sleep(RESTART_BACKOFF_S[min(worker.restarts, len(RESTART_BACKOFF_S) - 1)])
        if not self._closing:
            await self._start(worker)

    def _worker_for(self, url: str) -> _Worker:
        return self._workers[zlib.crc32(url.encode()) % len(self._workers)]

    async def fetch_and_read(self, url: str, timeout: float, engine: str, model: str | None) -> ScrapeResult:
        worker = self._worker_for(url)
        if worker.writer is None:  # being restarted
            return ScrapeResult(url, None, WORKER_FAILED, "scrape worker restarting", 0.0, 0)
        self._ids += 1
        request_id = self._ids
        future: asyncio.Future[ScrapeResult] = asyncio.get_running_loop().create_future()
        worker.pending[request_id] = (future, url)
        worker.writer.write(_frame((request_id, url, timeout, engine, model)))
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout + ANSWER_MARGIN_S)
        except TimeoutError:
            proc = worker.proc
            if worker.writer is not None and proc is not None and proc.poll() is None:
                # no answer by the deadline and a margin: wedged. Killed, its reader sees EOF and restarts it
                log.error("scrape_worker_wedged", worker=worker.index, pid=proc.pid, waited_s=timeout + ANSWER_MARGIN_S)
                proc.kill()
            return ScrapeResult(url, None, WORKER_FAILED, "scrape worker did not answer", timeout, 0)
        finally:
            worker.pending.pop(request_id, None)

    async def aclose(self) -> None:
        self._closing = True
        for w in self._workers:
            if w.writer is not None:
                w.writer.close()  # EOF: the worker exits on its own
        for w in self._workers:
            if w.proc is None:
                continue
            try:
                await asyncio.wait_for(asyncio.to_thread(w.proc.wait), 5.0)
            except TimeoutError:
                w.proc.kill()
                await asyncio.to_thread(w.proc.wait)
            if w.reader_task is not None:
                w.reader_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await w.reader_task
            for future, url in w.pending.values():
                if not future.done():
                    future.set_result(ScrapeResult(url, None, WORKER_FAILED, "scaler stopping", 0.0, 0))


# -- the worker process ---------------------------------------------------------------------------------
async def _serve(sock: socket.socket, config: dict[str, Any]) -> None:
    set_policy(
        AddressPolicy(
            refuse=parse_networks(",".join(config["refuse"]), "refuse"),
            allow=parse_networks(",".join(config["allow"]), "allow"),
        )
    )
    # the slots are the scaler's (fleet, namespace, process: its Scraper); the worker fetches what it is handed
    fetcher = Fetcher(max_bytes=config["max_bytes"], keepalive_budget=config["keepalive_budget"])
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    tasks: set[asyncio.Task[None]] = set()

    async def run(request_id: int, url: str, timeout: float, engine: str, model: str | None) -> None:
        try:
            result = await fetcher.fetch_and_read(url, timeout, engine, model)
        except Exception as exc:  # a bug here must fail one scrape, not the worker
            log.exception("scrape_worker_request_crashed")
            result = ScrapeResult(url, None, WORKER_FAILED, f"{type(exc).__name__} in the scrape worker", 0.0, 0)
        writer.write(_frame((request_id, result)))

    writer.write(_frame((0, None)))
    try:
        while True:
            try:
                request = await _read_frame(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                return  # the scaler closed its end, or exited
            task = asyncio.get_running_loop().create_task(run(*request))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            if writer.transport.get_write_buffer_size() > 1 << 20:
                await writer.drain()
    finally:
        for task in tasks:
            task.cancel()
        await fetcher.aclose()


def _take_signals() -> None:
    """Unblock the signals the scaler blocked across this worker's spawn (ScrapeWorkers._start), discarding any
    that arrived while it was still in the scaler's process group: that Ctrl-C or SIGTERM was the scaler's,
    which stops its workers itself. From here on they act as on any Python process."""
    for sig in STARTUP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)  # a pending signal whose action is to ignore it is discarded
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STARTUP_SIGNALS)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def main(argv: list[str] | None = None) -> int:
    _take_signals()
    parser = argparse.ArgumentParser(prog="keda_llm_scaler.workers", description="a keda-llm-scaler scrape worker")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--index", type=int, default=0)
    args = parser.parse_args(argv)
    config = json.loads(args.config)
    from keda_llm_scaler.logs import configure_logging

    configure_logging(config.get("log_level", "info"), config.get("log_json"))
    structlog.contextvars.bind_contextvars(scrape_worker=args.index)
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)  # as serve does: fewer, shorter pauses (server.GC_THRESHOLDS)
    with contextlib.suppress(OSError):
        # below the scaler process: when both want a core, KEDA's calls win and a scrape waits a little
        os.nice(WORKER_NICENESS)
    sock = socket.socket(fileno=args.fd)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(sock, config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
