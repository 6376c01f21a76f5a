#!/usr/bin/env python3
"""The simulator against real vLLM engines: calibrate a profile on a running engine, then run the same
open-loop arrivals on the real engines and through the simulator (a static fleet of the same size, the
same least-in-flight routing), at three loads (below, at and above the knee), and compare attainment,
TTFT p50/p95 and inter-token latency. Run inside ``scripts/engine run``:

    scripts/engine run 3 --cpus 0.5 --max-num-seqs 16 -- \
        python benchmarks/sim_to_real.py --fleets 1,3 --duration 90 --out docs/sim-to-real/a
    scripts/engine run 2 --cpus 0.75 --max-num-seqs 8 --layers 8 -- \
        python benchmarks/sim_to_real.py --out docs/sim-to-real/b

The knee is one real engine's capacity at the SLO (TTFT 1 s for 95 %), measured by a rate sweep with the
same token mix; loads are 0.5, 0.9 and 1.3 of it per engine. The simulator's own knee for the calibrated
profile is reported beside it. Each load runs ``--duration`` seconds of Poisson arrivals of the conversation
trace's token mix, clamped to 512-token prompts and 128-token outputs (what these small engines serve).

The engines of a run share this machine's cores, caches and memory bandwidth, which a CPU quota does not
divide (``engines_side_by_side.py`` measures what a busy neighbour costs; on this machine it read -13 %
and +8 % on two runs). The reported loads run every engine at once, so the calibration and the knee sweep
do too: every other engine runs the same calibration in its own process while engine 0's is read
(``neighbour-N.json``: their fits, the engine-to-engine spread), and each sweep point loads every engine.
``--alone`` calibrates and sweeps engine 0 with its neighbours idle, as runs before 2026-12-05 did.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from keda_llm_scaler.enginelab.calibrate import (
    OVERLOAD_SECONDS,
    OVERLOAD_SEED,
    OVERLOAD_WINDOW,
    SERVING_SECONDS,
    SERVING_SEED,
    Fit,
    _mean_delta_ms,
    _scrape,
    calibrate,
    scaled,
    serving_mix,
    serving_overhead_ms,
    serving_scales,
    simulated_throughput,
    steady_scale,
    write_profile,
)
from keda_llm_scaler.enginelab.loadgen import Arrival, run_load, summarize
from keda_llm_scaler.enginelab.sweep import burst_throughput, poisson_arrivals
from keda_llm_scaler.enginelab.sweep import capacity_at_slo as real_capacity_at_slo
from keda_llm_scaler.sim.profiles import get_profile, load_profile
from keda_llm_scaler.sim.run import RunConfig, capacity_at_slo, percentile, simulate
from keda_llm_scaler.sim.trace import BUNDLED_TRACE, TraceRequest, load_trace

SLO_S = 1.0
LOADS = (0.5, 0.9, 1.3)
MAX_PROMPT, MAX_OUTPUT = 512, 128
DRAIN_BATCHES = 4  # the drain check: this many x max_num_seqs requests of the loads' mix to each engine at once
DRAIN_SEED = 17


def _say(msg: str) -> None:
    print(f"sim-to-real: {msg}", file=sys.stderr, flush=True)


def _calibrate_in_fleet(urls: list[str], model: str, out: Path) -> Fit:
    """Engine 0's fit, read while every other engine runs the same calibration in its own process (the
    phases line up: the same probes, on engines of the same configuration). Each neighbour is stopped by
    its id if it outlives engine 0's calibration by more than two minutes."""
    neighbours = []
    for i, url in enumerate(urls[1:], start=1):
        log = (out / f"neighbour-{i}.log").open("w")
        argv = [sys.executable, "-m", "keda_llm_scaler", "calibrate", "--url", url, "--model", model,
                "--out", str(out / f"neighbour-{i}.json")]  # fmt: skip
        neighbours.append((subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT), log))
    try:
        return calibrate(urls[0], model)
    finally:
        for proc, log in neighbours:
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
            if proc.returncode != 0:  # its engine was then not busy throughout: the run should say so
                _say(f"a neighbour's calibration ended with {proc.returncode}: see {log.name}")


def _drain_shapes(mix: list[tuple[int, int]], max_num_seqs: int) -> list[tuple[int, int]]:
    return random.Random(DRAIN_SEED).sample(mix, DRAIN_BATCHES * max_num_seqs)


def _drain(urls: list[str], model: str, profile_path: Path, mix: list[tuple[int, int]]) -> dict[str, Any]:
    """How fast a saturated engine drains the loads' mix: the same burst to every engine at once, each
    one's completion rate from its first completion to its last, against the simulator's for the same
    burst. Past the knee the queue drains at this rate: a simulator that drains faster holds more
    requests within the SLO there than the engines do."""
    profile = get_profile(str(profile_path))
    shapes = _drain_shapes(mix, profile.max_num_seqs)
    real = _burst_rates(urls, model, shapes)
    return {"requests": len(shapes), "real_rps": real, "sim_rps": simulated_throughput(profile, shapes)}


def _burst_rates(urls: list[str], model: str, shapes: list[tuple[int, int]]) -> list[float]:
    """``shapes`` sent at once to every engine at once: each engine's completion rate from its first
    completion to its last."""
    burst = [Arrival(0.0, p, o) for p, o in shapes]

    async def each() -> list[Any]:
        return list(await asyncio.gather(*(run_load([u], burst, model, timeout_s=900) for u in urls)))

    return [
        burst_throughput([r.sent + r.e2e_s for r in res.records if r.error is None and r.e2e_s is not None])
        for res in asyncio.run(each())
    ]


def _speed_check(urls: list[str], model: str, max_num_seqs: int, mix: list[tuple[int, int]], at: str) -> dict[str, Any]:
    """The drain burst's real rate on every engine at one point of the run. Repeated at each step, it shows
    how far the engines' own speed moved between the calibration, the knee sweep and the loads: where it
    moved more than the goal's tolerance, no calibration taken once can be within it at every load."""
    rates = _burst_rates(urls, model, _drain_shapes(mix, max_num_seqs))
    _say(f"speed check {at}: the drain burst at {', '.join(f'{x:.2f}' for x in rates)} req/s")
    return {"at": at, "real_rps": rates}


def _real(urls: list[str], model: str, arrivals: list[Arrival]) -> dict[str, Any]:
    before = _fleet_histograms(urls)
    result = asyncio.run(run_load(urls, arrivals, model, timeout_s=900))
    after = _fleet_histograms(urls)
    s = summarize(result, SLO_S)
    per_request_itl = [statistics.fmean(r.itl_s) for r in result.records if r.error is None and r.itl_s]
    ttfts = [r.ttft_s for r in result.records if r.error is None and r.ttft_s is not None]

    return {
        "attainment": s["slo_attainment"],
        "ttft_p50_s": s["ttft_p50_s"],
        "ttft_p95_s": s["ttft_p95_s"],
        "itl_p50_s": percentile(per_request_itl, 0.5),
        "failed": s["failed"],
        "requests": s["requests"],
        # where a TTFT goes: the engines' own queue and prefill means, and the client's mean beside them
        # (what is left is outside the engine core: the API server and the client)
        "ttft_mean_ms": round(1000 * statistics.fmean(ttfts), 2) if ttfts else None,
        "engine_queue_ms": _mean_delta_ms(before, after, "vllm:request_queue_time_seconds"),
        "engine_prefill_ms": _mean_delta_ms(before, after, "vllm:request_prefill_time_seconds"),
        "engine_itl_ms": _mean_delta_ms(before, after, "vllm:inter_token_latency_seconds"),
    }


def _fleet_histograms(urls: list[str]) -> dict[str, Any]:
    """Every engine's histogram sums and counts, added up: the fleet's means over a load."""
    hist: dict[str, float] = {}
    for url in urls:
        for name, value in _scrape(url)["hist"].items():
            hist[name] = hist.get(name, 0.0) + value
    return {"hist": hist}


def _sim(profile: str, n: int, arrivals: list[Arrival]) -> dict[str, Any]:
    reqs = [TraceRequest(a.t, a.prompt_tokens, a.output_tokens) for a in arrivals]
    cfg = RunConfig(
        policy="static", knob=float(n), profile=profile, slo_ttft_s=SLO_S, min_replicas=n, max_replicas=n,
        initial_replicas=n, routing="least-loaded", keep_requests=True,
    )  # fmt: skip
    run = simulate(reqs, cfg)
    # the engine's first token, for its inter-token latency: the idle point off (with an overhead by answers
    # streaming a first token came up to some 50 ms later, under 0.5 ms a token over these outputs)
    overhead = get_profile(profile).first_token_overhead_ms(0) / 1000.0
    done = [r for r in run.requests if r.first_token_at is not None]
    ttfts = [r.first_token_at - r.arrival for r in done]  # type: ignore[operator]
    itl = [
        (r.finished_at - (r.first_token_at - overhead)) / (r.output - 1)
        for r in done
        if r.finished_at is not None and r.output > 1
    ]
    return {
        "attainment": sum(1 for t in ttfts if t <= SLO_S) / len(reqs),
        "ttft_p50_s": percentile(ttfts, 0.5),
        "ttft_p95_s": percentile(ttfts, 0.95),
        "itl_p50_s": percentile(itl, 0.5),
        "requests": len(reqs),
        "ttft_mean_ms": round(1000 * statistics.fmean(ttfts), 2) if ttfts else None,
    }


STEP_FIELDS = ("c_ms", "d_ms", "e_ms", "b_ms", "f_ms", "g_ms", "ttft_overhead_ms")


def speed_check_before(result: dict[str, Any], row: dict[str, Any]) -> float | None:
    """The engines' mean drain-burst rate in the speed check just before ``row``'s load (None on runs
    without one)."""
    at = f"before {row['engines']} x {row['load']:.1f} x knee"
    rates = [x for c in result.get("speed", []) if c["at"] == at for x in c["real_rps"] if x > 0]
    return statistics.fmean(rates) if rates else None


def at_speed(profile_path: Path, real_rps: float, mix: list[tuple[int, int]], out: Path) -> tuple[Path, float]:
    """The calibrated profile with every step time and the API server's time multiplied by one factor, so
    that it drains the speed check's burst at ``real_rps``: the engines' speed at the moment of a load,
    known. No calibration taken once can know it, so this is a bound, not a fit. It separates what the
    model gets wrong (how latency and the queue grow with load at a given speed) from how far the machine
    moved the engines' speed since calibrate. Returns the profile's path and the factor."""
    data = json.loads(profile_path.read_text())
    data.pop("fit_points", None)
    shapes = _drain_shapes(mix, get_profile(str(profile_path)).max_num_seqs)
    k = simulated_throughput(get_profile(str(profile_path)), shapes) / real_rps
    for field in STEP_FIELDS:
        if field in data:
            data[field] = data[field] * k
    if "ttft_overhead_by_streams" in data:
        data["ttft_overhead_by_streams"] = [[n, ms * k] for n, ms in data["ttft_overhead_by_streams"]]
    out.write_text(json.dumps(data, indent=2) + "\n")
    return out, k


def add_at_speed(result: dict[str, Any], profile_path: Path, mix: list[tuple[int, int]], rows: list[Any]) -> None:
    """Each row's ``sim_at_speed``: its arrivals through the profile held to the speed check before it
    (``at_speed``), on runs that have speed checks. ``rows`` pairs each row with its arrivals."""
    for row, arrivals in rows:
        real_rps = speed_check_before(result, row)
        if real_rps is None:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            path, k = at_speed(profile_path, real_rps, mix, Path(tmp) / "profile.json")
            row["sim_at_speed"] = {**_sim(str(path), row["engines"], arrivals), "step_factor": round(k, 4)}


GOAL_POINTS = 5.0  # the fidelity goal: attainment within this many points of the engines'
GOAL_TTFT_ERROR = 0.25  # and TTFT p50 within this fraction of theirs


def speed_band(result: dict[str, Any]) -> tuple[float, float] | None:
    """The slowest and fastest the engines were through a run: the lowest and highest of its speed checks
    (each check the mean of its engines' drain-burst rates, req/s per engine). None on runs without two."""
    means = [statistics.fmean(rates) for c in result.get("speed", []) if (rates := [x for x in c["real_rps"] if x > 0])]
    return (min(means), max(means)) if len(means) >= 2 else None


def within_band(real: dict[str, Any], band: tuple[dict[str, Any], dict[str, Any]]) -> dict[str, bool]:
    """Whether a real run's attainment and TTFT p50 fall within what the simulator gives over the engines'
    speed band, widened by the goal's tolerance: what a profile taken once can promise where the engines'
    own speed moves through a run."""
    attainments = [s["attainment"] for s in band]
    ttfts = [s["ttft_p50_s"] for s in band]
    low_a, high_a = min(attainments) - GOAL_POINTS / 100, max(attainments) + GOAL_POINTS / 100
    low_t, high_t = min(ttfts) * (1 - GOAL_TTFT_ERROR), max(ttfts) * (1 + GOAL_TTFT_ERROR)
    return {
        "attainment": low_a <= real["attainment"] <= high_a,
        "ttft_p50": low_t <= real["ttft_p50_s"] <= high_t,
    }


def add_speed_band(result: dict[str, Any], profile_path: Path, mix: list[tuple[int, int]], rows: list[Any]) -> None:
    """Each row's ``sim_band``: its arrivals through the profile held to the slowest and to the fastest
    speed the engines showed through the run (``speed_band``, ``at_speed``), and ``within_band`` for each
    of the engines' runs of it. Past the knee, where arrivals and the engines' sustained rate are within a
    few percent, a percent of speed moves attainment by several points, and the engines' speed moves by
    more than that within one run: the band is what a calibration taken once can be held to there."""
    band = speed_band(result)
    if band is None:
        return
    for row, arrivals in rows:
        ends = []
        for rps in band:
            with tempfile.TemporaryDirectory() as tmp:
                path, k = at_speed(profile_path, rps, mix, Path(tmp) / "profile.json")
                ends.append({**_sim(str(path), row["engines"], arrivals), "rps": rps, "step_factor": round(k, 4)})
        row["sim_band"] = {"slow": ends[0], "fast": ends[1]}
        row["within_band"] = [within_band(r, (ends[0], ends[1])) for r in row.get("real_repeats", [row["real"]])]


def plot_bands(runs: dict[str, dict[str, Any]], path: Path) -> None:
    """One PNG of recorded runs' ``sim_band``s: per load (columns), attainment (top) and TTFT p50 (bottom,
    log) for each run, the band as a bar from its slow end to its fast one, the calibrated simulator as a
    cross and each of the engines' runs as a dot. Rows without a band are left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(LOADS), figsize=(4.2 * len(LOADS), 7), sharex=True, squeeze=False)
    names = list(runs)
    for col, load in enumerate(LOADS):
        top, bottom = axes[0][col], axes[1][col]
        for x, name in enumerate(names):
            for row in runs[name]["rows"]:
                if abs(row["load"] - load) > 1e-9 or "sim_band" not in row:
                    continue
                ends = (row["sim_band"]["slow"], row["sim_band"]["fast"])
                reals = row.get("real_repeats", [row["real"]])
                for ax, key, scale in ((top, "attainment", 100.0), (bottom, "ttft_p50_s", 1.0)):
                    low, high = sorted(scale * e[key] for e in ends)
                    ax.plot([x, x], [low, high], color="#bbbbbb", linewidth=9, solid_capstyle="butt")
                    ax.plot([x], [scale * row["sim"][key]], "x", color="#d62728", markersize=9)
                    ax.plot([x] * len(reals), [scale * r[key] for r in reals], "o", color="#1f77b4")
        top.set_title(f"{load:.1f} x knee")
        top.set_ylim(-3, 103)
        bottom.set_yscale("log")
        bottom.set_xticks(range(len(names)), names)
        bottom.set_xlim(-0.6, len(names) - 0.4)
    axes[0][0].set_ylabel("attainment, % within TTFT 1 s")
    axes[1][0].set_ylabel("TTFT p50, s")
    handles = [
        plt.Line2D([], [], color="#bbbbbb", linewidth=9, label="simulator over the engines' speed band"),
        plt.Line2D([], [], color="#d62728", marker="x", linestyle="", label="simulator as calibrated"),
        plt.Line2D([], [], color="#1f77b4", marker="o", linestyle="", label="the engines (each run)"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=3, frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def loads_mix() -> list[tuple[int, int]]:
    """The loads' token mix: the bundled conversation trace clamped to ``MAX_PROMPT`` / ``MAX_OUTPUT``."""
    return [(min(r.prompt, MAX_PROMPT), min(r.output, MAX_OUTPUT)) for r in load_trace(BUNDLED_TRACE)[:4000]]


def load_arrivals(rate: float, duration_s: float, engines: int, i: int, mix: list[tuple[int, int]]) -> list[Arrival]:
    """The arrivals of a fleet of ``engines``' ``i``-th load: the seed rule every rebuild of a run uses."""
    return poisson_arrivals(rate, duration_s, 0, 0, seed=100 * engines + i, mix=mix)


def recorded_loads(
    result: dict[str, Any], duration_s: float, mix: list[tuple[int, int]]
) -> list[tuple[dict[str, Any], list[Arrival]]]:
    """Each row of a recorded run's ``results.json`` with its arrivals rebuilt (loads counted per fleet size)."""
    by_fleet: dict[int, int] = {}
    out = []
    for row in result["rows"]:
        n = row["engines"]
        i = by_fleet.get(n, 0)
        by_fleet[n] = i + 1
        out.append((row, load_arrivals(row["rate"], duration_s, n, i, mix)))
    return out


def resimulate(run: Path, out: Path, duration_s: float, *, steady: bool = True) -> dict[str, Any]:
    """The simulator's side of a recorded run again, with calibrate's current rule: the fitted profile
    before its serving and steady scales (the recorded coefficients over the recorded factors), scaled again
    from the recorded serving phase and, on runs since 2026-12-05 that have one, the steady-overload phase
    (their arrivals are rebuilt from their rates and seeds), and each load's arrivals (rebuilt from their
    seed) replayed through it. The real engines' rows are the recorded ones. ``steady=False`` leaves the
    steady-overload phase out: what the rule before it gives on the same run."""
    recorded = json.loads((run / "profile.json").read_text())
    points = recorded["fit_points"]
    serving = points["serving"]
    k_s = points.get("steady_scale", 1.0)
    k_d, k_p = k_s * points["step_scale"], k_s * points.get("prefill_scale", points["step_scale"])
    fitted = dataclasses.replace(
        load_profile(run / "profile.json"), c_ms=recorded["c_ms"] / k_d, d_ms=recorded["d_ms"] / k_d,
        e_ms=recorded["e_ms"] / k_d, b_ms=recorded["b_ms"] / k_p, f_ms=recorded["f_ms"] / k_p, g_ms=0.0,
    )  # fmt: skip
    arrivals = poisson_arrivals(serving["rate"], SERVING_SECONDS, 0, 0, seed=SERVING_SEED, mix=serving_mix())
    scales = serving_scales(fitted, arrivals, serving["engine_itl_ms"], serving.get("engine_prefill_ms"))
    served = scales.apply(fitted)
    k_steady = 1.0
    if "steady" in points and steady:
        phase = points["steady"]
        overload = poisson_arrivals(phase["rate"], OVERLOAD_SECONDS, 0, 0, seed=OVERLOAD_SEED, mix=serving_mix())
        assert len(overload) == phase["requests"], "the recorded run's overload arrivals were not these"
        k_steady = steady_scale(served, overload, OVERLOAD_WINDOW, phase["engine_rps"])
    _say(
        f"{run}: decode steps x {scales.k_decode:.3f}, prefill x {scales.k_prefill:.3f}, "
        f"g {scales.g_ms * 1000:.3f} us, every step x {k_steady:.3f} (recorded: x {points['step_scale']:.3f}, "
        f"x {points.get('prefill_scale', points['step_scale']):.3f}, every step x {k_s:.3f})"
    )
    final = scaled(served, k_steady, k_steady, served.g_ms * k_steady)
    profile = {
        **{k: v for k, v in recorded.items() if k != "fit_points"},
        "c_ms": round(final.c_ms, 4), "d_ms": round(final.d_ms, 5), "e_ms": round(final.e_ms, 5),
        "b_ms": round(final.b_ms, 6), "f_ms": float(f"{final.f_ms:.4g}"), "g_ms": float(f"{final.g_ms:.4g}"),
    }  # fmt: skip
    # runs since 2026-12-06 (evening) recorded the serving phase's client TTFT: the overhead is fitted on it
    # again; older runs keep the overhead they were made with
    overhead = serving_overhead_ms(final, arrivals, serving.get("client_ttft_mean_ms"))
    if overhead is not None:
        profile["ttft_overhead_ms"] = round(overhead, 3)
        profile.pop("ttft_overhead_by_streams", None)
    out.mkdir(parents=True, exist_ok=True)
    profile_path = out / "profile.json"
    fit_points = {
        **points, "step_scale": scales.k_decode, "prefill_scale": scales.k_prefill,
        "prefill_decode_g_ms": scales.g_ms, "steady_scale": k_steady, "resimulated_from": str(run),
    }  # fmt: skip
    profile_path.write_text(json.dumps({**profile, "fit_points": fit_points}, indent=2) + "\n")
    result: dict[str, Any] = json.loads((run / "results.json").read_text())
    mix = loads_mix()
    result["profile"] = profile
    result["sim_knee_rps"] = capacity_at_slo(get_profile(str(profile_path)), tuple(mix), SLO_S)
    for row, loads in recorded_loads(result, duration_s, mix):
        assert len(loads) == row["real"]["requests"], "the recorded run's arrivals were not these"
        row["sim"] = _sim(str(profile_path), row["engines"], loads)
    loads = recorded_loads(result, duration_s, mix)
    add_at_speed(result, profile_path, mix, loads)
    add_speed_band(result, profile_path, mix, loads)
    if "drain" in result:  # runs since 2026-12-05
        shapes = _drain_shapes(mix, get_profile(str(profile_path)).max_num_seqs)
        assert len(shapes) == result["drain"]["requests"], "the recorded run's burst was not this"
        result["drain"]["sim_rps"] = simulated_throughput(get_profile(str(profile_path)), shapes)
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="a directory: profile.json, results.json")
    ap.add_argument("--duration", type=float, default=120.0, help="seconds of arrivals per load (default 120)")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run each load this many times on the real engines (the same arrivals): their spread is the "
        "fidelity no simulator can beat (default 1)",
    )
    ap.add_argument(
        "--fleets",
        default=None,
        help="fleet sizes to compare, comma-separated (default: every engine of the run), e.g. 1,3",
    )
    ap.add_argument(
        "--resimulate",
        type=Path,
        default=None,
        metavar="RUN",
        help="no engines: replay a recorded run's directory through the simulator with calibrate's current "
        "rule (its serving phase refitted), into --out (use the run's --duration)",
    )
    ap.add_argument(
        "--plot-bands",
        type=Path,
        nargs="+",
        default=None,
        metavar="RUN",
        help="no engines: draw recorded runs' speed bands (results.json with sim_band) into --out/bands.png",
    )
    ap.add_argument(
        "--no-steady",
        action="store_true",
        help="with --resimulate: leave calibrate's steady-overload phase out (the rule before it)",
    )
    ap.add_argument(
        "--alone",
        action="store_true",
        help="calibrate and sweep engine 0 with the other engines idle (default: every engine at once, as the "
        "loads run them)",
    )
    args = ap.parse_args()
    if args.plot_bands:
        runs = {run.name: json.loads((run / "results.json").read_text()) for run in args.plot_bands}
        args.out.mkdir(parents=True, exist_ok=True)
        plot_bands(runs, args.out / "bands.png")
        _say(f"wrote {args.out / 'bands.png'}")
        return 0
    if args.resimulate is not None:
        print(table(resimulate(args.resimulate, args.out, args.duration, steady=not args.no_steady)))
        return 0
    urls = os.environ["KLS_ENGINE_URLS"].split(",")
    model = os.environ["KLS_ENGINE_MODEL"]
    config = {k: os.environ.get(f"KLS_ENGINE_{k.upper()}") for k in ("cpus", "max_num_seqs", "layers")}
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    fit = calibrate(urls[0], model) if args.alone else _calibrate_in_fleet(urls, model, args.out)
    profile_path = args.out / "profile.json"
    ready = os.environ.get("KLS_ENGINE_READY_SECONDS", "60").split(",")
    profile = write_profile(
        fit,
        profile_path,
        name=f"cpu-{config['layers']}l-{config['cpus']}cpu-{config['max_num_seqs']}seqs",
        description=f"tiny Llama, {config['layers']} layers, {config['cpus']} CPU, {config['max_num_seqs']} seqs",
        cold_start_s=round(statistics.fmean(float(x) for x in ready), 1),
    )
    _say(f"calibrated in {time.monotonic() - t0:.0f} s: {profile}")
    mix = loads_mix()
    calibrated = get_profile(str(profile_path))
    seqs = calibrated.max_num_seqs
    speed = [_speed_check(urls, model, seqs, mix, "after calibrate")]
    sim_knee = capacity_at_slo(calibrated, tuple(mix), SLO_S)
    _say(f"simulated capacity at the SLO: {sim_knee:.2f} req/s per engine")
    # the loads are set from the real engine's knee (a sweep with the same mix, of every engine at once
    # unless --alone: each point's rate is per engine)
    swept = urls[:1] if args.alone else urls
    knee, points = real_capacity_at_slo(swept, model, slo_s=SLO_S, prompt=0, output=0, mix=mix, bisections=2)
    _say(f"real capacity at the SLO: {knee:.2f} req/s per engine")
    rows: list[dict[str, Any]] = []
    loads: list[tuple[dict[str, Any], list[Arrival]]] = []
    fleets = [int(n) for n in args.fleets.split(",")] if args.fleets else [len(urls)]
    if any(not 1 <= n <= len(urls) for n in fleets):
        ap.error(f"--fleets: each size must be 1..{len(urls)} (the engines of this run)")
    for n in fleets:
        for i, share in enumerate(LOADS):
            rate = share * knee * n
            speed.append(_speed_check(urls, model, seqs, mix, f"before {n} x {share:.1f} x knee"))
            arrivals = load_arrivals(rate, args.duration, n, i, mix)
            runs = [_real(urls[:n], model, arrivals) for _ in range(max(1, args.repeat))]
            sim = _sim(str(profile_path), n, arrivals)
            row = {"load": share, "rate": rate, "engines": n, "real": runs[0], "sim": sim}
            if len(runs) > 1:
                row["real_repeats"] = runs
            rows.append(row)
            loads.append((row, arrivals))
            _say(json.dumps(row))
    drain = _drain(urls, model, profile_path, mix)
    _say(f"drain: {json.dumps(drain)}")
    result = {
        "config": config,
        "calibrated": "alone" if args.alone else f"beside {len(urls) - 1} neighbours calibrating",
        "profile": profile,
        "knee_rps": knee,
        "sim_knee_rps": sim_knee,
        "sweep": [(p.rate, p.attainment) for p in points],
        "slo_s": SLO_S,
        "rows": rows,
        "drain": drain,
        "speed": [*speed, {"at": "at the end (the drain)", "real_rps": drain["real_rps"]}],
    }
    add_at_speed(result, profile_path, mix, loads)
    add_speed_band(result, profile_path, mix, loads)
    (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    return 0


def table(result: dict[str, Any]) -> str:
    head = "| engines | load | req/s | attainment real / sim (points) | TTFT p50 s real / sim (error) |"
    head += " TTFT p95 s real / sim | ITL p50 ms real / sim | real again: attainment, TTFT p50 |"
    head += " sim at the engines' speed (bound): attainment, TTFT p50 |"
    head += " sim over the engines' speed band, slowest to fastest: attainment, TTFT p50 (real inside?) |"
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        r, s = row["real"], row["sim"]
        err = (s["ttft_p50_s"] - r["ttft_p50_s"]) / r["ttft_p50_s"] if r["ttft_p50_s"] else float("nan")
        lines.append(
            f"| {row['engines']} | {row['load']:.1f} x knee | {row['rate']:.2f} | "
            f"{100 * r['attainment']:.1f} / {100 * s['attainment']:.1f} "
            f"({100 * (s['attainment'] - r['attainment']):+.1f}) | {r['ttft_p50_s']:.3f} / {s['ttft_p50_s']:.3f} "
            f"({100 * err:+.0f} %) | {r['ttft_p95_s']:.2f} / {s['ttft_p95_s']:.2f} | "
            f"{1000 * (r['itl_p50_s'] or 0):.1f} / {1000 * (s['itl_p50_s'] or 0):.1f} | "
            + (
                "; ".join(
                    f"{100 * x['attainment']:.1f} % ({100 * (x['attainment'] - r['attainment']):+.1f}), "
                    f"{x['ttft_p50_s']:.3f} s ({100 * (x['ttft_p50_s'] - r['ttft_p50_s']) / r['ttft_p50_s']:+.0f} %)"
                    for x in row.get("real_repeats", [])[1:]
                )
                or "—"
            )
            + " | "
            + (
                f"{100 * a['attainment']:.1f} % ({100 * (a['attainment'] - r['attainment']):+.1f}), "
                f"{a['ttft_p50_s']:.3f} s ({100 * (a['ttft_p50_s'] - r['ttft_p50_s']) / r['ttft_p50_s']:+.0f} %), "
                f"steps x {a['step_factor']:.2f}"
                if (a := row.get("sim_at_speed"))
                else "—"
            )
            + " | "
            + (_band_cell(row) if "sim_band" in row else "—")
            + " |"
        )
    if "drain" in result:
        d = result["drain"]
        lines.append(
            f"\nA saturated engine draining {d['requests']} requests of the loads' mix sent at once (every engine "
            f"at once): real {', '.join(f'{x:.2f}' for x in d['real_rps'])} req/s, simulated {d['sim_rps']:.2f}."
        )
    if "speed" in result:  # runs since 2026-12-05, late
        checks = result["speed"]
        means = [statistics.fmean(c["real_rps"]) for c in checks if c["real_rps"]]
        lines.append(
            "\nThe engines' own speed through the run (the drain burst, req/s per engine): "
            + "; ".join(f"{c['at']} {', '.join(f'{x:.2f}' for x in c['real_rps'])}" for c in checks)
            + (f". The mean moved {100 * (max(means) / min(means) - 1):.0f} % from its slowest." if means else ".")
        )
    return "\n".join(lines)


def _band_cell(row: dict[str, Any]) -> str:
    """The band's two ends, and for each of the engines' runs whether it fell inside (or what did not)."""
    slow, fast = row["sim_band"]["slow"], row["sim_band"]["fast"]
    inside = "; ".join(
        "yes" if all(w.values()) else ", ".join(f"{name} outside" for name, ok in w.items() if not ok)
        for w in row["within_band"]
    )
    return (
        f"{100 * slow['attainment']:.1f} to {100 * fast['attainment']:.1f} %, "
        f"{slow['ttft_p50_s']:.3f} to {fast['ttft_p50_s']:.3f} s ({inside})"
    )


if __name__ == "__main__":
    sys.exit(main())
