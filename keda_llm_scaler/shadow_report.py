"""``keda-llm-scaler shadow-report FILE --out DIR``: what shadow saw, as a plot and a report (issue #33).

FILE is a ``shadow --record`` file (JSON lines), or ``--prometheus URL`` reads the same series from a
Prometheus that scraped shadow's /metrics (a range query per series over ``--since``). Per workload, the
report puts the replicas its autoscaler ran beside what the composite would have asked, the TTFT p95 and
queue the fleet saw, and the replica- and GPU-hours each would have cost; the PNG shows them over time.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

__all__ = ["Sample", "add_shadow_report_arguments", "from_prometheus", "read_record", "shadow_report_main", "summarize"]

# the series shadow exports, by the field of a record they fill
PROMETHEUS_SERIES: Final = {
    "desired": "llm_scaler_shadow_desired_replicas",
    "actual": "llm_scaler_shadow_actual_replicas",
    "ready": "llm_scaler_shadow_ready_replicas",
    "composite": "llm_scaler_composite",
    "ttft_p95_s": "llm_scaler_ttft_p95_seconds",
    "waiting": "llm_scaler_waiting_requests",
}
_DPI: Final = 110
MAX_GAP_S: Final = 300.0  # a gap in the record longer than this is not integrated (shadow was down)


@dataclass(frozen=True)
class Sample:
    t: float
    desired: float | None
    actual: float | None
    ready: float | None = None
    composite: float | None = None
    ttft_p95_s: float | None = None
    waiting: float | None = None


def _num(x: object) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) else None


def read_record(path: Path) -> dict[str, list[Sample]]:
    """A shadow --record file: samples by workload (namespace/name), in time order. Lines that are not
    records (a torn last line) are skipped, and counted in the report."""
    out: dict[str, list[Sample]] = defaultdict(list)
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if not isinstance(r, dict) or _num(r.get("t")) is None:
            continue
        key = f"{r.get('namespace', '')}/{r.get('scaledobject', '')}"
        out[key].append(
            Sample(
                float(r["t"]),
                _num(r.get("desired")),
                _num(r.get("actual")),
                _num(r.get("ready")),
                _num(r.get("composite")),
                _num(r.get("ttft_p95_s")),
                _num(r.get("waiting")),
            )
        )
    return {k: sorted(v, key=lambda s: s.t) for k, v in out.items()}


def from_prometheus(results: dict[str, Any]) -> dict[str, list[Sample]]:
    """Samples from Prometheus range queries: ``{field: query_range response}`` for the fields of
    PROMETHEUS_SERIES, each a matrix with ``namespace`` and ``scaledobject`` labels."""
    points: dict[str, dict[float, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for name, resp in results.items():
        data = resp.get("data") if isinstance(resp, dict) else None
        if not isinstance(data, dict) or data.get("resultType") != "matrix":
            raise ValueError(f"{name}: not a range query's answer (data.resultType matrix)")
        for series in data.get("result", []):
            labels = series.get("metric", {})
            key = f"{labels.get('namespace', '')}/{labels.get('scaledobject', '')}"
            for t, v in series.get("values", []):
                value = float(v)
                if math.isfinite(value):
                    points[key][float(t)][name] = value
    return {
        key: [
            Sample(
                t,
                f.get("desired"),
                f.get("actual"),
                f.get("ready"),
                f.get("composite"),
                f.get("ttft_p95_s"),
                f.get("waiting"),
            )
            for t, f in sorted(by_t.items())
        ]
        for key, by_t in points.items()
    }


def _hours(samples: Sequence[Sample], field: str) -> float | None:
    """The integral of a field over time, in replica-hours (left Riemann sum), over the intervals where both
    the actual and the desired replicas are known, so that the two compare over the same time (gaps past
    MAX_GAP_S are not counted). None when there is no such interval."""
    total, known = 0.0, False
    for a, b in itertools.pairwise(samples):
        v = getattr(a, field)
        dt = b.t - a.t
        if v is None or a.actual is None or a.desired is None or dt <= 0 or dt > MAX_GAP_S:
            continue
        total += v * dt
        known = True
    return total / 3600.0 if known else None


def summarize(samples: Sequence[Sample], gpus_per_replica: float, slo_s: float | None) -> dict[str, Any]:
    both = [s for s in samples if s.desired is not None and s.actual is not None]
    over = [s for s in both if s.desired is not None and s.actual is not None and s.desired > s.actual]
    under = [s for s in both if s.desired is not None and s.actual is not None and s.desired < s.actual]
    ttft = sorted(s.ttft_p95_s for s in samples if s.ttft_p95_s is not None)
    actual_h, desired_h = _hours(samples, "actual"), _hours(samples, "desired")
    out: dict[str, Any] = {
        "samples": len(samples),
        "duration_s": samples[-1].t - samples[0].t if samples else 0.0,
        "actual_replica_hours": actual_h,
        "desired_replica_hours": desired_h,
        "gpu_hours_actual": None if actual_h is None else actual_h * gpus_per_replica,
        "gpu_hours_desired": None if desired_h is None else desired_h * gpus_per_replica,
        "gpu_hours_difference": None
        if actual_h is None or desired_h is None
        else (desired_h - actual_h) * gpus_per_replica,
        "share_asking_more": len(over) / len(both) if both else None,
        "share_asking_fewer": len(under) / len(both) if both else None,
        "max_shortfall": max((s.desired - s.actual for s in over if s.desired and s.actual is not None), default=0.0),
        "max_actual": max((s.actual for s in samples if s.actual is not None), default=None),
        "max_desired": max((s.desired for s in samples if s.desired is not None), default=None),
        "ttft_p95_median_s": ttft[len(ttft) // 2] if ttft else None,
        "ttft_p95_max_s": ttft[-1] if ttft else None,
        "max_waiting": max((s.waiting for s in samples if s.waiting is not None), default=None),
    }
    if slo_s is not None:
        timed = [s for s in samples if s.ttft_p95_s is not None]
        slow = [s for s in timed if s.ttft_p95_s is not None and s.ttft_p95_s > slo_s]
        asking = [s for s in slow if s.desired is not None and s.actual is not None and s.desired > s.actual]
        out["share_over_slo"] = len(slow) / len(timed) if timed else None
        out["share_over_slo_while_asking_more"] = len(asking) / len(slow) if slow else None  # the HPA let these by
    return out


def _fmt(x: object, spec: str = ".1f") -> str:
    return "—" if x is None else format(x, spec) if isinstance(x, int | float) else str(x)


def write_report(
    out: Path, workloads: dict[str, list[Sample]], source: str, gpus_per_replica: float, slo_s: float | None
) -> dict[str, dict[str, Any]]:
    out.mkdir(parents=True, exist_ok=True)
    summaries = {k: summarize(v, gpus_per_replica, slo_s) for k, v in workloads.items() if v}
    lines = [
        "# Shadow report",
        "",
        f"From {source}. What the workloads' own autoscaler ran (`actual`: spec.replicas of the scaleTargetRef) "
        "against what the composite would have asked of an HPA (`desired`: targetValue, min/maxReplicaCount and "
        "the HPA's 10 % tolerance, no scaling behavior), and what the fleet saw.",
        f"GPU-hours count {gpus_per_replica:g} GPU(s) per replica (`--gpus-per-replica`), over the time both "
        "counts are known.",
        "",
        "| workload | duration | replica-h actual / desired | GPU-h difference | asking more / fewer "
        "| max actual / desired | TTFT p95 median / max | most waiting |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, s in summaries.items():
        lines.append(
            f"| {key} | {s['duration_s'] / 60:.0f} min | {_fmt(s['actual_replica_hours'], '.2f')} / "
            f"{_fmt(s['desired_replica_hours'], '.2f')} | {_fmt(s['gpu_hours_difference'], '+.2f')} | "
            f"{_fmt(s['share_asking_more'], '.0%')} / {_fmt(s['share_asking_fewer'], '.0%')} | "
            f"{_fmt(s['max_actual'], 'g')} / {_fmt(s['max_desired'], 'g')} | "
            f"{_fmt(s['ttft_p95_median_s'], '.2f')} / {_fmt(s['ttft_p95_max_s'], '.2f')} s | "
            f"{_fmt(s['max_waiting'], 'g')} |"
        )
    lines.append("")
    for key, s in summaries.items():
        png = f"shadow-{key.replace('/', '_')}.png"
        plot_shadow(out / png, key, workloads[key], slo_s)
        lines += [f"## {key}", "", f"![{key}]({png})", ""]
        if s["share_asking_more"]:
            lines.append(
                f"- The composite asked for more replicas than ran {s['share_asking_more']:.0%} of the time, by up to "
                f"{s['max_shortfall']:g}."
            )
        if slo_s is not None and s.get("share_over_slo"):
            lines.append(
                f"- TTFT p95 was over the {slo_s:g} s SLO {s['share_over_slo']:.0%} of the time; "
                f"{_fmt(s.get('share_over_slo_while_asking_more'), '.0%')} of that while the composite asked for more."
            )
        if s["gpu_hours_difference"] is not None:
            word = "more" if s["gpu_hours_difference"] > 0 else "fewer"
            lines.append(
                f"- Following the composite would have used {abs(s['gpu_hours_difference']):.2f} GPU-hours {word}."
            )
        lines.append("")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    (out / "summary.json").write_text(json.dumps(summaries, indent=1, sort_keys=True) + "\n")
    return summaries


def _since(raw: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        value = float(raw[:-1]) * units[raw[-1]] if raw[-1] in units else float(raw)
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"{raw!r}: a duration such as 30m, 6h or 2d") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{raw!r}: a duration > 0")
    return value


def add_shadow_report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("record", nargs="?", type=Path, help="a shadow --record file (JSON lines)")
    p.add_argument("--out", type=Path, required=True, help="directory for report.md, summary.json and PNGs")
    p.add_argument(
        "--prometheus", default=None, metavar="URL", help="read the exported series from this Prometheus instead"
    )
    p.add_argument("--since", type=_since, default=_since("6h"), help="with --prometheus: how far back (default 6h)")
    p.add_argument("--step", type=_since, default=_since("30s"), help="with --prometheus: the query step (default 30s)")
    p.add_argument("--gpus-per-replica", type=float, default=1.0, help="GPUs one replica holds (default 1)")
    p.add_argument("--slo-ttft", type=float, default=None, help="TTFT SLO in seconds, to mark it (default: none)")


def _query_prometheus(url: str, since_s: float, step_s: float) -> dict[str, Any]:
    import httpx

    end = time.time()
    out = {}
    with httpx.Client(base_url=url, timeout=30, trust_env=False) as client:
        for name, series in PROMETHEUS_SERIES.items():
            resp = client.get(
                "/api/v1/query_range", params={"query": series, "start": end - since_s, "end": end, "step": step_s}
            )
            resp.raise_for_status()
            out[name] = resp.json()
    return out


def shadow_report_main(args: argparse.Namespace) -> int:
    if (args.record is None) == (args.prometheus is None):
        print("keda-llm-scaler shadow-report: give a record FILE or --prometheus URL (one of them)", file=sys.stderr)
        return 2
    if not (args.gpus_per_replica > 0 and math.isfinite(args.gpus_per_replica)):
        print("keda-llm-scaler shadow-report: --gpus-per-replica must be > 0", file=sys.stderr)
        return 2
    try:
        if args.prometheus is not None:
            workloads = from_prometheus(_query_prometheus(args.prometheus, args.since, args.step))
            source = f"Prometheus {args.prometheus}, the last {args.since / 3600:g} h at a {args.step:g} s step"
        else:
            workloads = read_record(args.record)
            source = f"the shadow record {args.record.name}"
    except (OSError, ValueError) as exc:
        print(f"keda-llm-scaler shadow-report: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # httpx errors from --prometheus: say which, no traceback
        print(f"keda-llm-scaler shadow-report: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if not any(workloads.values()):
        print("keda-llm-scaler shadow-report: no samples to report", file=sys.stderr)
        return 1
    summaries = write_report(args.out, workloads, source, args.gpus_per_replica, args.slo_ttft)
    for key, s in summaries.items():
        print(
            f"{key}: {s['samples']} samples; replica-hours actual {_fmt(s['actual_replica_hours'], '.2f')}, desired "
            f"{_fmt(s['desired_replica_hours'], '.2f')}; asking for more {_fmt(s['share_asking_more'], '.0%')} "
            "of the time"
        )
    print(f"wrote {args.out / 'report.md'}")
    return 0


def plot_shadow(path: Path, title: str, samples: Sequence[Sample], slo_s: float | None) -> None:
    """shadow-report: the replicas the workload's autoscaler ran against what the composite would have asked,
    and the TTFT p95 and queue the fleet saw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    t0 = samples[0].t if samples else 0.0
    minutes = [(s.t - t0) / 60 for s in samples]
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(11, 7), dpi=_DPI, layout="constrained", sharex=True)
    ax.set_title(f"Shadow: {title}", fontsize=10, loc="left")
    ax.step(
        minutes, [s.actual for s in samples], where="post", color="#4575b4", label="actual replicas (its autoscaler)"
    )
    if any(s.ready is not None for s in samples):
        ax.step(minutes, [s.ready for s in samples], where="post", color="#4575b4", ls=":", lw=1, label="ready")
    ax.step(minutes, [s.desired for s in samples], where="post", color="#d73027", label="the composite would ask")
    ax.plot(minutes, [s.composite for s in samples], color="#fc8d59", lw=0.8, alpha=0.8, label="composite")
    ax.set_ylabel("replicas")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    ax2.plot(minutes, [s.ttft_p95_s for s in samples], color="#1a9850", label="TTFT p95 (s)")
    if slo_s is not None:
        ax2.axhline(slo_s, color="#1a9850", ls=":", lw=1, label=f"SLO {slo_s:g} s")
    ax2.set_ylabel("TTFT p95 (s)")
    ax2.grid(alpha=0.3)
    q = ax2.twinx()
    q.plot(minutes, [s.waiting for s in samples], color="#762a83", lw=1, label="waiting requests")
    q.set_ylabel("waiting requests")
    lines, lines2 = ax2.get_legend_handles_labels(), q.get_legend_handles_labels()
    ax2.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper left", fontsize=8)
    ax2.set_xlabel("minutes")
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)
