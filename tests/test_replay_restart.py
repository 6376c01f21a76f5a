"""``replay --restart-at`` (issue #33): the scaler loses its memory mid-run; kept state (``serve --state-dir``)
lets the restarted scaler know the capacity at once, and loses no attainment against starting cold."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from keda_llm_scaler.sim.run import RESTART_OUTAGE_S, RunConfig, simulate
from keda_llm_scaler.sim.workload import TraceWorkload
from tests.test_replay_pools import _step_day

EXE = str(Path(sys.executable).parent / "keda-llm-scaler")
RESTART_AT = 835.0  # a minute before the load steps up (at 900 s)


@pytest.fixture(scope="module")
def day() -> TraceWorkload:
    return _step_day(20.0, 30.0, ramp_s=120.0)


@pytest.fixture(scope="module")
def runs(day: TraceWorkload) -> dict[str, Any]:
    out = {}
    for name, restart, forget in (("none", None, False), ("kept", RESTART_AT, False), ("forgotten", RESTART_AT, True)):
        r = simulate(day, RunConfig(hpa_behavior="llm", warmup_s=300.0, restart_at_s=restart, forget_state=forget))
        out[name] = {"summary": r.summary, "timeline": r.timeline}
    return out


def _capacity_at(timeline: list[dict[str, Any]], t: float) -> float | None:
    """The capacity the policy read at the first point at or after ``t``."""
    return next(p.get("capacity_rps") for p in timeline if p["t"] >= t)


def test_a_restart_with_kept_state_reads_what_it_read_before_and_a_forgotten_one_does_not(
    runs: dict[str, Any],
) -> None:
    before = _capacity_at(runs["kept"]["timeline"], RESTART_AT - 10.0)
    assert before is not None, "the capacity was known before the restart"
    back = RESTART_AT + RESTART_OUTAGE_S + 10.0  # the first point after the outage
    assert _capacity_at(runs["kept"]["timeline"], back) == pytest.approx(before, rel=0.05)
    # what the scaler that never restarted reads then: the restart is invisible with its state
    none = _capacity_at(runs["none"]["timeline"], back)
    assert _capacity_at(runs["kept"]["timeline"], back) == pytest.approx(none, rel=1e-4)  # (6 digits kept)
    assert _capacity_at(runs["forgotten"]["timeline"], back) != pytest.approx(before, rel=0.05)
    # the outage itself: the policy read nothing, and the HPA held
    during = [p for p in runs["kept"]["timeline"] if RESTART_AT < p["t"] < RESTART_AT + RESTART_OUTAGE_S]
    assert during and all(p["metric"] is None for p in during)
    assert len({p["desired"] for p in during}) == 1


def test_kept_state_loses_no_attainment_against_forgotten(runs: dict[str, Any]) -> None:
    kept, forgotten = runs["kept"]["summary"], runs["forgotten"]["summary"]
    assert kept["after_restart"]["kept_state"] and not forgotten["after_restart"]["kept_state"]
    assert kept["after_restart"]["requests"] == forgotten["after_restart"]["requests"] > 0
    assert kept["after_restart"]["slo_attainment"] >= forgotten["after_restart"]["slo_attainment"] - 1e-3
    assert kept["after_warmup"]["slo_attainment"] >= 0.99
    assert "after_restart" not in runs["none"]["summary"]


def test_restart_flags_from_the_cli(tmp_path: Path) -> None:
    from keda_llm_scaler.sim.trace import BUNDLED_TRACE

    trace = tmp_path / "trace.csv"
    lines = BUNDLED_TRACE.read_text().splitlines()
    trace.write_text("\n".join([lines[0]] + [line for line in lines[1:] if line < "2023-11-16 18:35:46"]) + "\n")
    base = [EXE, "replay", "--trace", str(trace), "--rate-scale", "3", "--quiet"]
    out = subprocess.run(
        [*base, "--restart-at", "200", "--forget-state", "--json"],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    s = json.loads(out.stdout)
    assert s["after_restart"]["restart_at_s"] == 200 and s["after_restart"]["kept_state"] is False
    text = subprocess.run([*base, "--restart-at", "200"], capture_output=True, text=True, timeout=600, check=True)
    assert "restarted at 200 s (state kept)" in text.stdout
    for extra, says in (
        (["--forget-state"], "--forget-state goes with --restart-at"),
        (["--restart-at", "-5"], "--restart-at must be"),
        (["--restart-at", "100", "--policy", "queue"], "--restart-at restarts the composite"),
        (["--restart-at", "99999"], "not inside the replay"),
    ):
        bad = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and says in bad.stderr, (extra, bad.stderr)
