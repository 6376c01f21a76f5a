"""The lab's Service proxy (kube-proxy's part in the failover e2e), with real gRPC servers and a real
gRPC client: one connection pinned to the first backend; when that backend dies the client's next call
opens a new connection, which reaches the second. Nothing else is routed differently."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from keda_llm_scaler.controlplane.serviceproxy import ServiceProxy

# A gRPC server whose health service says SERVING for one name only, so that a call names its backend.
# In a process of its own: a SIGKILL ends its connections with no GOAWAY, as a killed pod's do.
_SERVER = """
import sys, time
from concurrent import futures
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
servicer = health.HealthServicer()
servicer.set(sys.argv[1], health_pb2.HealthCheckResponse.SERVING)
health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
print(server.add_insecure_port("127.0.0.1:0"), flush=True)
server.start()
time.sleep(600)
"""


def _health_server(name: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, name], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()


@pytest.fixture
def two_backends() -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    a, a_port = _health_server("a")
    b, b_port = _health_server("b")
    yield a, a_port, b_port
    _kill(a)
    _kill(b)


def _serving(stub: health_pb2_grpc.HealthStub, name: str) -> bool:
    try:
        got = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
    except grpc.RpcError:
        return False
    return bool(got.status == health_pb2.HealthCheckResponse.SERVING)


def test_one_connection_stays_on_the_first_backend_and_moves_when_it_dies(
    two_backends: tuple[subprocess.Popen[str], int, int],
) -> None:
    a, a_port, b_port = two_backends
    proxy = ServiceProxy([("127.0.0.1", a_port), ("127.0.0.1", b_port)])
    proxy.start()
    try:
        with grpc.insecure_channel(proxy.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            assert all(_serving(stub, "a") for _ in range(5)), "every call on the connection reaches a"
            assert proxy.connections == {("127.0.0.1", a_port): 1}

            _kill(a)  # the pod killed: its connections end, with no GOAWAY
            deadline = time.monotonic() + 30
            while not _serving(stub, "b"):  # the call that saw the connection go fails; a later one reconnects
                assert time.monotonic() < deadline, f"never reached b: {proxy.connections}"
                time.sleep(0.2)
            assert proxy.connections[("127.0.0.1", b_port)] == 1
            assert proxy.connections[("127.0.0.1", a_port)] == 1
    finally:
        proxy.stop()


def test_no_backend_listening_refuses_the_connection() -> None:
    a, port = _health_server("a")
    _kill(a)
    proxy = ServiceProxy([("127.0.0.1", port)])
    proxy.start()
    try:
        with grpc.insecure_channel(proxy.address) as channel:
            with pytest.raises(grpc.RpcError) as err:
                health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="a"), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert proxy.refused >= 1
        assert not proxy.connections
    finally:
        proxy.stop()


def test_a_proxy_needs_a_backend() -> None:
    with pytest.raises(ValueError, match="at least one backend"):
        ServiceProxy([])
