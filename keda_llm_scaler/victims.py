"""Which pod a scale-down should remove: each pod's deletion cost from its scraped load. Pure: no I/O.

The ReplicaSet controller removes, among ready pods, the one with the lowest
``controller.kubernetes.io/pod-deletion-cost`` first (before its own tie-breaks: pods doubled up on a
node, then the most recently ready, by log2 bucket, then at random; an absent annotation reads as 0).
Left to itself it picks pods semi-randomly, often one holding dozens of live streams. This module turns
what the scaler scraped into that cost, so the least busy pod goes first:

    cost = LEVEL_STEP x (level(requests held) - the fleet's median level) + kv_step(KV in use)

* ``level`` of the requests a pod holds (running + waiting: both are cut, or must finish, if it goes):
  ``floor(log(n + 8) / log(1.25)) - 9``, 0 for an idle pod. Steps of 25 % of the load once a pod holds
  dozens of requests; coarse below about eight (0 and 1 request share level 0, 2-3 are level 1, 4-6
  level 2), where a stream or two more decides nothing a drain does not cover, and where a lightly loaded
  fleet's pods flip between 0, 1 and 2 requests every scrape.
* It is written relative to the fleet's median level (the lower median of the pods above level 0): the
  ReplicaSet only compares pods, so what matters is each pod's place among the others. Behind an inference
  gateway a bursty load moves every pod's level together by two or three steps within seconds;
  absolute levels rewrote the whole fleet at every swing (649-706 patches in the simulated conversation
  hour x12 on about 8 pods, docs/scale-down.md) while their order hardly moved.
* ``kv_step``: KV-cache use in tenths, the tie-break between pods on one level: the one with less context
  in flight loses fewer tokens.
* A pod at level 0 (at most one request) gets ``IDLE_COST``: it goes first, and keeps its mark however
  the others move; it loses it once it holds ``LEVEL_HYSTERESIS`` levels (four requests).
* A pod without a fresh reading gets ``UNKNOWN_COST``: missing data is never idle, so it is never the
  first choice (the ReplicaSet already removes pods that are not ready before any ready one).

A pass rewrites a pod only when its relative level moved by ``LEVEL_HYSTERESIS`` or more, or into or out
of ``UNKNOWN_COST``, into idle, or when what the pod carries is not known (``PodLoad.observed``). So
annotations may lag the load by one level each way: two pods up to two levels apart (about 1.5x at high
counts) can read the same, and the ReplicaSet's own order then decides between them.
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
LEVEL_OFFSET: Final = 8.0  # requests: below about this many, levels are coarse (see the module docstring)
_LEVEL_ZERO: Final = int(math.log(LEVEL_OFFSET) / math.log(LEVEL_RATIO) + 1e-9)
LEVEL_HYSTERESIS: Final = 2  # levels a pod's load must move before its annotation is rewritten
UNKNOWN_COST: Final = 1_000_000  # above any relative level (+-60 levels: ~650,000 requests apart)
IDLE_COST: Final = -1_000_000  # level 0 (at most one request): below any, first whatever the others hold
INT32_MAX: Final = 2**31 - 1  # the annotation must parse as an int32
# Rate limits per fleet: a pass at most this often (the HPA acts every 15 s; fresher costs are not read)
# and at most this many patches in one pass (the next victims first, see ``plan``).
DEFAULT_INTERVAL_S: Final = 10.0
DEFAULT_BURST: Final = 16


def level(requests: float) -> int:
    """0 for an idle pod; then a step per 25 % more requests held, coarse below ``LEVEL_OFFSET``."""
    if not math.isfinite(requests) or requests <= 0:
        return 0
    return int(math.log(requests + LEVEL_OFFSET) / math.log(LEVEL_RATIO) + 1e-9) - _LEVEL_ZERO


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


def _level(p: PodLoad) -> int | None:
    held = _held(p)
    return None if held is None else level(held)


def fleet_costs(pods: Sequence[PodLoad]) -> list[int]:
    """Each pod's cost: ``IDLE_COST`` at level 0, else its level relative to the lower median level of the
    pods above level 0 (``UNKNOWN_COST`` without a reading)."""
    levels = sorted(lv for p in pods if (lv := _level(p)) is not None and lv > 0)
    median = levels[(len(levels) - 1) // 2] if levels else 0
    return [IDLE_COST if _level(p) == 0 else deletion_cost(p.running, p.waiting, p.kv_usage, median) for p in pods]


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
    # False: nobody can say what the pod carries (no informer shows it, and this process has not written
    # it since it started): the cost is written once whatever it is, never assumed to be there already
    observed: bool = True


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


def needs_write(current: int | None, cost: int, held_level: int | None = None) -> bool:
    """Whether a pod annotated ``current`` must be rewritten to ``cost`` (see ``LEVEL_HYSTERESIS``);
    ``held_level``: the level of what it holds now, for a pod marked idle."""
    now = effective(current)
    if cost == now:
        return False
    if cost in (UNKNOWN_COST, IDLE_COST) or now == UNKNOWN_COST:
        return True  # into or out of "no reading", or into idle: always
    if now == IDLE_COST:  # out of idle only once it holds LEVEL_HYSTERESIS levels (4 requests)
        return held_level is None or held_level >= LEVEL_HYSTERESIS
    return abs(cost // LEVEL_STEP - now // LEVEL_STEP) >= LEVEL_HYSTERESIS


def scale_down_plausible(composites: Iterable[float | None], targets: Iterable[float], replicas: int) -> bool:
    """Whether the HPA may shrink the fleet now: for every trigger, the replicas its composite asks for at
    its target (``ceil(composite / targetValue)``, the HPA's AverageValue rule) are fewer than the ready
    ones (the HPA takes the largest of its metrics). A scale-down only ever happens at such a moment, so
    costs written while this holds are fresh when the ReplicaSet reads them; a composite of 7.3 on 8
    pods asks for 8 and removes none. No reading: not plausible."""
    pairs = list(zip(composites, targets, strict=True))
    if replicas < 2 or not pairs:
        return False  # one pod: the HPA keeps it (KEDA alone takes a fleet from 1 to 0), nothing to choose
    return all(c is not None and math.ceil(round(c / t, 6)) < replicas for c, t in pairs)


def plan(pods: Sequence[PodLoad], limit: int) -> list[CostChange]:
    """The annotations to write: pods whose cost moved away from their annotation (``needs_write``), at
    most ``limit``.

    Over the limit, the pods the ReplicaSet would remove next go first: those whose cost is lowest now or
    after the change (an idle pod marked busy, or a busy pod marked idle, decides the next victim)."""
    changes = [
        CostChange(p, c)
        for p, c in zip(pods, fleet_costs(pods), strict=True)
        if not p.observed or needs_write(p.current, c, _level(p))
    ]
    changes.sort(key=lambda ch: (min(ch.cost, effective(ch.pod.current)), ch.pod.namespace, ch.pod.name))
    return changes[: max(0, limit)]
