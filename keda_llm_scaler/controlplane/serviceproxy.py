"""A Service's address for the e2e, as kube-proxy gives one to a ClusterIP Service: one TCP port that
forwards each new connection to a live backend and leaves the connections already made alone.

kube-proxy rewrites a connection's destination once, when it opens (DNAT); the connection then belongs to
the pod it reached. When that pod dies, the client sees its connection end and the next one it opens
goes to a pod that is still an endpoint. That is how KEDA's one gRPC connection per ``scalerAddress``
moves from a killed scaler pod to another, and this proxy reproduces exactly that on loopback:

- a new connection goes to the first backend, in the order given, that accepts it. kube-proxy picks at
  random among ready endpoints; a fixed order lets a test know which scaler KEDA talks to. A killed
  process refuses at once, as an endpoint the endpoints controller removed would not be picked;
- bytes are copied both ways unchanged (gRPC's HTTP/2 included);
- when either side ends or fails, both are reset at once: the client sees the connection go, as it
  sees a killed pod's reset through kube-proxy. (A graceful close, whose last bytes kube-proxy would
  still pass before the FIN, is not what this proxy is for: the failover test kills.)
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter

__all__ = ["ServiceProxy"]

_CHUNK = 64 * 1024
_CONNECT_TIMEOUT_S = 5.0  # a backend that neither accepts nor refuses is passed over, as a dead endpoint


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()


class ServiceProxy:
    """``start()`` binds the port and serves from a thread of its own; ``stop()`` closes everything."""

    def __init__(self, backends: list[tuple[str, int]], host: str = "127.0.0.1", port: int = 0) -> None:
        if not backends:
            raise ValueError("a Service proxy needs at least one backend")
        self.backends = list(backends)
        self.host = host
        self.port = port
        self._lock = threading.Lock()  # the counts are written on the proxy's thread, read on others
        self._connections: Counter[tuple[str, int]] = Counter()
        self._refused = 0
        self._closing = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="service-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def connections(self) -> dict[tuple[str, int], int]:
        """Connections made to each backend so far (a copy)."""
        with self._lock:
            return dict(self._connections)

    @property
    def refused(self) -> int:
        """Connections no backend accepted."""
        with self._lock:
            return self._refused

    def start(self) -> str:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._accept, self.host, self.port), self._loop
        ).result(timeout=10)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.address

    def stop(self) -> None:
        async def close() -> None:
            self._closing = True  # a connection accepted from now on is reset at once
            if self._server is not None:
                self._server.close()
            for task in list(self._open):
                task.cancel()
            await asyncio.gather(*self._open, return_exceptions=True)

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        self._loop.close()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._open.add(task)
        try:
            await self._serve(client_r, client_w)
        except asyncio.CancelledError:
            # stop() cancels what is open: end quietly, since asyncio's stream callback logs a handler
            # that ends cancelled as an error (a traceback in every test's teardown)
            client_w.transport.abort()
        finally:
            self._open.discard(task)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self._closing:
            client_w.transport.abort()
            return
        for backend in self.backends:
            try:
                backend_r, backend_w = await asyncio.wait_for(asyncio.open_connection(*backend), _CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError):
                continue  # not listening (killed, or not up yet): the next endpoint
            with self._lock:
                self._connections[backend] += 1
            break
        else:
            with self._lock:
                self._refused += 1
            client_w.transport.abort()
            return
        ways = [asyncio.create_task(_copy(client_r, backend_w)), asyncio.create_task(_copy(backend_r, client_w))]
        try:
            await asyncio.wait(ways, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for way in ways:
                way.cancel()
            await asyncio.gather(*ways, return_exceptions=True)
            # abort, not close: the client must see the connection end now, not after a graceful flush
            client_w.transport.abort()
            backend_w.transport.abort()
