"""The soak's short version (benchmarks/soak.py has the long one): the real `serve` process under churn,
GetMetrics load and streams that are cancelled and reopened, for one minute. What must hold on any machine:
the process lives, nothing crashes inside it, every error is an answer KEDA can act on, and its memory,
file descriptors and /metrics stay bounded while targets come and go. Latency is recorded, not asserted
(the figures are in docs/reliability.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_minute_of_churn_and_load(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--minutes", "1", "--rps", "40",
         "--replicas", "60", "--streams", "40", "--fleets", "6", "--churn-s", "15", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads((tmp_path / "soak.json").read_text())
    samples = result["samples"]
    assert not result["died"] and len(samples) >= 5
    assert (tmp_path / "soak.png").read_bytes()[:4] == b"\x89PNG"
    log = (tmp_path / "serve.log").read_text()
    assert "rpc_crashed" not in log and "Traceback" not in log, log[-3000:]
    # errors are answers KEDA acts on (UNAVAILABLE: a new target's first scrape; a deadline on a busy
    # machine), never INTERNAL
    codes = {code for s in samples for code in s["errors"]}
    assert codes <= {"UNAVAILABLE", "DEADLINE_EXCEEDED"}, codes
    calls = sum(s["rpcs"] + s["first_calls"] for s in samples)
    failed = sum(n for s in samples for n in s["errors"].values())
    assert failed < 0.2 * calls, (failed, calls)
    # bounded while targets churn: superseded ones retire (30 s), so growth levels off within the minute
    first, last = samples[0], samples[-1]
    assert last["rss_mb"] < 1.5 * first["rss_mb"] + 20, (first, last)
    assert last["fds"] < first["fds"] + 60, (first, last)
    peak_lines = max(s["metrics_lines"] for s in samples)
    assert peak_lines < 6 * first["metrics_lines"], [s["metrics_lines"] for s in samples]
