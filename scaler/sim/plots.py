"""PNG plots of replays (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

__all__ = ["plot_pareto", "plot_run"]

COLORS = {"composite": "#d62728", "queue": "#1f77b4", "kv": "#2ca02c", "gpu-util": "#9467bd", "cpu": "#8c564b",
          "kaito": "#e377c2", "static": "#7f7f7f", "oracle": "#000000"}


def plot_run(path: Path, summary: dict[str, Any], timeline: Sequence[dict[str, float | None]]) -> None:
    """Load, replicas (ready and starting), the policy's metric, and TTFT p95 against the SLO."""
    t = [float(p["t"] or 0) / 60.0 for p in timeline]
    fig, axes = plt.subplots(4, 1, figsize=(11, 10), sharex=True)
    title = (f"{summary['policy']} ({summary['knob']}={summary['knob_value']:g}) on {summary['profile']}: "
             f"SLO attainment {summary['slo_attainment']:.1%}, {summary['gpu_hours']:.1f} GPU-h, "
             f"{summary['streams_cut']} streams cut")
    fig.suptitle(title, fontsize=11)
    axes[0].plot(t, [p["load_rps"] for p in timeline], color="#1f77b4")
    axes[0].set_ylabel("load (req/s)")
    ready = [p["ready"] or 0 for p in timeline]
    starting = [p["starting"] or 0 for p in timeline]
    axes[1].stackplot(t, ready, starting, labels=["ready", "starting"], colors=["#2ca02c", "#ffbb78"])
    axes[1].plot(t, [p["draining"] or 0 for p in timeline], color="#7f7f7f", lw=1, label="draining")
    axes[1].set_ylabel("replicas")
    axes[1].legend(loc="upper left", fontsize=8)
    metric = [p["metric"] if p["metric"] is not None else math.nan for p in timeline]
    axes[2].plot(t, metric, color=COLORS.get(summary["policy"], "#d62728"))
    axes[2].set_ylabel("composite" if summary["policy"] == "composite" else f"{summary['policy']} metric")
    p95 = [min(v, 1e4) if (v := p.get("ttft_p95_s")) is not None else math.nan for p in timeline]
    axes[3].plot(t, p95, color="#d62728", label="TTFT p95 (arrivals of the last minute)")
    axes[3].axhline(summary["slo_ttft_s"], color="black", ls="--", lw=1, label=f"SLO {summary['slo_ttft_s']:g} s")
    axes[3].set_yscale("log")
    axes[3].set_ylabel("seconds")
    axes[3].set_xlabel("minutes")
    axes[3].legend(loc="upper left", fontsize=8)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_pareto(path: Path, results: Sequence[dict[str, Any]], title: str) -> None:
    """GPU-hours against SLO attainment, one line per policy through its knob values."""
    fig, ax = plt.subplots(figsize=(10, 7))
    by_policy: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        by_policy.setdefault(r["policy"], []).append(r)
    for policy, runs in by_policy.items():
        runs = sorted(runs, key=lambda r: r["gpu_hours"])
        ax.plot([r["gpu_hours"] for r in runs], [100 * r["slo_attainment"] for r in runs], marker="o",
                color=COLORS.get(policy), label=policy, lw=2.5 if policy == "composite" else 1.2)
        for r in runs:
            ax.annotate(f"{r['knob_value']:g}", (r["gpu_hours"], 100 * r["slo_attainment"]), fontsize=7,
                        textcoords="offset points", xytext=(4, 3))
    ax.set_xscale("log")
    ax.set_xlabel("GPU-hours (log)")
    ax.set_ylabel("SLO attainment (% of requests with TTFT within the SLO)")
    ax.set_title(title, fontsize=11)
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
