"""Issue #11's table in one run, each measure next to its reference measured in the same run.

    python -m benchmarks                      # the full table (~8 minutes on 2 cores), JSON to --out
    python -m benchmarks --quick              # the CI subset: 100 replicas, short windows, ratios only, no simulator

Everything runs on loopback on this machine: the fleet is one nginx (keda_llm_scaler/testing/fleetserver.py)
serving the 41 KB vLLM V1 fixture on /r<i>/metrics, counted by nginx's own request counter; the reference for the
scrape cost is a real Prometheus (Debian's `prometheus`) scraping the same fleet at the same interval; the
reference for serving is a bare grpc.aio ExternalScaler returning a constant, loaded by kedaclient (the
grpc-go client that calls like KEDA's operator). CPU is read from /proc for whole process trees (the scaler
and its scrape workers; Prometheus; nginx). Measures run one after another, never side by side, so each
has the machine to itself. Prints progress, then the table; writes the JSON with every raw figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.parse_bench import best_of, full_parse
from benchmarks.serve_under_load import BARE_SERVER, _load
from benchmarks.soak import _cpu_s, _proc_stats
from keda_llm_scaler.engines import read_replica
from keda_llm_scaler.testing.fleetserver import HttpFleet, start_fleet
from keda_llm_scaler.testing.payloads import EngineLoad, vllm_v1
from keda_llm_scaler.testing.replicas import unused_port

ROOT = Path(__file__).resolve().parent.parent

FIXTURES = ROOT / "tests" / "fixtures" / "metrics"
FIXTURE = FIXTURES / "vllm_v1_reconstructed_latest_1engine.txt"


def say(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def _get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return str(resp.read().decode())


def _metric_values(port: int, name: str) -> list[float]:
    """Every sample of one metric family on the scaler's /metrics."""
    out = []
    for line in _get(f"http://127.0.0.1:{port}/metrics").splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            out.append(float(line.rsplit(" ", 1)[1]))
    return out


def _terminate(proc: subprocess.Popen[bytes], grace_s: float = 20.0) -> None:
    """SIGTERM, and SIGKILL if it has not exited within ``grace_s``."""
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# -- processes -------------------------------------------------------------------------------------
@contextmanager
def scaler(workers: str = "auto", **env: str) -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    grpc_port, metrics_port = unused_port(), unused_port()
    full_env = {
        **os.environ,
        "LLM_SCALER_HOST": "127.0.0.1",
        "LLM_SCALER_GRPC_PORT": str(grpc_port),
        "LLM_SCALER_METRICS_PORT": str(metrics_port),
        "LLM_SCALER_LOG_LEVEL": "warning",
        "LLM_SCALER_SCRAPE_WORKERS": workers,
        **env,
    }
    exe = os.path.join(os.path.dirname(sys.executable), "keda-llm-scaler")
    proc = subprocess.Popen([exe, "serve"], env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(150):
            try:
                _get(f"http://127.0.0.1:{metrics_port}/metrics", 1)
                break
            except OSError:
                time.sleep(0.1)
        yield proc, grpc_port, metrics_port
    finally:
        _terminate(proc)


@contextmanager
def prometheus(
    fleet: HttpFleet, paths: list[str], interval: float, timeout: float
) -> Iterator[subprocess.Popen[bytes]]:
    exe = shutil.which("prometheus") or shutil.which("prometheus", path="/usr/bin:/usr/sbin")
    if not exe:
        raise SystemExit("prometheus not found (Debian: apt-get install prometheus)")
    work = Path(tempfile.mkdtemp(prefix="bench-prom-"))
    port = unused_port()
    config = {
        "global": {"scrape_interval": f"{interval:g}s", "scrape_timeout": f"{timeout:g}s"},
        "scrape_configs": [
            {
                "job_name": "fleet",
                # one target per replica path, as the scaler sees them
                "static_configs": [
                    {"targets": [f"127.0.0.1:{fleet.port}"], "labels": {"__metrics_path__": p, "replica": p}}
                    for p in paths
                ],
            }
        ],
    }
    (work / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    proc = subprocess.Popen(
        [exe, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for _ in range(300):
            try:
                if "Ready" in _get(f"http://127.0.0.1:{port}/-/ready", 1):
                    break
            except OSError:
                time.sleep(0.1)
        else:
            raise SystemExit("prometheus did not become ready")
        yield proc
    finally:
        _terminate(proc)
        shutil.rmtree(work, ignore_errors=True)


def _window(pid: int, fleet: HttpFleet, seconds: float, every: Callable[[], None] | None = None) -> dict[str, float]:
    """CPU (the process tree) and the fleet's requests over ``seconds``; ``every`` runs once a second."""
    cpu0, req0, t0 = _cpu_s(pid, children=True), fleet.requests(), time.monotonic()
    while time.monotonic() - t0 < seconds:
        time.sleep(1.0)
        if every is not None:
            every()
    elapsed = time.monotonic() - t0
    cpu, requests = _cpu_s(pid, children=True) - cpu0, fleet.requests() - req0
    return {
        "seconds": round(elapsed, 1),
        "cpu_cores": round(cpu / elapsed, 3),
        "scrapes": requests,
        "cpu_ms_per_scrape": round(1000 * cpu / max(1, requests), 3),
    }


def _meta(fleet: HttpFleet, ids: range, interval: float, timeout: float) -> str:
    endpoints = ",".join(fleet.url(i) for i in ids)
    return f"endpoints={endpoints};scrapeInterval={interval:g};scrapeTimeout={timeout:g}"


def _wait_first_answer(kedaclient: str, grpc_port: int, meta: str, name: str = "llm", budget_s: float = 60.0) -> None:
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        out = subprocess.run(
            [kedaclient, "-addr", f"127.0.0.1:{grpc_port}", "-op", "metrics", "-meta", meta, "-name", name],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        if out.returncode == 0:
            return
        time.sleep(0.5)
    raise SystemExit(f"the scaler never answered for {name}")


def _cycle_summary(cycles: list[float], interval: float) -> dict[str, Any]:
    return {
        "median": round(statistics.median(cycles), 2),
        "max": round(max(cycles), 2),
        "over_interval": sum(1 for c in cycles if c > interval),
        "samples": len(cycles),
    }


# -- the measures ----------------------------------------------------------------------------------
def measure_scrape_and_serve(args: argparse.Namespace, fleet: HttpFleet) -> dict[str, Any]:
    n, interval, timeout = args.replicas, args.interval, 2.0
    out: dict[str, Any] = {"replicas": n, "interval_s": interval}
    say(f"[1/6] Prometheus scraping {n} replicas every {interval:g} s ({args.window:g} s window) ...")
    with prometheus(fleet, [f"/r{i}/metrics" for i in range(n)], interval, timeout) as prom:
        time.sleep(interval + 1)  # every target scraped once (Prometheus spreads first scrapes over the interval)
        out["prometheus"] = _window(prom.pid, fleet, args.window)
        out["prometheus"]["rss_mb"] = round(_proc_stats(prom.pid)[0], 1)
    say(f"      {out['prometheus']}")
    say(f"[2/6] the scaler scraping the same {n} replicas ...")
    meta = _meta(fleet, range(n), interval, timeout)
    with scaler() as (proc, grpc_port, metrics_port):
        _wait_first_answer(args.kedaclient, grpc_port, meta)
        time.sleep(interval + 1)
        cycles: list[float] = []
        out["scaler"] = _window(
            proc.pid,
            fleet,
            args.window,
            lambda: cycles.extend(_metric_values(metrics_port, "llm_scaler_scrape_cycle_seconds")),
        )
        out["scaler"]["rss_mb"] = round(_proc_stats(proc.pid)[0], 1)
        out["cycle_s"] = _cycle_summary(cycles, interval)
        say(f"      {out['scaler']} cycle {out['cycle_s']}")
        say(f"[3/6] GetMetrics, {args.callers} callers for {args.load_s:g} s, while the loop runs ...")
        cpu0, t0 = _cpu_s(proc.pid, children=True), time.monotonic()
        out["serve_scaler"] = _load(args.kedaclient, f"127.0.0.1:{grpc_port}", meta, args.callers, args.load_s)
        out["serve_scaler"]["cpu_cores"] = round((_cpu_s(proc.pid, children=True) - cpu0) / (time.monotonic() - t0), 2)
        out["serve_cycle_s"] = max(_metric_values(metrics_port, "llm_scaler_scrape_cycle_seconds"), default=None)
    bare_port = unused_port()
    bare = subprocess.Popen([sys.executable, "-c", BARE_SERVER, str(bare_port)], cwd=ROOT)
    try:
        time.sleep(1.5)
        out["serve_bare"] = _load(args.kedaclient, f"127.0.0.1:{bare_port}", meta, args.callers, args.load_s)
    finally:
        bare.terminate()
        bare.wait(10)
    say(f"      scaler {out['serve_scaler']}\n      bare   {out['serve_bare']}")
    return out


def measure_many_fleets(args: argparse.Namespace, fleet: HttpFleet) -> dict[str, Any]:
    k, n, interval, timeout = args.fleets, args.replicas, 5.0, 2.0
    say(f"[4/6] {k} fleets x {n} replicas at {interval:g} s, polled once a second each ({args.window:g} s) ...")
    metas = [_meta(fleet, range(f * n, (f + 1) * n), interval, timeout) for f in range(k)]
    calls, unavailable, rss = 0, 0, []
    cycles: list[float] = []
    with scaler() as (proc, grpc_port, metrics_port):
        for f, meta in enumerate(metas):
            _wait_first_answer(args.kedaclient, grpc_port, meta, name=f"so{f}")
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.window:
            for f, meta in enumerate(metas):
                got = subprocess.run(
                    [args.kedaclient, "-addr", f"127.0.0.1:{grpc_port}", "-op", "metrics", "-meta", meta,
                     "-name", f"so{f}", "-timeout", "2s"],
                    capture_output=True, text=True, timeout=30,
                )  # fmt: skip
                calls += 1
                unavailable += got.returncode != 0
            cycles.extend(_metric_values(metrics_port, "llm_scaler_scrape_cycle_seconds"))
            rss.append(_proc_stats(proc.pid)[0])
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t0) % 1.0))
    out = {
        "fleets": k,
        "replicas_each": n,
        "cycle_s": _cycle_summary(cycles, interval),
        "getmetrics_calls": calls,
        "unavailable_share": round(unavailable / max(1, calls), 4),
        "rss_mb_max": round(max(rss), 1),
    }
    say(f"      {out}")
    return out


def measure_parse(args: argparse.Namespace) -> dict[str, Any]:
    say("[5/6] parse: the targeted reader vs prometheus_client's full parse ...")
    out = {}
    for path in sorted(FIXTURES.glob("vllm_v1_reconstructed_*.txt")):
        text = path.read_text()
        full = best_of(lambda t=text: full_parse(t), repeat=args.parse_repeat)
        ours = best_of(lambda t=text: read_replica(t), repeat=args.parse_repeat)
        out[path.stem] = {
            "full_ms": round(full * 1e3, 3),
            "ours_ms": round(ours * 1e3, 3),
            "ratio": round(full / ours, 1),
        }
    say(f"      {out}")
    return out


def measure_reaction(args: argparse.Namespace) -> dict[str, Any]:
    """Steps in waiting on every replica (the payload file is swapped under nginx) -> the first GetMetrics
    whose value moved, polled every 20 ms by kedaclient's -op metrics."""
    import grpc

    from keda_llm_scaler._proto import externalscaler_pb2 as pb
    from keda_llm_scaler._proto import externalscaler_pb2_grpc as pb_grpc

    low = vllm_v1([EngineLoad(0, 4, 0.2)]).encode()
    high = vllm_v1([EngineLoad(60, 40, 0.9)]).encode()
    out: dict[str, Any] = {}
    fleet = start_fleet(low, "nginx")
    try:
        for interval in args.reaction_intervals:
            steps = args.reaction_steps if interval <= 1 else max(2, args.reaction_steps // 3)
            say(f"[6/6] reaction at a {interval:g} s interval, {steps} steps ...")
            meta = {"endpoints": ",".join(fleet.url(i) for i in range(10)), "scrapeInterval": f"{interval:g}",
                    "scrapeTimeout": f"{min(interval, 2.0):g}"}  # fmt: skip
            ref = pb.ScaledObjectRef(name="react", namespace="bench", scalerMetadata=meta)
            req = pb.GetMetricsRequest(scaledObjectRef=ref, metricName="llm_composite")
            delays = []
            with scaler() as (_, grpc_port, _m), grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
                stub = pb_grpc.ExternalScalerStub(ch)

                def value(stub: Any = stub, req: Any = req) -> float | None:
                    try:
                        return float(stub.GetMetrics(req, timeout=2).metricValues[0].metricValueFloat)
                    except grpc.RpcError:
                        return None

                deadline = time.monotonic() + 60
                while value() is None and time.monotonic() < deadline:
                    time.sleep(0.2)
                time.sleep(2 * interval)
                for step in range(steps):
                    before = value()
                    fleet.swap(high if step % 2 == 0 else low)
                    t0 = time.monotonic()
                    while time.monotonic() - t0 < 3 * interval + 5:
                        now = value()
                        if now is not None and before is not None and abs(now - before) > 1e-9:
                            break
                        time.sleep(0.02)
                    delays.append(time.monotonic() - t0)
                    # the next step lands at another phase of the cycle (the detection above is in step
                    # with the cycle, so a fixed pause would measure one phase over and over)
                    time.sleep(0.1 + interval * ((0.37 * (step + 1)) % 1.0))
            ordered = sorted(delays)
            p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
            out[f"{interval:g}s"] = {"steps": steps, "p95_s": round(p95, 2), "max_s": round(max(delays), 2),
                                     "goal_s": interval + 0.5}  # fmt: skip
            say(f"      {out[f'{interval:g}s']}")
    finally:
        fleet.stop()
    return out


def measure_simulator(args: argparse.Namespace) -> dict[str, Any]:
    exe = os.path.join(os.path.dirname(sys.executable), "keda-llm-scaler")
    runs = {"hour (bundled bursty hour)": ["--trace", "bursty"]}
    for scale in args.sim_scales:
        if scale != 1:
            runs[f"hour x{scale:g} rate (a {scale:g}x fleet)"] = ["--trace", "bursty", "--rate-scale", f"{scale:g}"]
    if not args.quick:
        # the README's diurnal day: ServeGen's m-small curve, its busiest 10 minutes at 140 req/s
        day = ["--trace", "conv", "--rate-curve", "servegen", "--curve-model", "m-small", "--hours", "17:29"]
        runs["12-hour day (ServeGen m-small, peak 140 req/s)"] = [*day, "--peak-rate", "140"]
    out = {}
    for label, extra in runs.items():
        say(f"[sim] replay {label} ...")
        t0 = time.monotonic()
        got = subprocess.run([exe, "replay", *extra, "--json", "--quiet"], capture_output=True, text=True, timeout=900)
        wall = time.monotonic() - t0
        if got.returncode != 0:
            raise SystemExit(f"replay {label} failed: {got.stderr[-500:]}")
        report = json.loads(got.stdout)
        out[label] = {
            "wall_s": round(wall, 1),
            "requests": report.get("requests"),
            "gpu_hours": report.get("gpu_hours"),
        }
        say(f"      {out[label]}")
    return out


# -- the table -------------------------------------------------------------------------------------
def _row(measure: str, scaler: str, reference: str, goal: str, met: bool | None) -> dict[str, Any]:
    return {"measure": measure, "scaler": scaler, "reference": reference, "goal": goal, "met": met}


def _cycles(c: dict[str, Any]) -> str:
    return f"median {c['median']} s, max {c['max']} s"


def table(r: dict[str, Any]) -> list[dict[str, Any]]:
    s = r["scrape"]
    prom, ours, n = s["prometheus"], s["scaler"], s["replicas"]
    sb, ss = s["serve_bare"], s["serve_scaler"]
    rps, p99 = float(ss["rps"]) / float(sb["rps"]), float(ss["p99_ms"]) / float(sb["p99_ms"])
    cost = ours["cpu_ms_per_scrape"] / prom["cpu_ms_per_scrape"]
    rows = [
        _row(f"CPU per scrape, {n} replicas at {s['interval_s']:g} s", f"{ours['cpu_ms_per_scrape']} ms ({cost:.2f}x)",
             f"Prometheus {prom['cpu_ms_per_scrape']} ms", "<= 2x Prometheus", cost <= 2),
        _row(f"one cycle of {n} replicas", _cycles(s["cycle_s"]), "-", "<= 2 s", s["cycle_s"]["max"] <= 2.0),
        _row(f"GetMetrics, {r['config']['callers']} callers, while that loop runs",
             f"{float(ss['rps']):.0f} RPS ({rps:.0%}), p99 {float(ss['p99_ms']):.1f} ms ({p99:.1f}x)",
             f"bare {float(sb['rps']):.0f} RPS, p99 {float(sb['p99_ms']):.1f} ms",
             ">= 90 % RPS, p99 <= 2x", rps >= 0.9 and p99 <= 2),
    ]  # fmt: skip
    if "fleets" in r:
        f = r["fleets"]
        rows.append(_row(f"{f['fleets']} fleets x {f['replicas_each']} replicas",
                         f"cycles {_cycles(f['cycle_s'])}; {f['unavailable_share']:.1%} UNAVAILABLE", "-",
                         "every cycle within 5 s", f["cycle_s"]["over_interval"] == 0))  # fmt: skip
    ratios = {k.rsplit("_", 1)[-1]: v["ratio"] for k, v in r["parse"].items()}
    rows.append(_row("parse, vLLM V1 fixtures", ", ".join(f"{k} {v}x" for k, v in ratios.items()),
                     "prometheus_client", ">= 20x", min(ratios.values()) >= 20))  # fmt: skip
    for key, v in r["reaction"].items():
        rows.append(_row(f"reaction, step in waiting -> GetMetrics, {key} interval", f"p95 {v['p95_s']} s",
                         "-", f"<= {v['goal_s']:g} s", v["p95_s"] <= v["goal_s"]))  # fmt: skip
    if "fleets" in r:
        f = r["fleets"]
        rss = f"{f['rss_mb_max']} MB (scaler + workers)"
        reference = f"Prometheus {prom['rss_mb']} MB ({n} replicas)"
        rows.append(
            _row(f"RSS, {f['fleets']} x {f['replicas_each']}", rss, reference, "<= 200 MB", f["rss_mb_max"] <= 200)
        )
    for label, v in r.get("simulator", {}).items():
        rows.append(_row(f"simulator: {label}", f"{v['wall_s']} s wall", "-", "-", None))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--kedaclient", default=os.environ.get("KEDACLIENT") or str(ROOT.parent / "shared/tools/kedaclient")
    )
    parser.add_argument("--quick", action="store_true", help="the CI subset: 100 replicas, short windows")
    parser.add_argument(
        "--out", default="", help="write the JSON here (default: docs/performance/runner.json, or nothing with --quick)"
    )
    args = parser.parse_args(argv)
    if not Path(args.kedaclient).is_file():
        raise SystemExit(f"kedaclient not found at {args.kedaclient} (--kedaclient or KEDACLIENT)")
    quick = args.quick
    args.replicas = 100 if quick else 1000
    args.fleets = 5
    # the quick windows hold three cycles or so: a scrape count over fewer is too coarse to divide by
    args.interval = 2.0 if quick else 5.0
    args.window = 6.0 if quick else 30.0
    args.callers = 16
    args.load_s = 3.0 if quick else 20.0
    args.parse_repeat = 2 if quick else 7
    args.reaction_steps = 2 if quick else 12
    args.reaction_intervals = [1.0] if quick else [1.0, 5.0]
    args.sim_scales = [1.0] if quick else [1.0, 2.0, 4.0]
    started = time.monotonic()
    fleet = start_fleet(FIXTURE.read_bytes(), "nginx")
    result: dict[str, Any] = {"config": {"quick": quick, "replicas": args.replicas, "callers": args.callers,
                                         "machine_cores": os.cpu_count(), "fleet_server": fleet.kind}}  # fmt: skip
    try:
        result["scrape"] = measure_scrape_and_serve(args, fleet)
        if not quick:
            result["fleets"] = measure_many_fleets(args, fleet)
    finally:
        fleet.stop()
    result["parse"] = measure_parse(args)
    result["reaction"] = measure_reaction(args)
    if not quick:  # the CI subset keeps to the ratios
        result["simulator"] = measure_simulator(args)
    result["table"] = table(result)
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    widths = {"measure": 50, "scaler": 52, "reference": 34, "goal": 24}
    print("\n" + " | ".join(f"{k:{w}}" for k, w in widths.items()) + " | met")
    for row in result["table"]:
        met = {True: "yes", False: "MISSED", None: "-"}[row["met"]]
        print(" | ".join(f"{row[k][:w]:{w}}" for k, w in widths.items()) + f" | {met}")
    print(f"\n{result['elapsed_s']} s on {os.cpu_count()} cores")
    out = args.out or ("" if quick else str(ROOT / "docs/performance/runner.json"))
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=1))
        print(f"wrote {out}")
    return 0
