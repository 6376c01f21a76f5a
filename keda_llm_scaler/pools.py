"""Fleets of pools: one model served by several Deployments (a reserved baseline, burst pools on other GPU
classes), each scaled by its own ScaledObject. Pure: no I/O, no clock.

The gateway spreads one model's traffic over every pool's replicas, so no pool alone sees the fleet's
demand: the reserved pool's queue grows while the burst pool idles at zero, or the burst pool's arrivals
fall when the reserved one grows. The split reads every pool's own composite, puts the fleet's demand
back together, and hands it out again in tier order:

    unit_p  = requests/s one replica of pool p serves at its targetUtilization (capacity x utilization,
              learned per pool: another GPU class serves another rate). Unknown: the mean of the known
              units (assumed, and said so); none known: 1, and the split is in replica-equivalents.
    work    = sum_p demand_p x unit_p           the fleet's demand, in requests/s, where demand_p is what
              the pool's composite stands for (``pool_reading``: a pool without fresh data counts its
              members at target, never zero load; one with no replica awake counts nothing)
    in tier order (reserved first, then burst by tier number, ties by pool name):
        share_p = min(size_p, work_left / unit_p);  work_left -= share_p x unit_p
    the last pool takes what is left even beyond its size (reported as ``unplaced``: the HPA clamps it)

So the reserved pool fills first, up to its size; only the demand beyond it reaches burst pools, and a
falling demand leaves the burst pools first (scale-down takes burst first). The split is a function of
the pools' latest readings only, never of the order in which KEDA asks for them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from keda_llm_scaler.demand import SERVED_TRUST, DemandEstimate
from keda_llm_scaler.policy import Composite

__all__ = [
    "BURST",
    "RESERVED",
    "TIERS",
    "PoolReading",
    "PoolShare",
    "PoolSpec",
    "cost_per_million_tokens",
    "parse_tier",
    "pool_cost_per_hour",
    "pool_reading",
    "split",
    "unit_rps",
]

RESERVED: Final = "reserved"
BURST: Final = "burst"
TIERS: Final = {RESERVED: 0, BURST: 1}
MAX_TIER: Final = 99


def parse_tier(raw: str) -> int:
    """``reserved`` (0), ``burst`` (1), or an order number 0-99 where there are more than two tiers (0 is
    the reserved tier: it costs its size whether used or not). ValueError otherwise."""
    text = raw.strip().lower()
    if text in TIERS:
        return TIERS[text]
    if text.isascii() and text.isdigit() and int(text) <= MAX_TIER:
        return int(text)
    raise ValueError(f"{raw!r} is not a tier")


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """One pool of a fleet, as its trigger declares it."""

    fleet: str
    pool: str
    tier: int  # 0: reserved; higher: burst, filled in this order
    size: int | None = None  # reserved: the pool's size; burst: its maximum (None: not bounded here)
    cost_per_hour: float | None = None  # per replica

    @property
    def reserved(self) -> bool:
        return self.tier == 0

    @property
    def tier_name(self) -> str:
        return RESERVED if self.tier == 0 else BURST if self.tier == 1 else f"burst-{self.tier}"


@dataclass(frozen=True, slots=True)
class PoolReading:
    """What the split needs of one pool: the demand its replicas read (in its own replica-equivalents; None:
    no fresh data), the requests/s one of its replicas serves at its target utilization (None: unknown), its
    members (ready + starting), and its own composite as served before fleets (``own``). Build it with
    ``pool_reading``."""

    spec: PoolSpec
    value: float | None
    unit_rps: float | None
    members: int = 0
    own: float | None = None
    # what the pool holds for replicas it is starting while none is awake: a floor on its own share, never
    # demand of the fleet's (see ``pool_reading``)
    holding: float = 0.0


def pool_reading(
    spec: PoolSpec,
    own: Composite | None,
    target_utilization: float,
    members: int,
    known_unit_rps: float | None = None,
) -> PoolReading:
    """The demand a pool's own composite stands for in the fleet:

    - no composite (no fresh data): None, and the split counts its members at target;
    - no replica awake: what its gateway holds for it, or the arrivals that ask its sleeping replicas to
      wake (a fleet whose pools are all at zero wakes from these). What it holds for the replicas it is
      starting is no demand of the fleet's: it serves nothing, so the gateway sends its traffic to the others,
      whose readings carry it (counted, a burst pool starting five replicas would read five, and be given
      five). That hold is kept apart (``holding``), a floor on the pool's own share only: replicas on their
      way are not cancelled, and a reserved pool mid-rollout keeps what it is starting;
    - otherwise its composite, except that past the pool's size only evidence counts while its capacity is
      a lower bound (``served``: the rate one replica happened to serve, or a KV reading held at the step
      beyond it) or unknown: its pressure (KV, queue, rejects) and its SLO floor. A lower bound reads a
      pool the load never pushed as needing more than it has at every new peak (a reservation of 8 for a
      day of 30 req/s, where each replica serves 13, read 8.6), which would buy burst replicas on days
      the reservation covers. A capacity configured, learned past a knee, or read from KV spills as it
      reads: on the tuning day a reservation held at its size by that rule alone started its burst pool
      only at saturation, one start-up late (98.6 % after the warm-up, against 99.9 %).

    ``known_unit_rps``: the pool's unit when its composite has none now (a pool at zero): its configured
    capacity, else the last one it read."""
    unit = unit_rps(own.demand if own is not None else None, target_utilization) or known_unit_rps
    if own is None:
        return PoolReading(spec, None, unit, members)
    value = own.value
    if own.replicas == 0:
        demand = own.value if own.dominant in ("gateway", "rate") else 0.0
        return PoolReading(spec, demand, unit, members, own.value, holding=max(0.0, own.value - demand))
    if spec.size is not None and value > spec.size and not _capacity_read(own.demand):
        value = max(float(spec.size), own.pressure, own.slo_floor or 0.0)
        value = min(own.value, value)
    return PoolReading(spec, value, unit, members, own.value)


@dataclass(frozen=True, slots=True)
class PoolShare:
    pool: str
    value: float  # this pool's share of the fleet's demand, in its own replica-equivalents
    own: float | None  # the pool's own composite before the split
    work_rps: float  # the demand placed on this pool, in the fleet's unit (requests/s)
    unit_rps: float  # the unit this pool's share was converted with
    unit_assumed: bool  # unit_rps is the other pools' mean (or 1), not this pool's own
    fleet_work_rps: float  # the fleet's demand, in the same unit
    unplaced_rps: float  # demand beyond every pool's size (on the last pool only)
    fresh: bool  # the pool's own composite was known (else it counted its members at target)
    unsized: bool = False  # a pool before the last has no known size: no split, each its own composite

    def explain(self) -> str:
        if self.unsized:
            return f"pool {self.pool}: its own composite {self.value:.3f} (a pool's size is unknown: no split)"
        unit = f"{self.unit_rps:.3g} req/s per replica{' (assumed)' if self.unit_assumed else ''}"
        beyond = f", {self.unplaced_rps:.3g} req/s beyond every pool's size" if self.unplaced_rps > 0 else ""
        return (
            f"fleet demand {self.fleet_work_rps:.3g} req/s; pool {self.pool} takes {self.work_rps:.3g} "
            f"= {self.value:.3f} replicas at {unit}{beyond}"
        )


def unit_rps(demand: DemandEstimate | None, target_utilization: float) -> float | None:
    """The requests/s one replica of a pool serves at its target utilization: the capacity its own composite
    was scored with (configured, learned, or a prior), so that its composite times this is the demand it
    read; None while it has none (a pool at zero, one whose replicas never answered)."""
    if demand is None or demand.capacity_rps is None:
        return None
    unit = demand.capacity_rps * target_utilization
    return unit if math.isfinite(unit) and unit > 0 else None


def _capacity_read(demand: DemandEstimate | None) -> bool:
    """The capacity was configured, learned past a knee, or read from KV below the step beyond what
    replicas served that bounds it (at that bound it is the served rate's, a lower bound, not KV's)."""
    if demand is None or demand.capacity_rps is None:
        return False
    if demand.knee_known:
        return True
    if demand.capacity_source != "provisional":
        return False
    bound = None if demand.served_rps is None else SERVED_TRUST * demand.served_rps
    return bound is None or demand.capacity_rps < bound * (1 - 1e-9)


def _units(readings: Sequence[PoolReading]) -> dict[str, tuple[float, bool]]:
    known = [r.unit_rps for r in readings if r.unit_rps is not None and math.isfinite(r.unit_rps) and r.unit_rps > 0]
    fallback = math.fsum(known) / len(known) if known else 1.0
    out = {}
    for r in readings:
        own = r.unit_rps is not None and math.isfinite(r.unit_rps) and r.unit_rps > 0
        out[r.spec.pool] = (float(r.unit_rps), False) if own and r.unit_rps is not None else (fallback, True)
    return out


def split(readings: Sequence[PoolReading]) -> dict[str, PoolShare]:
    """Each pool's share of the fleet's demand (see the module's docstring), by pool name. Deterministic in
    the readings whatever their order; pools with the same name are one pool (the caller keeps one)."""
    if not readings:
        return {}
    ordered = sorted(readings, key=lambda r: (r.spec.tier, r.spec.pool))
    if any(r.spec.size is None for r in ordered[:-1]):
        return _unsplit(ordered)
    units = _units(ordered)
    own_work = []
    for r in ordered:
        value = r.value
        if value is None or not math.isfinite(value):
            value = float(max(r.members, 0))  # no fresh data: its members at target, never zero load
        own_work.append(max(0.0, value) * units[r.spec.pool][0])
    fleet = math.fsum(own_work)
    left = fleet
    shares: dict[str, PoolShare] = {}
    for i, r in enumerate(ordered):
        unit, assumed = units[r.spec.pool]
        last = i == len(ordered) - 1
        want = left / unit
        size = r.spec.size
        value = want if last or size is None else min(float(size), want)
        placed = value * unit
        value = max(value, r.holding)  # replicas on their way are kept, not counted as the fleet's demand
        unplaced = max(0.0, (want - size) * unit) if last and size is not None else 0.0
        left = max(0.0, left - placed)
        shares[r.spec.pool] = PoolShare(
            pool=r.spec.pool,
            value=round(value, 3),
            own=r.own,
            work_rps=placed,
            unit_rps=unit,
            unit_assumed=assumed,
            fleet_work_rps=fleet,
            unplaced_rps=unplaced,
            fresh=r.value is not None,
        )
    return shares


def _unsplit(ordered: Sequence[PoolReading]) -> dict[str, PoolShare]:
    """A pool before the last whose size is not known (no poolSize, and its maxReplicaCount unread: a 403, a
    ScaledObject not found) would take every demand as its own, and tell the running burst pools 0 while
    its HPA clamps it: every pool then answers its own composite, as before fleets, until the size is known
    (``PoolShare.unsized``)."""
    units = _units(ordered)
    out = {}
    for r in ordered:
        unit, assumed = units[r.spec.pool]
        value = r.own if r.own is not None else r.value
        value = max(0.0, value) if value is not None else float(max(r.members, 0))
        out[r.spec.pool] = PoolShare(
            pool=r.spec.pool,
            value=round(value, 3),
            own=r.own,
            work_rps=value * unit,
            unit_rps=unit,
            unit_assumed=assumed,
            fleet_work_rps=math.nan,
            unplaced_rps=0.0,
            fresh=r.value is not None,
            unsized=True,
        )
    return out


def pool_cost_per_hour(spec: PoolSpec, running: int) -> float | None:
    """What the pool costs per hour now: a reserved pool its size whether used or not (its running replicas
    when no size is known, or more run than it holds), a burst pool the replicas it runs (starting ones
    included: a start-up holds its GPUs). None without a price."""
    if spec.cost_per_hour is None:
        return None
    billed = max(running, spec.size or 0) if spec.reserved else running
    return billed * spec.cost_per_hour


def cost_per_million_tokens(cost_per_hour: float | None, tokens_per_s: float | None) -> float | None:
    """The fleet's cost per million tokens served (prompt + generated); None while nothing is served."""
    if cost_per_hour is None or tokens_per_s is None or not tokens_per_s > 0 or not math.isfinite(tokens_per_s):
        return None
    return cost_per_hour / (tokens_per_s * 3600.0 / 1e6)
