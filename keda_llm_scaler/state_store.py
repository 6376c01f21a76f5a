"""Where learned state is kept across restarts (issue #33): a directory (``serve --state-dir``) or one
ConfigMap per scaler release (``--state-configmap``, in a cluster), and the keeper that reads it at start
and writes what the fleets learned every ``--state-interval`` seconds.

Writes are read-merge-write: every scaler pod of a release writes into the same object, so each write
keeps the other pods' records (the newer of two records of one fleet wins). The ConfigMap is replaced with
its ``resourceVersion`` (a conflict is re-read and retried); the file is replaced atomically under a lock.
The document's format and its checks are ``keda_llm_scaler.learned``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

import structlog

from keda_llm_scaler import __version__
from keda_llm_scaler.kube import KubeClient, KubeError
from keda_llm_scaler.learned import FleetRecord, decode, encode, encode_record

__all__ = ["ConfigMapStore", "DirectoryStore", "StateKeeper", "StateStore"]

log = structlog.get_logger(__name__)

STATE_FILE: Final = "learned-state.json"
CONFIGMAP_KEY: Final = "learned-state.json"
MAX_DOCUMENT_BYTES: Final = 900_000  # a ConfigMap holds at most 1 MiB; a file keeps the same bound
MAX_READ_BYTES: Final = 4 * 1024 * 1024  # a bigger file is not ours: refused unread
CONFLICT_RETRIES: Final = 4

T = TypeVar("T")
Merge = Callable[[dict[str, FleetRecord]], dict[str, FleetRecord]]


class StateStore(Protocol):
    where: str

    async def read(self) -> object | None: ...  # the parsed document, None when there is none yet

    async def update(self, merge: Merge) -> dict[str, FleetRecord]: ...


def _parse(raw: bytes) -> object:
    """A stored document, or a marker decode() refuses with the reason: never an exception (a corrupt
    file must not keep the scaler from starting, nor from writing a good one over it)."""
    if len(raw) > MAX_READ_BYTES:
        return {"unreadable": f"larger than {MAX_READ_BYTES} bytes"}
    try:
        doc: object = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, or nested past the parser's depth
        return {"unreadable": type(exc).__name__}
    return doc


def _records_of(doc: object | None) -> tuple[dict[str, FleetRecord], list[str]]:
    if doc is None:
        return {}, []
    try:
        return decode(doc, __version__, time.time())
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:  # decode checks; this is the backstop
        return {}, [f"unreadable ({type(exc).__name__})"]


def _dump(records: dict[str, FleetRecord]) -> tuple[str, int]:
    """The document within MAX_DOCUMENT_BYTES, and how many records did not fit: the most recently written
    first (each encoded once: linear in the fleets, whatever their number)."""
    head = json.dumps(encode({}, __version__), separators=(",", ":"))[:-2]  # ..."fleets":{  (closed below)
    budget = MAX_DOCUMENT_BYTES - len(head) - 2
    parts: list[str] = []
    dropped = 0
    for key in sorted(records, key=lambda k: records[k].written_at, reverse=True):
        part = json.dumps(key) + ":" + json.dumps(encode_record(records[key]), separators=(",", ":"))
        if len(part) + 1 > budget:
            dropped += 1
            continue
        budget -= len(part) + 1
        parts.append(part)
    return head + ",".join(parts) + "}}", dropped


def _merge_and_dump(doc: object | None, merge: Merge) -> tuple[dict[str, FleetRecord], str, int]:
    records = merge(_records_of(doc)[0])
    text, dropped = _dump(records)
    return records, text, dropped


def _log_dropped(dropped: int, where: str) -> None:
    if dropped:
        log.warning(
            "state_records_dropped",
            where=where,
            records=dropped,
            why=f"the document holds at most {MAX_DOCUMENT_BYTES} bytes: the least recently written did not fit",
        )


class DirectoryStore:
    """One JSON file in a directory, replaced atomically (write, fsync, rename) under an flock, so scalers
    sharing the directory never read half a file nor lose each other's records."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / STATE_FILE
        self.where = str(self.path)

    def _read(self) -> object | None:
        try:
            with self.path.open("rb") as f:
                raw = f.read(MAX_READ_BYTES + 1)
        except FileNotFoundError:
            return None
        return _parse(raw)

    async def read(self) -> object | None:
        return await asyncio.to_thread(self._read)

    def _update(self, merge: Merge) -> dict[str, FleetRecord]:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / ".lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            records = merge(_records_of(self._read())[0])
            text, dropped = _dump(records)
            _log_dropped(dropped, self.where)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".state-")
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(text)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        return records

    async def update(self, merge: Merge) -> dict[str, FleetRecord]:
        return await asyncio.to_thread(self._update, merge)


class ConfigMapStore:
    """The document in one ConfigMap's data, replaced with its resourceVersion (409 -> read again, merge,
    retry). The chart creates the ConfigMap and grants get and update on that one name only; without the
    object, the scaler creates it where it may."""

    def __init__(self, kube: KubeClient, namespace: str, name: str) -> None:
        self._kube = kube
        self.namespace, self.name = namespace, name
        self.where = f"ConfigMap {namespace}/{name}"

    async def _get(self) -> tuple[dict[str, Any] | None, object | None]:
        obj = await self._kube.get_configmap(self.namespace, self.name)
        if obj is None:
            return None, None
        raw = (obj.get("data") or {}).get(CONFIGMAP_KEY)
        if not isinstance(raw, str):
            return obj, None
        return obj, await asyncio.to_thread(_parse, raw.encode())

    async def read(self) -> object | None:
        return (await self._get())[1]

    async def update(self, merge: Merge) -> dict[str, FleetRecord]:
        for _ in range(CONFLICT_RETRIES):
            obj, doc = await self._get()
            # the decode, merge and encode off the loop this runs on (the scrape loop: thousands of fleets'
            # records must not hold their scrapes)
            records, text, dropped = await asyncio.to_thread(_merge_and_dump, doc, merge)
            _log_dropped(dropped, self.where)
            if obj is None:
                created = await self._kube.create_configmap(self.namespace, self.name, {CONFIGMAP_KEY: text})
                if created:
                    return records
                continue  # created by another pod meanwhile: read it and merge
            obj = {**obj, "data": {**(obj.get("data") or {}), CONFIGMAP_KEY: text}}
            if await self._kube.replace_configmap(self.namespace, self.name, obj):
                return records
        raise KubeError(f"{self.where}: still in conflict after {CONFLICT_RETRIES} tries")


def _learned_anything(rec: FleetRecord) -> bool:
    s = rec.state
    return bool(s.capacity or s.tipped or s.served or s.startups)


class StateKeeper:
    """Reads the store at start and writes what the fleets learned every ``interval_s``.

    ``records`` is what the store held at its last read or write (every pod's), by fleet key: a fleet
    scraped for the first time takes its record from there (``record_for``)."""

    def __init__(
        self,
        store: StateStore,
        interval_s: float,
        on_write: Callable[[str], None] | None = None,
        run_on: Callable[[Coroutine[Any, Any, Any]], Awaitable[Any]] | None = None,
    ) -> None:
        """``run_on``: where the store's calls run (``serve``: the scrape loop, which owns the Kubernetes
        client's connections); else the caller's loop."""
        self.store = store
        self._run_on = run_on
        self.interval_s = interval_s
        self.records: dict[str, FleetRecord] = {}
        self.loaded = False  # the store has been read once (see load)
        self._on_write = on_write or (lambda outcome: None)
        self._last_error: str | None = None

    async def load(self) -> bool:
        """Read the store; False when it could not be read (then nothing is written until it can be: a
        write would merge into nothing and replace what the store holds with this pod's cold records)."""
        try:
            doc = await self._call(self.store.read())
        except Exception as exc:  # an API error, a disk error: start without it, and never crash for it
            if not self.loaded:
                log.warning("state_unreadable", where=self.store.where, error=f"{type(exc).__name__}: {exc}")
            return False
        self.records, ignored = _records_of(doc)
        for why in ignored:
            log.warning("state_ignored", where=self.store.where, why=why)
        if not self.loaded:
            log.info("state_loaded", where=self.store.where, fleets=len(self.records))
        self.loaded = True
        return True

    async def refresh(self) -> None:
        """Read the store again, quietly (a failed read keeps the records held)."""
        try:
            doc = await self._call(self.store.read())
        except (KubeError, OSError):
            return
        self.records = _records_of(doc)[0]

    def record_for(self, key: str) -> FleetRecord | None:
        return self.records.get(key)

    async def write(self, ours: dict[str, FleetRecord]) -> None:
        """Merge ``ours`` (this pod's fleets, just exported) into the store, newer record winning."""

        if not self.loaded and not await self.load():
            self._on_write("error")
            return

        def merge(theirs: dict[str, FleetRecord]) -> dict[str, FleetRecord]:
            merged = dict(theirs)
            for key, rec in ours.items():
                held = merged.get(key)
                # a fleet that has learned nothing yet (started while another pod held it, a record it could
                # not adopt) does not replace one that has
                if held is None or (
                    held.written_at <= rec.written_at and (_learned_anything(rec) or not _learned_anything(held))
                ):
                    merged[key] = rec
            return merged

        try:
            self.records = await self._call(self.store.update(merge))
        except (KubeError, OSError) as exc:
            self._on_write("error")
            if str(exc) != self._last_error:  # once per distinct error: a lasting 403 is one line
                log.warning("state_write_failed", where=self.store.where, error=str(exc))
                self._last_error = str(exc)
            return
        self._on_write("ok")
        if self._last_error is not None:
            log.info("state_write_recovered", where=self.store.where)
            self._last_error = None

    async def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._run_on is None:
            return await coro
        result: T = await self._run_on(coro)
        return result

    async def run(self, collect: Callable[[], Awaitable[dict[str, FleetRecord]]]) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                ours = await collect()
                if ours:
                    await self.write(ours)
                else:  # a pod KEDA does not call (a standby): keep the others' records current for a failover
                    await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not stop the writes for good: log it, try again next time
                self._on_write("error")
                log.exception("state_write_crashed", where=self.store.where)
