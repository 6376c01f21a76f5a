"""What a fleet's scaler has learned, as it is kept across restarts (issue #33): the document's format and
its checks. Pure: no I/O, no clock (the caller gives the wall-clock time).

A record holds one scraped fleet's capacity readings with the token mix each was read on, the rates its
replicas served and tipped over at, its start-up times, and its last minutes of arrivals (the demand
window's bins: enough for the first answer after a restart to know the load and the mix). Times are kept
as ages against the record's ``written_at`` (wall clock), since the monotonic clock they were taken on
does not survive the process.

Nothing read is trusted blindly:
- a document of another schema, or written by another minor release (what a reading means may change
  between them), is ignored whole, with the reason;
- a record whose basis differs (the SLO its capacities were read against) is ignored, with the reason;
- values that are not finite, negative or out of shape drop the record;
- readings taken on a token mix count only once the fleet's current mix is known and near it (the
  tracker's rule, ``DemandTracker.adopt``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "MAX_RECORD_AGE_S",
    "SCHEMA",
    "FleetRecord",
    "LearnedState",
    "aged",
    "compatible_release",
    "decode",
    "encode",
    "encode_record",
]

SCHEMA: Final = 1
MAX_RECORD_AGE_S: Final = 7 * 86400.0  # a record not rewritten for a week is of a fleet long gone
_MAX_ITEMS: Final = 4096  # per list: far above what a tracker keeps; a bigger list is not ours

MixTag = tuple[float, float] | None  # (prompt, generated) tokens per request, None: not counted


@dataclass(frozen=True, slots=True)
class LearnedState:
    """A DemandTracker's learning, every time an age in seconds before the record was written."""

    capacity: tuple[tuple[float, float, MixTag], ...] = ()  # (age, req/s within the SLO, mix)
    tipped: tuple[tuple[float, float, MixTag], ...] = ()  # (age, req/s per replica at a tipping, mix)
    served: tuple[tuple[float, float, MixTag], ...] = ()  # (age, req/s served healthily, mix)
    startups: tuple[float, ...] = ()  # seconds, oldest first
    startups_measured: bool = False  # from pods' creation to Ready (else estimated from the scrape)
    # the demand window: (age of its end, span, arrivals, counted, util_s, replica_s, complete,
    # prompt tokens, generation tokens, token requests)
    bins: tuple[tuple[float, float, float, float, float, float, bool, float, float, float], ...] = ()
    mix: MixTag = None  # the token mix the fleet was last seen on (what tagged readings are judged by at first)


@dataclass(frozen=True, slots=True)
class FleetRecord:
    label: str  # namespace/name of the first ScaledObject that scraped it (for people reading the object)
    basis: tuple[tuple[str, float | None], ...]  # what the readings depend on beyond the fleet (the SLO)
    written_at: float  # wall clock
    state: LearnedState


def compatible_release(version: str, other: str) -> bool:
    """Same major.minor: patch releases keep what readings mean."""
    return version.split(".")[:2] == other.split(".")[:2]


def _r(x: float) -> float:
    return float(f"{x:.6g}")


def _mix_out(m: MixTag) -> list[float] | None:
    return None if m is None else [_r(m[0]), _r(m[1])]


def encode_record(rec: FleetRecord) -> dict[str, Any]:
    s = rec.state
    return {
        "label": rec.label,
        "basis": {k: v for k, v in rec.basis},
        "written_at": rec.written_at,
        "capacity": [[_r(a), _r(v), _mix_out(m)] for a, v, m in s.capacity],
        "tipped": [[_r(a), _r(v), _mix_out(m)] for a, v, m in s.tipped],
        "served": [[_r(a), _r(v), _mix_out(m)] for a, v, m in s.served],
        "startups": [_r(x) for x in s.startups],
        "startups_measured": s.startups_measured,
        "bins": [[*(_r(x) for x in b[:6]), b[6], *(_r(x) for x in b[7:])] for b in s.bins],
        "mix": _mix_out(s.mix),
    }


def encode(records: Mapping[str, FleetRecord], release: str) -> dict[str, Any]:
    """The document: every record by its fleet's key."""
    return {"schema": SCHEMA, "release": release, "fleets": {k: encode_record(r) for k, r in records.items()}}


class _Invalid(ValueError):
    pass


# What a sane record holds, beyond which it is not a scaler's (a hand edit, corruption, another program):
MAX_RATE: Final = 1e6  # requests/s per replica; tokens per request
MAX_COUNT: Final = 1e12  # arrivals, tokens, replica-seconds in one bin
MAX_STARTUP_S: Final = 86400.0
MAX_BIN_SPAN_S: Final = 3600.0
CLOCK_SKEW_S: Final = 300.0  # a record written this far in the future is a wrong clock, not a record


def _num(x: object, what: str, most: float = MAX_COUNT) -> float:
    """A finite number in [0, most]; _Invalid naming ``what`` otherwise (huge JSON integers included)."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise _Invalid(f"{what}: not a number")
    try:
        value = float(x)
    except OverflowError:
        raise _Invalid(f"{what}: out of range") from None
    if not (math.isfinite(value) and 0 <= value <= most):
        raise _Invalid(f"{what}: not a number in [0, {most:g}]")
    return value


def _list(x: object, what: str) -> list[Any]:
    if not isinstance(x, list) or len(x) > _MAX_ITEMS:
        raise _Invalid(f"{what}: not a list of at most {_MAX_ITEMS}")
    return x


def _mix_in(x: object, what: str) -> MixTag:
    if x is None:
        return None
    items = _list(x, what)
    if len(items) != 2:
        raise _Invalid(f"{what}: a mix is [prompt, generated]")
    return (_num(items[0], what, MAX_RATE), _num(items[1], what, MAX_RATE))


def _readings(x: object, what: str) -> tuple[tuple[float, float, MixTag], ...]:
    out = []
    for item in _list(x, what):
        parts = _list(item, what)
        if len(parts) != 3:
            raise _Invalid(f"{what}: a reading is [age, rate, mix]")
        # a rate of 0 is a reading too (a replica past its knee that finished nothing in a scrape)
        age, rate = _num(parts[0], what, MAX_RECORD_AGE_S), _num(parts[1], what, MAX_RATE)
        out.append((age, rate, _mix_in(parts[2], what)))
    return tuple(out)


def _bins(x: object) -> tuple[tuple[float, float, float, float, float, float, bool, float, float, float], ...]:
    out = []
    for item in _list(x, "bins"):
        parts = _list(item, "bins")
        if len(parts) != 10 or not isinstance(parts[6], bool):
            raise _Invalid("bins: a bin is 10 fields, the 7th true or false")
        n = [_num(p, "bins") for i, p in enumerate(parts) if i != 6]
        if not (0.1 <= n[1] <= MAX_BIN_SPAN_S) or n[0] > MAX_RECORD_AGE_S:
            raise _Invalid(f"bins: a bin's span must be in [0.1, {MAX_BIN_SPAN_S:g}] s and its age within a week")
        out.append((n[0], n[1], n[2], n[3], n[4], n[5], bool(parts[6]), n[6], n[7], n[8]))
    return tuple(out)


def _decode_record(raw: object) -> FleetRecord:
    if not isinstance(raw, dict):
        raise _Invalid("not an object")
    basis = raw.get("basis")
    if not isinstance(basis, dict) or len(basis) > 16:
        raise _Invalid("basis: not an object of numbers")
    for k, v in basis.items():
        if not isinstance(k, str):
            raise _Invalid("basis: not an object of numbers")
        if v is not None:
            _num(v, "basis")
    written_at = _num(raw.get("written_at"), "written_at", 1e11)
    label = raw.get("label")
    measured = raw.get("startups_measured", False)
    if not isinstance(measured, bool):
        raise _Invalid("startups_measured: not true or false")
    state = LearnedState(
        capacity=_readings(raw.get("capacity", []), "capacity"),
        tipped=_readings(raw.get("tipped", []), "tipped"),
        served=_readings(raw.get("served", []), "served"),
        startups=tuple(_num(x, "startups", MAX_STARTUP_S) for x in _list(raw.get("startups", []), "startups")),
        startups_measured=measured,
        bins=_bins(raw.get("bins", [])),
        mix=_mix_in(raw.get("mix"), "mix"),
    )
    return FleetRecord(
        label if isinstance(label, str) else "",
        tuple(sorted((k, None if v is None else float(v)) for k, v in basis.items())),
        float(written_at),
        state,
    )


def decode(doc: object, release: str, now_wall: float) -> tuple[dict[str, FleetRecord], list[str]]:
    """The records of a document that can be trusted, and why any were not (one line each). A document
    of another schema or minor release gives none."""
    if not isinstance(doc, dict):
        return {}, ["not a JSON object"]
    if "unreadable" in doc and "schema" not in doc:
        return {}, [f"unreadable: {doc['unreadable']}"]
    if doc.get("schema") != SCHEMA:
        return {}, [f"schema {doc.get('schema')!r}, this scaler reads {SCHEMA}"]
    written_by = doc.get("release")
    if not isinstance(written_by, str) or not compatible_release(written_by, release):
        return {}, [f"written by release {written_by!r}; this is {release} (another minor release: ignored)"]
    fleets = doc.get("fleets")
    if not isinstance(fleets, dict):
        return {}, ["fleets: not an object"]
    records: dict[str, FleetRecord] = {}
    ignored: list[str] = []
    for key, raw in fleets.items():
        try:
            rec = _decode_record(raw)
        except _Invalid as exc:
            ignored.append(f"fleet {key}: {exc}")
            continue
        except (ValueError, TypeError, OverflowError, RecursionError) as exc:  # whatever else a corrupt one holds
            ignored.append(f"fleet {key}: unreadable ({type(exc).__name__})")
            continue
        if rec.written_at > now_wall + CLOCK_SKEW_S:
            ignored.append(f"fleet {key}: written {rec.written_at - now_wall:.0f} s in the future (a wrong clock)")
            continue
        if now_wall - rec.written_at > MAX_RECORD_AGE_S:
            continue  # a fleet not seen for a week: dropped quietly (it is gone)
        records[str(key)] = rec
    return records, ignored


def aged(state: LearnedState, seconds: float) -> LearnedState:
    """``state`` as seen ``seconds`` after it was written (every age grown by that)."""
    d = max(0.0, seconds)
    return LearnedState(
        capacity=tuple((a + d, v, m) for a, v, m in state.capacity),
        tipped=tuple((a + d, v, m) for a, v, m in state.tipped),
        served=tuple((a + d, v, m) for a, v, m in state.served),
        startups=state.startups,
        startups_measured=state.startups_measured,
        bins=tuple((b[0] + d, *b[1:]) for b in state.bins),
        mix=state.mix,
    )
