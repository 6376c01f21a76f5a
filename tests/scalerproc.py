"""Start the real scaler server in-process on ephemeral loopback ports."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace

import grpc

from keda_llm_scaler.config import Settings
from keda_llm_scaler.server import ScalerServer

BASE = Settings(
    host="127.0.0.1", grpc_port=0, metrics_port=0, warmup_wait=1.0, shutdown_grace=1.0, target_idle_ttl=600.0
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
