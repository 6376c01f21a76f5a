"""The pod stand-in with real engines: each pod is one real vLLM engine at the pod's own address.

``scripts/controlplane run --pods vllm`` starts this instead of the simulated replicas. The kubelet's part
is the stand-in's (``pods.PodStandIn``: node, binding, addresses, status); what runs in the pod is
``enginelab``'s engine (``scripts/engine build`` first), in its own cgroup, held to ``--engine-cpus`` once
it serves. So the pod's cold start is the engine's real start-up, the scaler scrapes the engine's own
/metrics at the pod IP, and KEDA and the HPA scale a Deployment of real vLLM.

Deletion follows the kubelet, with the pod spec as written: the pod leaves the load's routing at once
(its EndpointSlice endpoint turns terminating), its ``preStop`` runs (``exec: sleep N`` or ``sleep:
{seconds: N}``, the chart's drain examples), then SIGTERM; the engine does what its arguments say
(``--shutdown-timeout``, passed through from the container's args: finish what it holds, or abort it);
SIGKILL at the end of ``terminationGracePeriodSeconds``. A stream the engine did not finish is cut, and
counted: this measures the drain rather than assuming it.

The load: Poisson arrivals per app at the rate ``POST /load`` sets, streaming ``/v1/completions`` with a
fixed token mix, least-in-flight over the app's serving pods (``enginelab.loadgen``). ``GET /records``
returns every request (sent time, pod, TTFT, tokens, how it ended), for the client-side attainment.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from keda_llm_scaler.controlplane.api import Api
from keda_llm_scaler.controlplane.pods import DEFAULT_PORT, PodStandIn, Stats
from keda_llm_scaler.enginelab.build import MODEL_NAME, EngineEnv
from keda_llm_scaler.enginelab.loadgen import Arrival, RequestRecord, Router, stream_one
from keda_llm_scaler.enginelab.run import Engine, EngineSpec, is_ready, launch_engine, stop_engines

__all__ = ["EnginePodStandIn", "cgroup_prefix", "prestop_seconds", "shutdown_args"]

READY_POLL_S = 1.0
REQUEST_TIMEOUT_S = 600.0


def cgroup_prefix(standin_pid: int) -> str:
    """The cgroups of one stand-in's engines: ``scripts/controlplane run`` removes what is left of them."""
    return f"kls-pod-{standin_pid}-"


def prestop_seconds(container: dict[str, Any]) -> float:
    """The seconds a container's preStop hook holds it before SIGTERM: ``exec: [sleep, N]`` (also through
    ``sh -c "sleep N"``) or the native ``sleep: {seconds: N}``; 0 without one. Any other hook is not run
    (nothing here can exec in an engine's container), and reads as 0."""
    hook = (container.get("lifecycle") or {}).get("preStop") or {}
    if "sleep" in hook:
        return float(hook["sleep"].get("seconds", 0))
    command = [str(c) for c in (hook.get("exec") or {}).get("command", [])]
    if len(command) >= 3 and command[-2] in ("-c", "-ec") and command[-1].startswith("sleep "):
        command = command[-1].split()
    if len(command) == 2 and command[0].rsplit("/", 1)[-1] == "sleep":
        with contextlib.suppress(ValueError):
            return max(0.0, float(command[1]))
    return 0.0


def shutdown_args(container: dict[str, Any]) -> tuple[str, ...]:
    """The engine arguments taken from the container's: ``--shutdown-timeout`` (how vLLM drains on SIGTERM).
    The rest (model, port) is the stand-in's: its engine serves the tiny local model."""
    args = [str(a) for a in [*(container.get("command") or []), *(container.get("args") or [])]]
    out: list[str] = []
    for i, a in enumerate(args):
        if a.startswith("--shutdown-timeout="):
            out.append(a)
        elif a == "--shutdown-timeout" and i + 1 < len(args):
            out.append(f"--shutdown-timeout={args[i + 1]}")
    return tuple(out[-1:])


@dataclass
class EnginePod:
    namespace: str
    name: str
    uid: str
    app: str
    ip: str
    engine: Engine
    prestop_s: float
    engine_args: tuple[str, ...] = ()
    grace_s: float = 30.0
    ready: bool = False
    reported_ready: bool = False
    deleting_since: float | None = None
    deleting_wall: float | None = None  # the same moment on the wall clock, which the records use
    stopping: bool = False
    failed: str | None = None

    @property
    def serving(self) -> bool:
        return self.ready and self.deleting_since is None and self.failed is None


class EnginePodStandIn(PodStandIn):
    """Pods that run real engines; the node, bindings and status reports are ``PodStandIn``'s."""

    def __init__(
        self,
        api: Api,
        pod_cidr: str,
        env: EngineEnv,
        spec: EngineSpec,
        log_dir: Path,
        slo_ttft_s: float,
        prompt_tokens: int,
        output_tokens: int,
    ) -> None:
        super().__init__(api, pod_cidr, "8b-h100", "decode-heavy", 0.0, slo_ttft_s)
        self.env, self.spec, self.log_dir = env, spec, log_dir
        self.prompt_tokens, self.output_tokens = prompt_tokens, output_tokens
        self.epods: dict[str, EnginePod] = {}  # by uid
        # (wall time sent, wall time it ended, pod, record)
        self.records: list[tuple[float, float, str, RequestRecord]] = []
        self.unrouted = 0
        self.routers: dict[tuple[str, str], Router] = {}
        self.url_pod: dict[str, str] = {}
        self.loop = asyncio.new_event_loop()
        self.started_engines = 0
        self._arrival_tasks: set[tuple[str, str]] = set()
        self._in_flight: set[asyncio.Future[None]] = set()
        self.tokens: dict[tuple[str, str], tuple[int, int]] = {}  # per app: (prompt, output)

    # -- pods ---------------------------------------------------------------------------------------
    def _known(self, uid: str) -> bool:
        with self.lock:
            return uid in self.epods

    def _begin_deletion(self, uid: str, grace_s: float) -> bool:
        """The kubelet's part once a pod is deleted: out of routing now, then ``_terminate`` in its own thread."""
        with self.lock:
            local = self.epods.get(uid)
            if local is None or local.deleting_since is not None:
                return local is not None
            local.deleting_since, local.deleting_wall, local.grace_s = time.monotonic(), time.time(), grace_s
        self._route(local.namespace, local.app)
        threading.Thread(target=self._terminate, args=(local,), daemon=True, name=f"stop-{local.name}").start()
        return True

    def _start(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        containers = pod["spec"].get("containers") or [{}]
        container = containers[0]
        port = next((int(p["containerPort"]) for p in container.get("ports", []) if "containerPort" in p), DEFAULT_PORT)
        with self.lock:
            if not self.free_ips:
                self._error(f"no free pod address for {meta['name']}")
                return
            ip = self.free_ips.pop(0)
            self.started_engines += 1
            index = self.started_engines
        spec = EngineSpec(
            cpus=self.spec.cpus,
            max_num_seqs=self.spec.max_num_seqs,
            layers=self.spec.layers,
            kv_gib=self.spec.kv_gib,
            max_model_len=self.spec.max_model_len,
            host=ip,
            extra_args=shutdown_args(container),
        )
        try:
            log = self.log_dir / f"{meta['name']}.log"
            # named by this process: whoever stops it removes what it could not (cgroups.remove_groups)
            group = f"{cgroup_prefix(os.getpid())}{meta['uid'][:13]}"
            engine = launch_engine(self.env, spec, index, group, log, port)
        except (OSError, RuntimeError) as exc:
            self._error(f"engine for {meta['name']}: {exc}")
            with self.lock:
                self.free_ips.append(ip)
            return
        app = meta.get("labels", {}).get("app", "")
        local = EnginePod(meta["namespace"], meta["name"], meta["uid"], app, ip, engine, prestop_seconds(container),
                          spec.extra_args)  # fmt: skip
        with self.lock:
            self.epods[local.uid] = local
            self.url_pod[engine.url] = local.name
        self._report(local, ready=False)

    def _terminate(self, local: EnginePod) -> None:
        """The kubelet's deletion: preStop, SIGTERM, SIGKILL at the grace's end; then the final delete."""
        with self.lock:
            if local.stopping:
                return
            local.stopping = True
        time.sleep(min(local.prestop_s, local.grace_s))
        stop_engines([local.engine], grace_s=max(1.0, local.grace_s - local.prestop_s))
        self._settle(local.engine.url)
        self._forget_engine(local)
        self._delete_now({"namespace": local.namespace, "name": local.name, "uid": local.uid})

    def _settle(self, url: str, budget_s: float = 10.0) -> None:
        """Wait until the client saw every stream to this engine end (its connections closed with it)."""
        deadline = time.monotonic() + budget_s
        while time.monotonic() < deadline:
            with self.lock:
                busy = any(r.in_flight.get(url, 0) for r in self.routers.values())
            if not busy:
                return
            time.sleep(0.1)

    def _forget(self, uid: str, cut: bool) -> None:
        """A pod deleted for good (grace 0, or gone from the API): its engine is stopped now if it runs."""
        with self.lock:
            local = self.epods.get(uid)
        if local is not None and not local.stopping:
            local.stopping = True
            if local.deleting_since is None:
                local.deleting_since, local.deleting_wall = time.monotonic(), time.time()
            self._route(local.namespace, local.app)
            stop_engines([local.engine], grace_s=1.0)
            self._settle(local.engine.url)
            self._forget_engine(local)

    def _forget_engine(self, local: EnginePod) -> None:
        with self.lock:
            if self.epods.pop(local.uid, None) is None:
                return
            # a stream still open when the deletion began, which the engine did not finish
            since = local.deleting_wall if local.deleting_wall is not None else time.time()
            cut = sum(1 for _, end, pod, r in self.records if pod == local.name and end >= since and not r.complete)
            drained = cut == 0
            self.stats.streams_cut += cut
            self.stats.drained += int(drained)
            self.stats.deleted.append({
                "name": local.name, "namespace": local.namespace, "streams_cut": cut, "prestop_s": local.prestop_s,
                "engine_args": list(local.engine_args),
            })  # fmt: skip
            self.free_ips.append(local.ip)

    # -- the engines' readiness -----------------------------------------------------------------------
    def run_engines(self) -> None:
        threading.Thread(target=self.loop.run_forever, daemon=True, name="load").start()
        while not self.stopping.wait(READY_POLL_S):
            with self.lock:
                starting = [
                    p for p in self.epods.values() if not p.ready and p.failed is None and p.deleting_since is None
                ]
            for local in starting:
                try:
                    ready = is_ready(local.engine)
                except RuntimeError as exc:  # exited before serving: the pod's container failed
                    with self.lock:
                        local.failed = str(exc).splitlines()[0]
                    self._error(f"{local.name}: {local.failed}")
                    continue
                if ready:
                    local.engine.cgroup.limit(self.spec.cpus)
                    with self.lock:
                        local.ready = True
                    self._report(local, ready=True)
                    self._route(local.namespace, local.app)

    def stop_all(self) -> None:
        with self.lock:
            engines = [p.engine for p in self.epods.values()]
        stop_engines(engines, grace_s=4.0)  # within the control plane's stop grace (10 s)
        self.loop.call_soon_threadsafe(self.loop.stop)

    # -- the load -----------------------------------------------------------------------------------
    def _route(self, namespace: str, app: str) -> None:
        with self.lock:
            only = self.only_pods.get((namespace, app))
            urls = sorted(
                p.engine.url
                for p in self.epods.values()
                if p.namespace == namespace and p.app == app and p.serving and (only is None or p.name in only)
            )
            router = self.routers.setdefault((namespace, app), Router([]))
            router.route(urls)

    def set_tokens(self, namespace: str, app: str, prompt: int | None, output: int | None) -> None:
        old = self.tokens.get((namespace, app), (self.prompt_tokens, self.output_tokens))
        new = (int(prompt) if prompt is not None else old[0], int(output) if output is not None else old[1])
        if min(new) < 1:
            raise ValueError("prompt_tokens and output_tokens must be >= 1")
        with self.lock:
            self.tokens[(namespace, app)] = new

    def set_load(self, namespace: str, app: str, rps: float, only: list[str] | None = None) -> None:
        super().set_load(namespace, app, rps, only)
        key = (namespace, app)
        self._route(namespace, app)
        if key not in self._arrival_tasks:
            self._arrival_tasks.add(key)
            asyncio.run_coroutine_threadsafe(self._arrive(key), self.loop)

    async def _arrive(self, key: tuple[str, str]) -> None:
        rng = random.Random(zlib.crc32("/".join(key).encode()))
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            start = time.monotonic()
            while not self.stopping.is_set():
                with self.lock:
                    rps = self.loads.get(key, 0.0)
                if rps <= 0:
                    await asyncio.sleep(0.2)
                    continue
                await asyncio.sleep(rng.expovariate(rps))
                router = self.routers[key]
                with self.lock:
                    self.stats.sent += 1
                    if not router.urls:
                        self.unrouted += 1  # nobody to send it to: counted as sent, never served
                        continue
                    prompt, output = self.tokens.get(key, (self.prompt_tokens, self.output_tokens))
                a = Arrival(time.monotonic() - start, prompt, output)
                task = asyncio.ensure_future(self._send(session, router, a, start, rng))
                self._in_flight.add(task)  # held until done: the loop keeps only weak references
                task.add_done_callback(self._in_flight.discard)

    async def _send(
        self, session: aiohttp.ClientSession, router: Router, a: Arrival, start: float, rng: random.Random
    ) -> None:
        sent = time.time()
        rec = await stream_one(session, router, MODEL_NAME, a, start, rng, REQUEST_TIMEOUT_S)
        with self.lock:
            pod = self.url_pod.get(rec.url, rec.url)
            self.records.append((sent, time.time(), pod, rec))
            if rec.complete:
                self.stats.finished += 1
                self.stats.within_slo += rec.ttft_s is not None and rec.ttft_s <= self.slo_ttft_s

    # -- control ------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        with self.lock:
            in_flight = {u: n for r in self.routers.values() for u, n in r.in_flight.items()}
            pods = [
                {"name": p.name, "namespace": p.namespace, "app": p.app, "ip": p.ip, "url": p.engine.url,
                 "ready": p.ready, "deleting": p.deleting_since is not None, "failed": p.failed,
                 "in_flight": in_flight.get(p.engine.url, 0), "pid": p.engine.proc.pid,
                 "ready_s": p.engine.ready_s}
                for p in self.epods.values()
            ]  # fmt: skip
            s: Stats = self.stats
            return {
                "engine": "vllm",
                "pods": pods,
                "sent": s.sent,
                "unrouted": self.unrouted,
                "finished": s.finished,
                "ttft_attainment": s.within_slo / s.finished if s.finished else None,
                "streams_cut": s.streams_cut,
                "drained": s.drained,
                "deleted": list(s.deleted),
                "loads": [{"namespace": ns, "app": app, "rps": r} for (ns, app), r in self.loads.items()],
                "errors": list(self.errors),
            }

    def record_rows(self) -> list[dict[str, Any]] | None:
        with self.lock:
            return [
                {"sent": t, "ended": end, "pod": pod, "ttft_s": r.ttft_s, "tokens": r.tokens,
                 "output_tokens": r.output_tokens, "finish_reason": r.finish_reason, "error": r.error,
                 "complete": r.complete, "e2e_s": r.e2e_s}
                for t, end, pod, r in self.records
            ]  # fmt: skip
