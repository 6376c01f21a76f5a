#!/usr/bin/env python3
"""The README's replay table: per policy, the cheapest configuration reaching 99 % SLO attainment on each
workload swept by benchmarks/replay_figures.sh (docs/replay/*/sweep.json), else its best attainment."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ORDER = ["composite", "queue", "kv", "gpu-util", "cpu", "kaito", "static", "oracle"]


def cell(runs: list[dict], target: float) -> str:
    meeting = [r for r in runs if r["slo_attainment"] >= target]
    if meeting:
        r = min(meeting, key=lambda r: (r["gpu_hours"], r["knob_value"]))
        return f"{r['knob_value']:g} → {100 * r['slo_attainment']:.1f} %, **{r['gpu_hours']:.1f}**"
    r = max(runs, key=lambda r: (r["slo_attainment"], -r["gpu_hours"]))
    return f"never: best {100 * r['slo_attainment']:.1f} % ({r['knob_value']:g}, {r['gpu_hours']:.1f})"


def main() -> int:
    dirs = [Path(d) for d in sys.argv[1:]] or sorted(Path("docs/replay").glob("*/"))
    sweeps = {d.name: json.loads((d / "sweep.json").read_text()) for d in dirs if (d / "sweep.json").exists()}
    print("| policy (knob) | " + " | ".join(sweeps) + " |")
    print("|---|" + "---|" * len(sweeps))
    for policy in ORDER:
        runs = {name: [r for r in rs if r["policy"] == policy] for name, rs in sweeps.items()}
        knob = next((r["knob"] for rs in runs.values() for r in rs), "")
        print(f"| {policy} ({knob}) | " + " | ".join(cell(rs, 0.99) if rs else "-" for rs in runs.values()) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
