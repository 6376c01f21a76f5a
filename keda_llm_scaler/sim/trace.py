"""Request traces in the Azure LLM inference CSV format (``TIMESTAMP,ContextTokens,GeneratedTokens``).

``scale_rate(trace, X)`` multiplies the arrival rate at every time scale: it overlays ⌊X⌋ copies of the
trace, copy k shifted by k·μ/X where μ is the trace's mean inter-arrival time, and a fractional part
adds one more shifted copy thinned to that fraction (seeded). The shifts are a fraction of one mean
gap, so every window longer than a second holds X times the requests it held: the peak 10-second
rate grows with X exactly like the mean, and bursts stay bursts. Token mixes are unchanged.
"""

from __future__ import annotations

import csv
import itertools
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final, TextIO

__all__ = [
    "BUNDLED_TRACE",
    "BURSTY_TRACE",
    "TRACES",
    "TraceRequest",
    "load_trace",
    "peak_to_mean",
    "scale_rate",
    "slice_trace",
    "write_trace",
]

_TRACES_DIR: Final = Path(__file__).parent / "traces"
# Azure LLM inference trace 2023, conversation (CC-BY-4.0): see traces/README.md beside this module.
BUNDLED_TRACE: Final = _TRACES_DIR / "AzureLLMInferenceTrace_conv.csv"
# The same hour with four injected 3-5x bursts shorter than a cold start (scripts/build_bursty_hour.py).
BURSTY_TRACE: Final = _TRACES_DIR / "azure_conv_bursty_hour.csv"
# Short names for the bundled files (``replay --trace conv``).
TRACES: Final = {"conv": BUNDLED_TRACE, "bursty": BURSTY_TRACE}
HEADER: Final = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
_EPOCH: Final = datetime(2023, 11, 16, 18, 0, 0)


@dataclass(frozen=True, slots=True)
class TraceRequest:
    t: float  # seconds from the start of the trace
    prompt: int
    output: int


def _parse_time(raw: str) -> datetime:
    raw = raw.strip().replace("T", " ")
    if raw.endswith("Z"):
        raw = raw[:-1] + "+00:00"
    if "." in raw:  # the 2023 files carry 7 fractional digits; datetime takes 6
        head, frac = raw.split(".", 1)
        digits = "".join(itertools.takewhile(str.isdigit, frac))
        raw = f"{head}.{digits[:6].ljust(6, '0')}{frac[len(digits) :]}"
    ts = datetime.fromisoformat(raw)
    # mixed offsets in one file (the 2024 week-long traces): compare them in UTC
    return ts.astimezone(UTC).replace(tzinfo=None) if ts.tzinfo is not None else ts


def load_trace(path: Path) -> list[TraceRequest]:
    """Read an Azure-format CSV; raises ValueError naming the line on bad input."""
    with path.open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:3]] != HEADER:
            raise ValueError(f"{path}: expected header TIMESTAMP,ContextTokens,GeneratedTokens")
        rows = []
        for lineno, row in enumerate(reader, start=2):
            if not row:
                continue
            try:
                prompt, output = int(row[1]), int(row[2])
                if prompt < 0 or output < 0:
                    raise ValueError("token counts must be >= 0")
                rows.append((_parse_time(row[0]), prompt, output))
            except (ValueError, IndexError) as exc:
                raise ValueError(f"{path}:{lineno}: {exc}") from None
    if not rows:
        raise ValueError(f"{path}: no requests")
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    return [TraceRequest((ts - t0).total_seconds(), max(1, p), max(1, o)) for ts, p, o in rows]


def write_trace(out: TextIO, requests: Iterable[TraceRequest], start: datetime = _EPOCH) -> int:
    """Write requests in the Azure format (7 fractional digits, as the 2023 files); returns the row count."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(HEADER)
    n = 0
    for r in requests:
        ts = start + timedelta(seconds=r.t)
        writer.writerow([ts.strftime("%Y-%m-%d %H:%M:%S.%f") + "0", r.prompt, r.output])
        n += 1
    return n


def scale_rate(trace: Sequence[TraceRequest], factor: float, seed: int = 0) -> list[TraceRequest]:
    """The trace at ``factor`` times its rate, at every time scale (see the module docstring)."""
    if factor <= 0:
        raise ValueError("rate scale must be > 0")
    if not trace:
        return []
    span = trace[-1].t + 1e-3
    gap = span / len(trace)  # μ, the mean inter-arrival time
    rnd = random.Random(seed)
    out: list[TraceRequest] = []
    whole = int(factor)
    n = len(trace)
    for k in range(whole + 1):
        keep = 1.0 if k < whole else factor - whole
        if keep <= 1e-12:
            break
        shift = k * gap / factor
        out.extend(
            TraceRequest((r.t + shift) % span, trace[(i + k) % n].prompt, trace[(i + k) % n].output)
            for i, r in enumerate(trace)
            if keep >= 1.0 or rnd.random() < keep
        )
    out.sort(key=lambda r: r.t)
    return out


def peak_to_mean(times: Sequence[float], window_s: float = 10.0, span_s: float | None = None) -> float:
    """The busiest ``window_s`` window's rate over the mean rate (fixed, aligned windows)."""
    if not times:
        return 0.0
    span = span_s if span_s is not None else max(times) + 1e-9
    bins = [0] * (int(span // window_s) + 1)
    for t in times:
        bins[min(len(bins) - 1, int(t // window_s))] += 1
    full = bins[: max(1, int(span // window_s))]  # a trailing partial window would read low or high
    return max(full) / (sum(full) / len(full)) if sum(full) else 0.0


def slice_trace(trace: Iterable[TraceRequest], start: float, duration: float) -> list[TraceRequest]:
    return [TraceRequest(r.t - start, r.prompt, r.output) for r in trace if start <= r.t < start + duration]
