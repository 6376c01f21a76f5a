"""Which pod a scale-down should remove: each pod's deletion cost from its scraped load. Pure: no I/O.

The ReplicaSet controller removes, among ready pods, the one with the lowest
``controller.kubernetes.io/pod-deletion-cost`` first (before its own tie-breaks: pods doubled up on a
node, then the most recently ready, by log2 bucket, then at random). Left to itself it picks pods
semi-randomly, often one holding dozens of live streams. This module turns what the scaler scraped into
that cost, so the least busy pod goes first:

    cost = LEVEL_STEP x (level(requests held) - the fleet's median level) + kv_step(KV in use)

* ``level`` of the requests a pod holds (running + waiting: both are cut, or must finish, if it goes):
  0 for none, then geometric steps of 25 % (1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 19 ... requests).
* It is written relative to the fleet's median level (the lower median of the pods holding requests): the
  ReplicaSet only compares pods, so what matters is each pod's place among the others. Behind an inference
  gateway a bursty load moves every pod's level together by two or three steps within seconds (the
  conversation hour x12 swings 36 -> 72 -> 33 in flight per pod); absolute levels rewrote the whole fleet
  at every swing (~650 patches an hour on 8 pods) while their order hardly moved.
* ``kv_step``: KV-cache use in tenths, the tie-break between pods holding about as many requests: the one
  with less context in flight loses fewer tokens.
* A pod holding nothing gets ``IDLE_COST``: it goes first, and stays marked so however the others move.
* A pod without a fresh reading gets ``UNKNOWN_COST``: missing data is never idle, so it is never the
  first choice (the ReplicaSet already removes pods that are not ready before any ready one).

A pass rewrites a pod only when its relative level moved by ``LEVEL_HYSTERESIS`` or more (it now holds
about 1.5x, or 0.65x, what it held against the others when written), or into or out of ``IDLE_COST`` or
``UNKNOWN_COST``. A pod whose load wobbles by a request or two, or whose KV tenth changes, keeps its annotation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

__all__ = [
    "ANNOTATION",
    "DEFAULT_BURST",
    "DEFAULT_INTERVAL_S",
    "IDLE_COST",
    "LEVEL_HYSTERESIS",
    "LEVEL_STEP",
    "UNKNOWN_COST",
    "CostChange",
    "PodLoad",
    "deletion_cost",
    "effective",
    "fleet_costs",
    "level",
    "needs_write",
    "parse_cost",
    "plan",
    "scale_down_plausible",
]

ANNOTATION: Final = "controller.kubernetes.io/pod-deletion-cost"
LEVEL_STEP: Final = 100  # room for the KV tie-break (0-10) inside one level
LEVEL_RATIO: Final = 1.25
LEVEL_HYSTERESIS: Final = 2  # levels a pod's load must move before its annotation is rewritten
UNKNOWN_COST: Final = 1_000_000  # above any relative level (+-60 levels: ~650,000 requests apart)
IDLE_COST: Final = -1_000_000  # below any: an idle pod goes first, whatever the others hold
INT32_MAX: Final = 2**31 - 1  # the annotation must parse as an int32
# Rate limits per fleet: a pass at most this often (the HPA acts every 15 s; fresher costs are not read)
# and at most this many patches in one pass (the next victims first, see ``plan``).
DEFAULT_INTERVAL_S: Final = 10.0
DEFAULT_BURST: Final = 16


def level(requests: float) -> int:
    """0 for an idle pod; then one step per 25 % more requests held."""
    if not math.isfinite(requests) or requests <= 0:
        return 0
    return 1 + int(math.log(max(requests, 1.0)) / math.log(LEVEL_RATIO) + 1e-9)


def deletion_cost(running: float | None, waiting: float | None, kv_usage: float | None, median_level: int = 0) -> int:
    """The cost of a pod with this reading in a fleet whose median level is ``median_level`` (``None``
    anywhere: no reading, ``UNKNOWN_COST``)."""
    if running is None or waiting is None:
        return UNKNOWN_COST
    kv = kv_usage if kv_usage is not None and math.isfinite(kv_usage) else 0.0
    kv_step = min(10, max(0, int(kv * 10 + 1e-9)))
    return LEVEL_STEP * (level(max(0.0, running) + max(0.0, waiting)) - median_level) + kv_step


def _held(p: PodLoad) -> float | None:
    if p.running is None or p.waiting is None:
        return None
    return max(0.0, p.running) + max(0.0, p.waiting)


def fleet_costs(pods: Sequence[PodLoad]) -> list[int]:
    """Each pod's cost: ``IDLE_COST`` for a pod holding nothing, else its level relative to the lower
    median level of the pods that hold requests (``UNKNOWN_COST`` without a reading)."""
    levels = sorted(level(h) for p in pods if (h := _held(p)) is not None and h > 0)
    median = levels[(len(levels) - 1) // 2] if levels else 0
    return [IDLE_COST if _held(p) == 0 else deletion_cost(p.running, p.waiting, p.kv_usage, median) for p in pods]


@dataclass(frozen=True, slots=True)
class PodLoad:
    """One pod of a fleet as the ranker sees it: who it is, what its annotation says, what it holds."""

    namespace: str
    name: str
    uid: str = ""
    current: int | None = None  # the pod's annotation now (None: absent or not an int32; reads as 0)
    running: float | None = None  # None: no fresh reading
    waiting: float | None = None
    kv_usage: float | None = None


@dataclass(frozen=True, slots=True)
class CostChange:
    pod: PodLoad
    cost: int


def parse_cost(raw: object) -> int | None:
    """The annotation's value as the ReplicaSet reads it (an int32), else None (it then counts as 0)."""
    if not isinstance(raw, str):
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        return None
    return value if -(2**31) <= value <= INT32_MAX else None


def effective(current: int | None) -> int:
    """What the ReplicaSet reads: an absent or invalid annotation counts as 0."""
    return 0 if current is None else current


def needs_write(current: int | None, cost: int) -> bool:
    """Whether a pod annotated ``current`` must be rewritten to ``cost`` (see ``LEVEL_HYSTERESIS``)."""
    now = effective(current)
    if cost == now:
        return False
    if cost in (UNKNOWN_COST, IDLE_COST) or now in (UNKNOWN_COST, IDLE_COST):
        return True  # into or out of "no reading" or "idle": always
    return abs(cost // LEVEL_STEP - now // LEVEL_STEP) >= LEVEL_HYSTERESIS


def scale_down_plausible(composites: Iterable[float | None], targets: Iterable[float], replicas: int) -> bool:
    """Whether the HPA may shrink the fleet now: for every trigger, the replicas its composite asks for at
    its target (``ceil(composite / targetValue)``, the HPA's AverageValue rule) are fewer than the ready
    ones (the HPA takes the largest of its metrics). A scale-down only ever happens at such a moment, so
    costs written while this holds are fresh when the ReplicaSet reads them; a composite of 7.3 on 8
    pods asks for 8 and removes none. No reading: not plausible."""
    pairs = list(zip(composites, targets, strict=True))
    if replicas <= 0 or not pairs:
        return False
    return all(c is not None and math.ceil(round(c / t, 6)) < replicas for c, t in pairs)


def plan(pods: Sequence[PodLoad], limit: int) -> list[CostChange]:
    """The annotations to write: pods whose cost moved away from their annotation (``needs_write``), at
    most ``limit``.

    Over the limit, the pods the ReplicaSet would remove next go first: those whose cost is lowest now or
    after the change (an idle pod marked busy, or a busy pod marked idle, decides the next victim)."""
    changes = [CostChange(p, c) for p, c in zip(pods, fleet_costs(pods), strict=True) if needs_write(p.current, c)]
    changes.sort(key=lambda ch: (min(ch.cost, effective(ch.pod.current)), ch.pod.namespace, ch.pod.name))
    return changes[: max(0, limit)]
