"""PNG plots of replays (matplotlib, Agg backend: no display needed).

`plot_run` draws one replay as stacked panels sharing the time axis (load, replicas, the policy's raw metric when it
is not already in replica units, TTFT p95 against the SLO); `plot_pareto` draws GPU-hours against SLO attainment for
a sweep, one line per policy through its knob values. Both tolerate missing keys: a series that is absent (or None
throughout) is simply not drawn, so older timelines keep working. `plot_victims` compares scale-down victim choices
(random vs ranked): streams cut and tokens lost per scale-down, per workload and grace period.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import matplotlib

matplotlib.use("Agg")
import matplotlib.patheffects as path_effects
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.text import Text
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, MaxNLocator, MultipleLocator, NullFormatter
from matplotlib.transforms import Bbox, IdentityTransform

__all__ = ["plot_pareto", "plot_run", "plot_victims"]

COLORS = {
    "composite": "#d62728",
    "queue": "#1f77b4",
    "kv": "#2ca02c",
    "gpu-util": "#9467bd",
    "cpu": "#8c564b",
    "kaito": "#e377c2",
    "static": "#7f7f7f",
    "oracle": "#000000",
}
MARKERS = {
    "composite": "o",
    "queue": "s",
    "kv": "^",
    "gpu-util": "D",
    "cpu": "p",
    "kaito": "<",
    "static": "h",
    "oracle": "*",
}
_EXTRA_COLORS = ["#ff7f0e", "#17becf", "#bcbd22", "#393b79", "#ad494a", "#637939", "#8c6d31", "#7b4173"]
_DPI = 110
_TARGET_PCT = 99.0
_HOURS_ABOVE_S = 3 * 3600.0


def _color(policy: str, extra: dict[str, str]) -> str:
    if policy in COLORS:
        return COLORS[policy]
    if policy not in extra:
        extra[policy] = _EXTRA_COLORS[len(extra) % len(_EXTRA_COLORS)]
    return extra[policy]


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "?" if value is None else str(value)
    return f"{value:g}"


def _series(timeline: Sequence[dict[str, float | None]], key: str) -> list[float] | None:
    """The key's values as floats (NaN where missing), or None when no sample has it."""
    values = [p.get(key) for p in timeline]
    if all(v is None for v in values):
        return None
    return [math.nan if v is None else float(v) for v in values]


def _zero(values: list[float] | None, n: int) -> list[float]:
    if values is None:
        return [0.0] * n
    return [0.0 if math.isnan(v) else v for v in values]


def _legend_outside(ax: Axes) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, framealpha=0.9, borderaxespad=0.0)


# --------------------------------------------------------------------------------------------------- one run


def plot_run(path: Path, summary: dict[str, Any], timeline: Sequence[dict[str, float | None]]) -> None:
    """Load, replicas (ready, starting, desired, the policy's demand), its raw metric, and TTFT p95 against the SLO."""
    policy = str(summary.get("policy", "?"))
    color = _color(policy, {})
    n = len(timeline)
    t_s = [float(p.get("t") or 0.0) for p in timeline]
    span = max(t_s, default=0.0) - min(t_s, default=0.0)
    hours = span >= _HOURS_ABOVE_S
    t = [v / (3600.0 if hours else 60.0) for v in t_s]

    metric = _series(timeline, "metric")
    demand = _series(timeline, "metric_replicas")
    if demand is None and policy == "composite":
        demand = metric  # older timelines: the composite is the metric, already in replica-equivalents
    show_metric = policy != "composite" and metric is not None

    ratios = [1.0, 1.7] + ([1.0] if show_metric else []) + [1.3]
    fig, axes_arr = plt.subplots(
        len(ratios),
        1,
        figsize=(13, 1.0 + 2.2 * len(ratios)),
        sharex=True,
        dpi=_DPI,
        gridspec_kw={"height_ratios": ratios},
        layout="constrained",
    )
    axes: list[Axes] = list(axes_arr)
    ax_load, ax_rep, ax_ttft = axes[0], axes[1], axes[-1]
    fig.suptitle(_run_title(summary), fontsize=11)
    lw = 0.8 if n > 1500 else 1.2

    load = _series(timeline, "load_rps")
    if load is not None:
        ax_load.plot(t, load, color="#1f77b4", lw=lw, label="arrivals (req/s, last minute)")
    need = _series(timeline, "need_rps")
    if need is not None:
        # The composite's view: what it plans for, and what the ready fleet serves at its target.
        ax_load.plot(t, need, color="#d62728", lw=lw, ls="--", label="planned demand (offered + growth + 2 x spread)")
        capacity = _series(timeline, "capacity_rps")
        knob = summary.get("knob_value")
        if capacity is not None and isinstance(knob, int | float):
            ready = _zero(_series(timeline, "ready"), n)
            served = [r * c * float(knob) for r, c in zip(ready, capacity, strict=True)]
            ax_load.step(
                t,
                served,
                where="post",
                color="#2ca02c",
                lw=lw,
                label=f"ready replicas x capacity x {float(knob):g} (learned or read from KV)",
            )
    ax_load.set_ylabel("load (req/s)")
    ax_load.set_ylim(bottom=0)
    _legend_outside(ax_load)

    _replicas_panel(ax_rep, summary, timeline, t, demand, policy, color, lw)

    if show_metric and metric is not None:
        ax_m = axes[2]
        ax_m.plot(t, metric, color=color, lw=lw, label=f"{policy} metric (raw, as the policy reads it)")
        ax_m.set_ylabel(f"{policy} metric")
        _legend_outside(ax_m)

    _ttft_panel(ax_ttft, summary, timeline, t, lw)

    ax_ttft.set_xlabel("hours" if hours else "minutes")
    if t:
        lo_t, hi_t = min(t), max(t) if max(t) > min(t) else min(t) + 1.0
        ax_ttft.set_xlim(lo_t, hi_t)
        steps = (1.0, 2.0, 3.0, 6.0, 12.0) if hours else (1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0)
        ax_ttft.xaxis.set_major_locator(MultipleLocator(next((s for s in steps if (hi_t - lo_t) / s <= 12), 60.0)))
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.margins(x=0)
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)


def _run_title(summary: dict[str, Any]) -> str:
    head = [
        f"{summary.get('policy', '?')} ({summary.get('knob', 'knob')}={_fmt(summary.get('knob_value'))})",
        f"profile {summary.get('profile', '?')}",
    ]
    if summary.get("routing"):
        head.append(f"routing {summary['routing']}")
    if summary.get("workload"):
        head.append(f"workload {summary['workload']}")
    if isinstance(summary.get("rate_scale"), int | float) and summary["rate_scale"] != 1:
        head.append(f"rate x{summary['rate_scale']:g}")
    if isinstance(summary.get("cold_start_s"), int | float):
        head.append(f"cold start {summary['cold_start_s']:g} s")
    att = summary.get("slo_attainment")
    slo = summary.get("slo_ttft_s")
    gpu = summary.get("gpu_hours")
    tail = [f"SLO attainment {att:.1%}" if isinstance(att, int | float) else "SLO attainment ?"]
    if isinstance(slo, int | float):
        tail[0] += f" (TTFT \u2264 {slo:g} s)"
    tail.append(f"{gpu:.1f} GPU-h" if isinstance(gpu, int | float) else "? GPU-h")
    tail.append(f"{summary.get('streams_cut', '?')} streams cut")
    return "  |  ".join(head) + "\n" + "  |  ".join(tail)


def _replicas_panel(
    ax: Axes,
    summary: dict[str, Any],
    timeline: Sequence[dict[str, float | None]],
    t: list[float],
    demand: list[float] | None,
    policy: str,
    color: str,
    lw: float,
) -> None:
    n = len(timeline)
    ready = _zero(_series(timeline, "ready"), n)
    starting = _zero(_series(timeline, "starting"), n)
    prov_raw = _series(timeline, "provisioning")
    prov = [min(p, s) for p, s in zip(_zero(prov_raw, n), starting, strict=True)]
    top_ready = ready
    top_cold = [r + s - p for r, s, p in zip(ready, starting, prov, strict=True)]
    top_all = [r + s for r, s in zip(ready, starting, strict=True)]
    ax.fill_between(t, 0, top_ready, step="post", color="#a1d99b", lw=0, label="ready")
    cold_label = "starting (pod cold start)" if prov_raw is not None else "starting (cold start)"
    ax.fill_between(t, top_ready, top_cold, step="post", color="#ff9f40", alpha=0.6, lw=0, label=cold_label)
    if prov_raw is not None and any(v > 0 for v in prov):
        ax.fill_between(
            t,
            top_cold,
            top_all,
            step="post",
            facecolor="#fde0c5",
            edgecolor="#d9822b",
            hatch="////",
            lw=0,
            label="starting: waiting for a GPU node",
        )
    peak = max(top_all, default=0.0)
    draining = _series(timeline, "draining")
    if draining is not None:
        ax.step(t, draining, where="post", color="#6a3d9a", lw=0.9, label="draining")
        peak = max(peak, max((v for v in draining if not math.isnan(v)), default=0.0))
    desired = _series(timeline, "desired")
    if desired is not None:
        ax.step(t, desired, where="post", color="black", lw=1.3 if lw > 1 else 0.7, label="desired (HPA)")
        peak = max(peak, max((v for v in desired if not math.isnan(v)), default=0.0))
    top = max(1.0, peak * 1.12 + 0.5)
    if demand is not None:
        # The demand may run far above what the fleet can be (a queue in the thousands): let it reach twice the
        # replica scale at most, so the pods stay readable, and say in the legend where it really peaked.
        label = "composite (replica-equivalents)" if policy == "composite" else f"{policy} demand (replicas)"
        finite = [v for v in demand if math.isfinite(v)]
        demand_peak = max(finite, default=0.0)
        if demand_peak > top:
            top = min(demand_peak * 1.05, 2.0 * top)
        if demand_peak > top or any(v == math.inf for v in demand):
            label += f"; clipped, peak {demand_peak:.3g}"
        ax.plot(
            t,
            [min(v, top * 1.5) for v in demand],
            color=color,
            lw=lw,
            label=label,
            zorder=3,
            path_effects=[path_effects.withStroke(linewidth=lw + 1.6, foreground="white", alpha=0.8)],
        )
    config = summary.get("config")
    max_rep = config.get("max_replicas") if isinstance(config, dict) else None
    if isinstance(max_rep, int | float) and not isinstance(max_rep, bool):
        style: dict[str, Any] = {"color": "#b2182b", "ls": "--", "lw": 1.1}
        if max_rep <= 2.5 * top:
            top = max(top, max_rep * 1.1 + 0.5)
            ax.axhline(max_rep, **style, label=f"HPA max ({max_rep:g})")
            ax.annotate(
                f"HPA max {max_rep:g}",
                (1.0, max_rep),
                xycoords=("axes fraction", "data"),
                xytext=(-4, 2),
                textcoords="offset points",
                ha="right",
                va="bottom",
                fontsize=7.5,
                color="#b2182b",
                bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.75},
            )
        else:  # far above anything that happened: drawing it would flatten the pods into the floor
            ax.add_line(Line2D([], [], **style, label=f"HPA max ({max_rep:g}, above the axis)"))
            ax.text(
                0.995,
                0.98,
                f"\u2191 HPA max {max_rep:g}",
                transform=ax.transAxes,
                ha="right",
                va="top",
                fontsize=7.5,
                color="#b2182b",
                bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.75},
            )
    ax.set_ylim(0, top)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    ax.set_ylabel("replicas")
    _legend_outside(ax)


def _ttft_panel(
    ax: Axes, summary: dict[str, Any], timeline: Sequence[dict[str, float | None]], t: list[float], lw: float
) -> None:
    ax.set_yscale("log")
    ax.set_ylabel("TTFT p95 (s, log)")
    slo_raw = summary.get("slo_ttft_s")
    slo = float(slo_raw) if isinstance(slo_raw, int | float) and slo_raw > 0 else None
    p95 = _series(timeline, "ttft_p95_s")
    finite = [v for v in (p95 or []) if math.isfinite(v) and v > 0]
    ref = [*finite, *([slo] if slo else [])]
    if not ref:
        ax.text(0.5, 0.5, "no TTFT samples", transform=ax.transAxes, ha="center", va="center", color="#777777")
        ax.set_ylim(0.01, 10.0)
        return
    lo = min(ref) / 2.0
    cap = max(max(ref) * 2.0, (slo or 0.0) * 10.0)
    if p95 is not None:
        shown = [math.nan if math.isnan(v) else min(max(v, lo), cap) for v in p95]
        ax.plot(t, shown, color="#08519c", lw=lw, label="TTFT p95 (arrivals of the last minute)")
        inf_t = [x for x, v in zip(t, p95, strict=True) if v == math.inf]
        if inf_t:
            ax.plot(
                inf_t,
                [cap] * len(inf_t),
                ls="none",
                marker="v",
                ms=4,
                color="#b2182b",
                label=f"no first token (shown at {cap:.3g} s)",
            )
    top = cap * 1.6
    if slo is not None:
        ax.axhspan(slo, top, color="#d62728", alpha=0.07, lw=0, label="above the SLO")
        ax.axhline(slo, color="#b2182b", ls="--", lw=1.1, label=f"SLO {slo:g} s")
    ax.set_ylim(lo, top)
    _legend_outside(ax)


# --------------------------------------------------------------------------------------------------- pareto


def _pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of points no other point dominates (fewer or equal GPU-hours and higher or equal attainment)."""
    front = []
    for i, (x, y) in enumerate(points):
        if not any((x2 <= x and y2 >= y) and (x2 < x or y2 > y) for j, (x2, y2) in enumerate(points) if j != i):
            front.append(i)
    return front


def _log_ticks(lo: float, hi: float) -> list[float]:
    """Readable tick values for a log axis from lo to hi: 1-2-5 per decade, or every integer step when narrow."""
    for mantissas in ((1.0,), (1.0, 2.0, 5.0), (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0)):
        ticks = [
            m * 10.0**e for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1) for m in mantissas
        ]
        ticks = [v for v in ticks if lo <= v <= hi]
        if len(ticks) >= 4:
            return ticks
    span = hi - lo
    step = 10.0 ** math.floor(math.log10(span / 3.0))
    for mult in (1.0, 2.0, 5.0):
        if span / (step * mult) <= 6:
            step *= mult
            break
    return [k * step for k in range(math.ceil(lo / step), math.floor(hi / step) + 1)]


def _overlaps(box: Bbox, others: Iterable[Bbox]) -> bool:
    return any(box.x0 < o.x1 and box.x1 > o.x0 and box.y0 < o.y1 and box.y1 > o.y0 for o in others)


def _inside(box: Bbox, outer: Bbox) -> bool:
    return bool(box.x0 >= outer.x0 and box.x1 <= outer.x1 and box.y0 >= outer.y0 and box.y1 <= outer.y1)


# (dx, dy) in points and the text alignment that puts the label on that side of its point
_HA = Literal["left", "center", "right"]
_VA = Literal["bottom", "center", "top"]
_Offset = tuple[float, float, _HA, _VA]
_OFFSETS: list[_Offset] = [
    (5, 4, "left", "bottom"),
    (5, -4, "left", "top"),
    (-5, 4, "right", "bottom"),
    (-5, -4, "right", "top"),
    (0, 7, "center", "bottom"),
    (0, -7, "center", "top"),
    (8, 0, "left", "center"),
    (-8, 0, "right", "center"),
    (10, 10, "left", "bottom"),
    (-10, 10, "right", "bottom"),
    (10, -10, "left", "top"),
    (-10, -10, "right", "top"),
]


def _place(
    ax: Axes,
    text: Text,
    xy: tuple[float, float],
    placed: list[Bbox],
    obstacles: list[Bbox],
    offsets: Sequence[_Offset],
    pad_px: float = 1.0,
    remove: bool = True,
) -> bool:
    """Try the offsets in order; keep the first whose box stays in the axes and hits nothing, or (if `remove`) drop
    the text when none does."""
    fig = ax.get_figure()
    assert fig is not None
    scale = fig.dpi / 72.0
    px, py = ax.transData.transform(xy)
    area = ax.get_window_extent()
    for dx, dy, ha, va in offsets:
        text.set_position((px + dx * scale, py + dy * scale))
        text.set_horizontalalignment(ha)
        text.set_verticalalignment(va)
        box = text.get_window_extent().expanded(1.0, 1.0)
        box = Bbox.from_extents(box.x0 - pad_px, box.y0 - pad_px, box.x1 + pad_px, box.y1 + pad_px)
        if _inside(box, area) and not _overlaps(box, placed) and not _overlaps(box, obstacles):
            placed.append(box)
            return True
    if remove:
        text.remove()
    return False


def plot_pareto(path: Path, results: Sequence[dict[str, Any]], title: str) -> None:
    """GPU-hours (log) against SLO attainment (zoomed where policies differ), one line per policy through its knobs."""
    runs = [
        r
        for r in results
        if isinstance(r.get("gpu_hours"), int | float)
        and r["gpu_hours"] > 0
        and isinstance(r.get("slo_attainment"), int | float)
    ]
    fig, ax = plt.subplots(figsize=(13, 7.5), dpi=_DPI, layout="constrained")
    ax.set_title(title, fontsize=11, loc="left", pad=24)
    ax.text(0.0, 1.006, "\u2b09", transform=ax.transAxes, fontsize=15, color="#1b7837", ha="left", va="bottom")
    ax.annotate(
        "better: fewer GPU-hours, higher attainment (toward the upper left)",
        (0.0, 1.006),
        xycoords="axes fraction",
        xytext=(17, 2),
        textcoords="offset points",
        fontsize=9,
        color="#1b7837",
        ha="left",
        va="bottom",
        fontweight="bold",
    )
    ax.set_xscale("log")
    ax.set_xlabel("GPU-hours (log scale)")
    ax.set_ylabel("SLO attainment (% of requests with TTFT within the SLO)")
    ax.grid(alpha=0.3, which="major")
    ax.grid(alpha=0.12, which="minor")
    if not runs:
        ax.text(0.5, 0.5, "no runs", transform=ax.transAxes, ha="center", va="center", color="#777777")
        fig.savefig(path, dpi=_DPI)
        plt.close(fig)
        return

    xs = [float(r["gpu_hours"]) for r in runs]
    ys = [100.0 * float(r["slo_attainment"]) for r in runs]
    high = [y for y in ys if y >= 85.0]
    bottom = max(0.0, min(90.0, min(high)) - 1.0) if high else max(0.0, min(ys) - 1.0)
    top = 100.5
    lx, hx = math.log10(min(xs)), math.log10(max(xs))
    margin = 0.05 * (hx - lx) if hx > lx else 0.05
    xlo, xhi = 10.0 ** (lx - margin), 10.0 ** (hx + margin)
    ax.set_xlim(xlo, xhi)
    ax.set_ylim(bottom, top)
    ticks = _log_ticks(xlo, xhi)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.xaxis.set_minor_locator(LogLocator(base=10.0, subs=tuple(float(s) for s in range(1, 10))))
    ax.xaxis.set_minor_formatter(NullFormatter())

    order = ["composite", *[p for p in COLORS if p != "composite"]]
    policies = sorted({str(r["policy"]) for r in runs}, key=lambda p: (order.index(p) if p in order else len(order), p))
    extra: dict[str, str] = {}
    marker_px: list[tuple[float, float, float]] = []  # (x, y, marker size in points) of everything drawn
    polylines: list[tuple[list[tuple[float, float]], bool]] = []  # (points, thick)
    pinned: dict[str, list[tuple[float, float]]] = {}
    for policy in policies:
        idx = sorted((i for i, r in enumerate(runs) if r["policy"] == policy), key=lambda i: xs[i])
        px = [xs[i] for i in idx]
        py = [ys[i] for i in idx]
        color = _color(policy, extra)
        marker = MARKERS.get(policy, "o")
        comp = policy == "composite"
        ms = 7.5 if comp else (10.0 if marker == "*" else 6.5)
        knobs = {str(runs[i].get("knob")) for i in idx}
        label = f"{policy} ({knobs.pop()})" if len(knobs) == 1 and "None" not in knobs else policy
        ax.plot(
            px,
            py,
            color=color,
            lw=2.8 if comp else 1.2,
            ls=":" if policy == "oracle" else "-",
            zorder=4 if comp else 3,
            alpha=0.95,
        )
        inside = [(x, y) for x, y in zip(px, py, strict=True) if y >= bottom]
        below = [(x, y) for x, y in zip(px, py, strict=True) if y < bottom]
        ax.plot(
            [x for x, _ in inside],
            [y for _, y in inside],
            ls="none",
            marker=marker,
            ms=ms,
            color=color,
            mec="white",
            mew=0.6,
            zorder=5 if comp else 4,
        )
        ax.add_line(
            Line2D(
                [],
                [],
                color=color,
                lw=2.8 if comp else 1.2,
                ls=":" if policy == "oracle" else "-",
                marker=marker,
                ms=ms,
                mec="white",
                mew=0.6,
                label=label,
            )
        )
        if below:
            ax.plot(
                [x for x, _ in below],
                [bottom] * len(below),
                ls="none",
                marker="v",
                ms=7,
                color=color,
                mec="white",
                mew=0.6,
                zorder=6,
                clip_on=False,
            )
            pinned[policy] = [(float(runs[i].get("knob_value") or math.nan), ys[i]) for i in idx if ys[i] < bottom]
        marker_px += [(x, y, ms) for x, y in inside] + [(x, bottom, 7.0) for x, _ in below]
        polylines.append((list(zip(px, py, strict=True)), comp))

    front = _pareto_front(list(zip(xs, ys, strict=True)))
    ax.scatter(
        [xs[i] for i in front],
        [max(ys[i], bottom) for i in front],
        s=190,
        facecolors="none",
        edgecolors="black",
        linewidths=1.2,
        zorder=7,
        clip_on=False,
        label="Pareto front (non-dominated)",
    )
    ax.axhline(_TARGET_PCT, color="#1b7837", ls="--", lw=1.1, zorder=2, label=f"target {_TARGET_PCT:g} % attainment")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8.5, framealpha=0.95, borderaxespad=0.0)
    if pinned:
        lines = ["below the axis (attainment):"]
        for policy, items in pinned.items():
            cells = [f"{policy} {_fmt(k)} ({y:.1f} %)" for k, y in items]
            lines += ["  " + ", ".join(cells[i : i + 3]) for i in range(0, len(cells), 3)]
        ax.text(
            1.01,
            0.0,
            "\n".join(lines),
            transform=ax.transAxes,
            fontsize=7.5,
            va="bottom",
            ha="left",
            family="monospace",
            bbox={"boxstyle": "round,pad=0.4", "fc": "#f7f7f7", "ec": "#bbbbbb"},
        )

    # Fix the layout, then place labels in display coordinates (they are left out of the layout on purpose).
    fig.canvas.draw()
    fig.set_layout_engine("none")
    _place_labels(fig, ax, runs, xs, ys, bottom, front, marker_px, polylines, {p: _color(p, extra) for p in policies})
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)


def _place_labels(
    fig: Figure,
    ax: Axes,
    runs: Sequence[dict[str, Any]],
    xs: list[float],
    ys: list[float],
    bottom: float,
    front: list[int],
    marker_px: list[tuple[float, float, float]],
    polylines: list[tuple[list[tuple[float, float]], bool]],
    colors: dict[str, str],
) -> None:
    scale = fig.dpi / 72.0
    obstacles = []
    for x, y, ms in marker_px:
        cx, cy = ax.transData.transform((x, y))
        r = ms * scale / 2.0 + 1.0
        obstacles.append(Bbox.from_extents(cx - r, cy - r, cx + r, cy + r))
    for i in front:
        cx, cy = ax.transData.transform((xs[i], max(ys[i], bottom)))
        r = 7.5 * scale  # the ring: s=190 points^2 is about 14 points across
        obstacles.append(Bbox.from_extents(cx - r, cy - r, cx + r, cy + r))
    # Policy lines, as small boxes every few pixels: a label avoids a thin line when it can and crosses one when it
    # must; it never sits on the thick composite line.
    line_boxes: list[Bbox] = []
    for line, thick in polylines:
        disp = [tuple(ax.transData.transform(p)) for p in line]
        r = 2.5 if thick else 1.0
        for (x0, y0), (x1, y1) in itertools.pairwise(disp):
            steps = max(1, int(math.hypot(x1 - x0, y1 - y0) / 3.0))
            for k in range(steps + 1):
                cx, cy = x0 + (x1 - x0) * k / steps, y0 + (y1 - y0) * k / steps
                (obstacles if thick else line_boxes).append(Bbox.from_extents(cx - r, cy - r, cx + r, cy + r))
    area = ax.get_window_extent()
    _, ty = ax.transData.transform((xs[0], _TARGET_PCT))
    line_boxes.append(Bbox.from_extents(area.x0, ty - 1.0, area.x1, ty + 1.0))
    placed: list[Bbox] = []

    # The target line's label first, where it hides no point.
    def target_text() -> Text:
        return ax.text(
            0, 0, f"target {_TARGET_PCT:g} %", fontsize=7.5, color="#1b7837", transform=IdentityTransform(), zorder=8
        )

    target = target_text()
    xlo, xhi = ax.get_xlim()
    for frac in (0.99, 0.01, 0.5, 0.75, 0.25):
        target_x = 10.0 ** (math.log10(xlo) + frac * (math.log10(xhi) - math.log10(xlo)))
        ha: _HA = "right" if frac > 0.6 else "left" if frac < 0.4 else "center"
        if _place(ax, target, (target_x, _TARGET_PCT), placed, obstacles, [(0, 2, ha, "bottom"), (0, -2, ha, "top")]):
            break
        target = target_text()
    # Knob labels: the Pareto front first, then composite, then the rest from the cheapest point.
    front_set = set(front)
    ranked = sorted(
        (i for i in range(len(runs)) if ys[i] >= bottom),
        key=lambda i: (i not in front_set, runs[i]["policy"] != "composite", xs[i]),
    )
    halo = [path_effects.withStroke(linewidth=2.2, foreground="white")]
    for i in ranked:
        text = ax.text(
            0,
            0,
            _fmt(runs[i].get("knob_value")),
            fontsize=7,
            transform=IdentityTransform(),
            zorder=8,
            color=colors[str(runs[i]["policy"])],
            path_effects=halo,
            fontweight="bold" if runs[i]["policy"] == "composite" else "normal",
        )
        near, far = _OFFSETS[:8], _OFFSETS[8:]
        # Close to the point and clear of lines; else close and over a line; else a little farther, clear of lines.
        for offsets, avoid, last in (
            (near, obstacles + line_boxes, False),
            (near, obstacles, False),
            (far, obstacles + line_boxes, True),
        ):
            if _place(ax, text, (xs[i], ys[i]), placed, avoid, offsets, remove=last):
                break


VICTIM_COLORS = {"random": "#7f7f7f", "ranked": "#d62728"}


def plot_victims(path: Path, groups: Sequence[dict[str, Any]], title: str) -> None:
    """Grouped bars, one group per (workload, grace), one bar per victims mode: the mean over seeds of streams
    cut per scale-down (top) and tokens lost per scale-down (bottom), whiskers from the lowest to the highest
    seed. ``groups``: dicts with ``label`` and, per mode, ``{mode: {"cut": [..per seed], "tokens": [..]}}``
    under ``runs``."""
    modes = [m for m in VICTIM_COLORS if any(m in g["runs"] for g in groups)]
    fig, axes = plt.subplots(2, 1, figsize=(11, 8), dpi=_DPI, layout="constrained", sharex=True)
    fig.suptitle(title, fontsize=11, x=0.01, ha="left")
    width = 0.8 / max(1, len(modes))
    for ax, key, ylabel in (
        (axes[0], "cut", "streams cut per scale-down"),
        (axes[1], "tokens", "output tokens lost per scale-down"),
    ):
        top = 0.0
        for k, mode in enumerate(modes):
            xs, means, lo, hi, tops = [], [], [], [], []
            for i, g in enumerate(groups):
                values = g["runs"].get(mode, {}).get(key) or []
                if not values:
                    continue
                mean = sum(values) / len(values)
                xs.append(i + (k - (len(modes) - 1) / 2) * width)
                means.append(mean)
                lo.append(mean - min(values))
                hi.append(max(values) - mean)
                tops.append(max(values))
                top = max(top, max(values))
            bars = ax.bar(xs, means, width * 0.92, color=VICTIM_COLORS[mode], label=f"victims {mode}")
            ax.errorbar(xs, means, yerr=[lo, hi], fmt="none", ecolor="#222222", elinewidth=1, capsize=3)
            for bar, mean, above in zip(bars, means, tops, strict=True):
                ax.annotate(
                    f"{mean:.1f}" if key == "cut" else f"{mean:,.0f}",
                    (bar.get_x() + bar.get_width() / 2, above),  # above the whisker
                    xytext=(0, 3),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=9,
                )
        ax.set_ylabel(ylabel)
        ax.set_ylim(0, max(1.0, top) * 1.18)
        ax.grid(alpha=0.3, axis="y")
        ax.yaxis.set_major_locator(MaxNLocator(integer=key == "cut"))
    axes[0].legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncols=len(modes), fontsize=9, frameon=False)
    axes[1].set_xticks(range(len(groups)))
    axes[1].set_xticklabels([g["label"] for g in groups], fontsize=9)
    axes[1].annotate(
        "bars: mean over seeds; whiskers: lowest to highest seed",
        (1.0, -0.16),
        xycoords="axes fraction",
        ha="right",
        va="top",
        fontsize=8,
        color="#555555",
    )
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)


def plot_pools(path: Path, summary: dict[str, Any], timeline: Sequence[dict[str, float | None]], title: str) -> None:
    """A fleet of pools over the day: one band per pool (its ready replicas, stacked in tier order) with each
    pool's desired count, the load, and the TTFT p95 against the SLO."""
    pools = list(summary.get("pools", {}))
    t = [float(p["t"] or 0.0) / 3600.0 for p in timeline]
    fig, (ax, ax_ttft) = plt.subplots(
        2, 1, figsize=(13, 8), dpi=_DPI, sharex=True, layout="constrained", gridspec_kw={"height_ratios": [3, 1]}
    )
    w = summary.get("after_warmup", {})
    costs = ", ".join(f"{n} {summary['pools'][n]['cost']:.0f}" for n in pools)
    ax.set_title(
        f"{title}\nattainment {100 * float(summary.get('slo_attainment', 0.0)):.2f} % whole run, "
        f"{100 * float(w.get('slo_attainment', 0.0)):.2f} % after the warm-up; cost {summary.get('cost', 0.0):.0f} "
        f"({costs})",
        fontsize=10,
        loc="left",
    )
    colors = ["#4575b4", "#f46d43", "#66bd63", "#9e0142", "#fdae61"]
    bands = [_zero(_series(timeline, f"ready:{name}"), len(t)) for name in pools]
    if t and bands:
        ax.stackplot(
            t,
            *bands,
            labels=[f"{n} ready ({summary['pools'][n]['tier']})" for n in pools],
            colors=colors[: len(bands)],
            alpha=0.55,
            step="post",
        )
    below = [0.0] * len(t)  # desired counts stacked as the bands are: each line is the top of its pool's band
    for k, name in enumerate(pools):
        desired = _series(timeline, f"desired:{name}")
        if desired is not None:
            top = [b + d for b, d in zip(below, _zero(desired, len(t)), strict=True)]
            ax.step(t, top, where="post", color=colors[k % len(colors)], lw=1.2, label=f"{name} desired (stacked)")
            below = top
        size = summary["pools"][name].get("size")
        if size is not None:
            ax.axhline(size, color=colors[k % len(colors)], ls=":", lw=1, label=f"{name} size {size}")
    ax.set_ylabel("replicas")
    ax.grid(alpha=0.3)
    load = _series(timeline, "load_rps")
    if load is not None:
        ax_load = ax.twinx()
        ax_load.plot(t, load, color="#333333", lw=0.8, alpha=0.7, label="load (req/s, 1-min mean)")
        ax_load.set_ylabel("req/s")
        ax_load.legend(loc="upper right", fontsize=8)
    ax.legend(loc="upper left", fontsize=8, ncol=2)
    ttft = _series(timeline, "ttft_p95_s")
    if ttft is not None:
        ax_ttft.plot(t, [min(v, 60.0) for v in ttft], color="#762a83", lw=1, label="TTFT p95 (1-min, capped at 60 s)")
    ax_ttft.axhline(float(summary.get("slo_ttft_s", 2.0)), color="#d73027", ls="--", lw=1, label="SLO")
    warm = float(w.get("warmup_s", 0.0) or 0.0)
    if warm > 0:
        for a in (ax, ax_ttft):
            a.axvspan(0, warm / 3600.0, color="#bbbbbb", alpha=0.3, lw=0)
    ax_ttft.set_yscale("log")
    ax_ttft.set_ylabel("s")
    ax_ttft.set_xlabel("hours")
    ax_ttft.grid(alpha=0.3)
    ax_ttft.legend(loc="upper right", fontsize=8)
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)


def plot_plan(path: Path, plan: dict[str, Any], title: str) -> None:
    """``--plan-reserved``: cost and attainment after the warm-up per reserved size, the chosen size marked."""
    rows = plan.get("curve", [])
    sizes = [r["reserved_size"] for r in rows]
    fig, ax = plt.subplots(figsize=(11, 6), dpi=_DPI, layout="constrained")
    ax.set_title(f"Planning the reservation: {title}", fontsize=10, loc="left")
    target = float(plan.get("target_attainment", 0.99))
    ok = [r for r in rows if (r.get("slo_attainment") or 0.0) >= target]
    ax.plot(sizes, [r["cost"] for r in rows], color="#4575b4", marker="o", label="cost after the warm-up")
    ax.scatter(
        [r["reserved_size"] for r in ok],
        [r["cost"] for r in ok],
        color="#1a9850",
        zorder=3,
        s=60,
        label=f"reaches {100 * target:g} %",
    )
    chosen = plan.get("reserved_size")
    if chosen is not None:
        ax.axvline(chosen, color="#1a9850", ls="--", lw=1)
        ax.annotate(
            f" reserved_size {chosen}", (chosen, ax.get_ylim()[0]), ha="left", va="bottom", fontsize=9, color="#1a9850"
        )
    ax.set_xlabel("reserved pool size (replicas)")
    ax.set_ylabel("cost")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax2 = ax.twinx()
    ax2.plot(
        sizes, [100 * (r.get("slo_attainment") or 0.0) for r in rows], color="#d73027", marker="s", lw=1,
        label="attainment after the warm-up (%)",
    )  # fmt: skip
    ax2.axhline(100 * target, color="#d73027", ls=":", lw=1)
    ax2.set_ylabel("SLO attainment (%)")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper right", fontsize=8)
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)


def plot_restart(path: Path, title: str, restart_at_s: float, runs: dict[str, list[dict[str, Any]]]) -> None:
    """``--restart-at``: load, desired replicas and TTFT p95 of each run ("none", "kept", "forgotten") over the
    hour around the restart, the restart marked."""
    colors = {"none": "#999999", "kept": "#1a9850", "forgotten": "#d73027"}
    labels = {"none": "no restart", "kept": "restart, state kept", "forgotten": "restart, state forgotten"}
    lo, hi = restart_at_s - 1200.0, restart_at_s + 2400.0
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(11, 7), dpi=_DPI, layout="constrained", sharex=True)
    ax.set_title(f"A scaler restart: {title}", fontsize=10, loc="left")
    some = next(iter(runs.values()))
    near = [p for p in some if lo <= float(p["t"] or 0.0) <= hi]
    load = ax.twinx()
    load.fill_between(
        [float(p["t"] or 0) / 60 for p in near], [float(p["load_rps"] or 0) for p in near], color="#deebf7", lw=0
    )
    load.set_ylabel("load (req/s)")
    ax.set_zorder(load.get_zorder() + 1)
    ax.patch.set_visible(False)
    for name, timeline in runs.items():
        pts = [p for p in timeline if lo <= float(p["t"] or 0.0) <= hi]
        minutes = [float(p["t"] or 0) / 60 for p in pts]
        ax.step(
            minutes, [p["desired"] for p in pts], where="post", color=colors.get(name), label=labels.get(name, name)
        )
        ax2.plot(
            minutes, [p.get("ttft_p95_s") for p in pts], color=colors.get(name), lw=1, label=labels.get(name, name)
        )
    for a in (ax, ax2):
        a.axvline(restart_at_s / 60, color="black", ls="--", lw=1)
        a.grid(alpha=0.3)
    ax.annotate(" restart", (restart_at_s / 60, ax.get_ylim()[1]), va="top", fontsize=9)
    ax.set_ylabel("desired replicas")
    ax.legend(loc="upper left", fontsize=8)
    ax2.set_ylabel("TTFT p95 over the last minute (s)")
    ax2.set_yscale("log")
    ax2.set_xlabel("minutes into the day")
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)
