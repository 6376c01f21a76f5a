#!/usr/bin/env python3
"""Does engine 0 serve slower when its neighbour's load comes from another process? calibrate's serving
phase (``calibrate._serving``: its mix, its seed, ``--rate`` req/s for 75 s) on engine 0, in three
conditions, ``--rounds`` times:

- ``idle``: the neighbour gets nothing;
- ``other-process``: the neighbour gets the same phase from a second Python process (as when
  ``sim_to_real.py`` calibrates every engine at once, each in its own process);
- ``same-process``: the neighbour gets it from this process's event loop (as the reported loads do).

Each line is engine 0's mean inter-token and prefill times (the engine's own histograms) and the client's
mean TTFT. Run inside ``scripts/engine run`` with two engines:

    scripts/engine run 2 --cpus 0.45 --max-num-seqs 24 --layers 2 -- \
        python benchmarks/engine_neighbour_client.py --rate 2.2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from typing import Any

from keda_llm_scaler.enginelab.calibrate import _burst, _serving

CONDITIONS = ("idle", "other-process", "same-process")


def _row(result: dict[str, Any]) -> dict[str, float]:
    keys = ("engine_itl_ms", "engine_prefill_ms", "client_ttft_mean_ms")
    return {k: round(result[k], 1) for k in keys if isinstance(result.get(k), float)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=2.2, help="req/s of the serving phase on each engine")
    ap.add_argument("--rounds", type=int, default=2, help="times through the three conditions (default 2)")
    ap.add_argument("--max-model-len", type=int, default=4096, help="the engines' max_model_len (default 4096)")
    args = ap.parse_args()
    urls = os.environ["KLS_ENGINE_URLS"].split(",")
    model = os.environ["KLS_ENGINE_MODEL"]
    if len(urls) != 2:
        ap.error("run it with two engines: scripts/engine run 2 ...")
    engine, neighbour = urls
    for url in urls:  # the first requests of an engine compile and allocate
        asyncio.run(_burst(url, model, 2, 64, 8))
    phase = (args.rate, args.max_model_len)
    for round_ in range(args.rounds):
        for condition in CONDITIONS:
            if condition == "idle":
                result = asyncio.run(_serving(engine, model, *phase))
            elif condition == "other-process":
                code = (
                    "import asyncio; from keda_llm_scaler.enginelab.calibrate import _serving; "
                    f"asyncio.run(_serving({neighbour!r}, {model!r}, {args.rate}, {args.max_model_len}))"
                )
                other = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL)
                try:
                    result = asyncio.run(_serving(engine, model, *phase))
                finally:
                    try:
                        other.wait(timeout=600)
                    except subprocess.TimeoutExpired:
                        other.kill()
                        other.wait()
            else:

                async def both() -> list[dict[str, Any]]:
                    return list(await asyncio.gather(*(_serving(u, model, *phase) for u in urls)))

                result = asyncio.run(both())[0]
            print(json.dumps({"round": round_, "condition": condition, **_row(result)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
