"""The oracle as a lower bound, through `keda-llm-scaler replay --sweep` on each bundled workload. Its own
file: the two sweeps are the suite's longest tests, and pytest-xdist balances by file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXE = os.path.join(os.path.dirname(sys.executable), "keda-llm-scaler")


@pytest.mark.parametrize(("trace", "scale", "hours"), [("conv", "12", "0.25:0.6"), ("bursty", "4", "0.3:0.65")])
def test_the_oracle_is_a_lower_bound_on_the_bundled_workloads(
    tmp_path: Path, trace: str, scale: str, hours: str
) -> None:
    """Every policy over its knob on 21 minutes of each bundled workload (the full hours are in docs/):
    no configuration reaches an oracle front point's attainment with fewer GPU-hours."""
    from keda_llm_scaler.sim.replay import oracle_violations

    out_dir = tmp_path / trace
    out = subprocess.run(
        [
            EXE,
            "replay",
            "--trace",
            trace,
            "--rate-scale",
            scale,
            "--hours",
            hours,
            "--hpa-behavior",
            "llm",
            "--sweep",
            "--out-dir",
            str(out_dir),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr
    results = json.loads((out_dir / "sweep.json").read_text())
    assert {r["policy"] for r in results} == {
        "composite",
        "queue",
        "kv",
        "gpu-util",
        "cpu",
        "kaito",
        "static",
        "oracle",
    }
    assert all(r["routing"] == "least-loaded" for r in results)
    oracles = [r for r in results if r["policy"] == "oracle"]
    assert len(oracles) == 5 and max(r["slo_attainment"] for r in oracles) >= 0.99
    assert [(o["knob_value"], r["policy"], r["knob_value"]) for o, r in oracle_violations(results)] == []
    assert "Oracle as a lower bound: holds" in (out_dir / "sweep.md").read_text()
    statics = sorted(r["knob_value"] for r in results if r["policy"] == "static")
    assert len(statics) == 7  # sized around the workload's own peak, not fixed counts
