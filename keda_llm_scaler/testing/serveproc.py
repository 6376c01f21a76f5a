"""`keda-llm-scaler serve` as a real subprocess (the console script), configured via environment."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from keda_llm_scaler.testing.replicas import unused_port


@dataclass
class ServeProcess:
    proc: subprocess.Popen[bytes]
    grpc_port: int
    metrics_port: int
    log_file: IO[bytes]
    final_log: str | None = None  # everything the process printed, once it has exited

    def log(self) -> str:
        if self.final_log is not None:
            return self.final_log
        self.log_file.flush()
        self.log_file.seek(0)
        return self.log_file.read().decode(errors="replace")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


def _wait_healthy(
    address: str, timeout: float, creds: grpc.ChannelCredentials | None = None, server_name: str | None = None
) -> None:
    deadline = time.monotonic() + timeout
    options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    while time.monotonic() < deadline:
        channel = grpc.secure_channel(address, creds, options) if creds else grpc.insecure_channel(address)
        try:
            stub = health_pb2_grpc.HealthStub(channel)
            stub.Check(  # type: ignore[attr-defined]  # the stubs (types-grpcio-health-checking) declare no methods
                health_pb2.HealthCheckRequest(service="liveness"), timeout=0.5
            )
            return
        except grpc.RpcError:
            time.sleep(0.1)
        finally:
            channel.close()
    raise TimeoutError(f"scaler at {address} did not become healthy")


@contextlib.contextmanager
def serve(
    *args: str,
    env: dict[str, str] | None = None,
    creds: grpc.ChannelCredentials | None = None,
    server_name: str | None = None,
) -> Iterator[ServeProcess]:
    grpc_port, metrics_port = unused_port(), unused_port()
    full_env = {
        **os.environ,
        "LLM_SCALER_GRPC_PORT": str(grpc_port),
        "LLM_SCALER_METRICS_PORT": str(metrics_port),
        "LLM_SCALER_HOST": "127.0.0.1",
        **(env or {}),
    }
    exe = os.path.join(os.path.dirname(sys.executable), "keda-llm-scaler")
    log_file = tempfile.TemporaryFile()  # noqa: SIM115 - closed in finally; a pipe nobody reads would block the server
    proc = subprocess.Popen([exe, "serve", *args], env=full_env, stdout=log_file, stderr=subprocess.STDOUT)
    handle = ServeProcess(proc, grpc_port, metrics_port, log_file)
    try:
        _wait_healthy(f"127.0.0.1:{grpc_port}", 15, creds, server_name)
        yield handle
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        handle.final_log = handle.log()
        log_file.close()
