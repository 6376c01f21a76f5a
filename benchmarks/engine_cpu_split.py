#!/usr/bin/env python3
"""Where a real engine's CPU quota goes, in a burst and under steady arrivals: the API server, the engine
core, throttling, and this client. Run inside ``scripts/engine run``:

    scripts/engine run 2 --cpus 0.8 --max-num-seqs 14 --layers 3 -- python benchmarks/engine_cpu_split.py

Why: on config E (docs/sim-to-real.md) the engines drained a burst of the loads' mix at 23.0 req/s, but
under steady arrivals past the knee they served about 18.8, and the simulator about 20.2. This measures
both on the same engines: first the burst (4 x max_num_seqs requests of the loads' mix to every engine at
once, as sim_to_real's drain check), then Poisson arrivals of the same mix at ``--fractions`` of the burst
rate, each for ``--duration`` seconds. For each phase, per engine: the completion rate (steady phases:
completions from ``--skip`` seconds to the end of the arrivals), the cores each of the engine's
processes used (by name: the API server, the engine core), the share of CFS periods throttled, and the
cores this client and the whole machine used. Writes ``--out`` (JSON) and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keda_llm_scaler.enginelab.loadgen import Arrival, LoadResult, run_load
from keda_llm_scaler.enginelab.sweep import burst_throughput, poisson_arrivals
from keda_llm_scaler.sim.trace import BUNDLED_TRACE, load_trace

MAX_PROMPT, MAX_OUTPUT = 512, 128  # sim_to_real's loads' mix
BURST_BATCHES = 4
SEED = 17
TICK = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> tuple[str, float] | None:
    """A process's name and CPU seconds (user + system, every thread), or None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the name may hold spaces; the fields after it do not
    return name, (int(fields[11]) + int(fields[12])) / TICK  # utime, stime: fields 14 and 15 of stat


def throttling(cgroup: Path) -> tuple[int, int]:
    """(CFS periods, periods throttled) from ``cpu.stat``, v1 or v2 alike."""
    stat = dict(line.split() for line in (cgroup / "cpu.stat").read_text().splitlines() if line.strip())
    return int(stat.get("nr_periods", 0)), int(stat.get("nr_throttled", 0))


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent not idle (``/proc/stat``)."""
    cpu = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(x) for x in cpu[:8]]
    return (sum(ticks) - ticks[3] - ticks[4]) / TICK  # less idle and iowait


@dataclass
class Snapshot:
    t: float
    engines: list[dict[str, float]]  # per engine: CPU seconds by process name
    periods: list[tuple[int, int]]
    client_s: float
    machine_s: float


def snapshot(cgroups: list[Path]) -> Snapshot:
    engines: list[dict[str, float]] = []
    for cg in cgroups:
        by_name: dict[str, float] = {}
        for pid in (cg / "cgroup.procs").read_text().split():
            got = process_cpu_s(int(pid))
            if got is not None:
                by_name[got[0]] = by_name.get(got[0], 0.0) + got[1]
        engines.append(by_name)
    times = os.times()
    return Snapshot(
        time.monotonic(), engines, [throttling(cg) for cg in cgroups], times.user + times.system, machine_busy_s()
    )


@dataclass
class Sampler:
    """A snapshot every second on a thread, so a phase's window can be cut after it ran."""

    cgroups: list[Path]
    taken: list[Snapshot] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            self.taken.append(snapshot(self.cgroups))
            if self._stop.wait(1.0):
                return

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, t0: float, t1: float) -> tuple[Snapshot, Snapshot]:
        inside = [s for s in self.taken if t0 <= s.t <= t1]
        if len(inside) < 2:
            raise RuntimeError(f"fewer than two snapshots between {t0:.1f} and {t1:.1f}")
        return inside[0], inside[-1]


def usage(a: Snapshot, b: Snapshot) -> dict[str, Any]:
    """Cores used between two snapshots: per engine by process name, throttled share, client, machine."""
    dt = b.t - a.t
    engines = []
    for before, after, (p0, n0), (p1, n1) in zip(a.engines, b.engines, a.periods, b.periods, strict=True):
        cores = {name: round((after[name] - before.get(name, 0.0)) / dt, 3) for name in sorted(after)}
        periods = p1 - p0
        engines.append({"cores": cores, "throttled_share": round((n1 - n0) / periods, 3) if periods else None})
    return {
        "seconds": round(dt, 1),
        "engines": engines,
        "client_cores": round((b.client_s - a.client_s) / dt, 3),
        "machine_cores": round((b.machine_s - a.machine_s) / dt, 3),
    }


def completions(result: LoadResult, url: str) -> list[float]:
    return [r.sent + r.e2e_s for r in result.records if r.url == url and r.complete and r.e2e_s is not None]


def run_each(urls: list[str], arrivals: list[Arrival], model: str) -> tuple[list[LoadResult], float]:
    """The same arrivals to every engine at once, each engine its own load; the wall clock they began."""

    async def each() -> list[LoadResult]:
        return list(await asyncio.gather(*(run_load([u], arrivals, model, timeout_s=900) for u in urls)))

    started = time.monotonic()
    return asyncio.run(each()), started


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="a JSON file")
    ap.add_argument("--fractions", default="0.6,0.8,1.0,1.2", help="steady rates, as fractions of the burst rate")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals per steady phase")
    ap.add_argument("--skip", type=float, default=15.0, help="seconds of each steady phase left out of its rate")
    args = ap.parse_args()
    urls = os.environ["KLS_ENGINE_URLS"].split(",")
    cgroups = [Path(p) for p in os.environ["KLS_ENGINE_CGROUPS"].split(",")]
    model = os.environ["KLS_ENGINE_MODEL"]
    max_num_seqs = int(os.environ["KLS_ENGINE_MAX_NUM_SEQS"])
    mix = [(min(r.prompt, MAX_PROMPT), min(r.output, MAX_OUTPUT)) for r in load_trace(BUNDLED_TRACE)[:4000]]
    phases: list[dict[str, Any]] = []
    with Sampler(cgroups) as sampler:
        time.sleep(5.0)
        idle = usage(*sampler.between(0.0, time.monotonic()))
        phases.append({"phase": "idle", **idle})
        burst = [Arrival(0.0, p, o) for p, o in random.Random(SEED).sample(mix, BURST_BATCHES * max_num_seqs)]
        results, started = run_each(urls, burst, model)
        rates = [burst_throughput(completions(r, u)) for r, u in zip(results, urls, strict=True)]
        burst_rate = sum(rates) / len(rates)
        phases.append({"phase": "burst", "rate": None, "served_rps": rates,
                       **usage(*sampler.between(started, time.monotonic()))})  # fmt: skip
        print(f"burst: {len(burst)} requests to each engine at once, served {rates} req/s", file=sys.stderr)
        for i, fraction in enumerate(float(x) for x in args.fractions.split(",")):
            rate = fraction * burst_rate
            arrivals = poisson_arrivals(rate, args.duration, 0, 0, seed=SEED + i, mix=mix)
            results, started = run_each(urls, arrivals, model)
            served = [
                sum(1 for c in completions(r, u) if args.skip <= c <= args.duration) / (args.duration - args.skip)
                for r, u in zip(results, urls, strict=True)
            ]
            window = sampler.between(started + args.skip, started + args.duration)
            phases.append({"phase": f"steady {fraction:g} x burst", "rate": rate, "served_rps": served,
                           **usage(*window)})  # fmt: skip
            print(f"steady {fraction:g} x burst ({rate:.2f} req/s per engine): served {served} req/s",
                  file=sys.stderr)  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"burst_rps": burst_rate, "phases": phases}, indent=2) + "\n")
    print(table(phases))
    return 0


def table(phases: list[dict[str, Any]]) -> str:
    names = sorted({n for p in phases for e in p["engines"] for n in e["cores"]})
    head = ["phase", "req/s sent per engine", "served per engine", *[f"{n} cores" for n in names],
            "throttled", "client cores", "machine cores"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in phases:
        engines = p["engines"]
        per_name = [sum(e["cores"].get(n, 0.0) for e in engines) / len(engines) for n in names]
        throttled = [e["throttled_share"] for e in engines if e["throttled_share"] is not None]
        served = p.get("served_rps")
        cells = [
            p["phase"],
            "—" if p.get("rate") is None else f"{p['rate']:.2f}",
            "—" if not served else f"{sum(served) / len(served):.2f}",
            *[f"{c:.2f}" for c in per_name],
            f"{sum(throttled) / len(throttled):.0%}" if throttled else "—",
            f"{p['client_cores']:.2f}",
            f"{p['machine_cores']:.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
