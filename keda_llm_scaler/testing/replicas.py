"""Real HTTP replicas on loopback, each serving a /metrics payload with a switchable failure mode."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Behaviour:
    payload: str = ""
    status: int = 200
    delay_s: float = 0.0  # before the headers
    drip_s: float = 0.0  # between body chunks (a slow body)
    huge_bytes: int = 0  # serve this many bytes of valid-looking comments first
    garbage: bool = False
    hang_up: bool = False  # close the connection without answering


class _Handler(BaseHTTPRequestHandler):
    server: _ReplicaHTTPServer
    protocol_version = "HTTP/1.1"  # keep-alive, as vLLM's and SGLang's servers (uvicorn) do

    def setup(self) -> None:
        super().setup()
        self.server.replica.connections += 1
        self.server.replica.open_connections += 1

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.replica.open_connections -= 1

    def log_message(self, *args: object) -> None:  # keep test output clean
        pass

    def do_GET(self) -> None:
        b = self.server.replica.behaviour
        self.server.replica.requests += 1
        self.server.replica.user_agent = self.headers.get("User-Agent")
        if b.delay_s:
            time.sleep(b.delay_s)
        if b.hang_up:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(2)
            return
        if b.garbage:
            body = bytes(range(256)) * 64
        elif b.huge_bytes:
            body = (b"# " + b"x" * 1022 + b"\n") * (b.huge_bytes // 1024) + b.payload.encode()
        else:
            body = b.payload.encode()
        self.send_response(b.status)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        if not b.drip_s:
            self.send_header("Content-Length", str(len(body)))
        else:  # no length: the end of the body is the end of the connection
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        try:
            if b.drip_s:
                for i in range(0, len(body), 64):
                    self.wfile.write(body[i : i + 64])
                    self.wfile.flush()
                    time.sleep(b.drip_s)
            else:
                self.wfile.write(body)
        except OSError:
            pass


class _ReplicaHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    replica: Replica


class Replica:
    def __init__(self, payload: str = "", host: str = "127.0.0.1", port: int = 0) -> None:
        self.behaviour = Behaviour(payload=payload)
        self.requests = 0
        self.user_agent: str | None = None  # of the last request
        self.connections = 0  # TCP connections accepted
        self.open_connections = 0  # accepted and not yet closed (by either side)
        self._server = _ReplicaHTTPServer((host, port), _Handler)
        self._server.replica = self
        self.host = host
        self.port = self._server.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def set(self, **changes: object) -> None:
        self.behaviour = Behaviour(**{**self.behaviour.__dict__, **changes})

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextlib.contextmanager
def replicas(*payloads: str) -> Iterator[list[Replica]]:
    started = [Replica(p) for p in payloads]
    try:
        yield started
    finally:
        for r in started:
            r.close()


_HELD_SOCKETS: list[socket.socket] = []


def dead_port() -> int:
    """A loopback port that refuses connections for the rest of the test run.

    The socket stays bound without listening, so no other server (the scaler's own metrics port
    included) can be given this port later: connects get ECONNREFUSED, never somebody else's answer.
    """
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    _HELD_SOCKETS.append(s)
    return int(s.getsockname()[1])


def unused_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
