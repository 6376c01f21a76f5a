#!/usr/bin/env python3
"""A what-if, not calibrate's rule: a recorded sim-to-real run's profile with its serving scales fitted on
one of the run's own loads instead of calibrate's serving phase: that load's arrivals per engine and the
engines' mean inter-token latency and prefill over it (recorded per load by runs after config I). The best case
for any serving phase's rate, since it is fitted on the very load it is then compared on. Then the
steady-overload phase's one factor, as calibrate applies it. Each load of the run through the simulator,
both ways:

    python benchmarks/serving_scales_on_a_load.py --run docs/sim-to-real/j --load 0

``--load`` is the row of ``results.json`` to fit on (0: 0.5 x knee). The arrivals per engine are a
Poisson stream at the load's rate over its engines, with the loads' token mix (another seed than the
load's own: the engines' means are what is matched).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
from pathlib import Path

from keda_llm_scaler.enginelab.calibrate import (
    OVERLOAD_SECONDS,
    OVERLOAD_SEED,
    OVERLOAD_WINDOW,
    scaled,
    serving_mix,
    serving_scales,
    steady_scale,
)
from keda_llm_scaler.enginelab.sweep import poisson_arrivals
from keda_llm_scaler.sim.profiles import load_profile

sys.path.insert(0, str(Path(__file__).parent))
import sim_to_real


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, type=Path, help="a sim_to_real --out directory (a run after config I)")
    ap.add_argument("--load", type=int, default=0, help="the row of results.json to fit on (default 0)")
    ap.add_argument("--duration", type=float, default=90.0, help="the run's --duration")
    args = ap.parse_args()
    recorded = json.loads((args.run / "profile.json").read_text())
    points = recorded["fit_points"]
    k_s = points.get("steady_scale", 1.0)
    k_d, k_p = k_s * points["step_scale"], k_s * points.get("prefill_scale", points["step_scale"])
    fitted = dataclasses.replace(
        load_profile(args.run / "profile.json"), c_ms=recorded["c_ms"] / k_d, d_ms=recorded["d_ms"] / k_d,
        e_ms=recorded["e_ms"] / k_d, b_ms=recorded["b_ms"] / k_p, f_ms=recorded["f_ms"] / k_p, g_ms=0.0,
    )  # fmt: skip
    result = json.loads((args.run / "results.json").read_text())
    mix = sim_to_real.loads_mix()
    row = result["rows"][args.load]
    runs = row.get("real_repeats") or [row["real"]]
    if any("engine_itl_ms" not in r for r in runs):
        print(f"{args.run}: no engine means per load (recorded by runs after config I)", file=sys.stderr)
        return 2
    itl = statistics.fmean(r["engine_itl_ms"] for r in runs)
    prefill = statistics.fmean(r["engine_prefill_ms"] for r in runs)
    arrivals = poisson_arrivals(row["rate"] / row["engines"], args.duration, 0, 0, seed=5, mix=mix)
    scales = serving_scales(fitted, arrivals, itl, prefill)
    served = scales.apply(fitted)
    phase = points["steady"]
    overload = poisson_arrivals(phase["rate"], OVERLOAD_SECONDS, 0, 0, seed=OVERLOAD_SEED, mix=serving_mix())
    k_steady = steady_scale(served, overload, OVERLOAD_WINDOW, phase["engine_rps"])
    print(
        f"fitted on the {row['load']} x knee load (engines' ITL {itl:.1f} ms, prefill {prefill:.1f} ms): decode "
        f"x {scales.k_decode:.2f}, prefill x {scales.k_prefill:.2f}, g {scales.g_ms:.4f}; steady x {k_steady:.2f}"
    )
    with tempfile.TemporaryDirectory() as scratch:
        for label, profile in (
            ("serving scales only", served),
            ("then the steady factor", scaled(served, k_steady, k_steady, served.g_ms * k_steady)),
        ):
            path = Path(scratch) / f"{len(label)}.json"
            fields = {k: v for k, v in recorded.items() if k != "fit_points"}
            coefficients = {k: getattr(profile, k) for k in ("c_ms", "b_ms", "d_ms", "e_ms", "f_ms", "g_ms")}
            path.write_text(json.dumps({**fields, **coefficients}))
            for r, loads in sim_to_real.recorded_loads(result, args.duration, mix):
                sim = sim_to_real._sim(str(path), r["engines"], loads)
                real = r.get("real_repeats") or [r["real"]]
                print(
                    f"{label}: {r['load']} x knee: simulator TTFT p50 {1000 * sim['ttft_p50_s']:.0f} ms "
                    f"({100 * sim['attainment']:.1f} %), engines "
                    + ", ".join(f"{1000 * x['ttft_p50_s']:.0f} ms ({100 * x['attainment']:.1f} %)" for x in real)
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
