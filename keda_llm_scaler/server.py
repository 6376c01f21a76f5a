"""Process wiring: the gRPC server (ExternalScaler, health, reflection, TLS), the metrics port, and
graceful shutdown (health NOT_SERVING -> streams end with OK -> in-flight RPCs finish -> close)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import start_http_server

from keda_llm_scaler._proto import externalscaler_pb2 as pb
from keda_llm_scaler._proto import externalscaler_pb2_grpc as pb_grpc
from keda_llm_scaler.addresses import set_policy
from keda_llm_scaler.config import Settings, address_policy, describe, parse_configmap_ref
from keda_llm_scaler.deletion_cost import VictimRanker
from keda_llm_scaler.kube import KubeClient, KubeConfig, KubeError
from keda_llm_scaler.learned import FleetRecord
from keda_llm_scaler.loops import ScrapeLoop
from keda_llm_scaler.ranking_scope import parse_scope
from keda_llm_scaler.registry import TargetRegistry
from keda_llm_scaler.request_limit import MAX_REQUEST_BYTES, RequestLimitInterceptor
from keda_llm_scaler.scrape import Scraper
from keda_llm_scaler.service import ExternalScalerService
from keda_llm_scaler.state_store import ConfigMapStore, DirectoryStore, StateKeeper, StateStore
from keda_llm_scaler.telemetry import ScalerMetrics
from keda_llm_scaler.workers import ScrapeWorkers, worker_count

__all__ = ["HEALTH_SERVICES", "BindError", "ScalerServer", "run"]

log = structlog.get_logger(__name__)

HEALTH_SERVICES: Final = ("", "liveness", "readiness")
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

# KEDA's client sets no keepalive and keeps one connection per scaler address for its lifetime:
# the server pings so idle streams (external-push) survive NATs and conntrack timeouts.
_GRPC_OPTIONS: Final = [
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    # a second scaler on a port in use must fail, not silently share it (gRPC's default is SO_REUSEPORT)
    ("grpc.so_reuseport", 0),
    # what a ScaledObject can hold, with room: larger requests are refused by gRPC before Python sees them
    ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
]


def _kube_client(settings: Settings) -> KubeClient | None:
    """Explicit API URL, else a kubeconfig, else the in-cluster service account, else none."""
    if settings.kube_api_url:
        return KubeClient(KubeConfig(settings.kube_api_url, settings.kube_token_file, settings.kube_ca_file))
    if settings.kubeconfig is not None:
        return KubeClient(KubeConfig.from_kubeconfig(settings.kubeconfig, settings.kube_context or None))
    in_cluster = KubeConfig.in_cluster()
    return KubeClient(in_cluster) if in_cluster is not None else None


class BindError(Exception):
    """A port of the settings cannot be listened on: one line that names the flag, for the operator."""


# What the kernel says when a bind fails (gRPC C-core logs the same strerror text), and what to do about it.
_BIND_PROBLEMS: Final = {
    errno.EADDRINUSE: "is already in use (another process listens there); stop it or choose another port",
    errno.EACCES: "needs privileges (a port below 1024); choose a port of 1024 or above",
}
# C-core's log prefix: "E1203 14:11:16.747806   17935 add_port.cc:83] "
_C_LOG_PREFIX: Final = re.compile(r"^[EWIF]\d{4} [\d:.]+\s+\d+ \S+\] ", re.M)


def _bind_error(flag: str, host: str, port: int, reason: str) -> BindError:
    if os.strerror(errno.EADDRNOTAVAIL) in reason:
        return BindError(f"--host {host}: not an address of this host; use one of its addresses, or 0.0.0.0")
    if "lookup failed" in reason:  # gRPC resolves a host name itself
        return BindError(f"--host {host}: the name does not resolve; use an address of this host, or 0.0.0.0")
    for code, advice in _BIND_PROBLEMS.items():
        if os.strerror(code) in reason:
            return BindError(f"{flag} {port}: {host}:{port} {advice}")
    last = " ".join(_C_LOG_PREFIX.sub("", reason).split())  # one line, without C-core's log prefix
    return BindError(f"{flag} {port}: cannot listen on {host}:{port}: {last or 'gRPC could not bind it'}")


def _quiet_c_stderr(call: Callable[[], int]) -> tuple[int, str]:
    """Run ``call`` with file descriptor 2 captured; return its result and what C code wrote there.

    gRPC C-core logs a failed bind itself ("E... add_port.cc ... Address already in use"), from C, straight
    to fd 2: Python's sys.stderr never sees it, and GRPC_VERBOSITY would silence the server's later errors
    too. Capturing fd 2 around this one call (nothing else runs yet: the scrape loop and workers start
    after the ports are bound) turns it into the reason of our own one-line message, and loses nothing
    when the bind works: what was captured is written back.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            result = call()
        except RuntimeError:  # grpcio raises this when no address could be bound
            result = 0
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        text = captured.read().decode(errors="replace")
    if result and text:
        sys.stderr.write(text)
    return result, text


class _TlsFiles:
    """The gRPC port's certificate, key and client CA, re-read when they change on disk.

    cert-manager (and any Secret update) rewrites the mounted files in place; grpcio asks before every
    new TLS handshake whether the configuration changed, so a rotated certificate is served from the
    next connection on, without a restart. A half-written pair is retried at the next handshake.
    """

    def __init__(self, cert: Path, key: Path, client_ca: Path | None) -> None:
        self._paths = [p for p in (cert, key, client_ca) if p is not None]
        self._cert, self._key, self._ca = cert, key, client_ca
        self._stamp = self._stat()

    def _stat(self) -> tuple[tuple[int, int], ...]:
        return tuple((p.stat().st_mtime_ns, p.stat().st_size) for p in self._paths)

    def load(self) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(self._key.read_bytes(), self._cert.read_bytes())],
            root_certificates=self._ca.read_bytes() if self._ca else None,
        )

    def reload_if_changed(self) -> grpc.ServerCertificateConfiguration | None:
        try:
            stamp = self._stat()
            if stamp == self._stamp:
                return None
            config = self.load()
        except (OSError, ValueError) as exc:  # mid-rotation: keep serving the current certificate
            log.warning("tls_reload_failed", error=str(exc))
            return None
        self._stamp = stamp
        log.info("tls_reloaded", cert=str(self._cert))
        return config


def _keepalive_budget(reserve: int = 1024) -> int:
    """How many replica connections may stay open: the file-descriptor limit (raised to its hard limit,
    as Prometheus asks of its hosts) less a reserve for gRPC clients, API watches, DNS and /metrics."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
    if soft == resource.RLIM_INFINITY:
        return 65536
    return max(0, soft - reserve)


STATE_FLUSH_S: Final = 3.0  # at shutdown, the last write of the learned state may take this long


def _state_keeper(
    settings: Settings, kube: KubeClient | None, metrics: ScalerMetrics, scrape_loop: ScrapeLoop
) -> StateKeeper | None:
    """Where learned state is kept: --state-dir, else --state-configmap (which needs the Kubernetes API)."""
    store: StateStore
    if settings.state_dir is not None:
        store = DirectoryStore(settings.state_dir)
    elif settings.state_configmap:
        if kube is None:
            raise KubeError(
                "--state-configmap keeps learned state in a ConfigMap, and this scaler has no access to the "
                "Kubernetes API (no in-cluster service account, --kubeconfig or --kube-api-url)"
            )
        store = ConfigMapStore(kube, *parse_configmap_ref(settings.state_configmap))
    else:
        return None
    return StateKeeper(store, settings.state_interval, on_write=metrics.state_written, run_on=scrape_loop.run)


class ScalerServer:
    def __init__(
        self,
        settings: Settings,
        *,
        serve_grpc: bool = True,
        scale_targets: Mapping[tuple[str, str], Mapping[str, str]] | None = None,
    ) -> None:
        """``serve_grpc``: False for ``shadow``, which scrapes and scores exactly as ``serve`` does but answers
        no KEDA. ``scale_targets``: (namespace, name) -> the scaleTargetRef zero-config discovery reads when
        there is no ScaledObject to read it from (``shadow``)."""
        self.settings = settings
        self.serve_grpc = serve_grpc
        self.shutdown_event = asyncio.Event()
        self._previous_policy = set_policy(address_policy(settings))  # process-wide: every scrape checks it
        budget = _keepalive_budget()
        count = worker_count(settings.scrape_workers)
        self.workers = None
        if count > 0:  # fetch and parse on every core (keda_llm_scaler/workers.py)
            self.workers = ScrapeWorkers(
                count,
                max_bytes=settings.max_scrape_bytes,
                keepalive_budget=budget,
                policy=address_policy(settings),
                log_level=settings.log_level,
                log_json=settings.log_json,
            )
        self.scraper = Scraper(
            max_bytes=settings.max_scrape_bytes,
            max_concurrency=settings.max_concurrent_scrapes,
            keepalive_budget=budget,
            workers=self.workers,
        )
        self.metrics = ScalerMetrics(lambda: self.registry.targets(), workers=self.workers)
        self.scrape_loop = ScrapeLoop(threaded=True)  # scrape work off the loop that answers KEDA
        kube = self.kube = _kube_client(settings)
        self.ranker: VictimRanker | None = None
        scope = parse_scope(settings.victim_ranking)
        if scope.enabled:
            if kube is None:
                raise KubeError(
                    "--victim-ranking writes pod annotations through the Kubernetes API, and this scaler has "
                    "no access to it (no in-cluster service account, --kubeconfig or --kube-api-url)"
                )
            self.ranker = VictimRanker(
                kube,
                scope,
                interval_s=settings.victim_ranking_interval,
                burst=settings.victim_ranking_burst,
                registry=self.metrics.registry,
            )
        self.state = _state_keeper(settings, kube, self.metrics, self.scrape_loop)
        self.registry = TargetRegistry(
            self.scraper,
            kube=kube,
            ranker=self.ranker,
            observer=self.metrics,
            idle_ttl_s=settings.target_idle_ttl,
            max_targets=settings.max_targets,
            allow_cross_namespace=settings.allow_cross_namespace,
            scrape_loop=self.scrape_loop,
            learned=None if self.state is None else self.state.record_for,
            scale_targets=scale_targets,
        )
        self.health = health.aio.HealthServicer()
        self.grpc = grpc.aio.server(
            options=_GRPC_OPTIONS, interceptors=[RequestLimitInterceptor(self.metrics.no_request)]
        )
        self.service = ExternalScalerService(
            self.registry, self.metrics, shutdown=self.shutdown_event, warmup_wait_s=settings.warmup_wait
        )
        self.grpc_port = 0
        self.metrics_port = 0
        self._http: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._ready: bool | None = None

    def _bind(self) -> int:
        s = self.settings
        address = f"{s.host}:{s.grpc_port}"
        if s.tls_cert is None or s.tls_key is None:
            return self.grpc.add_insecure_port(address)
        files = _TlsFiles(s.tls_cert, s.tls_key, s.tls_client_ca)
        creds = grpc.dynamic_ssl_server_credentials(  # grpcio documents None as "no change"; the stub omits it
            files.load(),
            files.reload_if_changed,  # type: ignore[arg-type]
            require_client_authentication=s.tls_client_ca is not None,
        )
        return self.grpc.add_secure_port(address, creds)

    async def start(self) -> None:
        pb_grpc.add_ExternalScalerServicer_to_server(self.service, self.grpc)  # type: ignore[no-untyped-call]
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc)
        reflection.enable_server_reflection(
            (
                pb.DESCRIPTOR.services_by_name["ExternalScaler"].full_name,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            self.grpc,
        )
        # Both ports are bound before anything starts (threads, workers, the gRPC server), so a port in use
        # ends start() with nothing to stop and a BindError naming the flag.
        s = self.settings
        if self.serve_grpc:
            self.grpc_port, reason = _quiet_c_stderr(self._bind)
            if self.grpc_port == 0:
                raise _bind_error("--grpc-port", s.host, s.grpc_port, reason)
        try:
            self._http, _ = start_http_server(s.metrics_port, addr=s.host, registry=self.metrics.registry)
        except OSError as exc:
            await self.grpc.stop(None)  # releases the gRPC port it has bound
            raise _bind_error("--metrics-port", s.host, s.metrics_port, exc.strerror or str(exc)) from None
        self.metrics_port = self._http.server_port
        for name in HEALTH_SERVICES:
            await self.health.set(name, _SERVING)
        self.scrape_loop.start()  # before the first RPC can create a fleet
        if self.state is not None:
            await self.state.load()  # before the first RPC: a fleet's first answer uses what was learned
        if self.workers is not None:
            await self.scrape_loop.run(self.workers.start())  # their sockets belong to the scrape loop
        if self.serve_grpc:
            await self.grpc.start()
        self._tasks = [
            asyncio.create_task(self.registry.run_evictor(), name="evictor"),
            asyncio.create_task(self._watch_readiness(), name="readiness"),
        ]
        if self.state is not None:
            self._tasks.append(asyncio.create_task(self.state.run(self._learned_now), name="state"))
        log.info(
            "scaler_started",
            grpc_port=self.grpc_port,
            metrics_port=self.metrics_port,
            tls=self.settings.tls_cert is not None,
            mtls=self.settings.tls_client_ca is not None,
            settings=describe(self.settings),
        )

    async def _learned_now(self) -> dict[str, FleetRecord]:
        """Every fleet's record, exported on the scrape loop (where their trackers change)."""

        fleets = self.registry.fleets()  # on this loop, which adds and evicts them

        async def export() -> dict[str, FleetRecord]:
            wall = time.time()
            return {w.state_key: w.learned(wall) for w in fleets}

        return await self.scrape_loop.run(export())

    def readiness(self) -> bool:
        """Ready unless every target is without fresh data: one broken fleet must not take the scaler
        (and with it every healthy ScaledObject) out of its Service, but a scaler that can reach no
        fleet at all, or whose loops are stuck, is not ready."""
        # a target still on its first scrape says nothing yet: counting it would flap readiness on every
        # new ScaledObject of a scaler that serves only a few
        judged = [t for t in self.registry.targets() if t.snapshot is not None]
        return not judged or any(t.is_fresh() for t in judged)

    async def _watch_readiness(self, every_s: float = 1.0) -> None:
        while True:
            ready = self.readiness()
            if ready != self._ready:
                await self.health.set("readiness", _SERVING if ready else _NOT_SERVING)
                if self._ready is not None:
                    log.warning("readiness_changed", ready=ready)
                self._ready = ready
            await asyncio.sleep(every_s)

    async def stop(self) -> None:
        log.info("scaler_stopping", grace_s=self.settings.shutdown_grace)
        await self.health.enter_graceful_shutdown()
        self.shutdown_event.set()  # StreamIsActive handlers return: streams end with OK
        await asyncio.sleep(0)
        if self.serve_grpc:
            await self.grpc.stop(self.settings.shutdown_grace)
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.state is not None:  # what was learned since the last write (a rolling update loses nothing)
            state = self.state

            async def flush() -> None:
                await state.write(await self._learned_now())

            try:
                await asyncio.wait_for(flush(), STATE_FLUSH_S)
            except TimeoutError:
                log.warning("state_flush_timed_out", after_s=STATE_FLUSH_S)
            except Exception:  # the shutdown goes on: the last periodic write is kept
                log.exception("state_flush_crashed")
        await self.registry.aclose()
        await self.scrape_loop.aclose()
        set_policy(self._previous_policy)
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        log.info("scaler_stopped")


# The cyclic collector stops every thread while it runs. In the soak (500 churned replicas, 200 RPC/s)
# full collections came every ~6 s and took 100-220 ms: they were the RPC p99. Objects alive once the
# server is up (modules, classes, functions: ~60k) are frozen out of every collection, and young
# collections run every 50,000 allocations instead of 700, so full ones come about once a minute.
GC_THRESHOLDS = (50_000, 20, 20)
# Two threads run Python (RPCs, scraping): an RPC waits for the interpreter lock at each of its few
# hand-overs, up to one switch interval each. When scraping keeps a core busy, 1 ms instead of 5 ms halved
# GetMetrics p99 (benchmarks/serve_under_load.py, 200 replicas at 1 s: 180 -> 89 ms; docs/performance.md)
# at the cost of slower scrape cycles, which a fleet that size needs more cores for anyway.
SWITCH_INTERVAL_S = 0.001


async def run(settings: Settings) -> None:
    # The signals are taken first: a Ctrl-C or SIGTERM during start-up (workers starting, ports binding)
    # then waits for start() to finish and stops the server as at any other time, instead of breaking
    # start() halfway with its threads, workers and sockets open.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = ScalerServer(settings)
    await server.start()
    try:
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        await stop.wait()
    finally:
        await server.stop()
