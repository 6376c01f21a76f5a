"""SGLang (``model_name`` or the early ``name`` label, tp/pp/dp rank labels) -> ReplicaSignals."""

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
    present_family,
)
from keda_llm_scaler.promtext import Sample, SampleNames
from keda_llm_scaler.signals import DEDUCTED, ReplicaSignals

__all__ = ["SglangAdapter"]

WAITING: Final = "sglang:num_queue_reqs"
RUNNING: Final = "sglang:num_running_reqs"
KV: Final = "sglang:token_usage"  # used KV tokens / max_total_num_tokens, a fraction
RETRACTIONS: Final = "sglang:num_retracted_requests_total"  # SGLang's preemption (2026 builds)
# Every request that finished, served or not: the refused (below) and the client-aborted are counted too.
FINISHED: Final = "sglang:num_requests_total"
ABORTED: Final = "sglang:num_aborted_requests_total"  # client aborts only, whatever its help text says
TTFT: Final = "sglang:time_to_first_token_seconds"
PROMPT_TOKENS: Final = "sglang:prompt_tokens_total"
GENERATION_TOKENS: Final = "sglang:generation_tokens_total"
QUEUE_TIME: Final = "sglang:queue_time_seconds"
# The gap between two tokens of a stream; named time_per_output_token_seconds until late 2025.
ITL_NAMES: Final = ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds")
# SGLang has no reject counter. A request refused for a full queue or a wait timeout is answered 503 and
# shows in its HTTP middleware's counter (0.5+, no model label), and is also counted as finished in
# num_requests_total with 0 tokens; /health answers 503 while the server starts or stops, which is no reject.
# Other 5xx of the generation endpoints are failures (faults), also counted as finished.
HTTP_RESPONSES: Final = "sglang:http_responses_total"
GENERATION_ENDPOINTS: Final = ("/generate", "/v1/")


def _is_generation_5xx(sample: Sample) -> bool:
    return sample.labels.get("status_code", "").startswith("5") and sample.labels.get("endpoint", "").startswith(
        GENERATION_ENDPOINTS
    )


def _total_only(series: list[Sample]) -> list[Sample]:
    """With priority scheduling a queue gauge has its total under ``priority=""`` and a series per
    priority beside it: the total only."""
    return [s for s in series if not s.labels.get("priority")]


def _dp_rank(sample: Sample) -> str:
    # One scheduler per DP rank; with --enable-metrics-for-all-schedulers every TP/PP rank of that
    # scheduler repeats the same queue, so ranks are grouped by dp_rank and combined with max, not sum.
    return sample.labels.get("dp_rank", "0")


class SglangAdapter:
    name = "sglang"
    sample_names = SampleNames(
        {WAITING, RUNNING, KV, RETRACTIONS, FINISHED, ABORTED, PROMPT_TOKENS, GENERATION_TOKENS, HTTP_RESPONSES}
        | histogram_names(TTFT)
        | histogram_names(QUEUE_TIME)
        | histogram_names(ITL_NAMES[0])
        | histogram_names(ITL_NAMES[1])
    )

    def claims(self, samples: Samples) -> bool:
        return any(n in samples for n in (WAITING, RUNNING, KV))

    def extract(self, samples: Samples, model: str | None) -> ReplicaSignals:
        flt = SeriesFilter(model, ("model_name", "name"))
        waiting = gauge_by_group(_total_only(flt.require(samples, WAITING)), _dp_rank, max)
        running = gauge_by_group(_total_only(flt.require(samples, RUNNING)), _dp_rank, max)
        kv = gauge_by_group(flt.require(samples, KV), _dp_rank, max)
        engines = assemble_engines(waiting, running, kv, (WAITING, RUNNING, KV), "dp_rank")
        retractions, finished = flt.select(samples, RETRACTIONS), flt.select(samples, FINISHED)
        prompt, generation = flt.select(samples, PROMPT_TOKENS), flt.select(samples, GENERATION_TOKENS)
        answered_5xx = [s for s in samples.get(HTTP_RESPONSES, ()) if _is_generation_5xx(s)]
        refusals = [s for s in answered_5xx if s.labels["status_code"] == "503"]
        failures = [s for s in answered_5xx if s.labels["status_code"] != "503"]
        # the middleware's counter exists from the first response on; a 5xx series is created at the first
        # one, so none yet with the family present is 0. Without the family (before 0.5) unknown.
        has_http = HTTP_RESPONSES in samples
        rejects = counter_sum(refusals) if refusals else (0.0 if has_http else None)
        faults = counter_sum(failures) if failures else (0.0 if has_http else None)
        aborted = flt.select(samples, ABORTED)
        finished_total = counter_sum(finished)
        # the refused, the failed (the scheduler ends them with a 500 as their finish reason) and the aborted
        # are counted as finished too: admitted is what is left once they are out
        unserved = (rejects or 0.0) + (faults or 0.0) + (counter_sum(aborted) or 0.0)
        admitted = None if finished_total is None else max(0.0, finished_total - unserved)
        return ReplicaSignals.from_engines(
            self.name,
            engines,
            models=tuple(sorted({m for s in samples.get(WAITING, ()) if (m := flt.model_of(s))})),
            preemptions_total=counter_sum(retractions),
            rejects_total=rejects,
            admitted_total=admitted,
            # what left the engine once let in, served or not: the finished less the refused
            finished_total=None if finished_total is None else max(0.0, finished_total - (rejects or 0.0)),
            faults_total=faults,
            prompt_tokens_total=counter_sum(prompt),
            generation_tokens_total=counter_sum(generation),
            counter_series=(
                *counter_parts("preemptions", retractions),
                *counter_parts("rejects", refusals),
                *counter_parts("faults", failures),
                *counter_parts("admitted", finished),
                *counter_parts(DEDUCTED + "admitted", [*answered_5xx, *aborted]),
                *counter_parts("finished", finished),
                *counter_parts(DEDUCTED + "finished", refusals),
                *counter_parts("prompt_tokens", prompt),
                *counter_parts("generation_tokens", generation),
            ),
            **histograms(
                samples,
                {"ttft": TTFT, "queue_time": QUEUE_TIME, "itl": present_family(samples, ITL_NAMES)},
                flt.keep,
            ),
        )
