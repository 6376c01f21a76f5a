#!/usr/bin/env python3
"""Fleets of pools on 12-hour days: a reserved pool and a burst pool of another replica type (issue #32).

    python -m benchmarks.fleet_days [OUT_DIR]      # ~15 min on 2 cores; default docs/fleets

Each day: ServeGen's aggregate curve for one model over 12 hours, with the mix's tokens, scaled so its
busiest 10-minute window is PEAK_OVER_RESERVED (1.6) times what the reserved pool serves at the SLO (its
size times one replica's capacity at the 2 s TTFT SLO on that mix): the burst pool is needed at the
peaks and not at night. 2 s TTFT SLO given to the composite, the README's ``llm`` HPA behavior, seed 0,
a 900 s warm-up. The pools are the bundled files in OUT_DIR (``<day>.yaml``), with illustrative prices
per replica-hour (reserved GPUs cheaper per GPU than on-demand ones).

- ``tuning``: the day the split's rules were chosen on (keda_llm_scaler/pools.py): m-mid hours 30-33;
- ``held-out-*``: days, models, mixes and replica pairs that nothing was tuned on;
- ``covering``: the first held-out day with a reservation above the day's peak: no burst should run;
- a plan of the reservation on the first held-out day (``--plan-reserved``).

Writes OUT_DIR/days.json, OUT_DIR/plan.json, one PNG per day and the plan's, and prints the table and
the command line that reproduces each row.
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Final

from keda_llm_scaler.sim.plots import plot_plan, plot_pools
from keda_llm_scaler.sim.pools import load_pools, plan_reserved, simulate_pools
from keda_llm_scaler.sim.profiles import get_profile
from keda_llm_scaler.sim.run import RunConfig, capacity_at_slo
from keda_llm_scaler.sim.trace import BUNDLED_TRACE
from keda_llm_scaler.sim.workload import BUNDLED_CURVE, CurveWorkload

PEAK_OVER_RESERVED: Final = 1.6
WARMUP_S: Final = 900.0
TARGET: Final = 0.99
# name: (curve model, hours, mix, pools file stem, peak req/s or None: PEAK_OVER_RESERVED x the reservation)
DAYS: Final[dict[str, tuple[str, tuple[float, float], str, str, float | None]]] = {
    "tuning": ("m-mid", (30.0, 33.0), "conversation", "tuning", 60.0),
    "held-out-1": ("m-large", (0.0, 12.0), "conversation", "held-out-1", None),
    "held-out-2": ("m-small", (100.0, 112.0), "decode-heavy", "held-out-2", None),
    "held-out-3": ("m-mid", (150.0, 162.0), "prefill-heavy", "held-out-3", None),
    "covering": ("m-large", (0.0, 12.0), "conversation", "covering", None),  # held-out-1's day
}
PLAN_DAY: Final = "held-out-1"
PLAN_SIZES: Final = (3, 12)


def _peak(name: str, out: Path) -> float:
    model, hours, mix, stem, peak = DAYS[name]
    if peak is not None:
        return peak
    # the covering day keeps held-out-1's load: the same day, a larger reservation
    pools = load_pools(out / f"{'held-out-1' if name == 'covering' else stem}.yaml")
    reserved = pools[0]
    base = CurveWorkload.build(BUNDLED_CURVE, BUNDLED_TRACE, model=model, hours=hours, peak_rate=1.0, mix=mix)
    cap = capacity_at_slo(get_profile(reserved.profile), base.token_mix(4000, 0), 2.0)
    return round(PEAK_OVER_RESERVED * reserved.size * cap, 2)


def _day(name: str, peak: float) -> CurveWorkload:
    model, hours, mix, _, _ = DAYS[name]
    return CurveWorkload.build(BUNDLED_CURVE, BUNDLED_TRACE, model=model, hours=hours, peak_rate=peak, mix=mix)


def command(name: str, peak: float, out: Path, extra: str = "") -> str:
    model, hours, mix, stem, _ = DAYS[name]
    return (
        f"keda-llm-scaler replay --trace conv --rate-curve servegen --curve-model {model} "
        f"--hours {hours[0]:g}:{hours[1]:g} --mix {mix} --peak-rate {peak:g} --pools {out}/{stem}.yaml "
        f"--hpa-behavior llm --warmup {WARMUP_S:g}{extra}"
    )


def _run(job: tuple[str, float, str]) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    name, peak, out = job
    stem = DAYS[name][3]
    result = simulate_pools(
        _day(name, peak), load_pools(Path(out) / f"{stem}.yaml"), RunConfig(hpa_behavior="llm", warmup_s=WARMUP_S)
    )
    return name, result.summary, result.timeline  # type: ignore[return-value]


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/fleets")
    start = time.perf_counter()
    peaks = {name: _peak(name, out) for name in DAYS}
    results: dict[str, Any] = {}
    with ProcessPoolExecutor(2) as pool:
        for name, summary, timeline in pool.map(_run, [(n, peaks[n], str(out)) for n in DAYS]):
            plot_pools(out / f"{name}.png", summary, timeline, f"{name}: {_title(name, peaks[name])}")
            keep = {k: summary[k] for k in ("slo_attainment", "cost", "gpu_hours", "pools", "requests")}
            results[name] = {**keep, "after_warmup": summary["after_warmup"], "peak_rate_rps": peaks[name]}
            w = summary["after_warmup"]
            per_pool = ", ".join(f"{n} {v['cost']:.1f}" for n, v in w["pools"].items())
            print(
                f"[{time.perf_counter() - start:5.0f}s] {name}: {w['slo_attainment']:.2%} after the warm-up, "
                f"cost {w['cost']:.1f} ({per_pool})",
                file=sys.stderr,
                flush=True,
            )
    (out / "days.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    plan = plan_reserved(
        _day(PLAN_DAY, peaks[PLAN_DAY]),
        load_pools(out / f"{DAYS[PLAN_DAY][3]}.yaml"),
        RunConfig(hpa_behavior="llm", warmup_s=WARMUP_S),
        PLAN_SIZES,
        TARGET,
        progress=lambda line: print(f"[{time.perf_counter() - start:5.0f}s] {line}", file=sys.stderr, flush=True),
    )
    (out / "plan.json").write_text(json.dumps(plan, indent=1, sort_keys=True) + "\n")
    plot_plan(out / "plan.png", plan, f"{PLAN_DAY}: {_title(PLAN_DAY, peaks[PLAN_DAY])}")
    print(table(results, plan, peaks, out))
    return 0


def _title(name: str, peak: float) -> str:
    model, hours, mix, _, _ = DAYS[name]
    return f"ServeGen {model} h{hours[0]:g}-{hours[1]:g}, {mix}, peak {peak:g} req/s"


def table(results: dict[str, Any], plan: dict[str, Any], peaks: dict[str, float], out: Path) -> str:
    lines = [
        "| day | pools (size / max) | attainment after warm-up (whole run) | cost after warm-up: reserved + burst "
        "| burst GPU-h | max replicas per pool |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        w = r["after_warmup"]
        pools = r["pools"]
        names = list(pools)
        sizes = ", ".join(f"{n} {p['profile']} {p.get('size', p.get('max'))}" for n, p in pools.items())
        burst_gpu_h = sum(p["gpu_hours"] for p in pools.values() if p["tier"] != "reserved")
        costs = " + ".join(f"{w['pools'][n]['cost']:.1f}" for n in names)
        lines.append(
            f"| {name} | {sizes} | {w['slo_attainment']:.2%} ({r['slo_attainment']:.2%}) | {w['cost']:.1f} = "
            f"{costs} | {burst_gpu_h:.1f} | {', '.join(str(p['max_replicas']) for p in pools.values())} |"
        )
    lines += ["", "Reproduce a row:", ""]
    lines += [f"    {command(name, peaks[name], out)}" for name in results]
    lines += ["", f"Planning the reservation on {PLAN_DAY} (target {TARGET:.0%} after the warm-up):", ""]
    lines += ["| reserved size | attainment after warm-up | cost after warm-up |", "|---|---|---|"]
    for row in plan["curve"]:
        mark = " **reserved_size**" if row["reserved_size"] == plan["reserved_size"] else ""
        lines.append(f"| {row['reserved_size']}{mark} | {row['slo_attainment']:.2%} | {row['cost']:.1f} |")
    lo, hi = PLAN_SIZES
    lines += ["", f"    {command(PLAN_DAY, peaks[PLAN_DAY], out, f' --plan-reserved {lo}:{hi} --plot plan.png')}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
