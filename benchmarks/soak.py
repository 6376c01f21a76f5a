"""Soak: the real `keda-llm-scaler serve` under churn and load, watched for leaks and slow answers.

    python benchmarks/soak.py                      # 10 minutes, 200 RPC/s, 500 replicas, 300 streams
    python benchmarks/soak.py --minutes 1 --rps 50 --replicas 100 --streams 50 --churn-s 10   # the CI size

Replicas are one loopback asyncio HTTP server (its own process) answering vLLM payloads on
/r<i>/metrics. `--fleets` ScaledObjects each scrape a slice of them; every `--churn-s` every fleet's
endpoint list moves on (new trigger metadata: a new target, the old one superseded) and, as KEDA does on a
spec change, its streams reopen on the new metadata; half-way between churns a third of the streams are
cancelled and reopened. The load is GetMetrics at `--rps` (random fleet, 2 s deadline) plus `--streams`
StreamIsActive streams. Every 10 s the scaler's RSS, CPU and open fds (its process and its scrape workers
together) and its /metrics size are sampled with the window's GetMetrics p50/p99 (calls to targets that have
answered before; calls before a new target's first answer are counted apart) and its errors. Writes `soak.json`
and `soak.png` to `--out` and prints one line per sample (progress) and a JSON summary. Exit code 1 if
the process died.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc

from keda_llm_scaler._proto import externalscaler_pb2 as pb
from keda_llm_scaler._proto import externalscaler_pb2_grpc as pb_grpc
from keda_llm_scaler.testing.fleetserver import serve_replicas
from keda_llm_scaler.testing.payloads import EngineLoad, vllm_v1
from keda_llm_scaler.testing.replicas import unused_port

PAYLOADS = [vllm_v1([EngineLoad(w, 20 + w, 0.2 + 0.1 * w)]).encode() for w in range(6)]


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (the scaler and its scrape workers: the pod's processes)."""
    pids, i = [pid], 0
    while i < len(pids):
        # children are listed per thread: the scaler starts its workers from its scrape thread
        try:
            for task in os.listdir(f"/proc/{pids[i]}/task"):
                with open(f"/proc/{pids[i]}/task/{task}/children") as f:
                    pids.extend(int(c) for c in f.read().split())
        except OSError:
            pass
        i += 1
    return pids


def _cpu_s(pid: int, children: bool = False) -> float:
    """CPU seconds (user + system) of ``pid``, and with ``children`` of its live descendants too."""
    total = 0.0
    for p in _tree(pid) if children else [pid]:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited between listing and reading
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    return total


def _proc_stats(pid: int) -> tuple[float, int]:
    """RSS (MB) and open fds of ``pid`` and its descendants together."""
    rss_kb, fds = 0, 0
    for p in _tree(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss_kb += int(line.split()[1])
            fds += len(os.listdir(f"/proc/{p}/fd"))
        except OSError:
            continue
    return rss_kb / 1024.0, fds


def _scaler_metrics(port: int) -> tuple[int, dict[float, float]]:
    """The scaler's /metrics: its sample count, and its own GetMetrics handling-time buckets (cumulative,
    all status codes): the server-side latency, free of the load generator's own scheduling."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        lines = [line for line in resp.read().decode().splitlines() if line and not line.startswith("#")]
    buckets: dict[float, float] = {}
    for line in lines:
        if line.startswith("llm_scaler_rpc_duration_seconds_bucket{") and 'method="GetMetrics"' in line:
            le = float(line.split('le="', 1)[1].split('"', 1)[0])
            buckets[le] = buckets.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
    return len(lines), buckets


async def _probe(kedaclient: str, grpc_port: int, endpoints: str) -> dict[str, Any]:
    """kedaclient's GetMetrics load, one caller for 3 s, on a target whose metadata never changes."""
    meta = f"endpoints={endpoints};scrapeInterval=5;scrapeTimeout=2"
    proc = await asyncio.create_subprocess_exec(
        kedaclient, "-addr", f"127.0.0.1:{grpc_port}", "-op", "load", "-c", "1", "-d", "3s", "-meta", meta,
        "-name", "probe", "-namespace", "probe", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    out, _ = await proc.communicate()
    lines = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    return lines[-1] if lines else {}


def _bucket_quantile(now: dict[float, float], before: dict[float, float], q: float) -> float | None:
    """The q-quantile's bucket bound of the observations between two cumulative snapshots."""
    delta = sorted((le, count - before.get(le, 0.0)) for le, count in now.items())
    if not delta or delta[-1][1] <= 0:
        return None
    rank = q * delta[-1][1]
    return next(le for le, count in delta if count >= rank)


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def endpoints(args: argparse.Namespace, rport: int, fleet: int, epoch: int) -> str:
    """Fleet ``fleet``'s endpoint list at move ``epoch``: a slice of the replicas, shifted a third per move."""
    per_fleet = max(1, args.replicas // args.fleets)
    start = (fleet * per_fleet + epoch * max(1, per_fleet // 3)) % args.replicas
    ids = [(start + k) % args.replicas for k in range(per_fleet)]
    return ",".join(f"http://127.0.0.1:{rport}/r{i}/metrics" for i in ids)


def scaled_object(args: argparse.Namespace, rport: int, fleet: int, epoch: int) -> pb.ScaledObjectRef:
    meta = {"endpoints": endpoints(args, rport, fleet, epoch), "scrapeInterval": "5", "scrapeTimeout": "2"}
    return pb.ScaledObjectRef(name=f"so{fleet}", namespace=f"ns{fleet % 4}", scalerMetadata=meta)


def _hold_streams(args: argparse.Namespace, rport: int, grpc_port: int, epoch: Any, stop: Any) -> None:
    """The StreamIsActive streams, in their own process (as the operator's are, apart from its GetMetrics
    callers): the load generator's latency then measures its calls, not 300 streams' scheduling. Follows
    ``epoch`` (a shared counter) as KEDA follows a spec change: every stream reopens on the new metadata,
    the new one before the old one is cancelled, so the two overlap briefly. Half-way between moves a
    third of the streams are cancelled by the client and reopened (an operator restart, a lost lease)."""

    async def main() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
            stub = pb_grpc.ExternalScalerStub(ch)

            async def drain(call: Any) -> None:
                try:
                    async for _ in call:
                        pass
                except (grpc.aio.AioRpcError, asyncio.CancelledError):
                    pass

            def open_stream(k: int, at: int) -> tuple[Any, asyncio.Task[None]]:
                call = stub.StreamIsActive(scaled_object(args, rport, k % args.fleets, at))
                return call, asyncio.create_task(drain(call))

            seen = epoch.value
            streams = [open_stream(k, seen) for k in range(args.streams)]
            next_cancel = time.monotonic() + args.churn_s / 2
            while not stop.is_set():
                await asyncio.sleep(0.1)
                if epoch.value != seen:
                    seen = epoch.value
                    next_cancel = time.monotonic() + args.churn_s / 2
                    for k, (call, task) in enumerate(list(streams)):
                        streams[k] = open_stream(k, seen)
                        call.cancel()
                        task.cancel()
                if time.monotonic() >= next_cancel:
                    next_cancel += args.churn_s
                    for k in random.sample(range(len(streams)), len(streams) // 3):
                        call, task = streams[k]
                        call.cancel()
                        task.cancel()
                        streams[k] = open_stream(k, seen)
            for call, task in streams:
                call.cancel()
                task.cancel()

    asyncio.run(main())


class Started:
    """The replica server and the scaler process (started before the event loop)."""

    def __init__(self, args: argparse.Namespace) -> None:
        ports: multiprocessing.Queue[int] = multiprocessing.Queue()
        self.replicas = multiprocessing.Process(target=serve_replicas, args=(ports, PAYLOADS), daemon=True)
        self.replicas.start()
        self.rport = ports.get(timeout=30)
        self.grpc_port, self.metrics_port = unused_port(), unused_port()
        self.out_dir = Path(args.out)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.log = open(self.out_dir / "serve.log", "wb")  # noqa: SIM115 - closed by stop()
        env = {
            **os.environ,
            "LLM_SCALER_HOST": "127.0.0.1",
            "LLM_SCALER_GRPC_PORT": str(self.grpc_port),
            "LLM_SCALER_METRICS_PORT": str(self.metrics_port),
            "LLM_SCALER_LOG_LEVEL": "warning",
            "LLM_SCALER_LOG_JSON": "true",
        }
        exe = os.path.join(os.path.dirname(sys.executable), "keda-llm-scaler")
        self.proc = subprocess.Popen([exe, "serve"], env=env, stdout=self.log, stderr=subprocess.STDOUT)
        # spawned, not forked: the load generator has started gRPC by the time the streams start
        self.spawn = multiprocessing.get_context("spawn")
        self.epoch = self.spawn.Value("i", 0)
        self.streams_stop = self.spawn.Event()
        self.streams: Any = None  # the spawned streams process

    def harness_cpu_s(self) -> float:
        """CPU seconds of the load generator, its streams process and the replicas."""
        pids = [os.getpid(), self.replicas.pid, self.streams.pid if self.streams else None]
        return sum(_cpu_s(pid) for pid in pids if pid)

    def start_streams(self, args: argparse.Namespace) -> None:
        self.streams = self.spawn.Process(
            target=_hold_streams, args=(args, self.rport, self.grpc_port, self.epoch, self.streams_stop), daemon=True
        )
        self.streams.start()

    def stop(self) -> None:
        if self.streams is not None:
            self.streams_stop.set()
            self.streams.join(10)
            if self.streams.is_alive():
                self.streams.terminate()
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
        self.replicas.terminate()


async def soak(args: argparse.Namespace, started: Started) -> dict[str, Any]:
    proc, rport, grpc_port, metrics_port = started.proc, started.rport, started.grpc_port, started.metrics_port
    per_fleet = max(1, args.replicas // args.fleets)
    epoch = 0

    def ref(fleet: int) -> pb.ScaledObjectRef:
        return scaled_object(args, rport, fleet, epoch)

    latencies: list[float] = []  # calls to a target that has answered before: from memory
    first_calls: list[float] = []  # calls on new metadata before its first answer: wait up to warmupWait
    warm: set[tuple[int, int]] = set()
    errors: dict[str, int] = {}
    details: dict[str, str] = {}  # one message per error code and window
    samples: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60.0 * args.minutes
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
        stub = pb_grpc.ExternalScalerStub(ch)
        for _ in range(100):  # wait for the server
            try:
                await stub.GetMetricSpec(ref(0), timeout=1)
                break
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.2)
        started.start_streams(args)

        async def one_call() -> None:
            fleet = random.randrange(args.fleets)
            key = (fleet, epoch)
            into = latencies if key in warm else first_calls
            start = time.perf_counter()
            try:
                await stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref(fleet), metricName="llm_composite"),
                                      timeout=2.0)  # fmt: skip
                warm.add(key)
            except grpc.aio.AioRpcError as exc:
                code = exc.code().name
                errors[code] = errors.get(code, 0) + 1
                details.setdefault(code, (exc.details() or "")[:160])
            into.append(time.perf_counter() - start)

        next_churn = time.monotonic() + args.churn_s
        next_sample = time.monotonic() + 10.0
        cpu_before = _cpu_s(proc.pid, children=True)
        load_before = started.harness_cpu_s()
        server_before: dict[float, float] = {}
        probe_endpoints = ",".join(f"http://127.0.0.1:{rport}/r{i}/metrics" for i in range(per_fleet))
        probe: asyncio.Task[dict[str, Any]] | None = None
        if args.kedaclient:
            await _probe(args.kedaclient, grpc_port, probe_endpoints)  # registers it: later windows are warm
            probe = asyncio.create_task(_probe(args.kedaclient, grpc_port, probe_endpoints))
        t0 = time.monotonic()
        pending: set[asyncio.Task[None]] = set()
        interval = 1.0 / args.rps
        tick = time.monotonic()
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            task = asyncio.create_task(one_call())
            pending.add(task)
            task.add_done_callback(pending.discard)
            now = time.monotonic()
            if now >= next_churn:
                epoch += 1
                next_churn += args.churn_s
                started.epoch.value = epoch  # the streams process follows (see _hold_streams)
            if now >= next_sample:
                next_sample += 10.0
                rss, fds = _proc_stats(proc.pid)
                cpu_now = _cpu_s(proc.pid, children=True)
                cpu, cpu_before = (cpu_now - cpu_before) / 10.0, cpu_now
                load_now = started.harness_cpu_s()
                load_cpu, load_before = (load_now - load_before) / 10.0, load_now
                lines, buckets = await asyncio.to_thread(_scaler_metrics, metrics_port)
                server_p99, server_before = _bucket_quantile(buckets, server_before, 0.99), buckets
                window, latencies[:] = list(latencies), []
                firsts, first_calls[:] = list(first_calls), []
                sample = {
                    "t_s": round(now - t0),
                    "rss_mb": round(rss, 1),
                    "scaler_cpu": round(cpu, 2),  # cores the scaler process used over the window
                    "harness_cpu": round(load_cpu, 2),  # cores the load generator and the replicas used
                    "fds": fds,
                    "metrics_lines": lines,
                    "rpcs": len(window),
                    "p50_ms": None if not window else round(1000 * (_quantile(window, 0.5) or 0), 1),
                    "p99_ms": None if not window else round(1000 * (_quantile(window, 0.99) or 0), 1),
                    # the scaler's own handling time (bucket bound: 10, 25, 50, 100, 250 ms ...)
                    "server_p99_ms": None if server_p99 is None else round(1000 * server_p99, 1),
                    # an independent client (grpc-go) on a target that never churns: see --kedaclient
                    "probe": await probe if probe is not None else None,
                    "first_calls": len(firsts),
                    "first_p99_ms": None if not firsts else round(1000 * (_quantile(firsts, 0.99) or 0), 1),
                    "errors": dict(errors),
                    "error_examples": dict(details),
                }
                errors.clear()
                details.clear()
                if args.kedaclient:
                    probe = asyncio.create_task(_probe(args.kedaclient, grpc_port, probe_endpoints))
                samples.append(sample)
                print(json.dumps(sample), file=sys.stderr, flush=True)
            tick += interval
            await asyncio.sleep(max(0.0, tick - time.monotonic()))
        await asyncio.gather(*pending, return_exceptions=True)
    died = proc.poll() is not None
    return {"config": vars(args), "died": died, "exit_code": proc.returncode, "samples": samples}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["samples"]
    t = [x["t_s"] / 60 for x in s]
    fig, axes = plt.subplots(2, 2, figsize=(11, 6.5), sharex=True)
    series = [
        ("RSS (MB)", [x["rss_mb"] for x in s]),
        ("open fds", [x["fds"] for x in s]),
        ("/metrics samples", [x["metrics_lines"] for x in s]),
        ("GetMetrics p99 (ms), targets with a snapshot", [x["p99_ms"] for x in s]),
    ]
    for ax, (label, values) in zip(axes.flat, series, strict=True):
        ax.plot(t, values, marker="o", ms=3, label="load generator (Python)")
        ax.set_title(label)
    probes = [(x["probe"] or {}).get("p99_ms") for x in s]
    if any(p is not None for p in probes):
        axes[1][1].plot(t, probes, marker="s", ms=3, label="probe: grpc-go client, static target")
        axes[1][1].axhline(100, color="grey", ls="--", lw=1, label="100 ms goal")
        axes[1][1].legend(fontsize=8)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("minutes")
    c = result["config"]
    fig.suptitle(
        f"soak: {c['rps']} RPC/s, {c['replicas']} replicas in {c['fleets']} churning fleets "
        f"(every {c['churn_s']:g} s), {c['streams']} streams"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rps", type=float, default=200.0)
    parser.add_argument("--replicas", type=int, default=500)
    parser.add_argument("--fleets", type=int, default=20)
    parser.add_argument("--streams", type=int, default=300)
    parser.add_argument("--churn-s", type=float, default=30.0)
    parser.add_argument("--out", default="soak-output")
    parser.add_argument(
        "--kedaclient",
        default="",
        help="path to kedaclient: each window also probes a static ScaledObject with one Go caller for 3 s, "
        "a latency free of this Python load generator's own scheduling",
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` stops the scaler too
    started = Started(args)
    try:
        result = asyncio.run(soak(args, started))
    finally:
        started.stop()
    (started.out_dir / "soak.json").write_text(json.dumps(result, indent=1))
    plot(result, started.out_dir / "soak.png")
    s = result["samples"]
    summary = {
        "died": result["died"],
        "samples": len(s),
        "rss_mb": [s[0]["rss_mb"], s[-1]["rss_mb"]] if s else None,
        "fds": [s[0]["fds"], s[-1]["fds"]] if s else None,
        "metrics_lines": [s[0]["metrics_lines"], s[-1]["metrics_lines"]] if s else None,
        "p99_ms_max": max((x["p99_ms"] or 0) for x in s) if s else None,
        "probe_p99_ms": sorted(p for x in s if (p := (x.get("probe") or {}).get("p99_ms")) is not None),
    }
    print(json.dumps(summary))
    return 1 if result["died"] else 0


if __name__ == "__main__":
    sys.exit(main())
