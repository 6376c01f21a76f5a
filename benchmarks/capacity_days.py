#!/usr/bin/env python3
"""The composite at its defaults on 12-hour diurnal days with the mixes and profiles of issue #20.

    python -m benchmarks.capacity_days            # four days, ~25 min on 2 cores

Each day: ServeGen's aggregate curve for one model over 12 hours, scaled so its busiest 10-minute window
is PEAK_REPLICAS (11) replicas' worth of the profile's single-replica capacity at the SLO, with the mix's
tokens; 2 s TTFT SLO given to the composite, least-loaded routing, the README's ``llm`` HPA behavior,
seed 0. Per day: the composite, the oracle at utilisation 1.0, and the static fleet with the most
GPU-hours that the composite does not exceed, and the one above it (a static fleet that beats the
composite on both attainment and GPU-hours would have to be one of these or smaller).
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Final

from keda_llm_scaler.sim.profiles import get_profile
from keda_llm_scaler.sim.run import RunConfig, capacity_at_slo, simulate
from keda_llm_scaler.sim.trace import BUNDLED_TRACE
from keda_llm_scaler.sim.workload import BUNDLED_CURVE, CurveWorkload

PEAK_REPLICAS: Final = 11.0
# (curve model, hours, mix, profile): none of these days or curves was used to choose the defaults
DAYS: Final = (
    ("m-large", (0.0, 12.0), "conversation", "8b-a100"),
    ("m-mid", (30.0, 42.0), "prefill-heavy", "70b-h100x4"),
    ("m-small", (100.0, 112.0), "decode-heavy", "70b-h100x2"),
    ("m-large", (200.0, 212.0), "prefill-heavy", "32b-h100"),
)


def day(model: str, hours: tuple[float, float], mix: str, profile: str) -> CurveWorkload:
    base = CurveWorkload.build(BUNDLED_CURVE, BUNDLED_TRACE, model=model, hours=hours, peak_rate=1.0, mix=mix)
    cap = capacity_at_slo(get_profile(profile), base.token_mix(4000, 0), 2.0)
    return CurveWorkload.build(
        BUNDLED_CURVE, BUNDLED_TRACE, model=model, hours=hours, peak_rate=round(PEAK_REPLICAS * cap, 2), mix=mix
    )


def _run(job: tuple[int, str, float | None]) -> tuple[tuple[int, str, float | None], dict[str, Any]]:
    i, policy, knob = job
    model, hours, mix, profile = DAYS[i]
    s = simulate(
        day(model, hours, mix, profile), RunConfig(policy=policy, knob=knob, profile=profile, hpa_behavior="llm")
    ).summary
    keep = ("slo_attainment", "gpu_hours", "max_replicas", "peak_rate_rps", "capacity_rps", "requests")
    return job, {k: s[k] for k in keep}


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/replay/matrix/days.json")
    start = time.perf_counter()
    results: dict[str, Any] = {}

    def run_all(jobs: list[tuple[int, str, float | None]]) -> None:
        with ProcessPoolExecutor(2) as pool:
            for (i, policy, knob), s in pool.map(_run, jobs):
                key = f"{i}/{policy}/{knob}"
                results[key] = s
                print(
                    f"[{time.perf_counter() - start:5.0f}s] day {i} {DAYS[i]} {policy} {knob}: "
                    f"{s['slo_attainment']:.2%}, {s['gpu_hours']:.1f} GPU-h, max {s['max_replicas']}",
                    file=sys.stderr,
                    flush=True,
                )

    run_all([(i, p, k) for i in range(len(DAYS)) for p, k in (("composite", None), ("oracle", 1.0))])
    statics = []
    for i, (_, _, _, profile) in enumerate(DAYS):
        per_replica = get_profile(profile).gpus * 12.0
        n = max(1, int(results[f"{i}/composite/None"]["gpu_hours"] // per_replica))
        statics += [(i, "static", float(n)), (i, "static", float(n + 1))]
    run_all(statics)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    print(table(results))
    return 0


def table(results: dict[str, Any]) -> str:
    lines = [
        "| day | mix | profile | peak req/s | composite `llm` | oracle (1.0) | ÷ oracle | static at or below "
        "its GPU-h | static above | goals |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, (model, hours, mix, profile) in enumerate(DAYS):
        c, o = results[f"{i}/composite/None"], results[f"{i}/oracle/1.0"]
        st = sorted((float(k.split("/")[2]), v) for k, v in results.items() if k.startswith(f"{i}/static/"))
        below = [(n, v) for n, v in st if v["gpu_hours"] <= c["gpu_hours"]]
        above = [(n, v) for n, v in st if v["gpu_hours"] > c["gpu_hours"]]
        dominated = any(v["slo_attainment"] > c["slo_attainment"] for _, v in below)
        ok = c["slo_attainment"] >= 0.99 and c["gpu_hours"] <= 1.2 * o["gpu_hours"] and not dominated
        fmt = lambda nv: f"{int(nv[0])}: {nv[1]['slo_attainment']:.2%}, {nv[1]['gpu_hours']:.1f}" if nv else "-"  # noqa: E731
        lines.append(
            f"| {model} h{hours[0]:g}-{hours[1]:g} | {mix} | {profile} | {c['peak_rate_rps']:.1f} | "
            f"{c['slo_attainment']:.2%}, {c['gpu_hours']:.1f}, max {c['max_replicas']} | "
            f"{o['slo_attainment']:.2%}, {o['gpu_hours']:.1f}, max {o['max_replicas']} | "
            f"{c['gpu_hours'] / o['gpu_hours']:.2f} | {fmt(below[-1] if below else None)} | "
            f"{fmt(above[0] if above else None)} | {'met' if ok else '**missed**'} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
