"""Request traces in the Azure LLM inference CSV format (``TIMESTAMP,ContextTokens,GeneratedTokens``).

``rate_scale`` multiplies the arrival rate by overlaying time-shifted copies of the trace: copy k
(k = 0 .. floor(X)-1) is shifted by k x 17 s, wrapping around the end of the trace, and a fractional
part adds every request of one more shifted copy with that probability (seeded). Small shifts keep the
trace's minute-scale shape (bursts, trends) while the rate grows by X; token mixes are unchanged.
"""

from __future__ import annotations

import csv
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Final

__all__ = ["BUNDLED_TRACE", "SHIFT_S", "TraceRequest", "load_trace", "scale_rate", "slice_trace"]

SHIFT_S: Final = 17.0
# Azure LLM inference trace 2023, conversation (CC-BY-4.0): see traces/README.md beside this module.
BUNDLED_TRACE: Final = Path(__file__).parent / "traces" / "AzureLLMInferenceTrace_conv.csv"


@dataclass(frozen=True, slots=True)
class TraceRequest:
    t: float  # seconds from the start of the trace
    prompt: int
    output: int


def _parse_time(raw: str) -> datetime:
    raw = raw.strip().replace("+00:00", "")
    if "." in raw:  # the 2023 files carry 7 fractional digits; datetime takes 6
        head, frac = raw.split(".", 1)
        raw = f"{head}.{frac[:6]}"
    return datetime.fromisoformat(raw)


def load_trace(path: Path) -> list[TraceRequest]:
    """Read an Azure-format CSV; raises ValueError naming the line on bad input."""
    with path.open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:3]] != ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]:
            raise ValueError(f"{path}: expected header TIMESTAMP,ContextTokens,GeneratedTokens")
        rows = []
        for lineno, row in enumerate(reader, start=2):
            if not row:
                continue
            try:
                rows.append((_parse_time(row[0]), int(row[1]), int(row[2])))
            except (ValueError, IndexError) as exc:
                raise ValueError(f"{path}:{lineno}: {exc}") from None
    if not rows:
        raise ValueError(f"{path}: no requests")
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    return [TraceRequest((ts - t0).total_seconds(), max(1, p), max(1, o)) for ts, p, o in rows]


def scale_rate(trace: Sequence[TraceRequest], factor: float, seed: int = 0) -> list[TraceRequest]:
    if factor <= 0:
        raise ValueError("rate scale must be > 0")
    span = trace[-1].t + 1e-3
    rnd = random.Random(seed)
    out: list[TraceRequest] = []
    whole = int(factor)
    for k in range(whole + 1):
        keep = 1.0 if k < whole else factor - whole
        if keep <= 0:
            break
        shift = (k * SHIFT_S) % span
        out.extend(TraceRequest((r.t + shift) % span, r.prompt, r.output)
                   for r in trace if keep >= 1.0 or rnd.random() < keep)
    out.sort(key=lambda r: r.t)
    return out


def slice_trace(trace: Iterable[TraceRequest], start: float, duration: float) -> list[TraceRequest]:
    return [TraceRequest(r.t - start, r.prompt, r.output) for r in trace if start <= r.t < start + duration]
