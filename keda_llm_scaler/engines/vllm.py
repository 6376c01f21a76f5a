"""vLLM (V0 and V1 names, data-parallel ``engine`` label) -> ReplicaSignals."""

from __future__ import annotations

import math
from typing import Final

from keda_llm_scaler.engines.base import (
    Samples,
    SeriesFilter,
    assemble_engines,
    counter_parts,
    counter_sum,
    gauge_by_group,
    histogram_names,
    histograms,
    present_family,
)
from keda_llm_scaler.errors import MissingSignal
from keda_llm_scaler.promtext import Sample, SampleNames
from keda_llm_scaler.signals import DEDUCTED, ReplicaSignals

__all__ = ["VllmAdapter"]

WAITING: Final = "vllm:num_requests_waiting"
# Since 0.30 the waiting gauge is the sum of two reasons (vllm/v1/metrics/loggers.py): "capacity", the
# requests that wait for room in the batch, and "deferred", the ones held back by the LoRA budget, an async
# KV transfer (the decode side of P/D) or a blocked status. More replicas serve only the first: demand.
WAITING_BY_REASON: Final = "vllm:num_requests_waiting_by_reason"
# awake=1, or awake=0 with weights_offloaded=1 (sleep level 1) or discard_all=1 (level 2), per engine. An
# engine asleep exports 0 waiting and 0 running: it is not free capacity until it is woken.
SLEEP_STATE: Final = "vllm:engine_sleep_state"
RUNNING: Final = "vllm:num_requests_running"
# Renamed in 0.9.2; both are emitted with identical values until 0.11 hides the old one. Never add them.
KV_NAMES: Final = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
PREEMPTIONS: Final = "vllm:num_preemptions_total"
# Proposed upstream (vLLM PR #55812); read when present.
ADMISSION_REJECTIONS: Final = "vllm:admission_rejections_total"
# Until then admission 503s show only as grouped HTTP status (prometheus-fastapi-instrumentator).
HTTP_REQUESTS: Final = "http_requests_total"
# Every finished request, by finished_reason: "abort" (the client went away) and "error" (a request-level
# failure, answered 500) are no served work; "stop", "length", "repetition" are.
SUCCESS: Final = "vllm:request_success_total"
UNSERVED_REASONS: Final = frozenset({"abort", "error"})
TTFT: Final = "vllm:time_to_first_token_seconds"
# The gap between two tokens of a stream; the old name (deprecated 0.10.2, then hidden) until then.
ITL_NAMES: Final = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
PROMPT_TOKENS: Final = "vllm:prompt_tokens_total"
GENERATION_TOKENS: Final = "vllm:generation_tokens_total"
QUEUE_TIME: Final = "vllm:request_queue_time_seconds"
# How long each request held its place in the batch (prefill to last token): the spread of the slots'
# hold times, for the queue behind a batch at its cap (keda_llm_scaler.queueing). V0 0.6+ and V1.
HOLD_TIME: Final = "vllm:request_inference_time_seconds"


def _engine_rank(sample: Sample) -> str:
    # V1 labels every engine series with its data-parallel index; V0 and early V1 have one engine. Under Ray
    # every series also carries the Ray worker that recorded it, and one Ray node's export holds every
    # replica on the node: each replica's engines are its own.
    engine = sample.labels.get("engine") or "0"
    worker = sample.labels.get("WorkerId")
    return f"{worker}/{engine}" if worker else engine


def _waiting_by_reason(series: list[Sample], reason: str) -> dict[str, float]:
    """Per engine, the waiting gauge's series for one reason (engines that do not split theirs: absent)."""
    return gauge_by_group((s for s in series if s.labels.get("reason") == reason), _engine_rank, sum)


def _sleep_levels(series: list[Sample]) -> dict[str, int]:
    """Per engine, 0 awake, 1 asleep with its weights offloaded, 2 asleep with them discarded. vLLM sets
    every engine at once; an engine whose awake series reads 0 with neither level set is asleep at level 1
    (the lighter reading: it is still not capacity)."""
    states: dict[str, dict[str, float]] = {}
    for s in series:
        if "sleep_state" in s.labels and not math.isnan(s.value):
            states.setdefault(_engine_rank(s), {})[s.labels["sleep_state"]] = s.value
    levels = {}
    for rank, state in states.items():
        if state.get("discard_all", 0.0) >= 1.0:
            levels[rank] = 2
        elif state.get("weights_offloaded", 0.0) >= 1.0 or state.get("awake", 1.0) < 1.0:
            levels[rank] = 1
        else:
            levels[rank] = 0
    return levels


def _is_generation_handler(sample: Sample) -> bool:
    return sample.labels.get("handler", "").startswith("/v1/")


def _rejects_and_faults(
    samples: Samples, admission: list[Sample], errored: list[Sample]
) -> tuple[float | None, float | None, list[tuple[str, str, float]]]:
    """(rejects, faults, their counter parts). Every 5xx of a generation handler is a refusal at admission
    (503) or a fault: a request finished in error (500), or an engine that failed outright. With vLLM's
    admission counter the refusals are known and the rest of the 5xx are faults; without it (before it
    existed) every 5xx is read as a refusal, as 0.2.0 did: a request that ends in error while streaming was
    answered 200 and is in no 5xx, so taking the errored out would hide refusals, and a reject over-read is
    the safer error. The errored requests are the faults then, and without the HTTP family (a frontend
    that is not vLLM's, Ray Serve's)."""
    http = [s for s in samples.get(HTTP_REQUESTS, ()) if _is_generation_handler(s)]
    # the family exists: its 5xx series is created at the first one, so none yet means 0
    http_5xx = [s for s in http if s.labels.get("status") == "5xx"]
    errors = counter_sum(errored)
    faults: float | None
    if admission:
        if http:
            parts = [*counter_parts("faults", http_5xx), *counter_parts(DEDUCTED + "faults", admission)]
            faults = max(0.0, sum(s.value for s in http_5xx) - (counter_sum(admission) or 0.0))
        else:
            parts, faults = counter_parts("faults", errored), errors
        return counter_sum(admission), faults, [*counter_parts("rejects", admission), *parts]
    if http:
        rejects = sum(s.value for s in http_5xx)
        return rejects, errors, [*counter_parts("rejects", http_5xx), *counter_parts("faults", errored)]
    return None, errors, counter_parts("faults", errored)


class VllmAdapter:
    name = "vllm"
    sample_names = SampleNames(
        {WAITING, RUNNING, *KV_NAMES, PREEMPTIONS, ADMISSION_REJECTIONS, HTTP_REQUESTS, SUCCESS, PROMPT_TOKENS}
        | {GENERATION_TOKENS, WAITING_BY_REASON, SLEEP_STATE}
        | histogram_names(TTFT)
        | histogram_names(QUEUE_TIME)
        | histogram_names(HOLD_TIME)
        | histogram_names(ITL_NAMES[0])
        | histogram_names(ITL_NAMES[1])
    )

    def claims(self, samples: Samples) -> bool:
        return any(n in samples for n in (WAITING, RUNNING, *KV_NAMES))

    def extract(self, samples: Samples, model: str | None) -> ReplicaSignals:
        flt = SeriesFilter(model, ("model_name",))
        waiting = gauge_by_group(flt.require(samples, WAITING), _engine_rank, sum)
        by_reason = flt.select(samples, WAITING_BY_REASON)
        deferred = _waiting_by_reason(by_reason, "deferred")
        # per engine, where the engine splits its waiting: the capacity-waiting is the demand
        waiting.update(_waiting_by_reason(by_reason, "capacity"))
        sleep_levels = _sleep_levels(flt.select(samples, SLEEP_STATE))
        running = gauge_by_group(flt.require(samples, RUNNING), _engine_rank, sum)
        kv: dict[str, float] = {}
        for name in reversed(KV_NAMES):  # the new name wins per engine where both exist
            kv.update(gauge_by_group(flt.select(samples, name), _engine_rank, max))
        if not kv:
            raise MissingSignal(" or ".join(KV_NAMES))
        engines = assemble_engines(waiting, running, kv, (WAITING, RUNNING, KV_NAMES[0]), "engine")

        finished = flt.select(samples, SUCCESS)
        success = [s for s in finished if s.labels.get("finished_reason") not in UNSERVED_REASONS]
        errored = [s for s in finished if s.labels.get("finished_reason") == "error"]
        rejects, faults, outcome_parts = _rejects_and_faults(
            samples, flt.select(samples, ADMISSION_REJECTIONS), errored
        )
        preemptions = flt.select(samples, PREEMPTIONS)
        prompt, generation = flt.select(samples, PROMPT_TOKENS), flt.select(samples, GENERATION_TOKENS)
        return ReplicaSignals.from_engines(
            self.name,
            engines,
            models=tuple(sorted({m for s in samples.get(WAITING, ()) if (m := flt.model_of(s))})),
            deferred=math.fsum(deferred.values()) if deferred else None,
            # a pod is asleep when every engine of it is (one vLLM sets all of its engines at once; a Ray node's
            # export holds several replicas, and one asleep beside an awake one leaves the node serving)
            sleep_level=min(sleep_levels.values()) if sleep_levels else None,
            preemptions_total=counter_sum(preemptions),
            rejects_total=rejects,
            admitted_total=counter_sum(success),
            finished_total=counter_sum(finished),
            faults_total=faults,
            prompt_tokens_total=counter_sum(prompt),
            generation_tokens_total=counter_sum(generation),
            counter_series=(
                *counter_parts("preemptions", preemptions),
                *outcome_parts,
                *counter_parts("admitted", success),
                *counter_parts("finished", finished),
                *counter_parts("prompt_tokens", prompt),
                *counter_parts("generation_tokens", generation),
            ),
            **histograms(
                samples,
                {
                    "ttft": TTFT,
                    "queue_time": QUEUE_TIME,
                    "hold_time": HOLD_TIME,
                    "itl": present_family(samples, ITL_NAMES),
                },
                flt.keep,
            ),
        )
