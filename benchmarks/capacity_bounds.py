#!/usr/bin/env python3
"""Where issue #20's remaining misses come from, against what other policies could do in the same replay.

    python -m benchmarks.capacity_bounds            # ~3 min on 2 cores; writes docs/replay/matrix/bounds.md

Two cases, each shown as SLO attainment per five minutes:

* **The start of prefill-heavy/8b-h100** (the capacity matrix's hour: ``benchmarks.capacity_matrix``). Every
  dynamic policy starts from the fleet the first five minutes need at the knee, while the trace ramps from a
  quarter of its mean to its mean within a minute. Compared are the composite at its defaults, the same
  composite told the replica's true capacity (``replicaCapacity`` = the replay's capacity at the SLO: what no
  learning can beat), and a policy that asks at once, at the first tick, for the smallest static fleet that
  reaches 99 % (a size known only in hindsight: foresight, from the same start).
* **The bursty hour x4** (``replay --trace bursty --rate-scale 4``, cold start 240 s, ``llm`` behavior):
  the composite against static fleets of 5-9. The first burst arrives before anything of it is known, and
  lasts less than a start-up.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.capacity_matrix import SLO_S, workload
from keda_llm_scaler.sim import policies, run
from keda_llm_scaler.sim.profiles import get_profile
from keda_llm_scaler.sim.run import RunConfig, capacity_at_slo, simulate
from keda_llm_scaler.sim.trace import BURSTY_TRACE
from keda_llm_scaler.sim.workload import TraceWorkload, Workload

BUCKET_S = 300.0


@dataclasses.dataclass
class AskAt(policies.StaticPolicy):
    """Holds the common starting fleet until ``at_s``, then asks for ``knob`` replicas and keeps them."""

    at_s: float = 0.0

    def fixed_replicas(self, now: float) -> int | None:
        return None if now <= self.at_s else int(self.knob)


def _first_burst_s(w: Workload, bin_s: float = 10.0) -> float:
    """The first 10 s bin with more than twice the mean arrivals of the five minutes before it."""
    bins: dict[int, int] = defaultdict(int)
    for r in w.requests():
        bins[int(r.t // bin_s)] += 1
    window = int(300 / bin_s)
    for b in range(window, max(bins) + 1):
        if bins[b] > 2 * sum(bins[k] for k in range(b - window, b)) / window:
            return b * bin_s
    raise ValueError("no burst")


def _policy(name: str, knob: float | None, capacity: float | None, at_s: float, **kw: Any) -> policies.Policy:
    if name == "ask-at":
        return AskAt(name, float(knob or 0), "replicas", at_s=at_s)
    made = policies.make_policy(name, knob, **kw)
    if capacity is not None and isinstance(made, policies.CompositePolicy):
        made.params = dataclasses.replace(made.params, replica_capacity=capacity)
        made.__post_init__()
    return made


def _row(label: str, w: Workload, cfg: RunConfig, capacity: float | None = None, at_s: float = 0.0) -> str:
    original = run.make_policy
    run.make_policy = lambda name, knob=None, **kw: _policy(name, knob, capacity, at_s, **kw)  # type: ignore[assignment]
    try:
        res = simulate(w, dataclasses.replace(cfg, keep_requests=True))
    finally:
        run.make_policy = original
    met: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for r in res.requests:
        b = int(r.arrival // BUCKET_S)
        met[b][0] += r.first_token_at is not None and r.first_token_at - r.arrival <= cfg.slo_ttft_s
        met[b][1] += 1
    s = res.summary
    buckets = " ".join(f"{100 * met[b][0] / met[b][1]:.0f}" for b in sorted(met))
    line = f"| {label} | {100 * s['slo_attainment']:.2f} % | {s['gpu_hours']:.1f} | {s['max_replicas']} | {buckets} |"
    print(line, file=sys.stderr, flush=True)
    return line


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("docs/replay/matrix/bounds.md"))
    args = ap.parse_args()
    head = "| policy | attainment | GPU-h | max | attainment per 5 minutes (%) |\n|---|---|---|---|---|"
    out = ["# Where the remaining misses come from (`python -m benchmarks.capacity_bounds`)", ""]

    mix, profile = "prefill-heavy", "8b-h100"
    w = workload(mix, profile)
    cap = capacity_at_slo(get_profile(profile), w.token_mix(4000, 0), SLO_S)
    cfg = RunConfig(policy="composite", profile=profile, hpa_behavior="llm")
    out += [f"## The start: {mix}/{profile}, one hour, `llm` behavior", "", head]
    out.append(_row("composite, defaults", w, cfg))
    out.append(_row(f"composite told the true capacity ({cap:.1f} req/s)", w, cfg, capacity=cap))
    for n in (8, 10):
        out.append(
            _row(f"ask for {n} at the first tick (foresight)", w, dataclasses.replace(cfg, policy="ask-at", knob=n))
        )
    out.append(_row("static 8 (from the start)", w, dataclasses.replace(cfg, policy="static", knob=8)))

    bursty = TraceWorkload.from_file(BURSTY_TRACE, 4.0, 0, None)
    cfg = RunConfig(policy="composite", profile="70b-h100x4", hpa_behavior="llm", cold_start_s=240.0)
    out += ["", "## The bursty hour x4, 70b-h100x4, cold start 240 s, `llm` behavior", "", head]
    out.append(_row("composite, defaults", bursty, cfg))
    onset = _first_burst_s(bursty)
    for n in (9, 13):
        label = f"the starting fleet until the first burst ({onset:.0f} s), then {n} at once (foresight of its onset)"
        out.append(_row(label, bursty, dataclasses.replace(cfg, policy="ask-at", knob=n), at_s=onset))
    for n in (5, 6, 7, 8, 9):
        out.append(_row(f"static {n}", bursty, dataclasses.replace(cfg, policy="static", knob=n)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(out) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
