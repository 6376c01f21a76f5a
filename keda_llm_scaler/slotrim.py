"""The SLO trim: how hot the composite plans replicas, corrected by the TTFT the fleet actually delivers.

Pure: the clock is passed in. A replica's capacity (``keda_llm_scaler.demand``) is the rate at its knee;
how far below the knee a fleet must run to hold a TTFT SLO depends on how the knee is shaped, and that
differs by mix and hardware: measured in the replay, the smallest fleet holding 99 % within 2 s ran its
replicas at 0.48 of the knee on 70B chat (a cliff preceded by TTFT growth), 0.54 on 8B with long prompts
(a queue that grows smoothly) and 0.63 on 8B chat. One ``targetUtilization`` cannot hit all three, so
with ``ttftSloSeconds`` set the planned utilization is ``targetUtilization x trim`` and the trim follows
the fleet's TTFT quantile (``ttftSloQuantile``, over the rate window):

    quantile > SLO              trim falls, e-fold per TRIM_DOWN_S of breach (fast: misses are the cost)
    quantile < RAISE_SHARE SLO  trim rises, e-fold per TRIM_UP_S (slow: slack is only money)
    in between                  trim holds
    TRIM_MIN <= trim <= TRIM_MAX; no TTFT reading (idle fleet, no SLO): trim holds

Without ``ttftSloSeconds`` the trim is 1: the composite plans at ``targetUtilization`` as before.
"""

from __future__ import annotations

import math
from typing import Final

__all__ = ["RAISE_SHARE", "TRIM_DOWN_S", "TRIM_MAX", "TRIM_MIN", "TRIM_UP_S", "SloTrim"]

TRIM_MIN: Final = 0.5
TRIM_MAX: Final = 1.0
TRIM_DOWN_S: Final = 600.0
TRIM_UP_S: Final = 3600.0
RAISE_SHARE: Final = 0.5
MAX_STEP_S: Final = 60.0  # a gap in the readings (a restart, no traffic) is not a long breach or a long calm


class SloTrim:
    """One trigger's trim (keyed by its SLO and quantile in ``FleetState``)."""

    __slots__ = ("_t", "slo_s", "value")

    def __init__(self, slo_s: float) -> None:
        self.slo_s = slo_s
        self.value = 1.0
        self._t: float | None = None

    def update(self, now: float, quantile_s: float | None) -> float:
        """Move the trim by the time since the last update; returns it. Called once per evaluation."""
        last, self._t = self._t, now
        if last is None or now <= last or quantile_s is None or not math.isfinite(quantile_s):
            return self.value
        dt = min(now - last, MAX_STEP_S)
        if quantile_s > self.slo_s:
            self.value = max(TRIM_MIN, self.value * math.exp(-dt / TRIM_DOWN_S))
        elif quantile_s < RAISE_SHARE * self.slo_s:
            self.value = min(TRIM_MAX, self.value * math.exp(dt / TRIM_UP_S))
        return self.value
