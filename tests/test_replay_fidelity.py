"""The fleet simulator against the independent step-level reference (keda_llm_scaler/testing/refsim.py), on
static fleets.

Fed the same pre-scaled trace with the same routing, the fast simulator (closed-form decode stretches,
routing in 50 ms slices, KV in tokens) must agree with the per-step, per-arrival reference (exact KV
blocks) within 1 point of SLO attainment and 15 % of TTFT p95, at the smallest static fleet reaching
99 % and one replica either side — where a fleet is most sensitive to the model.
"""

from __future__ import annotations

import pytest

from keda_llm_scaler.sim.run import RunConfig, simulate
from keda_llm_scaler.sim.trace import BUNDLED_TRACE, BURSTY_TRACE, TraceRequest, load_trace, scale_rate
from keda_llm_scaler.testing.refsim import simulate_static


def _smallest_meeting(reqs: list[tuple[float, int, int]], start: int, routing: str) -> int:
    n = start
    while simulate_static(reqs, n, routing=routing).slo_attainment < 0.99:
        n += 1
    while n > 1 and simulate_static(reqs, n - 1, routing=routing).slo_attainment >= 0.99:
        n -= 1
    return n


@pytest.mark.parametrize(
    ("name", "trace", "scale", "guess"),
    [
        ("conversation x12", BUNDLED_TRACE, 12.0, 8),
        ("bursty hour x4", BURSTY_TRACE, 4.0, 9),
    ],
)
def test_static_fleets_agree_with_the_step_level_reference(name: str, trace: object, scale: float, guess: int) -> None:
    scaled: list[TraceRequest] = scale_rate(load_trace(trace), scale)  # type: ignore[arg-type]
    reqs = [(r.t, r.prompt, r.output) for r in scaled]
    best = _smallest_meeting(reqs, guess, "least-loaded")
    for n in (best - 1, best, best + 1):
        ref = simulate_static(reqs, n, routing="least-loaded")
        ours = simulate(scaled, RunConfig(policy="static", knob=n, routing="least-loaded")).summary
        assert ours["requests"] == len(reqs)
        assert abs(ours["slo_attainment"] - ref.slo_attainment) <= 0.01, (
            name,
            n,
            ours["slo_attainment"],
            ref.slo_attainment,
        )
        assert ours["ttft_p95_s"] == pytest.approx(ref.ttft_p95_s, rel=0.15), (name, n)


def test_round_robin_agrees_too() -> None:
    scaled = scale_rate(load_trace(BUNDLED_TRACE), 12)
    reqs = [(r.t, r.prompt, r.output) for r in scaled if r.t < 1800]
    ours = simulate(
        [r for r in scaled if r.t < 1800], RunConfig(policy="static", knob=7, routing="round-robin")
    ).summary
    ref = simulate_static(reqs, 7, routing="round-robin")
    assert abs(ours["slo_attainment"] - ref.slo_attainment) <= 0.01
    assert ours["ttft_p95_s"] == pytest.approx(ref.ttft_p95_s, rel=0.15)
