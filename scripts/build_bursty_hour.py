#!/usr/bin/env python3
"""Build the bundled bursty hour: the Azure conversation trace with four injected bursts.

Each burst multiplies the trace's own arrivals inside its interval by 3-5x (``scale_rate`` applied to
that slice: copies at fractions of the mean gap, token counts from neighbouring requests) and is
shorter than one 70B cold start (240 s), so no reactive policy can add a replica in time: only
headroom already there, or capacity already starting, serves it. The bursts start as steps (a launch,
a retry storm, a batch job pointed at the endpoint). Deterministic; rerun to regenerate:

    python scripts/build_bursty_hour.py keda_llm_scaler/sim/traces/azure_conv_bursty_hour.csv
"""

from __future__ import annotations

import sys
from pathlib import Path

from keda_llm_scaler.sim.trace import BUNDLED_TRACE, TraceRequest, load_trace, peak_to_mean, scale_rate

# (start s, length s, multiplier)
BURSTS = ((480.0, 180.0, 3.0), (1320.0, 120.0, 4.0), (2160.0, 60.0, 5.0), (2940.0, 150.0, 3.0))


def build() -> list[TraceRequest]:
    base = load_trace(BUNDLED_TRACE)
    out = [r for r in base if not any(a <= r.t < a + n for a, n, _ in BURSTS)]
    for k, (a, n, m) in enumerate(BURSTS):
        inside = [TraceRequest(r.t - a, r.prompt, r.output) for r in base if a <= r.t < a + n]
        out.extend(TraceRequest(r.t + a, r.prompt, r.output) for r in scale_rate(inside, m, seed=k))
    out.sort(key=lambda r: r.t)
    return out


def main() -> int:
    from keda_llm_scaler.sim.trace import write_trace

    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("azure_conv_bursty_hour.csv")
    trace = build()
    with path.open("w") as fh:
        n = write_trace(fh, trace)
    times = [r.t for r in trace]
    print(
        f"wrote {path}: {n} requests, peak/mean at 10 s {peak_to_mean(times, 10):.2f}, at 60 s "
        f"{peak_to_mean(times, 60):.2f}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
