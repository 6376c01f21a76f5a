"""What one scrape of one replica says, in engine-neutral terms."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["DEDUCTED", "EngineSignals", "Histogram", "ReplicaSignals", "histogram_quantile"]

# A counter that an engine does not export whole is a difference of counters it does (SGLang's admitted: the
# finished, less the refused and the aborted). Its parts are ``counter_series`` entries; the ones to take out
# are named DEDUCTED + the counter's name.
DEDUCTED = "-"


@dataclass(frozen=True, slots=True)
class Histogram:
    """Cumulative bucket counts, ``buckets`` sorted by upper bound, the last one ``+Inf``."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    sum: float

    def minus(self, earlier: Histogram) -> Histogram | None:
        """Observations made since ``earlier``; None if the layouts differ or any counter reset. A bucket that
        went down is a reset too, even when the total grew: one data-parallel engine restarting while the
        others serve would otherwise give negative buckets and a quantile that means nothing."""
        if [le for le, _ in self.buckets] != [le for le, _ in earlier.buckets]:
            return None
        if self.count < earlier.count or any(
            c < e for (_, c), (_, e) in zip(self.buckets, earlier.buckets, strict=True)
        ):
            return None
        return Histogram(
            tuple((le, c - e) for (le, c), (_, e) in zip(self.buckets, earlier.buckets, strict=True)),
            self.count - earlier.count,
            self.sum - earlier.sum,
        )

    @staticmethod
    def merge(parts: Sequence[Histogram]) -> Histogram | None:
        """Sum histograms with identical bucket layouts (data-parallel engines of one pod)."""
        if not parts:
            return None
        first = parts[0]
        layout = [le for le, _ in first.buckets]
        totals = [0.0] * len(layout)
        for part in parts:
            if [le for le, _ in part.buckets] != layout:
                return None
            for i, (_, c) in enumerate(part.buckets):
                totals[i] += c
        return Histogram(
            tuple(zip(layout, totals, strict=True)),
            sum(p.count for p in parts),
            sum(p.sum for p in parts),
        )


def histogram_quantile(q: float, hist: Histogram) -> float | None:
    """Prometheus' ``histogram_quantile``: linear interpolation inside the bucket holding rank q.

    Returns None when the histogram holds no observations. A quantile falling in the ``+Inf`` bucket
    returns the largest finite bound, as Prometheus does.
    """
    if not hist.buckets:
        return None
    total = hist.buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in hist.buckets:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            if count == prev_count:
                return le
            lower = prev_le if prev_le <= le else 0.0
            return lower + (le - lower) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return prev_le


@dataclass(frozen=True, slots=True)
class EngineSignals:
    """One data-parallel engine (vLLM ``engine`` label, SGLang ``dp_rank``) inside a replica."""

    rank: str
    waiting: float
    running: float
    kv_usage: float


@dataclass(frozen=True, slots=True)
class ReplicaSignals:
    """Pod-level signals of one replica, aggregated over its data-parallel engines.

    waiting and running are summed over engines; kv_usage is the mean over engines (each engine has
    its own KV pool of the same size, so the mean is the pod's fraction of KV in use) and
    kv_usage_max the fullest engine. Counters are raw cumulative values; rates are derived across
    scrapes by the target that owns the replica. None means "this engine does not export it".
    """

    engine: str
    waiting: float
    running: float
    kv_usage: float
    kv_usage_max: float
    engines: tuple[EngineSignals, ...]
    models: tuple[str, ...] = ()
    # Waiting requests the engine holds back for reasons more replicas do not remove (vLLM 0.30+: the LoRA
    # budget, an async KV transfer, a blocked status); they are not in ``waiting``. None: not split.
    deferred: float | None = None
    # 0 awake, 1 or 2 asleep (vLLM's sleep levels: weights offloaded, discarded; asleep only when every
    # engine of the pod is, at the lightest level among them); None: the engine does not say. An engine
    # asleep reads 0 waiting and 0 running.
    sleep_level: int | None = None
    preemptions_total: float | None = None
    rejects_total: float | None = None
    admitted_total: float | None = None  # served to the end: neither refused, aborted nor errored
    # every request that left the engine after it was let in, served or not (aborted, errored too): what the
    # demand counts as arrived, where admitted would miss the ones a client gave up on. None: as admitted.
    finished_total: float | None = None
    # Answers the engine failed (5xx other than its admission refusals, requests finished in error): no
    # demand (more replicas do not fix them) and no admission, but an SRE wants to see them.
    faults_total: float | None = None
    prompt_tokens_total: float | None = None  # prompt tokens of the requests it took in
    generation_tokens_total: float | None = None
    ttft: Histogram | None = None
    queue_time: Histogram | None = None
    hold_time: Histogram | None = None  # how long requests held a batch slot (vLLM only)
    itl: Histogram | None = None  # the gap between two tokens of one stream (inter-token latency)
    # The counters' series, (counter, series key, value), counter one of "preemptions", "rejects",
    # "admitted", "finished", "faults", "prompt_tokens", "generation_tokens", or one prefixed with DEDUCTED
    # (series taken out of it): resets are detected per series (one data-parallel engine restarting resets
    # only its own), not on the pod's sum (``keda_llm_scaler.rates.SeriesCounter``).
    counter_series: tuple[tuple[str, str, float], ...] = ()
    # Each series of the histograms, (series key, histogram), for the same reason.
    ttft_series: tuple[tuple[str, Histogram], ...] = ()
    queue_time_series: tuple[tuple[str, Histogram], ...] = ()
    hold_time_series: tuple[tuple[str, Histogram], ...] = ()
    itl_series: tuple[tuple[str, Histogram], ...] = ()

    @classmethod
    def from_engines(cls, engine: str, engines: Sequence[EngineSignals], **extra: object) -> ReplicaSignals:
        ordered = tuple(sorted(engines, key=lambda e: (len(e.rank), e.rank)))
        kv = [e.kv_usage for e in ordered]
        return cls(
            engine=engine,
            waiting=sum(e.waiting for e in ordered),
            running=sum(e.running for e in ordered),
            kv_usage=sum(kv) / len(kv),
            kv_usage_max=max(kv),
            engines=ordered,
            **extra,  # type: ignore[arg-type]
        )
