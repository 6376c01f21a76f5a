"""(f) The scaler's own Kubernetes client (``keda_llm_scaler.kube``) against the real API server: a watch
resumes after a dropped connection without a relist, bookmarks move its resourceVersion, an API-server
restart mid-run and a 410 after an etcd compaction each cost at most one relist. Requests are counted
from the API server's audit log (what the server saw), as the fake-API tests count theirs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from keda_llm_scaler import kube
from keda_llm_scaler.controlplane.api import Api
from keda_llm_scaler.kube import Informer, KubeClient, KubeConfig
from tests.e2e.kube import Fleet

SLICES = "endpointslices"


def server_counts(namespace: str) -> tuple[int, int]:
    """(lists, watches) of EndpointSlices in ``namespace``, as the API server's audit log has them."""
    lists = watches = 0
    for line in Path(os.environ["KLS_AUDIT_LOG"]).read_text().splitlines():
        ev = json.loads(line)
        ref = ev.get("objectRef") or {}
        if ref.get("resource") == SLICES and ref.get("namespace") == namespace:
            lists += ev["verb"] == "list"
            watches += ev["verb"] == "watch"
    return lists, watches


class DroppingProxy:
    """TCP between the client and the API server; ``drop()`` cuts every open connection, as a load
    balancer or a network blip does (TLS passes through untouched)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.writers: set[asyncio.StreamWriter] = set()
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:  # the API server is down: the client sees its connection closed
            writer.transport.abort()
            return
        self.writers |= {writer, up_w}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))
        self.writers -= {writer, up_w}

    def drop(self) -> None:
        for w in list(self.writers):
            w.transport.abort()
        self.writers.clear()

    async def close(self) -> None:
        self.drop()
        if self.server is not None:
            self.server.close()


async def until(check: object, timeout: float, what: str, state: object = None) -> None:
    """Wait for ``check()``; on a timeout, say what ``state()`` reads then (the client's and the server's
    view, so a failure tells a client that stopped following from a cluster that never changed)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():  # type: ignore[operator]
        if asyncio.get_running_loop().time() > deadline:
            seen = "" if state is None else f"; {state()}"  # type: ignore[operator]
            raise AssertionError(f"{what}: not within {timeout:.0f}s{seen}")
        await asyncio.sleep(0.3)


def slice_addresses(slices: list[dict[str, Any]]) -> set[str]:
    return {a for s in slices for e in s.get("endpoints") or [] for a in e.get("addresses") or []}


def addresses(informer: Informer) -> set[str]:
    return slice_addresses(informer.items())


@pytest.fixture
def short_watches(monkeypatch: pytest.MonkeyPatch) -> None:
    # the server sends a bookmark shortly before a watch's timeout: short watches show them in seconds
    monkeypatch.setattr(kube, "WATCH_TIMEOUT_S", (6, 8))


@pytest.fixture
async def proxied(api: Api) -> AsyncIterator[tuple[DroppingProxy, KubeClient]]:
    base = KubeConfig.from_kubeconfig(Path(os.environ["KUBECONFIG"]))
    proxy = DroppingProxy(int(base.api_url.rsplit(":", 1)[1]))
    port = await proxy.start()
    client = KubeClient(KubeConfig(f"https://127.0.0.1:{port}", ca_file=base.ca_file,
                                   client_cert_file=base.client_cert_file, client_key_file=base.client_key_file))  # fmt: skip  # noqa: E501
    yield proxy, client
    await client.aclose()
    await proxy.close()


def views(fleet: Fleet, informer: Informer) -> str:
    """The informer's state beside the server's: its addresses, error, lists and watches, and the
    addresses the API server's own EndpointSlices hold now."""
    listed = fleet.api.list("discovery.k8s.io/v1", "EndpointSlice", fleet.namespace)
    server = slice_addresses(listed["items"])
    return (f"informer: {sorted(addresses(informer))}, error {informer.error!r}, lists {informer.lists}, "
            f"watches {informer.watches}, version {informer.resource_version}; server: {sorted(server)}, "
            f"audit (lists, watches) {server_counts(fleet.namespace)}")  # fmt: skip


def scale(fleet: Fleet, n: int) -> None:
    fleet.api.patch("apps/v1", "Deployment", fleet.namespace, fleet.app, {"spec": {"replicas": n}})


async def test_dropped_watches_resume_without_a_relist_and_bookmarks_advance(
    fleet: Fleet, proxied: tuple[DroppingProxy, KubeClient], short_watches: None
) -> None:
    proxy, client = proxied
    fleet.create()
    informer = client.endpointslices(fleet.namespace, fleet.app)
    assert await informer.wait_synced(30), informer.error
    await until(lambda: len(addresses(informer)) == 1, 30, "the first pod's address")
    for n in (2, 3, 4):
        await until(lambda n=n: server_counts(fleet.namespace)[1] >= n - 1, 30, "a watch open")
        proxy.drop()  # cut mid-stream
        scale(fleet, n)
        await until(lambda n=n: len(addresses(informer)) == n, 60, f"{n} addresses after the drop")
    lists, watches = server_counts(fleet.namespace)
    assert lists == 1, "every reconnect resumed from the last resourceVersion"
    assert informer.lists == 1 and informer.error is None
    assert watches >= 4  # the first and one per drop (short watches also end and resume on their own)

    # a change elsewhere moves the server's version; a bookmark carries it to this quiet watch
    first = int(informer.resource_version or 0)
    other = Fleet.in_new_namespace(fleet.api, "bookmark-other")
    try:
        other.create()
        await until(lambda: int(informer.resource_version or 0) > first, 30, "a bookmark advanced the version")
    finally:
        other.delete_namespace()
    assert server_counts(fleet.namespace)[0] == 1


async def test_an_api_server_restart_and_a_compaction_cost_one_relist_each_at_most(
    fleet: Fleet, proxied: tuple[DroppingProxy, KubeClient]
) -> None:
    _, client = proxied
    control = os.environ["KLS_CONTROLPLANE"]
    fleet.create()
    informer = client.endpointslices(fleet.namespace, fleet.app)
    assert await informer.wait_synced(30), informer.error
    await until(lambda: len(addresses(informer)) == 1, 30, "the first pod's address")

    async with httpx.AsyncClient(timeout=120) as http:
        r = await http.post(f"{control}/restart-apiserver")
        assert r.status_code == 200, r.text
        scale(fleet, 2)
        await until(
            lambda: len(addresses(informer)) == 2, 90, "the change after a restart", lambda: views(fleet, informer)
        )
        after_restart = server_counts(fleet.namespace)[0]
        assert after_restart <= 2, f"{after_restart} lists: a restart costs at most one relist"

        # history compacted away and the watch cache rebuilt while the client is disconnected: its
        # resourceVersion is too old, the server says 410, the client lists once and follows again
        r = await http.post(f"{control}/compact-etcd")
        assert r.status_code == 200, r.text
        scale(fleet, 3)
        r = await http.post(f"{control}/restart-apiserver")
        assert r.status_code == 200, r.text
        await until(lambda: len(addresses(informer)) == 3, 180, "the change after compaction and restart",
                    lambda: views(fleet, informer))  # fmt: skip
    lists = server_counts(fleet.namespace)[0]
    assert lists <= after_restart + 1, f"{lists} lists: the compaction cost more than one relist"
    assert informer.error is None
