"""Targeted parse vs prometheus_client's full parse, on the shipped fixtures and on a synthetic DP=8 pod.

Prints ratios against the reference measured in the same run (the machine is shared and noisy).
    python benchmarks/parse_bench.py
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from keda_llm_scaler.engines import read_replica
from keda_llm_scaler.testing.payloads import EngineLoad, vllm_v1

ROOT = Path(__file__).resolve().parent.parent


def best_of(fn: Callable[[], object], repeat: int = 7, number: int = 20) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - start) / number)
    return min(times)


def full_parse(text: str) -> None:
    for family in text_string_to_metric_families(text):
        for _ in family.samples:
            pass


def payloads() -> dict[str, str]:
    fixtures = ROOT / "tests" / "fixtures" / "metrics"
    out = {p.name: p.read_text() for p in sorted(fixtures.glob("vllm_v1_reconstructed_*.txt"))}
    out["sglang_v0.4.x_docs"] = (fixtures / "sglang_v0.4.x_docs-production-metrics-md.txt").read_text()
    out["synthetic_dp8_200ttft"] = vllm_v1([EngineLoad(3, 40, 0.6)] * 8, ttft_observations=[0.05] * 200)
    return out


def main() -> int:
    ratios = []
    print(f"{'payload':45} {'bytes':>8} {'full ms':>9} {'ours ms':>9} {'speed-up':>9}")
    for name, text in payloads().items():
        full = best_of(lambda t=text: full_parse(t))
        ours = best_of(lambda t=text: read_replica(t))
        ratios.append(full / ours)
        print(f"{name:45} {len(text):8d} {full * 1e3:9.3f} {ours * 1e3:9.3f} {full / ours:8.1f}x")
    print(f"median speed-up: {statistics.median(ratios):.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
