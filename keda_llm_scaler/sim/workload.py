"""What a replay feeds the fleet: a trace file, or a day built from a rate curve — streamed, not stored.

A ``Workload`` yields requests in arrival order as often as asked (the oracle looks ahead with one
extra pass) and offers a sample of its token mix (for single-replica capacity measurements).

``CurveWorkload`` is a diurnal day: arrivals are a non-homogeneous Poisson process whose rate is the
curve's 10-minute rates interpolated linearly between window midpoints (no artificial steps at
window edges; the day's total is kept, a single window's mean only approximately: a lone peak
window is shaved by up to a quarter of its excess over its neighbours), generated exactly by
thinning within each linear segment; every request draws its (prompt, output) pair from a trace's
token mix. ServeGen's per-window burstiness (``cv``, arrival distribution) is not reproduced: the
arrivals are Poisson around the curve.
Everything is deterministic per seed. Curves come in ServeGen's formats: the aggregate
``category,model,window_start_s,total_rate_rps,...`` (pick a model) or one client's raw file
``window_start_s,rate_rps,cv,dist,p1,p2`` (no header).
"""

from __future__ import annotations

import csv
import itertools
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from keda_llm_scaler.sim.mixes import TRACE_MIX, apply_mix, sample_mix
from keda_llm_scaler.sim.trace import TraceRequest, load_trace, scale_rate

__all__ = ["BUNDLED_CURVE", "CurveWorkload", "TraceWorkload", "Workload", "load_curve", "parse_hours"]

# ServeGen per-model aggregate rates, 10-minute windows over 14 days (Apache-2.0): traces/servegen/.
BUNDLED_CURVE: Final = Path(__file__).parent / "traces" / "servegen" / "servegen_aggregate_rate_10min.csv"


class Workload:
    """A source of requests: ``name`` and ``duration_s`` are set by each kind."""

    name: str
    duration_s: float

    def requests(self) -> Iterator[TraceRequest]:
        return (TraceRequest(t, p, o) for t, p, o in self.rows())

    def rows(self) -> Iterator[tuple[float, int, int]]:
        """(arrival s, prompt tokens, output tokens) in arrival order: the cheap form the simulator reads."""
        raise NotImplementedError

    def token_mix(self, n: int = 4000, seed: int = 0) -> list[tuple[int, int]]:
        raise NotImplementedError

    def describe(self) -> dict[str, object]:
        return {"workload": self.name, "duration_s": self.duration_s}


@dataclass
class TraceWorkload(Workload):
    """A request list in memory (a trace file, rate-scaled): an hour at x12 is ~230k small records."""

    name: str
    trace: Sequence[TraceRequest]
    rate_scale: float = 1.0
    mix: str = TRACE_MIX

    duration_s: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        self.duration_s = self.trace[-1].t + 1.0 if self.trace else 0.0

    @classmethod
    def from_file(
        cls,
        path: Path,
        rate_scale: float = 1.0,
        seed: int = 0,
        hours: tuple[float, float] | None = None,
        mix: str = TRACE_MIX,
    ) -> TraceWorkload:
        trace = load_trace(path)
        name = path.name
        if mix != TRACE_MIX:
            trace = apply_mix(trace, mix, seed)
            name += f" [{mix} mix]"
        if hours is not None:
            a, b = hours[0] * 3600.0, hours[1] * 3600.0
            span = trace[-1].t
            if b > span + 60.0:  # a minute of slack: the last arrival is not the end of the hour
                raise ValueError(
                    f"{path}: the trace covers {span / 3600:.2f} h; --hours {hours[0]:g}:{hours[1]:g} goes beyond it"
                )
            trace = [TraceRequest(r.t - a, r.prompt, r.output) for r in trace if a <= r.t < b]
            if not trace:
                raise ValueError(f"{path}: no requests in hours {hours[0]:g}:{hours[1]:g}")
            name += f" h{hours[0]:g}-{hours[1]:g}"
        if rate_scale != 1.0:
            trace = scale_rate(trace, rate_scale, seed)
        return cls(name, trace, rate_scale, mix)

    def requests(self) -> Iterator[TraceRequest]:
        return iter(self.trace)

    def rows(self) -> Iterator[tuple[float, int, int]]:
        return ((r.t, r.prompt, r.output) for r in self.trace)

    def token_mix(self, n: int = 4000, seed: int = 0) -> list[tuple[int, int]]:
        rnd = random.Random(seed)
        return [(r.prompt, r.output) for r in rnd.sample(list(self.trace), min(len(self.trace), n))]

    def describe(self) -> dict[str, object]:
        return {"workload": self.name, "duration_s": self.duration_s, "rate_scale": self.rate_scale, "mix": self.mix}


def parse_hours(raw: str) -> tuple[float, float]:
    """``A:B`` hours from the curve's start (B > A >= 0)."""
    try:
        a_s, b_s = raw.split(":", 1)
        a, b = float(a_s), float(b_s)
    except ValueError:
        raise ValueError(f"--hours takes A:B (hours, e.g. 2:14), not {raw!r}") from None
    if not (math.isfinite(a) and math.isfinite(b) and 0 <= a < b):
        raise ValueError(f"--hours {raw!r}: need 0 <= A < B")
    return a, b


def load_curve(path: Path, model: str | None = None) -> tuple[list[float], float]:
    """(rates per window in req/s, window length in s) from a ServeGen aggregate or client file."""
    with path.open(newline="") as fh:
        rows = [row for row in csv.reader(fh) if row]
    if not rows:
        raise ValueError(f"{path}: empty rate curve")
    points: list[tuple[float, float]] = []
    if rows[0][:2] == ["category", "model"]:
        head = rows[0]
        try:
            i_model, i_start, i_rate = head.index("model"), head.index("window_start_s"), head.index("total_rate_rps")
        except ValueError:
            raise ValueError(f"{path}: expected columns model, window_start_s, total_rate_rps") from None
        models = sorted({r[i_model] for r in rows[1:]})
        if model is None:
            raise ValueError(f"{path} holds several models: choose one with --curve-model ({', '.join(models)})")
        if model not in models:
            raise ValueError(f"{path}: no model {model!r} (there are: {', '.join(models)})")
        data = [(r[i_start], r[i_rate], n) for n, r in enumerate(rows[1:], start=2) if r[i_model] == model]
    else:  # a ServeGen client file: window_start_s, rate_rps, cv, dist, p1, p2
        if model is not None:
            raise ValueError(f"{path} is a single-client rate file (no model column): drop --curve-model")
        data = [(r[0], r[1] if len(r) > 1 else "", n) for n, r in enumerate(rows, start=1)]
    for start, rate, lineno in data:
        try:
            s, v = float(start), float(rate)
        except ValueError:
            raise ValueError(f"{path}:{lineno}: window start and rate must be numbers") from None
        if not (math.isfinite(s) and math.isfinite(v)) or v < 0:
            raise ValueError(f"{path}:{lineno}: rate must be a finite number >= 0, not {rate!r}")
        points.append((s, v))
    points.sort()
    if len(points) < 2:
        raise ValueError(f"{path}: a rate curve needs at least two windows")
    window = points[1][0] - points[0][0]
    if window <= 0 or any(abs((b[0] - a[0]) - window) > 1e-6 for a, b in itertools.pairwise(points)):
        raise ValueError(f"{path}: windows must be evenly spaced (found a gap other than {window:g} s)")
    return [v for _, v in points], window


@dataclass
class CurveWorkload(Workload):
    name: str
    rates: Sequence[float]  # req/s per window, after scaling
    window_s: float
    mix: Sequence[tuple[int, int]]
    seed: int = 0
    source: dict[str, object] = field(default_factory=dict)
    duration_s: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        if not self.mix:
            raise ValueError("a curve workload needs a token mix (a trace with requests)")
        if not self.rates or max(self.rates) <= 0:
            raise ValueError("the rate curve is zero everywhere")
        self.duration_s = len(self.rates) * self.window_s

    @classmethod
    def build(
        cls,
        curve: Path,
        mix_trace: Path,
        *,
        model: str | None = None,
        hours: tuple[float, float] | None = None,
        rate_scale: float = 1.0,
        peak_rate: float | None = None,
        seed: int = 0,
        mix: str = TRACE_MIX,
    ) -> CurveWorkload:
        rates, window = load_curve(curve, model)
        if hours is not None:
            first, last = int(hours[0] * 3600 // window), math.ceil(hours[1] * 3600 / window)
            if last > len(rates):
                raise ValueError(
                    f"{curve}: the curve covers {len(rates) * window / 3600:g} h; "
                    f"--hours {hours[0]:g}:{hours[1]:g} is beyond it"
                )
            rates = rates[first:last]
        if max(rates) <= 0:
            raise ValueError(f"{curve}: the rate is zero over the chosen hours")
        if rate_scale <= 0 or not math.isfinite(rate_scale):
            raise ValueError("rate scale must be > 0")
        factor = rate_scale * (peak_rate / max(rates) if peak_rate is not None else 1.0)
        trace = load_trace(mix_trace)
        label = f"{curve.name}:{model}" if model else curve.name
        pairs = sample_mix(mix, [(r.prompt, r.output) for r in trace], seed=seed)
        if hours is not None:  # whole windows: say which
            label += f" h{first * window / 3600:g}-{min(last, first + len(rates)) * window / 3600:g}"
        if mix != TRACE_MIX:
            label += f" [{mix} mix]"
        return cls(
            label,
            [r * factor for r in rates],
            window,
            pairs,
            seed,
            {
                "curve": curve.name,
                "curve_model": model,
                "hours": list(hours) if hours else None,
                "token_mix": mix_trace.name if mix == TRACE_MIX else mix,
                "mix": mix,
                "curve_factor": factor,
            },
        )

    def rate_at(self, t: float) -> float:
        """Linear between window midpoints, flat before the first and after the last."""
        x = t / self.window_s - 0.5
        if x <= 0:
            return self.rates[0]
        i = int(x)
        if i >= len(self.rates) - 1:
            return self.rates[-1]
        frac = x - i
        return self.rates[i] * (1 - frac) + self.rates[i + 1] * frac

    def rows(self) -> Iterator[tuple[float, int, int]]:
        rnd = random.Random(self.seed)
        mix, n_mix = self.mix, len(self.mix)
        half = self.window_s / 2
        # segment edges: 0, the window midpoints, the end; the rate is linear inside each
        edges = [0.0] + [half + i * self.window_s for i in range(len(self.rates))] + [self.duration_s]
        expovariate, uniform = rnd.expovariate, rnd.random
        for a, b in itertools.pairwise(edges):
            if b <= a:
                continue
            ra, rb = self.rate_at(a), self.rate_at(b)
            top = max(ra, rb)
            if top <= 0:
                continue
            slope = (rb - ra) / (b - a)
            t = a
            while True:
                t += expovariate(top)
                if t >= b:
                    break
                if uniform() * top <= ra + slope * (t - a):
                    p, o = mix[int(uniform() * n_mix)]
                    yield t, p, o

    def token_mix(self, n: int = 4000, seed: int = 0) -> list[tuple[int, int]]:
        rnd = random.Random(seed)
        return rnd.sample(list(self.mix), min(len(self.mix), n))

    def describe(self) -> dict[str, object]:
        return {
            "workload": self.name,
            "duration_s": self.duration_s,
            "peak_rate_rps": max(self.rates),
            "mean_rate_rps": sum(self.rates) / len(self.rates),
            **self.source,
        }
