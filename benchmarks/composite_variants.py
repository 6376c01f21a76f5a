"""The real composite with some DemandConfig / ScoringParams fields overridden, on the docs workloads: how
the variants in docs/replay.md ("Variants measured on the way") are measured.

    python benchmarks/composite_variants.py WORKLOADS BEHAVIORS KNOBS [OVERRIDES_JSON ...]
    python benchmarks/composite_variants.py conv,bursty,day:m-small:17:29:140 llm 1.0 '{"headroom_sigmas": 3}'

WORKLOADS: conv (x12), bursty (x4), convslice, day:MODEL:A:B:PEAK; BEHAVIORS: llm,default; KNOBS:
targetUtilization values. OVERRIDES: fields of DemandConfig (calm_window_s, headroom_sigmas, growth_cap)
or ScoringParams; the burst-window and plain-spread switches of the table's † rows were removed after
6a0475f (docs/replay.md: how those rows reproduce at 34e8303). Prints one line per run: workload, behavior, knob,
overrides, SLO attainment (%), GPU-hours, max and mean replicas. Two worker processes.
"""

import dataclasses
import itertools
import json
import sys
from concurrent.futures import ProcessPoolExecutor


def job(a):
    wl, beh, knob, over = a
    import keda_llm_scaler.sim.run as runmod
    from keda_llm_scaler.demand import DemandConfig
    from keda_llm_scaler.fleet import demand_config
    from keda_llm_scaler.policy import ScoringParams
    from keda_llm_scaler.sim import policies

    dc = {k: v for k, v in over.items() if k in {f.name for f in dataclasses.fields(DemandConfig)}}
    sp = {k: v for k, v in over.items() if k in {f.name for f in dataclasses.fields(ScoringParams)}}
    orig = policies.make_policy

    def make(name, knob=None, **kw):
        p = orig(name, knob, **kw)
        if name == "composite":
            params = dataclasses.replace(p.params, **sp)  # keeps the run's ttftSloSeconds
            demand = dataclasses.replace(demand_config(params), **dc)
            p = policies.CompositePolicy(name, p.knob, p.knob_name, params=params, demand=demand)
        return p

    runmod.make_policy = make
    from keda_llm_scaler.sim.run import RunConfig, simulate
    from keda_llm_scaler.sim.trace import TRACES
    from keda_llm_scaler.sim.workload import BUNDLED_CURVE, CurveWorkload, TraceWorkload

    if wl == "conv":
        w = TraceWorkload.from_file(TRACES["conv"], 12.0, 0)
    elif wl == "bursty":
        w = TraceWorkload.from_file(TRACES["bursty"], 4.0, 0)
    elif wl == "convslice":
        w = TraceWorkload.from_file(TRACES["conv"], 12.0, 0, (0.25, 0.6))
    elif wl.startswith("day"):
        _, model, a, b, peak = wl.split(":")
        w = CurveWorkload.build(
            BUNDLED_CURVE,
            TRACES["conv"],
            model=model,
            hours=(float(a), float(b)),
            rate_scale=1.0,
            peak_rate=float(peak),
            seed=0,
        )
    s = simulate(w, RunConfig(policy="composite", knob=knob, hpa_behavior=beh)).summary
    return (
        wl,
        beh,
        knob,
        json.dumps(over),
        round(s["slo_attainment"] * 100, 2),
        round(s["gpu_hours"], 1),
        s["max_replicas"],
        round(s["mean_replicas"], 1),
    )


if __name__ == "__main__":
    wls = sys.argv[1].split(",")
    behs = sys.argv[2].split(",")
    knobs = [float(k) for k in sys.argv[3].split(",")]
    overs = [json.loads(p) for p in sys.argv[4:]] or [{}]
    from keda_llm_scaler.demand import DemandConfig
    from keda_llm_scaler.policy import ScoringParams

    known = {f.name for cls in (DemandConfig, ScoringParams) for f in dataclasses.fields(cls)}
    if unknown := sorted({k for over in overs for k in over} - known):
        # e.g. use_burst_window, robust_spread: removed after 6a0475f (docs/replay.md: the † rows)
        raise SystemExit(f"not a DemandConfig or ScoringParams field: {', '.join(unknown)}")
    jobs = list(itertools.product(wls, behs, knobs, overs))
    with ProcessPoolExecutor(2) as ex:
        for r in ex.map(job, jobs):
            print(*r, flush=True)
