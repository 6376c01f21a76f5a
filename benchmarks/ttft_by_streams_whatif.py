#!/usr/bin/env python3
"""A what-if, not calibrate's rule: a recorded sim-to-real run's loads through the simulator with the
client's TTFT overhead depending on how many answers stream from the replica at the first token, from a
table measured by ``benchmarks/engine_ttft_split.py`` (the client's TTFT beyond vLLM's own, by answers
beside), against the flat ``ttft_overhead_ms`` the run's profile carries. It patches the simulator's
replica in this process only:

    python benchmarks/ttft_by_streams_whatif.py --run docs/sim-to-real/i --table 0:3.3,1:21,3:47,6:57

One line per load: the engines' TTFT p50 and attainment on each run, the simulator's with the flat
overhead and with the table (linear between its points, flat past the last).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

from keda_llm_scaler.enginelab.sweep import poisson_arrivals
from keda_llm_scaler.sim import replica
from keda_llm_scaler.sim.trace import BUNDLED_TRACE, load_trace

sys.path.insert(0, str(Path(__file__).parent))
import sim_to_real


def _interpolated(table: list[tuple[float, float]], n: float) -> float:
    if n >= table[-1][0]:
        return table[-1][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(table):
        if x0 <= n <= x1:
            return y0 + (y1 - y0) * (n - x0) / (x1 - x0)
    return table[0][1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="a sim_to_real --out directory")
    ap.add_argument("--table", required=True, help="answers:extra ms beyond the frontend's TTFT, comma-separated")
    ap.add_argument("--duration", type=float, default=90.0, help="the run's --duration")
    args = ap.parse_args()
    table = sorted((float(a), float(b)) for a, b in (p.split(":") for p in args.table.split(",")))
    run = Path(args.run)
    result = json.loads((run / "results.json").read_text())
    mix = [
        (min(r.prompt, sim_to_real.MAX_PROMPT), min(r.output, sim_to_real.MAX_OUTPUT))
        for r in load_trace(BUNDLED_TRACE)[:4000]
    ]
    flat = {id(row): row["sim"] for row in result["rows"]}
    first_token = replica.SimReplica._start_decoding

    def by_streams(self: replica.SimReplica, r: replica.Request) -> None:
        first = r.first_token_at is None
        first_token(self, r)
        if first and r.first_token_at is not None:  # the table's extra over its own idle point
            r.first_token_at += (_interpolated(table, self.decoding) - table[0][1]) / 1000.0

    replica.SimReplica._start_decoding = by_streams  # type: ignore[method-assign]
    by_fleet: dict[int, int] = {}
    for row in result["rows"]:
        n = row["engines"]
        i = by_fleet.get(n, 0)
        by_fleet[n] = i + 1
        arrivals = poisson_arrivals(row["rate"], args.duration, 0, 0, seed=100 * n + i, mix=mix)
        patched = sim_to_real._sim(str(run / "profile.json"), n, arrivals)
        real = row.get("real_repeats") or [row["real"]]
        print(
            f"{n} engines, {row['load']} x knee: engines TTFT p50 "
            + ", ".join(f"{r['ttft_p50_s']:.3f} s ({100 * r['attainment']:.1f} %)" for r in real)
            + f"; simulator flat {flat[id(row)]['ttft_p50_s']:.3f} s ({100 * flat[id(row)]['attainment']:.1f} %)"
            + f", by answers streaming {patched['ttft_p50_s']:.3f} s ({100 * patched['attainment']:.1f} %)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
