"""Start the real scaler server in-process on ephemeral loopback ports."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace

import grpc

from keda_llm_scaler.config import Settings
from keda_llm_scaler.server import ScalerServer

# In-process scraping (scrape_workers="0") unless a test asks for workers: tests patch scrape-side constants
# in this process, which a worker would not see. The worker path has its own tests (test_workers.py), and
# every test that runs `serve` as a process (serveproc.py) runs the default, workers included.
BASE = Settings(
    host="127.0.0.1",
    grpc_port=0,
    metrics_port=0,
    warmup_wait=1.0,
    shutdown_grace=1.0,
    target_idle_ttl=600.0,
    scrape_workers="0",
)


@contextlib.asynccontextmanager
async def running_scaler(**overrides: object) -> AsyncIterator[ScalerServer]:
    server = ScalerServer(replace(BASE, **overrides))  # type: ignore[arg-type]
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@contextlib.asynccontextmanager
async def channel_to(server: ScalerServer) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as ch:
        yield ch
