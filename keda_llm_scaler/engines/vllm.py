"""vLLM (V0 and V1 names, data-parallel ``engine`` label) -> ReplicaSignals."""

from __future__ import annotations

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
)
from keda_llm_scaler.errors import MissingSignal
from keda_llm_scaler.promtext import Sample, SampleNames
from keda_llm_scaler.signals import ReplicaSignals

__all__ = ["VllmAdapter"]

WAITING: Final = "vllm:num_requests_waiting"
RUNNING: Final = "vllm:num_requests_running"
# Renamed in 0.9.2; both are emitted with identical values until 0.11 hides the old one. Never add them.
KV_NAMES: Final = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
PREEMPTIONS: Final = "vllm:num_preemptions_total"
# Proposed upstream (vLLM PR #55812); read when present.
ADMISSION_REJECTIONS: Final = "vllm:admission_rejections_total"
# Until then admission 503s show only as grouped HTTP status (prometheus-fastapi-instrumentator).
HTTP_REQUESTS: Final = "http_requests_total"
SUCCESS: Final = "vllm:request_success_total"
TTFT: Final = "vllm:time_to_first_token_seconds"
PROMPT_TOKENS: Final = "vllm:prompt_tokens_total"
GENERATION_TOKENS: Final = "vllm:generation_tokens_total"
QUEUE_TIME: Final = "vllm:request_queue_time_seconds"
# How long each request held its place in the batch (prefill to last token): the spread of the slots'
# hold times, for the queue behind a batch at its cap (keda_llm_scaler.queueing). V0 0.6+ and V1.
HOLD_TIME: Final = "vllm:request_inference_time_seconds"


def _engine_rank(sample: Sample) -> str:
    # V1 labels every engine series with its data-parallel index; V0 and early V1 have one engine; under
    # Ray Serve each engine is a Ray worker (WorkerId).
    return sample.labels.get("engine") or sample.labels.get("WorkerId") or "0"


def _is_generation_handler(sample: Sample) -> bool:
    return sample.labels.get("handler", "").startswith("/v1/")


class VllmAdapter:
    name = "vllm"
    sample_names = SampleNames(
        {WAITING, RUNNING, *KV_NAMES, PREEMPTIONS, ADMISSION_REJECTIONS, HTTP_REQUESTS, SUCCESS, PROMPT_TOKENS}
        | {GENERATION_TOKENS}
        | histogram_names(TTFT)
        | histogram_names(QUEUE_TIME)
        | histogram_names(HOLD_TIME)
    )

    def claims(self, samples: Samples) -> bool:
        return any(n in samples for n in (WAITING, RUNNING, *KV_NAMES))

    def extract(self, samples: Samples, model: str | None) -> ReplicaSignals:
        flt = SeriesFilter(model, ("model_name",))
        waiting = gauge_by_group(flt.require(samples, WAITING), _engine_rank, sum)
        running = gauge_by_group(flt.require(samples, RUNNING), _engine_rank, sum)
        kv: dict[str, float] = {}
        for name in reversed(KV_NAMES):  # the new name wins per engine where both exist
            kv.update(gauge_by_group(flt.select(samples, name), _engine_rank, max))
        if not kv:
            raise MissingSignal(" or ".join(KV_NAMES))
        engines = assemble_engines(waiting, running, kv, (WAITING, RUNNING, KV_NAMES[0]), "engine")

        reject_series = flt.select(samples, ADMISSION_REJECTIONS)
        rejects = counter_sum(reject_series)
        if rejects is None:
            http = [s for s in samples.get(HTTP_REQUESTS, ()) if _is_generation_handler(s)]
            if http:  # the family exists: 5xx series are created lazily, so none yet means 0
                reject_series = [s for s in http if s.labels.get("status") == "5xx"]
                rejects = sum(s.value for s in reject_series)
        preemptions, success = flt.select(samples, PREEMPTIONS), flt.select(samples, SUCCESS)
        prompt, generation = flt.select(samples, PROMPT_TOKENS), flt.select(samples, GENERATION_TOKENS)
        return ReplicaSignals.from_engines(
            self.name,
            engines,
            models=tuple(sorted({m for s in samples.get(WAITING, ()) if (m := flt.model_of(s))})),
            preemptions_total=counter_sum(preemptions),
            rejects_total=rejects,
            admitted_total=counter_sum(success),
            prompt_tokens_total=counter_sum(prompt),
            generation_tokens_total=counter_sum(generation),
            counter_series=(
                *counter_parts("preemptions", preemptions),
                *counter_parts("rejects", reject_series),
                *counter_parts("admitted", success),
                *counter_parts("prompt_tokens", prompt),
                *counter_parts("generation_tokens", generation),
            ),
            **histograms(samples, {"ttft": TTFT, "queue_time": QUEUE_TIME, "hold_time": HOLD_TIME}, flt.keep),
        )
