#!/usr/bin/env python3
"""A what-if, not calibrate's rule: a recorded sim-to-real run's loads through the simulator with the
client's TTFT overhead depending on how many answers stream from the replica at the first token, from a
table measured by ``benchmarks/engine_ttft_split.py`` (the client's TTFT beyond vLLM's own, by answers
beside), against the flat ``ttft_overhead_ms`` the run's profile carries: the run's profile with
``ttft_overhead_by_streams`` set to the table (calibrate measured one on 2026-12-06, config J's run; that
run can be replayed with another table, or with ``--table flat`` without its own; calibrate now fits a
flat overhead on its serving phase instead):

    python benchmarks/ttft_by_streams_whatif.py --run docs/sim-to-real/i --table 0:3.3,1:21,3:47,6:57

One line per load: the engines' TTFT p50 and attainment on each run, the simulator's as recorded and
with the table (linear between its points, flat past the last).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import sim_to_real


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="a sim_to_real --out directory")
    ap.add_argument("--table", required=True, help="answers:ms of the API server's TTFT, comma-separated, or 'flat'")
    ap.add_argument("--duration", type=float, default=90.0, help="the run's --duration")
    args = ap.parse_args()
    run = Path(args.run)
    result = json.loads((run / "results.json").read_text())
    profile = json.loads((run / "profile.json").read_text())
    if args.table == "flat":
        profile.pop("ttft_overhead_by_streams", None)
    else:
        profile["ttft_overhead_by_streams"] = [[float(x) for x in p.split(":")] for p in args.table.split(",")]
    label = "flat" if args.table == "flat" else "with the table"
    scratch = tempfile.TemporaryDirectory()
    patched_profile = Path(scratch.name) / "profile.json"
    patched_profile.write_text(json.dumps(profile))
    mix = sim_to_real.loads_mix()
    recorded = {id(row): row["sim"] for row in result["rows"]}
    for row, arrivals in sim_to_real.recorded_loads(result, args.duration, mix):
        n = row["engines"]
        patched = sim_to_real._sim(str(patched_profile), n, arrivals)
        real = row.get("real_repeats") or [row["real"]]
        print(
            f"{n} engines, {row['load']} x knee: engines TTFT p50 "
            + ", ".join(f"{r['ttft_p50_s']:.3f} s ({100 * r['attainment']:.1f} %)" for r in real)
            + f"; simulator as recorded {recorded[id(row)]['ttft_p50_s']:.3f} s "
            + f"({100 * recorded[id(row)]['attainment']:.1f} %)"
            + f", {label} {patched['ttft_p50_s']:.3f} s ({100 * patched['attainment']:.1f} %)"
        )
    scratch.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
