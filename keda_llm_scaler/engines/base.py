"""Shared pieces of the engine adapters: series filtering, grouping and histogram assembly."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from keda_llm_scaler.errors import InvalidSignal, MissingSignal, ModelNotFound
from keda_llm_scaler.promtext import Sample, SampleNames
from keda_llm_scaler.signals import EngineSignals, Histogram, ReplicaSignals

__all__ = [
    "EngineAdapter",
    "Samples",
    "SeriesFilter",
    "assemble_engines",
    "counter_parts",
    "counter_sum",
    "gauge_by_group",
    "histogram_names",
    "histogram_series",
    "histograms",
    "present_family",
]

Samples = Mapping[str, Sequence[Sample]]
KV_MAX = 1.0 + 1e-6  # a usage fraction; rounding may land a hair above 1


class EngineAdapter(Protocol):
    """Maps one engine's metric names to ReplicaSignals; adapters only map names."""

    name: str
    sample_names: SampleNames

    def claims(self, samples: Samples) -> bool: ...

    def extract(self, samples: Samples, model: str | None) -> ReplicaSignals: ...


def histogram_names(family: str) -> set[str]:
    return {f"{family}_bucket", f"{family}_count", f"{family}_sum"}


@dataclass(frozen=True, slots=True)
class SeriesFilter:
    """Keeps the series of one model; label ``model_labels`` name the model across versions."""

    model: str | None
    model_labels: tuple[str, ...]

    def model_of(self, sample: Sample) -> str | None:
        for label in self.model_labels:
            if label in sample.labels:
                return sample.labels[label]
        return None

    def keep(self, sample: Sample) -> bool:
        if self.model is None:
            return True
        model = self.model_of(sample)
        return model is None or model == self.model

    def select(self, samples: Samples, name: str) -> list[Sample]:
        return [s for s in samples.get(name, ()) if self.keep(s)]

    def require(self, samples: Samples, name: str) -> list[Sample]:
        """The kept series of a family the composite cannot do without."""
        present = samples.get(name, ())
        if not present:
            raise MissingSignal(name)
        kept = [s for s in present if self.keep(s)]
        if not kept:
            assert self.model is not None
            raise ModelNotFound(self.model, (m for s in present if (m := self.model_of(s)) is not None))
        return kept


def gauge_by_group(
    series: Iterable[Sample], group_of: Callable[[Sample], str], combine: Callable[[Iterable[float]], float]
) -> dict[str, float]:
    """Per data-parallel group, combine the group's series (NaN readings are dropped: missing, not zero).
    A negative or infinite gauge is garbage: InvalidSignal, never combined into a plausible number."""
    grouped: dict[str, list[float]] = {}
    for s in series:
        grouped.setdefault(group_of(s), [])
        if math.isnan(s.value):
            continue
        if math.isinf(s.value) or s.value < 0:
            raise InvalidSignal(s.name, s.value, "a finite gauge >= 0")
        grouped[group_of(s)].append(s.value)
    return {g: combine(v) if v else math.nan for g, v in grouped.items()}


def assemble_engines(
    waiting: Mapping[str, float],
    running: Mapping[str, float],
    kv: Mapping[str, float],
    families: tuple[str, str, str],
    rank_label: str,
) -> list[EngineSignals]:
    """One EngineSignals per data-parallel rank; a rank missing any of the three is missing data."""
    engines = []
    for rank in sorted(set(waiting) | set(running) | set(kv)):
        values = (waiting.get(rank, math.nan), running.get(rank, math.nan), kv.get(rank, math.nan))
        for family, value in zip(families, values, strict=True):
            if math.isnan(value):
                raise MissingSignal(f"{family}{{{rank_label}={rank!r}}}")
        if values[2] > KV_MAX:
            raise InvalidSignal(f"{families[2]}{{{rank_label}={rank!r}}}", values[2], "a fraction of the KV pool, 0-1")
        engines.append(EngineSignals(rank, *values))
    return engines


def counter_parts(counter: str, series: Sequence[Sample]) -> list[tuple[str, str, float]]:
    """(counter, series key, value) of each series with a value: what ``ReplicaSignals.counter_series``
    holds so that resets are found per series."""
    return [
        (counter, ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())), s.value)
        for s in series
        if not math.isnan(s.value)
    ]


def counter_sum(series: Sequence[Sample]) -> float | None:
    values = [s.value for s in series if not math.isnan(s.value)]
    return sum(values) if values else None


def histogram_series(samples: Samples, family: str, keep: Callable[[Sample], bool]) -> dict[str, Histogram]:
    """Each kept series of a histogram (labels other than ``le``: engine, priority …) on its own, so that
    a reset is found per series, as for counters. Series without a ``+Inf`` bucket are incomplete and left
    out."""
    # bucket lines are most of the wanted lines: group them by their label tuple (an exposition writes a
    # series' labels in one order), convert each distinct bound once, build the text keys per series only
    buckets: dict[tuple[tuple[str, str], ...], dict[float, float]] = {}
    bounds: dict[str, float] = {}
    for s in samples.get(f"{family}_bucket", ()):
        if "le" not in s.labels or not keep(s):
            continue
        labels = s.labels.copy()
        raw = labels.pop("le")
        le = bounds.get(raw)
        if le is None:
            try:
                le = float(raw)
            except ValueError:
                le = math.nan
            if math.isnan(le):
                raise InvalidSignal(f"{family}_bucket", raw, "an `le` bound that is a number or +Inf")
            bounds[raw] = le
        by_le = buckets.setdefault(tuple(labels.items()), {})
        by_le[le] = by_le.get(le, 0.0) + s.value
    counts = {_series_key(s.labels): s.value for s in samples.get(f"{family}_count", ()) if keep(s)}
    sums = {_series_key(s.labels): s.value for s in samples.get(f"{family}_sum", ()) if keep(s)}
    series: dict[str, Histogram] = {}
    for items, by_le in buckets.items():
        if not math.isinf(max(by_le)):
            continue
        key = _series_key(dict(items))  # (the parser refuses a series written twice, in any label order)
        series[key] = Histogram(tuple(sorted(by_le.items())), counts.get(key, 0.0), sums.get(key, 0.0))
    return series


def histograms(samples: Samples, families: Mapping[str, str], keep: Callable[[Sample], bool]) -> dict[str, object]:
    """``ReplicaSignals`` fields for each histogram: ``<field>`` (the series summed) and
    ``<field>_series`` (each series, for per-series resets)."""
    fields: dict[str, object] = {}
    for field_name, family in families.items():
        series = histogram_series(samples, family, keep)
        fields[field_name] = Histogram.merge(list(series.values()))
        fields[f"{field_name}_series"] = tuple(sorted(series.items()))
    return fields


def present_family(samples: Samples, names: Sequence[str]) -> str:
    """The first of a histogram's names across versions that the payload has (the first if none): a
    release that emits the old and the new name side by side gives the same observations twice."""
    return next((n for n in names if f"{n}_bucket" in samples), names[0])


def _series_key(labels: Mapping[str, str], skip: str = "") -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != skip)
