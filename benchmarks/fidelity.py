#!/usr/bin/env python3
"""The fleet simulator against the independent step-level reference (keda_llm_scaler/testing/refsim.py) on
static fleets: SLO attainment and TTFT p95 at the smallest fleet reaching 99 % and one either side, per
routing.

    python benchmarks/fidelity.py            # conversation hour x12 and the bursty hour x4, ~3 min
"""

from __future__ import annotations

import sys
import time

from keda_llm_scaler.sim.run import RunConfig, simulate
from keda_llm_scaler.sim.trace import BUNDLED_TRACE, BURSTY_TRACE, load_trace, scale_rate
from keda_llm_scaler.testing.refsim import simulate_static

CASES = (("conversation x12", BUNDLED_TRACE, 12.0, 8), ("bursty hour x4", BURSTY_TRACE, 4.0, 9))


def main() -> int:
    print("| workload | routing | replicas | attainment: ours / reference | TTFT p95 s: ours / reference (diff) |")
    print("|---|---|---|---|---|")
    for name, path, scale, guess in CASES:
        scaled = scale_rate(load_trace(path), scale)
        reqs = [(r.t, r.prompt, r.output) for r in scaled]
        for routing in ("least-loaded", "round-robin", "random"):
            n = guess
            ref = {n: simulate_static(reqs, n, routing=routing)}
            while ref[n].slo_attainment < 0.99:
                n += 1
                ref[n] = simulate_static(reqs, n, routing=routing)
            while n > 1:
                ref[n - 1] = simulate_static(reqs, n - 1, routing=routing)
                if ref[n - 1].slo_attainment < 0.99:
                    break
                n -= 1
            ref.setdefault(n + 1, simulate_static(reqs, n + 1, routing=routing))
            for k in (n - 1, n, n + 1):
                start = time.perf_counter()
                ours = simulate(scaled, RunConfig(policy="static", knob=k, routing=routing)).summary
                took = time.perf_counter() - start
                r = ref[k]
                diff = ours["ttft_p95_s"] / r.ttft_p95_s - 1
                print(
                    f"| {name} | {routing} | {k}{' (smallest at 99 %)' if k == n else ''} | "
                    f"{100 * ours['slo_attainment']:.2f} % / {100 * r.slo_attainment:.2f} % | "
                    f"{ours['ttft_p95_s']:.3f} / {r.ttft_p95_s:.3f} ({100 * diff:+.1f} %) |",
                    flush=True,
                )
                print(f"  ({name}, {routing}, {k}: ours {took:.1f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
