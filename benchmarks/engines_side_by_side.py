#!/usr/bin/env python3
"""How much one real engine slows beside a busy neighbour on this machine: each engine's saturated
throughput alone, then every engine's at once, ``--rounds`` times. A CPU quota divides CPU time, not the
cores' caches or memory bandwidth; this is why ``sim_to_real.py`` calibrates with every engine busy.
Run inside ``scripts/engine run`` with two or more engines:

    scripts/engine run 2 --cpus 0.6 --max-num-seqs 12 --layers 6 -- python benchmarks/engines_side_by_side.py

Each measurement sends 4 x max_num_seqs requests of 256/64 tokens at once (``sweep.saturated_throughput``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from keda_llm_scaler.enginelab.sweep import saturated_throughput

PROMPT, OUTPUT = 256, 64


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="alone-then-together rounds (default 2)")
    args = ap.parse_args()
    urls = os.environ["KLS_ENGINE_URLS"].split(",")
    if len(urls) < 2:
        ap.error("needs two or more engines (scripts/engine run N with N >= 2)")
    model = os.environ["KLS_ENGINE_MODEL"]
    burst = 4 * int(os.environ["KLS_ENGINE_MAX_NUM_SEQS"])
    alone: list[float] = []
    together: list[float] = []
    for i in range(args.rounds):
        for url in urls:
            alone.append(saturated_throughput(url, model, burst, PROMPT, OUTPUT))
        together.append(saturated_throughput(urls, model, burst, PROMPT, OUTPUT))  # the mean of the engines'
        print(f"round {i + 1}/{args.rounds}: alone {alone[-len(urls):]}, together {together[-1]:.2f} req/s each",
              file=sys.stderr, flush=True)  # fmt: skip
    a, t = statistics.fmean(alone), statistics.fmean(together)
    print(json.dumps({"alone_rps": alone, "together_rps": together, "alone_mean": round(a, 2),
                      "together_mean": round(t, 2), "change": round(t / a - 1, 3)}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
