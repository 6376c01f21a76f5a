#!/usr/bin/env python3
"""A scaler restart with and without its learned state (issue #33): ``replay --restart-at``.

    python -m benchmarks.restart_state [OUT_DIR]      # ~20 min on 2 cores; default docs/state
    python -m benchmarks.restart_state --windows DAY RESTART_AT [SEED]   # one restart, per 10-minute window
    python -m benchmarks.restart_state --paired 1,2 [OUT_DIR]     # other draws of every day, ~40 min
    python -m benchmarks.restart_state --matched [OUT_DIR]   # the kept runs that read less, with more margin
    python -m benchmarks.restart_state --nearby [OUT_DIR]    # the pairs that parted, restarts moved by 5-10 s
    python -m benchmarks.restart_state --views DAY RESTART_AT SEED FROM TO   # what each view read, ~3 min each

Each day: six hours of ServeGen's aggregate curve for one model, with the mix's tokens, scaled so its
busiest 10-minute window needs PEAK_REPLICAS replicas at the profile's capacity at the 2 s TTFT SLO on
that mix. The scaler restarts RESTART_BEFORE_RISE_S before the curve's steepest rise (the worst moment to
start cold: the load grows while nothing is known), and is out for 10 s (``sim/run.py``,
RESTART_OUTAGE_S), then RESTARTS_PER_DAY more times evenly spaced, each its own run. Per day: no restart,
each restart reading the persisted state (what ``serve --state-dir`` and the chart's ConfigMap do) and
forgetting it (``--forget-state``: every release before 0.3.0), and no restart at more margin (MARGINS).
2 s TTFT SLO given to the composite, the README's ``llm`` HPA behavior, seed 0 (``--paired``: other
seeds), a 900 s warm-up.

Nothing here was tuned: the restart keeps what the tracker learned and the rules that read it are
unchanged. ``8b-h200`` is the capacity matrix's held-out validation profile (docs/replay.md) and
``70b-h100x2`` the KV-bound one; ``70b-h100x4`` is the profile the composite's rules were chosen on.

Writes OUT_DIR/restart.json and OUT_DIR/restart-<day>.png (replicas and attainment around the restart,
kept against forgotten), and prints the table with the command line that reproduces each row.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Final

import keda_llm_scaler
from keda_llm_scaler.sim.profiles import get_profile
from keda_llm_scaler.sim.run import RunConfig, capacity_at_slo, simulate
from keda_llm_scaler.sim.trace import BUNDLED_TRACE
from keda_llm_scaler.sim.workload import BUNDLED_CURVE, CurveWorkload

PEAK_REPLICAS: Final = 8.0
WARMUP_S: Final = 900.0
RESTART_BEFORE_RISE_S: Final = 300.0
RESTARTS_PER_DAY: Final = 5  # evenly spaced after the warm-up, beside the one before the steepest rise
TARGET: Final = 0.99
# the uninterrupted scaler with more margin than the default 0.9 (``--knob``: targetUtilization): what
# attainment extra replicas buy without losing any knowledge, to judge a cold restart's extra replicas by
MARGINS: Final = (0.85, 0.8)
# name: (curve model, hours, mix, profile, role)
DAYS: Final[dict[str, tuple[str, tuple[float, float], str, str, str]]] = {
    "reference": ("m-mid", (30.0, 36.0), "conversation", "70b-h100x4", "the profile the rules were chosen on"),
    "held-out-type": ("m-large", (0.0, 6.0), "conversation", "8b-h200", "held-out validation profile"),
    "kv-bound": ("m-small", (100.0, 106.0), "decode-heavy", "70b-h100x2", "KV-bound, held out"),
}


def _day(name: str, seed: int = 0) -> tuple[CurveWorkload, list[float]]:
    """The day's workload (peak at PEAK_REPLICAS replicas' worth) and its restart times: RESTART_BEFORE_RISE_S
    before the steepest rise between two 10-minute windows, then RESTARTS_PER_DAY evenly spaced. ``seed``
    draws other arrivals and tokens on the same curve, peak and restart times (``replay --seed``)."""
    model, hours, mix, profile, _ = DAYS[name]
    base = CurveWorkload.build(BUNDLED_CURVE, BUNDLED_TRACE, model=model, hours=hours, peak_rate=1.0, mix=mix)
    cap = capacity_at_slo(get_profile(profile), base.token_mix(4000, 0), 2.0)
    peak = round(PEAK_REPLICAS * cap, 2)
    day = CurveWorkload.build(
        BUNDLED_CURVE, BUNDLED_TRACE, model=model, hours=hours, peak_rate=peak, mix=mix, seed=seed
    )
    rates, window = day.rates, day.window_s
    first = int(WARMUP_S // window) + 1
    rise = max(range(max(first, 1), len(rates)), key=lambda i: rates[i] - rates[i - 1])
    span = day.duration_s - WARMUP_S - 900.0  # every restart has its 15 minutes inside the day
    spaced = [WARMUP_S + span * (k + 0.5) / RESTARTS_PER_DAY for k in range(RESTARTS_PER_DAY)]
    return day, [max(WARMUP_S, rise * window - RESTART_BEFORE_RISE_S), *spaced]


def command(
    name: str, peak: float, restart_at: float | None, forget: bool, knob: float | None = None, seed: int = 0
) -> str:
    model, hours, mix, profile, _ = DAYS[name]
    extra = "" if restart_at is None else f" --restart-at {restart_at:g}" + (" --forget-state" if forget else "")
    extra += "" if knob is None else f" --knob {knob:g}"
    extra += "" if seed == 0 else f" --seed {seed}"
    return (
        f"keda-llm-scaler replay --trace conv --rate-curve servegen --curve-model {model} "
        f"--hours {hours[0]:g}:{hours[1]:g} --mix {mix} --peak-rate {peak:g} --profile {profile} "
        f"--hpa-behavior llm --warmup {WARMUP_S:g}{extra}"
    )


Job = tuple[str, float | None, bool, float | None]  # day, restart at, forget, targetUtilization (None: 0.9)


def _config(job: Job, keep_requests: bool = False, seed: int = 0) -> RunConfig:
    name, restart_at, forget, knob = job
    return RunConfig(
        seed=seed,
        profile=DAYS[name][3],
        hpa_behavior="llm",
        warmup_s=WARMUP_S,
        restart_at_s=restart_at,
        forget_state=forget,
        knob=knob,
        keep_requests=keep_requests,
    )


def _run(job: Job) -> tuple[Job, dict[str, Any], list[dict[str, Any]]]:
    result = simulate(_day(job[0])[0], _config(job))
    return job, result.summary, result.timeline


def margin_frontier(points: list[tuple[float, float]], gpu_hours: float) -> float | None:
    """The attainment the uninterrupted scaler reaches for ``gpu_hours`` on this day, from its runs at several
    margins ``points`` (GPU-hours, attainment), interpolated; None outside their range (no claim)."""
    pts = sorted(points)
    for (g0, a0), (g1, a1) in itertools.pairwise(pts):
        if g0 <= gpu_hours <= g1:
            return a0 if g1 == g0 else a0 + (a1 - a0) * (gpu_hours - g0) / (g1 - g0)
    return None


def windows(name: str, restart_at: float, seed: int = 0, window_s: float = 600.0) -> int:
    """Where a day's misses lie: requests missed and sent per window of arrivals, with no restart and with a
    restart at ``restart_at`` kept and forgotten, beside each run's learned capacity and replicas at the
    window's start (why one run misses a burst another serves), on the draw ``seed``. Prints a markdown
    table of the windows where some run missed a request."""
    jobs: list[Job] = [(name, None, False, None), (name, restart_at, False, None), (name, restart_at, True, None)]
    day, _ = _day(name, seed)

    def one(job: Job) -> tuple[dict[int, list[int]], dict[int, dict[str, Any]]]:
        cfg = _config(job, keep_requests=True, seed=seed)
        result = simulate(day, cfg)
        per: dict[int, list[int]] = {}
        for r in result.requests:
            counts = per.setdefault(int(r.arrival // window_s), [0, 0])
            counts[1] += 1
            counts[0] += r.ttft is None or r.ttft > cfg.slo_ttft_s
        at_start = {}
        for point in result.timeline:
            at_start.setdefault(int(point["t"] // window_s), point)
        return per, at_start

    runs = [one(job) for job in jobs]
    print(f"| {name}, window of arrivals (s) | no restart: missed / sent | kept at {restart_at:g} s | forgotten |")
    print("|---|---|---|---|")
    for w in sorted(set().union(*(per for per, _ in runs))):
        cells = []
        for per, at_start in runs:
            missed, sent = per.get(w, [0, 0])
            point = at_start.get(w, {})
            cap = point.get("capacity_rps")
            cells.append(
                f"{missed} / {sent} ({point.get('desired', 0):.0f} replicas, "
                f"{'—' if cap is None else f'{cap:.1f}'} req/s each)"
            )
        if any(per.get(w, [0, 0])[0] for per, _ in runs):
            print(f"| {w * window_s:.0f}-{(w + 1) * window_s:.0f} | " + " | ".join(cells) + " |")
    return 0


def views(name: str, restart_at: float, seed: int, start: float, end: float) -> int:
    """What the scaler read every scrape from ``start`` to ``end`` s of one day, with no restart and with a
    kept restart at ``restart_at``: the answer, the view that stood, and the demand each view estimated
    (need = offered + growth + 2 x spread, the capacity and where it came from). Why a kept run asked for
    more than the cold view at some instant, beside what the uninterrupted scaler read there. Prints a
    markdown table, one row per 10 s."""
    from keda_llm_scaler.sim import policies

    def read(tracker: Any, params: Any, now: float) -> str:
        d = None if tracker is None else tracker.estimate(now, params.replica_capacity, params.startup_s)
        if d is None:
            return "—"
        cap = "—" if d.capacity_rps is None else f"{d.capacity_rps:.1f} {d.capacity_source}"
        return f"{d.need_rps:.1f} = {d.offered_rps:.1f} + {d.growth_rps:.1f} + 2 x {d.spread_rps:.2f}; {cap}"

    rows: dict[float | None, dict[int, tuple[str, ...]]] = {None: {}, restart_at: {}}
    sample = policies.CompositePolicy.sample
    for at in rows:

        def recording(policy: Any, now: float, fleet: Any, at: float | None = at) -> None:
            sample(policy, now, fleet)
            slot = int(now // 10)
            if start <= now <= end and slot not in rows[at]:
                state = policy._state
                value = "—" if policy.last is None else f"{policy.last.value:.2f}"
                cold = read(state.demand.cold_view, state.params, now)
                rows[at][slot] = (value, policy._view or "", read(state.demand, state.params, now), cold)

        policies.CompositePolicy.sample = recording  # type: ignore[method-assign]
        try:
            simulate(_day(name, seed)[0], _config((name, at, False, None), seed=seed))
        finally:
            policies.CompositePolicy.sample = sample  # type: ignore[method-assign]
    print(
        f"| {name}, draw {seed}, t (s) | no restart: answer | its need (req/s) = offered + growth + 2 x spread; "
        f"capacity | kept at {restart_at:g} s: answer (view) | kept's need | the cold view's need |"
    )
    print("|---|---|---|---|---|---|")
    for slot in sorted(set(rows[None]) | set(rows[restart_at])):
        a = rows[None].get(slot, ("—", "", "—", "—"))
        b = rows[restart_at].get(slot, ("—", "", "—", "—"))
        print(f"| {slot * 10} | {a[0]} | {a[2]} | {b[0]} ({b[1] or '—'}) | {b[2]} | {b[3]} |")
    return 0


# the uninterrupted scaler's line on each draw, down to a thinner margin than the default 0.9 as well, since
# restart runs often spend less than the uninterrupted one
PAIRED_MARGINS: Final = (0.95, None, 0.85, 0.8)  # None: the default, 0.9
# day, restart at (None: none), forget, seed, targetUtilization (None: the default)
PairedJob = tuple[str, float | None, bool, int, float | None]


def _run_paired(job: PairedJob) -> tuple[PairedJob, float, float]:
    name, at, forget, seed, knob = job
    summary = simulate(_day(name, seed)[0], _config((name, at, forget, knob), seed=seed)).summary
    return job, summary["after_warmup"]["slo_attainment"], summary["gpu_hours"]


def code_fingerprint() -> str:
    """What a cached run depends on: the scaler's and the simulator's source (keda_llm_scaler/**/*.py)."""
    root = Path(keda_llm_scaler.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def best_at_or_below(line: list[tuple[float, float]], gpu_hours: float) -> float | None:
    """The best attainment the uninterrupted scaler reached at no more than ``gpu_hours`` (GPU-hours,
    attainment points): what margin bought at that cost, never falling as GPU-hours rise (a noisy line
    interpolated can reward noise); None where every point costs more."""
    within = [att for gpu, att in line if gpu <= gpu_hours]
    return max(within) if within else None


def _load_runs(path: Path, code: str) -> dict[PairedJob, dict[str, Any]]:
    """The runs already in ``path`` made by the code ``code`` (``code_fingerprint``): what a resumed
    benchmark does not run again."""
    runs: dict[PairedJob, dict[str, Any]] = {}
    if path.exists():
        for r in json.loads(path.read_text()).get("runs", []):
            if r.get("code") == code:
                runs[(r["day"], r["restart_at_s"], r["forgotten"], r["seed"], r["target_utilization"])] = r
    return runs


def _run_resumable(path: Path, runs: dict[PairedJob, dict[str, Any]], todo: list[PairedJob], code: str) -> None:
    """Runs ``todo`` two at a time, adding each to ``runs`` and rewriting ``path`` as it finishes (a run
    stopped midway resumes where it was), with its command line and the code that made it."""
    peaks = {(name, seed): round(max(_day(name, seed)[0].rates), 2) for name, _, _, seed, _ in todo}
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=2) as pool:
        for i, (job, att, gpu_h) in enumerate(pool.map(_run_paired, todo), 1):
            name, at, forget, seed, knob = job
            runs[job] = {
                "day": name,
                "restart_at_s": at,
                "forgotten": forget,
                "seed": seed,
                "target_utilization": knob,
                "attainment_after_warmup": att,
                "gpu_hours": gpu_h,
                "code": code,
                "command": command(name, peaks[(name, seed)], at, forget, knob, seed),
            }
            path.write_text(json.dumps({"runs": list(runs.values())}, indent=1) + "\n")
            took = time.perf_counter() - started
            print(f"[{i}/{len(todo)}] {job}: {100 * att:.3f} % {took:.0f}s", file=sys.stderr, flush=True)


def paired(seeds: list[int], out: Path) -> int:
    """Every restart of every day kept and forgotten again on other draws of the day (``seeds``), beside the
    uninterrupted scaler at PAIRED_MARGINS on the same draw: whether keeping the state loses attainment
    against forgetting it beyond what the draw moves, and whether forgetting buys more than the same
    GPU-hours as margin would. Resumable: runs already in OUT/paired.json made by the same code
    (``code_fingerprint``) are not run again. Writes OUT/paired.json and prints a table."""
    path = out / "paired.json"
    code = code_fingerprint()
    runs = _load_runs(path, code)
    days = {name: _day(name) for name in DAYS}
    jobs: list[PairedJob] = []
    for seed in seeds:
        for name in DAYS:
            jobs += [(name, at, forget, seed, None) for at in days[name][1] for forget in (False, True)]
            jobs += [(name, None, False, seed, knob) for knob in PAIRED_MARGINS]
    _run_resumable(path, runs, [j for j in jobs if j not in runs], code)
    print(
        "| day | pairs | kept >= forgotten | kept - forgotten: mean (lowest, highest) | GPU-h kept / forgotten, mean "
        "| above the uninterrupted scaler's best at no more GPU-h: kept / forgotten, mean (pairs with both) |"
    )
    print("|---|---|---|---|---|---|")
    for name in DAYS:
        diffs: list[float] = []
        hours: list[tuple[float, float]] = []
        above: list[tuple[float, float]] = []
        for seed in seeds:
            uninterrupted = [runs[(name, None, False, seed, k)] for k in PAIRED_MARGINS]
            line = [(r["gpu_hours"], r["attainment_after_warmup"]) for r in uninterrupted]
            for at in days[name][1]:
                kept, forgot = runs[(name, at, False, seed, None)], runs[(name, at, True, seed, None)]
                diffs.append(100 * (kept["attainment_after_warmup"] - forgot["attainment_after_warmup"]))
                hours.append((kept["gpu_hours"], forgot["gpu_hours"]))
                bounds = [best_at_or_below(line, r["gpu_hours"]) for r in (kept, forgot)]
                if bounds[0] is not None and bounds[1] is not None:
                    above.append(
                        (
                            100 * (kept["attainment_after_warmup"] - bounds[0]),
                            100 * (forgot["attainment_after_warmup"] - bounds[1]),
                        )
                    )
        judged = (
            "—"
            if not above
            else f"{sum(a[0] for a in above) / len(above):+.3f} / {sum(a[1] for a in above) / len(above):+.3f} pp "
            f"({len(above)})"
        )
        print(
            f"| {name} | {len(diffs)} | {sum(d >= 0 for d in diffs)} | {sum(diffs) / len(diffs):+.3f} pp "
            f"({min(diffs):+.3f}, {max(diffs):+.3f}) | {sum(h[0] for h in hours) / len(hours):.1f} / "
            f"{sum(h[1] for h in hours) / len(hours):.1f} | {judged} |"
        )
    return 0


# the kept restart again with more margin, where it read less than the forgotten one: down to a thicker
# margin than the uninterrupted line's, since a cold restart over-provisions by up to ~15 % (kv-bound)
MATCHED_MARGINS: Final = (0.85, 0.8, 0.75)
# day, restart at, seed: one restart, kept against forgotten
Pair = tuple[str, float, int]


def _pairs(out: Path, code: str) -> dict[Pair, tuple[tuple[float, float], tuple[float, float]]]:
    """Every restart at the default margin in OUT/restart.json (seed 0) and OUT/paired.json (other seeds)
    made by the code ``code``: (attainment after the warm-up, GPU-hours) kept and forgotten. Runs by other
    code are left out (a pair judged on one code and rerun on another would compare two scalers)."""
    pairs: dict[Pair, dict[bool, tuple[float, float]]] = {}
    if (out / "restart.json").exists():
        for name, day in json.loads((out / "restart.json").read_text()).items():
            for r in day["runs"]:
                if r["state"] is not None and r.get("code") == code:
                    pairs.setdefault((name, r["restart_at_s"], 0), {})[r["state"] == "forgotten"] = (
                        r["after_warmup"]["slo_attainment"],
                        r["gpu_hours"],
                    )
    if (out / "paired.json").exists():
        for r in json.loads((out / "paired.json").read_text())["runs"]:
            if r["restart_at_s"] is not None and r["target_utilization"] is None and r.get("code") == code:
                pairs.setdefault((r["day"], r["restart_at_s"], r["seed"]), {})[r["forgotten"]] = (
                    r["attainment_after_warmup"],
                    r["gpu_hours"],
                )
    return {k: (v[False], v[True]) for k, v in pairs.items() if False in v and True in v}


def _no_pairs(out: Path, code: str) -> int:
    """What --matched and --nearby answer where OUT holds no restart pair made by this code."""
    print(f"no restart runs by this code ({code}) in {out}: run restart_state and --paired first", file=sys.stderr)
    return 1


def matched(out: Path) -> int:
    """Whether what forgetting bought where it read more is knowledge or GPU-hours: every pair (from
    OUT/restart.json and OUT/paired.json) where the kept restart read less than the forgotten one, the kept
    restart again at MATCHED_MARGINS on the same draw, and the best it read at no more GPU-hours than the
    forgotten run spent (``best_at_or_below``). Resumable like ``paired`` (same code). Writes
    OUT/matched.json and prints a table, one row per pair."""
    path = out / "matched.json"
    code = code_fingerprint()
    pairs = _pairs(out, code)
    if not pairs:
        return _no_pairs(out, code)
    losing = sorted(k for k, (kept, forgot) in pairs.items() if kept[0] < forgot[0])
    runs = _load_runs(path, code)
    jobs: list[PairedJob] = [(name, at, False, seed, knob) for name, at, seed in losing for knob in MATCHED_MARGINS]
    _run_resumable(path, runs, [j for j in jobs if j not in runs], code)
    print(
        "| day | seed | restart (s) | kept, GPU-h | forgotten, GPU-h | kept at more margin: targetUtilization, "
        "GPU-h | kept's best at no more GPU-h than forgotten, minus forgotten |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, at, seed in losing:
        kept, forgot = pairs[(name, at, seed)]
        more = [runs[(name, at, False, seed, knob)] for knob in MATCHED_MARGINS]
        line = [(kept[1], kept[0])] + [(r["gpu_hours"], r["attainment_after_warmup"]) for r in more]
        best = best_at_or_below(line, forgot[1])
        margins = ", ".join(
            f"{r['target_utilization']:g}: {_pct(r['attainment_after_warmup'])} {r['gpu_hours']:.1f}" for r in more
        )
        print(
            f"| {name} | {seed} | {at:g} | {_pct(kept[0])}, {kept[1]:.1f} | {_pct(forgot[0])}, {forgot[1]:.1f} "
            f"| {margins} | {'—' if best is None else f'{100 * (best - forgot[0]):+.3f} pp'} |"
        )
    return 0


# the restart moved by a scrape interval or two either way: an instant no scaler chooses
NEARBY_SHIFTS_S: Final = (-10.0, -5.0, 5.0, 10.0)


def nearby(out: Path) -> int:
    """How far "kept reads less than forgotten" can be read: every pair (OUT/restart.json, OUT/paired.json)
    whose kept and forgotten runs read different attainments, again with the restart NEARBY_SHIFTS_S
    earlier and later, kept and forgotten. Whether the sign of kept - forgotten holds when the restart moves
    by a scrape interval, and how far forgetting's own attainment moves with it (the resolution of the
    comparison). Resumable like ``paired`` (same code). Writes OUT/nearby.json and prints a table, one row
    per pair."""
    path = out / "nearby.json"
    code = code_fingerprint()
    pairs = _pairs(out, code)
    if not pairs:
        return _no_pairs(out, code)
    parted = sorted(k for k, (kept, forgot) in pairs.items() if kept[0] != forgot[0])
    runs = _load_runs(path, code)
    jobs: list[PairedJob] = [
        (name, at + shift, forget, seed, None)
        for name, at, seed in parted
        for shift in NEARBY_SHIFTS_S
        for forget in (False, True)
    ]
    _run_resumable(path, runs, [j for j in jobs if j not in runs], code)
    shifts = ", ".join(f"{s:+g} s" for s in NEARBY_SHIFTS_S)
    print(
        f"| day | seed | restart (s) | kept - forgotten there | kept - forgotten at {shifts} "
        "| forgotten's attainment over the five restarts: lowest, highest (spread) |"
    )
    print("|---|---|---|---|---|---|")
    for name, at, seed in parted:
        kept, forgot = pairs[(name, at, seed)]
        moved = [
            (runs[(name, at + s, False, seed, None)], runs[(name, at + s, True, seed, None)]) for s in NEARBY_SHIFTS_S
        ]
        diffs = ", ".join(
            f"{100 * (k['attainment_after_warmup'] - f['attainment_after_warmup']):+.3f}" for k, f in moved
        )
        forgotten = [forgot[0], *(f["attainment_after_warmup"] for _, f in moved)]
        print(
            f"| {name} | {seed} | {at:g} | {100 * (kept[0] - forgot[0]):+.3f} pp | {diffs} pp "
            f"| {_pct(min(forgotten))}, {_pct(max(forgotten))} ({100 * (max(forgotten) - min(forgotten)):.3f} pp) |"
        )
    return 0


def _pct(x: float) -> str:
    return f"{100 * x:.2f} %"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--matched"]:
        return matched(Path(argv[1]) if len(argv) > 1 else Path("docs/state"))
    if argv[:1] == ["--nearby"]:
        return nearby(Path(argv[1]) if len(argv) > 1 else Path("docs/state"))
    if argv[:1] == ["--views"]:
        return views(argv[1], float(argv[2]), int(argv[3]), float(argv[4]), float(argv[5]))
    if argv[:1] == ["--windows"]:
        return windows(argv[1], float(argv[2]), int(argv[3]) if len(argv) > 3 else 0)
    if argv[:1] == ["--paired"]:
        return paired([int(s) for s in argv[1].split(",")], Path(argv[2]) if len(argv) > 2 else Path("docs/state"))
    out = Path(argv[0]) if argv else Path("docs/state")
    out.mkdir(parents=True, exist_ok=True)
    jobs: list[Job] = []
    for name in DAYS:
        jobs.append((name, None, False, None))
        jobs += [(name, None, False, knob) for knob in MARGINS]
        for at in _day(name)[1]:
            jobs += [(name, at, False, None), (name, at, True, None)]
    started = time.perf_counter()
    code = code_fingerprint()
    results: dict[str, dict[str, Any]] = {}
    timelines: dict[tuple[str, float | None, bool], list[dict[str, Any]]] = {}
    with ProcessPoolExecutor(max_workers=2) as pool:
        for i, ((name, at, forget, knob), summary, timeline) in enumerate(pool.map(_run, jobs), 1):
            day, times = _day(name)
            peak = round(max(day.rates), 2)
            r = results.setdefault(
                name, {"peak_rps": peak, "profile": DAYS[name][3], "role": DAYS[name][4], "runs": []}
            )
            run = {
                "restart_at_s": at,
                "state": None if at is None else ("forgotten" if forget else "kept"),
                "before_steepest_rise": at == times[0],
                "after_warmup": summary["after_warmup"],
                "after_restart": summary.get("after_restart"),
                "gpu_hours": summary["gpu_hours"],
                "command": command(name, peak, at, forget, knob),
                "code": code,
            }
            if at is not None and not forget:
                # whether the view flaps: serve logs state_view on each change (no hysteresis on it)
                # running totals on every sample (a sample without a composite carries none)
                run["state_view_changes"] = int(max((p.get("state_view_changes") or 0 for p in timeline), default=0))
                run["restored_view_s"] = float(max((p.get("restored_view_s") or 0.0 for p in timeline), default=0.0))
            if knob is not None:
                r.setdefault("margins", []).append({**run, "target_utilization": knob})
                continue
            r["runs"].append(run)
            if at is None or at == times[0]:
                timelines[(name, at, forget)] = timeline
            took = time.perf_counter() - started
            print(
                f"[{i}/{len(jobs)}] {name} {at} {'forget' if forget else ''}: {took:.0f}s", file=sys.stderr, flush=True
            )
    (out / "restart.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    from keda_llm_scaler.sim.plots import plot_restart

    for name in DAYS:
        first = _day(name)[1][0]
        plot_restart(
            out / f"restart-{name}.png",
            f"{name}: {DAYS[name][3]}, {DAYS[name][0]} h{DAYS[name][1][0]:g}-{DAYS[name][1][1]:g} [{DAYS[name][2]}]",
            first,
            {"none": timelines[(name, None, False)], "kept": timelines[(name, first, False)],
             "forgotten": timelines[(name, first, True)]},
        )  # fmt: skip
    print(
        "| day | profile | no restart | kept: after warm-up (min) | forgotten: after warm-up (min) "
        "| 15 min after: kept / forgotten (mean) | kept >= forgotten | GPU-h kept / forgotten (mean) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        runs = r["runs"]
        none = next(x for x in runs if x["state"] is None)
        kept = sorted((x for x in runs if x["state"] == "kept"), key=lambda x: x["restart_at_s"])
        forgot = sorted((x for x in runs if x["state"] == "forgotten"), key=lambda x: x["restart_at_s"])
        n = len(kept)

        def mean(xs: list[dict[str, Any]], *path: str) -> float:
            vals = []
            for x in xs:
                v: Any = x
                for k in path:
                    v = v[k]
                vals.append(float(v))
            return sum(vals) / len(vals)

        wins = sum(
            k["after_warmup"]["slo_attainment"] >= f["after_warmup"]["slo_attainment"]
            for k, f in zip(kept, forgot, strict=True)
        )
        print(
            f"| {name} | {r['profile']} | {_pct(none['after_warmup']['slo_attainment'])} "
            f"| {_pct(mean(kept, 'after_warmup', 'slo_attainment'))} "
            f"({_pct(min(x['after_warmup']['slo_attainment'] for x in kept))}) "
            f"| {_pct(mean(forgot, 'after_warmup', 'slo_attainment'))} "
            f"({_pct(min(x['after_warmup']['slo_attainment'] for x in forgot))}) "
            f"| {_pct(mean(kept, 'after_restart', 'slo_attainment'))} / "
            f"{_pct(mean(forgot, 'after_restart', 'slo_attainment'))} | {wins} of {n} "
            f"| {mean(kept, 'gpu_hours'):.1f} / {mean(forgot, 'gpu_hours'):.1f} |"
        )
    print("\n| day | kept restarts where the restored view stood | for (s, each) | view changes (each) |")
    print("|---|---|---|---|")
    for name, r in results.items():
        kept = sorted((x for x in r["runs"] if x["state"] == "kept"), key=lambda x: x["restart_at_s"])
        stood = [x for x in kept if x["restored_view_s"] > 0]
        seconds = ", ".join(f"{x['restored_view_s']:.0f}" for x in kept)
        changes = ", ".join(str(x["state_view_changes"]) for x in kept)
        print(f"| {name} | {len(stood)} of {len(kept)} | {seconds} | {changes} |")
    # what a cold restart's extra replicas are worth: each run against the uninterrupted scaler's margin
    # frontier at the same GPU-hours (above it: the restart bought more than margin would; below: less)
    print("\n| day | run | GPU-h | after warm-up | the uninterrupted scaler at those GPU-h | above it by |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        none = next(x for x in r["runs"] if x["state"] is None)
        points = [(x["gpu_hours"], x["after_warmup"]["slo_attainment"]) for x in [none, *r.get("margins", [])]]
        for x in r.get("margins", []):
            print(f"| {name} | no restart, targetUtilization {x['target_utilization']:g} | {x['gpu_hours']:.1f} "
                  f"| {_pct(x['after_warmup']['slo_attainment'])} | | |")  # fmt: skip
        for x in sorted((x for x in r["runs"] if x["state"]), key=lambda x: (x["state"], x["restart_at_s"])):
            bound = margin_frontier(points, x["gpu_hours"])
            att = x["after_warmup"]["slo_attainment"]
            at_bound, above = ("—", "—") if bound is None else (_pct(bound), f"{100 * (att - bound):+.2f} pp")
            print(
                f"| {name} | {x['state']} at {x['restart_at_s']:g} s | {x['gpu_hours']:.1f} | {_pct(att)} "
                f"| {at_bound} | {above} |"
            )
    for name, r in results.items():
        for x in [*r["runs"], *r.get("margins", [])]:
            print(f"{name}: {x['command']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
