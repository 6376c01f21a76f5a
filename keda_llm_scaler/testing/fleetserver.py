"""A cheap fleet of replicas for benchmarks: one server answering a /metrics payload on /r<i>/metrics.

nginx when it is installed (Debian `nginx-light`: static files from C, keep-alive, so the fleet costs the
machine little and the scaler's own cost is what the benchmarks see), else one asyncio HTTP/1.1 server in
its own process (``serve_replicas``, which benchmarks/soak.py's replicas are too). Every path is its own
replica to the scaler (connections are kept per scrape URL) and to Prometheus (``__metrics_path__`` per target).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keda_llm_scaler.testing.replicas import unused_port

NGINX_CONF = """
worker_processes 1;
daemon off;
error_log {dir}/error.log;
pid {dir}/nginx.pid;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  keepalive_timeout 300s;
  keepalive_requests 1000000;
  default_type "text/plain; version=0.0.4";
  client_body_temp_path {dir}/t1; proxy_temp_path {dir}/t2; fastcgi_temp_path {dir}/t3;
  uwsgi_temp_path {dir}/t4; scgi_temp_path {dir}/t5;
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    root {dir};
    location / {{ rewrite ^/r\\d+/metrics$ /metrics.txt break; }}
    location = /nginx_status {{ stub_status; }}
  }}
}}
"""


@dataclass
class HttpFleet:
    kind: str  # "nginx" | "asyncio"
    port: int
    pids: list[int]
    _stop: Any
    root: Path | None = None  # nginx: the directory it serves the payload from

    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.port}/r{i}/metrics"

    def requests(self) -> int:
        """Requests nginx has answered since it started (its stub_status counter): scrapes, by anyone."""
        if self.kind != "nginx":
            raise RuntimeError("request counts need the nginx fleet")
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/nginx_status", timeout=5) as resp:
            lines = resp.read().decode().splitlines()
        return int(lines[2].split()[2]) - 1  # "accepts handled requests"; less this very request

    def swap(self, payload: bytes) -> None:
        """Every replica serves ``payload`` from the next request on (nginx opens the file per request)."""
        if self.root is None:
            raise RuntimeError("swapping payloads needs the nginx fleet")
        staged = self.root / "metrics.next"
        staged.write_bytes(payload)
        os.replace(staged, self.root / "metrics.txt")

    def stop(self) -> None:
        self._stop()


def serve_replicas(port_out: multiprocessing.Queue[int], payloads: list[bytes]) -> None:
    """All replicas in one asyncio HTTP/1.1 keep-alive server, run in a process of its own (no GIL shared
    with the load): /r<i>/metrics answers payloads[i % len(payloads)]. Puts its port on ``port_out``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode()
                try:
                    n = int(path.split("/")[1].removeprefix("r"))
                except (ValueError, IndexError):
                    n = 0
                body = payloads[n % len(payloads)]
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
        port_out.put(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(main())


def start_fleet(payload: bytes, kind: str = "auto") -> HttpFleet:
    """``kind``: ``nginx``, ``asyncio`` or ``auto`` (nginx if on PATH or in /usr/sbin)."""
    nginx = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")
    if kind == "nginx" or (kind == "auto" and nginx):
        if not nginx:
            raise SystemExit("nginx not found (Debian: apt-get install nginx-light)")
        return _start_nginx(nginx, payload)
    ports: multiprocessing.Queue[int] = multiprocessing.Queue()
    proc = multiprocessing.Process(target=serve_replicas, args=(ports, [payload]), daemon=True)
    proc.start()
    port = ports.get(timeout=30)
    return HttpFleet("asyncio", port, [proc.pid or 0], proc.terminate)


def _start_nginx(nginx: str, payload: bytes) -> HttpFleet:
    root = Path(tempfile.mkdtemp(prefix="fleet-"))
    root.chmod(0o755)  # run as root, nginx's workers read as nobody
    (root / "metrics.txt").write_bytes(payload)
    port = unused_port()
    (root / "nginx.conf").write_text(NGINX_CONF.format(dir=root, port=port))
    # its own process group: stopping it stops its worker too, whatever state the master is in
    proc = subprocess.Popen(
        [nginx, "-c", str(root / "nginx.conf"), "-p", str(root)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

    def stop() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(root, ignore_errors=True)

    for _ in range(100):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/r0/metrics", timeout=1) as resp:
                if resp.read() == payload:
                    break
        except OSError:
            time.sleep(0.1)
    else:
        log = (root / "error.log").read_text(errors="replace")[-500:]
        stop()
        raise SystemExit(f"nginx did not serve the fleet: {log}")
    return HttpFleet("nginx", port, [proc.pid], stop, root)
