"""(g) The replay's HPA emulation against the real HPA controller, on the same composite series.

A scripted ExternalScaler (``keda_llm_scaler.controlplane.scripted``) serves one composite series to two
ScaledObjects, one per ``--hpa-behavior`` setting (``default``: Kubernetes' own; ``llm``: the README's),
each played ``KLS_HPA_TIME_SCALE`` times faster (0.05 in CI: every window and period of the behavior and
every step of the series shrunk alike). KEDA's metrics adapter calls GetMetrics once per HPA sync, so the
recorded calls are the controller's syncs, with the values it read. The emulation replays exactly those
readings at exactly those instants, and must choose the replica count the real controller chose after
every one of them.

``KLS_HPA_REPORT=DIR`` writes the two trajectories (JSON and a PNG) there: how docs/e2e.md's figure is
made (at ``KLS_HPA_TIME_SCALE=1``, about 30 minutes).
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from keda_llm_scaler.controlplane.api import Api
from keda_llm_scaler.controlplane.scripted import Call, Script, ScriptedScaler
from keda_llm_scaler.sim.hpa import AVERAGE_VALUE, BEHAVIORS, Behavior, Hpa, MetricReading
from tests.e2e.kube import Fleet, Pods, eventually

SCALE = float(os.environ.get("KLS_HPA_TIME_SCALE", "0.05"))
INITIAL, MIN, MAX = 2, 1, 20
# The series at full scale (seconds, composite): steady, a rise the up policies must pace, a reading
# inside the 10 % tolerance, a second rise, a long fall the down window and policies must pace, and a
# spike soon after the first step down (under `llm` at full scale, an up period that holds a down).
SERIES = [(0, 2.0), (200, 11.5), (500, 12.9), (650, 13.6), (800, 3.0), (1430, 20.0), (1500, 3.0), (1800, 3.0)]


def _emulate(calls: list[Call], behavior: Behavior) -> list[int]:
    hpa = Hpa(MIN, MAX, behavior)
    current, out = INITIAL, []
    for c in calls:
        current = hpa.decide(c.t, current, current, MetricReading(AVERAGE_VALUE, c.value, 1.0))
        out.append(current)
    return out


class _Sampler(threading.Thread):
    """The Deployment's ``spec.replicas`` of each fleet every 0.2 s (what the controller last set)."""

    def __init__(self, api: Api, fleets: list[Fleet]) -> None:
        super().__init__(daemon=True)
        self.api, self.fleets = api, fleets
        self.samples: dict[str, list[tuple[float, int]]] = {f.namespace: [] for f in fleets}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.2):
            for f in self.fleets:
                try:
                    n = f.spec_replicas()
                except Exception:  # a slow API read: the next sample
                    continue
                self.samples[f.namespace].append((time.monotonic(), n))

    def at(self, namespace: str, t: float) -> int | None:
        before = [n for ts, n in self.samples[namespace] if ts <= t]
        return before[-1] if before else None


def _real_after_each(sampler: _Sampler, namespace: str, calls: list[Call]) -> list[int | None]:
    # the controller writes the scale within milliseconds of its read; sample just before the next sync
    out = []
    for i, c in enumerate(calls):
        nxt = calls[i + 1].t if i + 1 < len(calls) else c.t + 3.0
        out.append(sampler.at(namespace, min(nxt, c.t + 4.0) - 0.3))
    return out


def _report(out: Path, runs: dict[str, dict[str, Any]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "hpa-emulation.json").write_text(json.dumps(runs, indent=1) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 3.2 * len(runs)), sharex=True, squeeze=False)
    for ax, (name, run) in zip(axes[:, 0], runs.items(), strict=True):
        ax.step(run["t"], run["composite"], where="post", color="0.6", label="composite (scripted)")
        ax.step(run["t"], run["real"], where="post", lw=2.5, label="real HPA controller")
        ax.step(run["t"], run["emulated"], where="post", ls="--", lw=1.5, label="emulation (sim/hpa.py)")
        ax.set_title(f"--hpa-behavior {name}: {run['agree']}/{len(run['t'])} syncs agree")
        ax.set_ylabel("replicas")
        ax.legend(loc="lower right", fontsize=8)
    axes[-1, 0].set_xlabel(f"seconds (time scale {SCALE:g}, HPA sync {os.environ.get('KLS_HPA_SYNC_PERIOD', '15')} s)")
    fig.tight_layout()
    fig.savefig(out / "hpa-emulation.png", dpi=110)
    plt.close(fig)


def test_the_emulation_decides_what_the_real_hpa_decides(api: Api, pods: Pods) -> None:
    steps = [(t * SCALE, v) for t, v in SERIES]
    behaviors = {name: BEHAVIORS[name].scaled(SCALE) for name in ("default", "llm")}
    fleets: dict[str, Fleet] = {}
    scripts: dict[str, Script] = {}
    with ScriptedScaler() as scaler:
        try:
            for name, behavior in behaviors.items():
                fleet = Fleet.in_new_namespace(api, f"hpa-{name}", replicas=INITIAL)
                fleets[name] = fleet
                fleet.create(grace_s=1)
                scripts[name] = scaler.add(fleet.namespace, "vllm", Script(steps))
                # KEDA's own poll would be one more GetMetrics call that is not a sync: poll once an hour
                fleet.scaled_object({"scalerAddress": scaler.address}, min_replicas=MIN, max_replicas=MAX,
                                    polling_s=3600, behavior=behavior.to_kubernetes())  # fmt: skip
            for name in fleets:
                eventually(lambda s=scripts[name]: len(scaler.calls(s)) >= 2, 90, f"the {name} HPA syncing")
            sampler = _Sampler(api, list(fleets.values()))
            sampler.start()
            time.sleep(1.0)
            scaler.begin(*scripts.values())
            time.sleep(steps[-1][0] + 2.0)
            sampler.stop.set()
            sampler.join(5)

            runs: dict[str, dict[str, Any]] = {}
            for name, fleet in fleets.items():
                calls = scaler.calls(scripts[name])
                real = _real_after_each(sampler, fleet.namespace, calls)
                emulated = _emulate(calls, behaviors[name])
                began = scripts[name].began or calls[0].t
                played = [i for i, c in enumerate(calls) if 0 <= c.t - began <= steps[-1][0]]
                runs[name] = {
                    "t": [round(calls[i].t - began, 2) for i in played],
                    "composite": [calls[i].value for i in played],
                    "real": [real[i] for i in played],
                    "emulated": [emulated[i] for i in played],
                    "agree": sum(real[i] == emulated[i] for i in played),
                    "behavior": behaviors[name].to_kubernetes(),
                    # every sync, also those before the series began: what the emulation was given
                    "calls": [(round(c.t - began, 3), c.value) for c in calls],
                    "real_after_each_call": real,
                }
            if os.environ.get("KLS_HPA_REPORT"):
                _report(Path(os.environ["KLS_HPA_REPORT"]), runs)
            sync_s = float(os.environ.get("KLS_HPA_SYNC_PERIOD", "15"))
            for name, run in runs.items():
                assert len(run["t"]) >= 0.8 * steps[-1][0] / sync_s, f"{name}: only {len(run['t'])} syncs in the run"
                # the series must have made the real controller work: up, paced, held, and down
                real_run = [r or 0 for r in run["real"]]
                assert max(real_run) >= 12 and any(b < a for a, b in itertools.pairwise(real_run)), (name, real_run)
                diff = [(t, r, e) for t, r, e in zip(run["t"], run["real"], run["emulated"], strict=True) if r != e]
                assert not diff, f"{name}: (t, real, emulated) where they differ: {diff}"
        finally:
            for fleet in fleets.values():
                pods.load(fleet.namespace, fleet.app, 0)
                fleet.delete_namespace()
