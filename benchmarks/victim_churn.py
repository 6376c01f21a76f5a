#!/usr/bin/env python3
"""Annotation writes of victim ranking under a pessimistic load: 8 pods whose in-flight counts are drawn
anew (Poisson) at every pass, one pass per 10 s for an hour, every pass plausible. Real loads carry over
from one pass to the next, so this is an upper bound for a fleet of that size and mean.

    python benchmarks/victim_churn.py          # a second; prints patches per hour per mean in flight
"""

from __future__ import annotations

import random
import sys

from keda_llm_scaler.victims import DEFAULT_BURST, DEFAULT_INTERVAL_S, PodLoad, plan

PODS = 8
PASSES = int(3600 / DEFAULT_INTERVAL_S)


def patches_per_hour(mean_in_flight: float, seed: int = 1) -> int:
    rng = random.Random(seed)

    def poisson(lam: float) -> int:  # Knuth's method: exact, and fast enough for these means
        limit, k, p = pow(2.718281828459045, -lam), 0, 1.0
        while True:
            p *= rng.random()
            if p < limit:
                return k
            k += 1

    current: list[int | None] = [None] * PODS
    writes = 0
    for _ in range(PASSES):
        pods = [
            PodLoad("ns", f"p{i}", current=current[i], running=poisson(mean_in_flight), waiting=0, kv_usage=0.1)
            for i in range(PODS)
        ]
        for change in plan(pods, DEFAULT_BURST):
            current[int(change.pod.name[1:])] = change.cost
            writes += 1
    return writes


def main() -> int:
    for mean in (0.3, 0.7, 1.5, 5.0, 30.0):
        n = patches_per_hour(mean)
        print(f"mean in flight per pod {mean:>4g}: {n} patches an hour for {PODS} pods ({n / 3600:.2f}/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
