#!/usr/bin/env python3
"""Which pods a scale-down removes: the ReplicaSet's own semi-random choice (``--victims random``) against
the scaler's pod-deletion-cost ranking (``--victims ranked``), in streams cut and tokens lost per scale-down.

    python benchmarks/victims.py --out docs/scale-down        # ~8 min on 2 cores
    python benchmarks/victims.py --routing random --day-seeds '' --out /tmp/v   # ClusterIP routing, hour only

Each run is a ``keda-llm-scaler replay`` command (printed in victims.json): the default composite policy,
70B on 4xH100, 2 s TTFT SLO, least-loaded routing, the README's ``llm`` HPA behavior (the one the README's
ScaledObject sets and docs/replay.md's headline figures use), on

* the bundled conversation hour x12 of the README's figures (``--trace conv --rate-scale 12``), seeds
  0, 1 and 2 (the seed moves cold starts, pod UIDs and so the ReplicaSet's tie-breaks, and the capacity
  estimate);
* the 12-hour diurnal day of docs/replay.md (ServeGen ``m-small``, hours 17-29, busiest 10-minute window
  140 req/s, conversation tokens), seed 0;

each with victims random and ranked, and a 30 s grace period (a drain: preStop + shutdown timeout, the
default) and none (SIGTERM cuts what a pod holds at once). Writes victims.json (every summary), victims.md
(the table) and victims.png.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from keda_llm_scaler.sim.fleet import ROUTINGS
from keda_llm_scaler.sim.replay import _config, _public, add_replay_arguments, describe_setup, load_workload
from keda_llm_scaler.sim.run import simulate

HOUR = ["--trace", "conv", "--rate-scale", "12"]
DAY = [
    *("--trace", "conv", "--rate-curve", "servegen", "--curve-model", "m-small"),
    *("--hours", "17:29", "--peak-rate", "140"),
]
WORKLOADS = {"conversation hour x12": HOUR, "12-hour ServeGen day": DAY}
COMMON = ["--policy", "composite", "--hpa-behavior", "llm"]
GRACES = (30.0, 0.0)
MODES = ("random", "ranked")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    add_replay_arguments(p)
    return p


def _argv(workload: str, victims: str, grace: float, seed: int, routing: str) -> list[str]:
    routed = ["--routing", routing] if routing != "least-loaded" else []
    return [*WORKLOADS[workload], *COMMON, *routed, "--victims", victims, "--grace", f"{grace:g}", "--seed", str(seed)]


def _run(job: tuple[str, str, float, int, str]) -> dict[str, Any]:
    workload_name, victims, grace, seed, routing = job
    argv = _argv(workload_name, victims, grace, seed, routing)
    args = _parser().parse_args(argv)
    start = time.perf_counter()
    workload = load_workload(args)
    summary = simulate(workload, _config(args, args.policy, args.knob)).summary
    return {
        **_public(summary, args),
        "bench_workload": workload_name,
        "grace_s": grace,
        "seed": seed,
        "command": "keda-llm-scaler replay " + " ".join(argv),
        "setup": describe_setup(args, workload),
        "wall_s": time.perf_counter() - start,
    }


def _stats(values: list[float], fmt: str) -> str:
    """The mean, and the range over seeds when they differ."""
    mean = sum(values) / len(values)
    text = format(mean, fmt)
    if format(min(values), fmt) != format(max(values), fmt):
        text += f" ({format(min(values), fmt)} to {format(max(values), fmt)})"
    return text


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| workload | grace | victims | runs | scale-down events | streams cut | per scale-down: mean / max | "
        "tokens lost | tokens lost per scale-down | victims idle | annotation writes | SLO attainment | GPU-hours |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in WORKLOADS:
        for grace in GRACES:
            for mode in MODES:
                runs = [r for r in results if (r["bench_workload"], r["grace_s"], r["victims"]) == (name, grace, mode)]
                if not runs:
                    continue

                def col(key: str, fmt: str, rs: list[dict[str, Any]] = runs) -> str:
                    return _stats([float(r[key]) for r in rs], fmt)

                idle = [r["victims_idle"] / r["victims_removed"] if r["victims_removed"] else 0.0 for r in runs]
                attainment = _stats([100 * r["slo_attainment"] for r in runs], ".2f")
                lines.append(
                    f"| {name} | {grace:g} s | {mode} | {len(runs)} | {col('scale_down_events', '.1f')} | "
                    f"{col('streams_cut', '.1f')} | {col('streams_cut_per_scale_down', '.2f')} / "
                    f"{col('streams_cut_max_per_scale_down', '.1f')} | {col('tokens_lost', ',.0f')} | "
                    f"{col('tokens_lost_per_scale_down', ',.0f')} | {_stats([100 * v for v in idle], '.0f')} % | "
                    f"{col('deletion_cost_writes', ',.0f')} | {attainment} % | {col('gpu_hours', '.1f')} |"
                )
    return "\n".join(lines) + "\n"


def per_seed(results: list[dict[str, Any]]) -> str:
    lines = [
        "| workload | grace | seed | victims | scale-downs | victims removed (idle) | streams cut | per scale-down: "
        "mean / max | tokens lost | annotation writes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(results, key=lambda r: (list(WORKLOADS).index(r["bench_workload"]), -r["grace_s"], r["seed"])):
        lines.append(
            f"| {r['bench_workload']} | {r['grace_s']:g} s | {r['seed']} | {r['victims']} | {r['scale_down_events']} | "
            f"{r['victims_removed']} ({r['victims_idle']}) | {r['streams_cut']} | "
            f"{r['streams_cut_per_scale_down']:.2f} / {r['streams_cut_max_per_scale_down']} | {r['tokens_lost']:,} | "
            f"{r['deletion_cost_writes']:,} |"
        )
    return "\n".join(lines) + "\n"


def plot(path: Path, results: list[dict[str, Any]], routing: str) -> None:
    from keda_llm_scaler.sim.plots import plot_victims

    def runs_of(name: str, grace: float, mode: str) -> list[dict[str, Any]]:
        return [r for r in results if (r["bench_workload"], r["grace_s"], r["victims"]) == (name, grace, mode)]

    groups = []
    for name in WORKLOADS:
        for grace in GRACES:
            by_mode = {mode: rs for mode in MODES if (rs := runs_of(name, grace, mode))}
            if not by_mode:
                continue
            seeds = len({r["seed"] for rs in by_mode.values() for r in rs})
            groups.append(
                {
                    "label": f"{name}\ngrace {grace:g} s" + (f" ({seeds} seeds)" if seeds > 1 else ""),
                    "runs": {
                        mode: {
                            "cut": [r["streams_cut_per_scale_down"] for r in rs],
                            "tokens": [r["tokens_lost_per_scale_down"] for r in rs],
                        }
                        for mode, rs in by_mode.items()
                    },
                }
            )
    plot_victims(
        path,
        groups,
        "Scale-down victims: random (ReplicaSet default) vs ranked (pod-deletion-cost)\n"
        f"composite policy, llm HPA behavior, 70b-h100x4, {routing} routing",
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--out", type=Path, default=Path("docs/scale-down"), help="output directory")
    p.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    p.add_argument("--seeds", default="0,1,2", help="seeds of the hour (default 0,1,2)")
    p.add_argument("--day-seeds", default="0", help="seeds of the day (default 0; '' for no day)")
    p.add_argument(
        "--routing",
        default="least-loaded",
        choices=ROUTINGS,
        help="as replay's (default least-loaded, an inference gateway; random: a ClusterIP Service)",
    )
    args = p.parse_args(argv)
    hour_seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    day_seeds = [int(s) for s in args.day_seeds.split(",") if s.strip()]
    names = list(WORKLOADS)
    # the day's runs first: they are the longest, the hour's fill the other worker
    jobs = [(names[1], m, g, s, args.routing) for s in day_seeds for g in GRACES for m in MODES]
    jobs += [(names[0], m, g, s, args.routing) for s in hour_seeds for g in GRACES for m in MODES]
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    print(f"victims: {len(jobs)} runs on {args.workers} workers", file=sys.stderr, flush=True)
    results: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        futures = {pool.submit(_run, job): job for job in jobs}
        for n, future in enumerate(as_completed(futures), start=1):
            r = future.result()
            results.append(r)
            print(
                f"victims {n}/{len(jobs)} ({time.perf_counter() - start:.0f}s): {r['bench_workload']}, grace "
                f"{r['grace_s']:g} s, seed {r['seed']}, {r['victims']}: {r['scale_down_events']} scale-downs, "
                f"{r['streams_cut']} streams cut, {r['deletion_cost_writes']} writes ({r['wall_s']:.0f}s)",
                file=sys.stderr,
                flush=True,
            )
    elapsed = time.perf_counter() - start
    results.sort(key=lambda r: (names.index(r["bench_workload"]), -r["grace_s"], r["seed"], MODES.index(r["victims"])))
    (args.out / "victims.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    seeds = "; ".join(
        f"{what} {', '.join(map(str, ss))}" for what, ss in (("the hour", hour_seeds), ("the day", day_seeds)) if ss
    )
    setups = sorted({r["setup"].replace(f"{r['victims']} victims", "random/ranked victims") for r in results})
    md = [
        "# Scale-down victims: random (the ReplicaSet alone) vs ranked (pod-deletion-cost from the scraped load)",
        "",
        f"`python benchmarks/victims.py {shlex.join(argv if argv is not None else sys.argv[1:])}` "
        f"({len(results)} runs, {elapsed / 60:.1f} min on {args.workers} workers). Setups:",
        "",
        *[f"- {s}" for s in setups],
        "",
        "Composite policy at its defaults; grace = terminationGracePeriodSeconds (30 s: the victim drains; 0 s: "
        f"it is cut at once). Seeds: {seeds}; over several seeds a cell reads mean (lowest to highest seed). "
        "A scale-down event is one change of the Deployment's replicas downward; victims idle = the share "
        "of the ready pods sent to drain that held no request when chosen. Annotation writes = "
        "pod-deletion-cost patches (a pass per 10 s while a scale-down is plausible, at most 16 a pass).",
        "",
        table(results),
        "Per run:",
        "",
        per_seed(results),
    ]
    (args.out / "victims.md").write_text("\n".join(md))
    plot(args.out / "victims.png", results, args.routing)
    print(f"wrote {args.out}/victims.json, victims.md, victims.png in {elapsed:.0f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
