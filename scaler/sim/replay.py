"""``keda-llm-scaler replay``: a trace through the simulated fleet, one policy or a sweep of all."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from scaler.sim.hpa import BEHAVIORS
from scaler.sim.policies import POLICIES
from scaler.sim.profiles import PROFILES
from scaler.sim.run import RunConfig, simulate
from scaler.sim.trace import TraceRequest, load_trace, scale_rate

__all__ = ["add_replay_arguments", "replay_main"]


def add_replay_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True, type=Path, help="CSV in the Azure format (TIMESTAMP,ContextTokens,"
                                                             "GeneratedTokens)")
    p.add_argument("--policy", default="composite", choices=list(POLICIES), help="default composite")
    p.add_argument("--knob", type=float, default=None, help="the policy's main knob (see README); default per policy")
    p.add_argument("--profile", default="70b-h100x4", choices=list(PROFILES), help="default 70b-h100x4")
    p.add_argument("--rate-scale", type=float, default=1.0,
                   help="multiply the arrival rate by overlaying copies shifted by 17 s each (default 1)")
    p.add_argument("--slo-ttft", type=float, default=2.0, help="TTFT SLO in seconds (default 2)")
    p.add_argument("--hpa-behavior", default="default", choices=list(BEHAVIORS),
                   help="default: Kubernetes' HPA defaults; llm: the README's minute-long-cold-start behavior")
    p.add_argument("--cold-start", type=float, default=None, help="mean cold start, s (default: the profile's)")
    p.add_argument("--min-replicas", type=int, default=1)
    p.add_argument("--max-replicas", type=int, default=64)
    p.add_argument("--max-queue", type=int, default=None, help="admission limit: reject (503) above this queue")
    p.add_argument("--grace", type=float, default=30.0, help="terminationGracePeriodSeconds (default 30)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object with the summary")
    p.add_argument("--plot", type=Path, default=None, help="write a PNG: load, replicas, metric, TTFT p95")
    p.add_argument("--sweep", action="store_true", help="run every policy over its knob; write a Pareto plot "
                                                        "and a Markdown table to --out-dir")
    p.add_argument("--out-dir", type=Path, default=Path("replay-sweep"), help="for --sweep (default replay-sweep)")
    p.add_argument("--target-attainment", type=float, default=0.99,
                   help="for --sweep: the attainment the table's cheapest-config column aims at (default 0.99)")
    p.add_argument("--workers", type=int, default=2, help="for --sweep: processes (default 2)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _config(args: argparse.Namespace, policy: str, knob: float | None) -> RunConfig:
    return RunConfig(policy=policy, knob=knob, profile=args.profile, slo_ttft_s=args.slo_ttft,
                     min_replicas=args.min_replicas, max_replicas=args.max_replicas, cold_start_s=args.cold_start,
                     grace_s=args.grace, max_queue=args.max_queue, hpa_behavior=args.hpa_behavior, seed=args.seed)


def _load(path: Path, scale: float, seed: int) -> list[TraceRequest]:
    trace = load_trace(path)
    return scale_rate(trace, scale, seed) if scale != 1.0 else trace


def _progress(label: str, quiet: bool) -> Callable[[float], None] | None:
    if quiet:
        return None
    tty = sys.stderr.isatty()
    last = [-1]

    def show(fraction: float) -> None:
        pct = int(fraction * 100)
        if tty:
            print(f"\r{label}: {pct:3d}%", end="", file=sys.stderr, flush=True)
        elif pct // 10 != last[0]:
            last[0] = pct // 10
            print(f"{label}: {pct}%", file=sys.stderr, flush=True)

    return show


def _public(summary: dict[str, Any], trace_name: str) -> dict[str, Any]:
    return {"trace": trace_name, **summary}


def _one(args: argparse.Namespace) -> int:
    trace = _load(args.trace, args.rate_scale, args.seed)
    start = time.perf_counter()
    result = simulate(trace, _config(args, args.policy, args.knob),
                      progress=_progress(f"replay {args.policy}", args.quiet))
    if not args.quiet:
        print(f"\rreplay {args.policy}: done in {time.perf_counter() - start:.1f}s", file=sys.stderr)
    summary = _public(result.summary, args.trace.name)
    summary["rate_scale"] = args.rate_scale
    if args.plot is not None:
        from scaler.sim.plots import plot_run  # matplotlib only when a plot is asked for

        plot_run(args.plot, summary, result.timeline)
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        s = summary
        print(f"{s['policy']} ({s['knob']}={s['knob_value']:g}) on {s['profile']}, {s['requests']} requests: "
              f"SLO attainment {s['slo_attainment']:.2%} (TTFT <= {s['slo_ttft_s']:g}s), TTFT p95 "
              f"{s['ttft_p95_s']:.2f}s, {s['gpu_hours']:.1f} GPU-h, replicas mean {s['mean_replicas']:.1f} "
              f"max {s['max_replicas']}, {s['scale_events']} scale events, {s['streams_cut']} streams cut")
    return 0


def _sweep_job(job: tuple[dict[str, Any], str, float]) -> dict[str, Any]:
    argv, policy, knob = job
    args = argparse.Namespace(**argv)
    trace = _load(args.trace, args.rate_scale, args.seed)
    return simulate(trace, _config(args, policy, knob)).summary


def _fmt(v: Any, pct: bool = False) -> str:
    if v is None:
        return "-"
    if pct:
        return f"{100 * v:.1f} %"
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def _table(results: list[dict[str, Any]], target: float) -> str:
    lines = ["| policy | knob | SLO attainment | TTFT p95 (s) | GPU-hours | mean / max replicas | scale events | "
             "streams cut |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: (list(POLICIES).index(r["policy"]), r["knob_value"])):
        lines.append(f"| {r['policy']} | {r['knob']}={r['knob_value']:g} | {_fmt(r['slo_attainment'], True)} | "
                     f"{_fmt(r['ttft_p95_s'])} | {r['gpu_hours']:.1f} | {r['mean_replicas']:.1f} / "
                     f"{r['max_replicas']} | {r['scale_events']} | {r['streams_cut']} |")
    lines += ["", f"Cheapest configuration per policy reaching {100 * target:g} % SLO attainment "
                  "(else its best attainment):", "",
              "| policy | configuration | SLO attainment | GPU-hours |", "|---|---|---|---|"]
    for policy in POLICIES:
        runs = [r for r in results if r["policy"] == policy]
        if not runs:
            continue
        meeting = [r for r in runs if r["slo_attainment"] >= target]
        best = min(meeting, key=lambda r: r["gpu_hours"]) if meeting else max(runs, key=lambda r: r["slo_attainment"])
        mark = "" if meeting else " (misses the target)"
        lines.append(f"| {policy} | {best['knob']}={best['knob_value']:g}{mark} | "
                     f"{_fmt(best['slo_attainment'], True)} | {best['gpu_hours']:.1f} |")
    return "\n".join(lines) + "\n"


def _sweep(args: argparse.Namespace) -> int:
    jobs = [(vars(args), policy, knob) for policy, (_, _, knobs) in POLICIES.items() for knob in knobs]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        futures = {pool.submit(_sweep_job, job): job for job in jobs}
        for n, future in enumerate(as_completed(futures), start=1):
            r = future.result()
            results.append(r)
            if not args.quiet:
                print(f"sweep {n}/{len(jobs)} ({time.perf_counter() - start:.0f}s): {r['policy']} "
                      f"{r['knob']}={r['knob_value']:g} -> {r['slo_attainment']:.1%}, {r['gpu_hours']:.1f} GPU-h",
                      file=sys.stderr, flush=True)
    title = (f"{args.trace.name} x{args.rate_scale:g} on {args.profile}, TTFT SLO {args.slo_ttft:g} s, "
             f"HPA behavior '{args.hpa_behavior}'")
    (args.out_dir / "sweep.json").write_text(json.dumps(
        [_public(r, args.trace.name) for r in results], indent=1, sort_keys=True) + "\n")
    (args.out_dir / "sweep.md").write_text(f"# Sweep: {title}\n\n" + _table(results, args.target_attainment))
    from scaler.sim.plots import plot_pareto

    plot_pareto(args.out_dir / "pareto.png", results, title)
    if not args.quiet:
        print(f"wrote {args.out_dir}/sweep.md, sweep.json, pareto.png", file=sys.stderr)
    if args.json:
        print(json.dumps([_public(r, args.trace.name) for r in results], sort_keys=True))
    return 0


def replay_main(args: argparse.Namespace) -> int:
    try:
        return _sweep(args) if args.sweep else _one(args)
    except (OSError, ValueError) as exc:
        print(f"keda-llm-scaler replay: {exc}", file=sys.stderr)
        return 2
