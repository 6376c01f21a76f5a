"""Engine adapters on real fixtures and on engine-rendered payloads."""

from __future__ import annotations

import pytest

from keda_llm_scaler.engines import read_replica
from keda_llm_scaler.errors import InvalidSignal, MissingSignal, ModelNotFound, UnrecognizedPayload
from keda_llm_scaler.testing.payloads import MODEL, EngineLoad, sglang, vllm_v1
from tests.conftest import fixture_text


def _engines(text: str, **kw: object) -> list[tuple[str, float, float, float]]:
    r = read_replica(text, **kw)  # type: ignore[arg-type]
    return [(e.rank, e.waiting, e.running, e.kv_usage) for e in r.engines]


def test_vllm_v1_single_engine_matches_fixture_header() -> None:
    # header: "engine 0: running=42 waiting=7 kv=0.63 preemptions=3"; the 7 is the waiting gauge, which
    # since vLLM 0.30 is 5 waiting for capacity (demand) + 2 deferred (num_requests_waiting_by_reason)
    r = read_replica(fixture_text("vllm_v1_reconstructed_latest_1engine.txt"))
    assert r.engine == "vllm"
    assert (r.waiting, r.deferred, r.running, r.kv_usage, r.preemptions_total) == (5, 2, 42, 0.63, 3)
    assert r.models == (MODEL,)
    assert r.rejects_total == 12.0  # http_requests_total{handler="/v1/...",status="5xx"}


def test_vllm_hold_times_are_read_and_their_spread_told() -> None:
    """vLLM's ``request_inference_time_seconds`` (how long each request held its batch slot) is read as a
    histogram, summed over data-parallel engines; its spread feeds the queue behind a capped batch."""
    from keda_llm_scaler.queueing import service_scv

    one = read_replica(fixture_text("vllm_v1_reconstructed_latest_1engine.txt"))
    assert one.hold_time is not None and one.hold_time.count == 200
    assert one.hold_time.sum == pytest.approx(1964.7158935036246)
    # 200 hold times from 0.3 s to 20 s (mean ~9.8 s): a spread, but narrower than exponential
    scv = service_scv(one.hold_time.buckets)
    assert scv is not None and 0.2 < scv < 0.5
    dp4 = read_replica(fixture_text("vllm_v1_reconstructed_v0.10_dp4.txt"))
    assert dp4.hold_time is not None and len(dp4.hold_time_series) == 4
    assert dp4.hold_time.count == sum(h.count for _, h in dp4.hold_time_series)
    assert read_replica(fixture_text("sglang_v0.4.x_docs-production-metrics-md.txt")).hold_time is None


def test_vllm_v010_data_parallel_engines_and_both_kv_names() -> None:
    text = fixture_text("vllm_v1_reconstructed_v0.10_dp4.txt")
    assert _engines(text) == [
        ("0", 0, 120, 0.41),
        ("1", 18, 251, 0.97),
        ("2", 3, 200, 0.88),
        ("3", 0, 0, 0.0),
    ]
    r = read_replica(text)
    assert r.waiting == 21 and r.running == 571
    assert r.kv_usage == pytest.approx((0.41 + 0.97 + 0.88 + 0.0) / 4)  # mean: both names, never added
    assert r.kv_usage_max == 0.97
    assert r.preemptions_total == 61


def test_vllm_v0_fixture() -> None:
    r = read_replica(fixture_text("vllm_v0.4.x_datadog-fixture.txt"))
    assert (r.engine, r.waiting, r.running, r.kv_usage) == ("vllm", 0, 0, 0)
    assert [e.rank for e in r.engines] == ["0"]
    assert r.ttft is not None and r.ttft.count == 1


def test_sglang_docs_fixture() -> None:
    r = read_replica(fixture_text("sglang_v0.4.x_docs-production-metrics-md.txt"))
    assert (r.engine, r.waiting, r.running, r.kv_usage) == ("sglang", 2826, 162, 0.28)
    assert r.rejects_total is None  # SGLang exports no reject counter: the term is unavailable, not 0


@pytest.mark.parametrize(
    "fixture",
    [
        "tgi_v2-v3_datadog-payload_TRUNCATED.txt",
        "triton-trtllm_docs-example_newer.txt",
        "llamacpp_2025-06_pr13196-comment_excerpt.txt",
        "vllm_v1_docs-http-instrumentator-grep.txt",
    ],
)
def test_other_engines_are_unrecognized_not_zero(fixture: str) -> None:
    with pytest.raises(UnrecognizedPayload):
        read_replica(fixture_text(fixture))


def test_missing_family_is_an_error_not_zero() -> None:
    text = "\n".join(
        line for line in fixture_text("vllm_v1_docs-design-metrics-md_elided.txt").splitlines() if line != "..."
    )
    with pytest.raises(MissingSignal, match="num_requests_waiting"):
        read_replica(text)


def test_old_kv_name_only_v0_and_early_v1() -> None:
    text = vllm_v1([EngineLoad(1, 2, 0.5)], kv_names=["vllm:gpu_cache_usage_perc"])
    assert read_replica(text).kv_usage == 0.5


def test_new_kv_name_wins_when_both_differ() -> None:
    text = (
        'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0\n'
        'vllm:num_requests_running{engine="0",model_name="m"} 1.0\n'
        'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.9\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.3\n'
    )
    assert read_replica(text).kv_usage == 0.3


def test_model_filter() -> None:
    second = vllm_v1([EngineLoad(1, 1, 0.1)], model="b").replace("# HELP", "# HELP-ignored")
    # the HTTP counters carry no model label: one exporter serves them once (twice would be a duplicate)
    second = "".join(ln + "\n" for ln in second.replace("# TYPE", "# TYPE-ignored").splitlines() if "http_" not in ln)
    text = vllm_v1([EngineLoad(4, 8, 0.5)], model="a") + second
    assert read_replica(text, model="a").waiting == 4
    assert read_replica(text, model="b").waiting == 1
    with pytest.raises(ModelNotFound, match=r"\['a', 'b'\]"):
        read_replica(text, model="c")


def test_reject_source_ignores_non_generation_handlers_and_counts_lazy_5xx_as_zero() -> None:
    assert read_replica(vllm_v1(http_2xx=10)).rejects_total == 0.0
    assert read_replica(vllm_v1(http_2xx=10, http_5xx=4)).rejects_total == 4.0


def test_sglang_ranks_sum_over_dp_and_not_over_tp() -> None:
    text = sglang([EngineLoad(3, 10, 0.5), EngineLoad(1, 20, 0.7)], tp_ranks=4, finished=9)
    r = read_replica(text)
    assert [(e.rank, e.waiting, e.running, e.kv_usage) for e in r.engines] == [("0", 3, 10, 0.5), ("1", 1, 20, 0.7)]
    assert (r.waiting, r.running, r.kv_usage, r.kv_usage_max) == (4, 30, 0.6, 0.7)
    assert r.admitted_total == 9


def test_sglang_early_name_label_and_explicit_engine() -> None:
    text = sglang([EngineLoad(2, 5, 0.25)]).replace("model_name=", "name=")
    assert read_replica(text, engine="sglang", model=MODEL).waiting == 2
    with pytest.raises(MissingSignal):
        read_replica(text, engine="vllm")


def test_an_engine_missing_one_gauge_is_missing_data() -> None:
    text = (
        'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0\n'
        'vllm:num_requests_waiting{engine="1",model_name="m"} 4.0\n'
        'vllm:num_requests_running{engine="0",model_name="m"} 1.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 1.0\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.3\n'
    )
    with pytest.raises(MissingSignal, match=r"kv_cache_usage_perc\{engine='1'\}"):
        read_replica(text)


@pytest.mark.parametrize(
    ("family", "value"),
    [
        ("vllm:kv_cache_usage_perc", "+Inf"),
        ("vllm:kv_cache_usage_perc", "-0.5"),
        ("vllm:kv_cache_usage_perc", "1e19"),
        ("vllm:kv_cache_usage_perc", "1.5"),
        ("vllm:num_requests_waiting", "-3"),
        ("vllm:num_requests_waiting", "Inf"),
        ("vllm:num_requests_running", "-Inf"),
    ],
)
def test_impossible_gauges_are_invalid_not_zero(family: str, value: str) -> None:
    # an idle-looking reading made of garbage must fail that replica (never read as 0 / idle)
    text = "".join(
        f"{line.rsplit(' ', 1)[0]} {value}\n" if line.startswith(family + "{") else line + "\n"
        for line in vllm_v1([EngineLoad(0, 0, 0.0)]).splitlines()
    )
    assert f"{family}{{" in text and f" {value}\n" in text
    with pytest.raises(InvalidSignal) as err:
        read_replica(text)
    assert err.value.reason == "invalid_signal" and family in str(err.value)


def test_a_bucket_bound_that_is_not_a_number_fails_the_replica_cleanly() -> None:
    original = fixture_text("vllm_v1_reconstructed_latest_1engine.txt")
    bound = original[original.index("time_to_first_token_seconds_bucket{") :].split('le="', 1)[1].split('"', 1)[0]
    text = original.replace(f'le="{bound}"', 'le="abc"', 1)
    assert 'le="abc"' in text
    with pytest.raises(InvalidSignal, match="abc"):
        read_replica(text)


def test_a_duplicate_series_fails_the_scrape_as_prometheus_does() -> None:
    from keda_llm_scaler.promtext import TextFormatError

    text = vllm_v1([EngineLoad(1, 2, 0.3)])
    line = next(ln for ln in text.splitlines() if ln.startswith("vllm:num_requests_waiting{"))
    with pytest.raises(TextFormatError, match="duplicate series"):
        read_replica(text + line + "\n")


def test_vllm_under_ray_serve_reads_as_vllm() -> None:
    # Ray Serve LLM prefixes every family with `ray_vllm:` and adds Ray's labels (real, truncated payload)
    r = read_replica(fixture_text("ray-serve-vllm_v0.6.x_datadog-fixture_TRUNCATED.txt"))
    assert r.engine == "vllm" and r.models == ("neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8",)
    assert (r.waiting, r.running) == (0, 0) and r.kv_usage == pytest.approx(5.882698982295764e-05)
    assert read_replica(fixture_text("ray-serve-vllm_v0.6.x_datadog-fixture_TRUNCATED.txt"), "vllm").engine == "vllm"


def test_sglang_with_underscore_names_reads_as_sglang() -> None:
    own = fixture_text("sglang_v0.4.x_docs-production-metrics-md.txt")
    underscored = own.replace("sglang:", "sglang_")
    assert "sglang:" not in underscored
    a, b = read_replica(own), read_replica(underscored)
    assert b.engine == "sglang" and (b.waiting, b.running, b.kv_usage) == (a.waiting, a.running, a.kv_usage)
    assert read_replica(underscored, "sglang").waiting == a.waiting


def test_two_ray_workers_on_one_endpoint_are_two_engines() -> None:
    base = fixture_text("ray-serve-vllm_v0.6.x_datadog-fixture_TRUNCATED.txt")
    second = "".join(
        ln.replace('WorkerId="6ad5', 'WorkerId="7be6') + "\n"
        for ln in base.splitlines()
        if ln.startswith(("ray_vllm:num_requests_waiting", "ray_vllm:num_requests_running", "ray_vllm:gpu_cache"))
    )
    r = read_replica(base + second)
    assert len(r.engines) == 2


# Made by vLLM 0.34.0's own PrometheusStatLogger (scripts/make_fixtures); each file's second line says what
# its engines were given: (running, waiting for capacity, deferred, KV usage) per engine.
@pytest.mark.parametrize(
    ("fixture", "engines", "deferred", "sleep_level"),
    [
        ("vllm_v0.34.0_capacity-and-deferred.txt", [("0", 7, 5, 0.42)], 2, 0),
        ("vllm_v0.34.0_dp2-deferred.txt", [("0", 1, 4, 0.61), ("1", 0, 2, 0.18)], 3, 0),
        ("vllm_v0.34.0_sleeping-level1.txt", [("0", 0, 0, 0.0)], 0, 1),
        ("vllm_v0.34.0_sleeping-level2.txt", [("0", 0, 0, 0.0)], 0, 2),
    ],
)
def test_vllm_034_demand_is_the_capacity_waiting_and_sleep_is_read(
    fixture: str, engines: list[tuple[str, float, float, float]], deferred: float, sleep_level: int
) -> None:
    text = fixture_text(fixture)
    assert "made by vLLM 0.34.0's PrometheusStatLogger" in text.splitlines()[0]
    r = read_replica(text)
    assert _engines(text) == engines
    assert r.waiting == sum(w for _, w, _, _ in engines)
    assert r.deferred == deferred
    assert r.sleep_level == sleep_level


def test_vllm_034_admission_rejections_are_the_rejects() -> None:
    r = read_replica(fixture_text("vllm_v0.34.0_capacity-and-deferred.txt"))
    assert r.rejects_total == 3  # vllm:admission_rejections_total{reason="max_num_queued_reqs"}


def test_engines_that_do_not_split_their_waiting_or_sleep_say_so() -> None:
    """vLLM before 0.30 (and SGLang): the waiting gauge is all there is, and nothing says the engine is
    asleep: unknown (None), never 0 deferred or awake."""
    r = read_replica(fixture_text("vllm_v1_reconstructed_v0.10_dp4.txt"))
    assert (r.deferred, r.sleep_level) == (None, None)
    assert r.waiting > 0


def test_an_engine_whose_awake_series_reads_0_is_asleep_even_without_a_level() -> None:
    text = """vllm:num_requests_waiting{engine="0",model_name="m"} 0
vllm:num_requests_running{engine="0",model_name="m"} 0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0
vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} 0
vllm:num_requests_waiting{engine="1",model_name="m"} 0
vllm:num_requests_running{engine="1",model_name="m"} 0
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0
vllm:engine_sleep_state{engine="1",model_name="m",sleep_state="awake"} 1
"""
    # one engine asleep beside an awake one (two Ray replicas on a node): the pod serves, it is not asleep
    assert read_replica(text).sleep_level == 0
    both = text.replace(
        'engine="1",model_name="m",sleep_state="awake"} 1', 'engine="1",model_name="m",sleep_state="awake"} 0'
    )
    assert read_replica(both).sleep_level == 1


# Made by SGLang 0.5.23's own collectors and HTTP middleware counters (scripts/make_fixtures).
def test_sglang_0523_refusals_are_its_rejects_and_not_admitted() -> None:
    text = fixture_text("sglang_v0.5.23_rejects-503.txt")
    assert "made by SGLang 0.5.23's" in text.splitlines()[0]
    r = read_replica(text)
    assert _engines(text) == [("0", 30, 12, 0.93)]
    # 6 chat completions answered 503 (queue full); /health's 4 503s while starting are not rejects
    assert r.rejects_total == 6
    # num_requests_total counts the 46 finished, the 6 refused among them
    assert r.admitted_total == 40
    assert ("rejects", "endpoint=/v1/chat/completions,method=POST,status_code=503", 6.0) in r.counter_series


def test_sglang_0523_priority_queues_read_their_total_once() -> None:
    """With priority scheduling the queue gauge carries its total under priority="" and one series per
    priority beside it (3 + 2): the total is the reading, never the sum of the three."""
    text = fixture_text("sglang_v0.5.23_dp2-priority.txt")
    r = read_replica(text)
    assert _engines(text) == [("0", 5, 8, 0.71), ("1", 0, 3, 0.22)]
    assert (r.waiting, r.running) == (5, 11)
    assert r.rejects_total == 0  # the middleware's counter is there, no 503 yet: 0, not unknown


def test_sglang_before_the_http_counter_has_no_reject_reading() -> None:
    r = read_replica(fixture_text("sglang_v0.4.x_docs-production-metrics-md.txt"))
    assert r.rejects_total is None


# Exported by Ray 2.60.0's metrics agent from vLLM 0.34.0's RayPrometheusStatLogger (scripts/make_fixtures):
# every name is `ray_vllm_…`, every series carries Ray's labels, and counters still at 0 are absent.
RAY_FIXTURES = {
    "capacity-and-deferred": ([(7, 5, 0.42)], 2, 0),
    "dp2-deferred": ([(1, 4, 0.61), (0, 2, 0.18)], 3, 0),
    "sleeping-level1": ([(0, 0, 0.0)], 0, 1),
}


@pytest.mark.parametrize("scenario", sorted(RAY_FIXTURES))
def test_vllm_under_ray_260_reads_as_vllm_with_its_engines(scenario: str) -> None:
    text = fixture_text(f"ray-serve_v2.60.0-vllm_v0.34.0_{scenario}.txt")
    assert "exported by Ray 2.60.0's metrics agent" in text.splitlines()[0]
    assert not [ln for ln in text.splitlines() if ln.startswith("vllm:")]  # Ray's names only
    engines, deferred, sleep_level = RAY_FIXTURES[scenario]
    r = read_replica(text)
    assert r.engine == "vllm" and r.models == ("tiny-llama",)
    # each engine is the Ray worker's engine: <WorkerId>/<engine index>
    assert [(e.waiting, e.running, e.kv_usage) for e in r.engines] == engines
    assert all(e.rank.endswith(f"/{i}") and len(e.rank) > 40 for i, e in enumerate(r.engines))
    assert (r.deferred, r.sleep_level) == (deferred, sleep_level)
    assert read_replica(text, "vllm").waiting == r.waiting


def test_under_ray_counters_never_incremented_are_absent_and_read_as_unknown() -> None:
    r = read_replica(fixture_text("ray-serve_v2.60.0-vllm_v0.34.0_capacity-and-deferred.txt"))
    assert r.rejects_total == 3 and r.admitted_total == 36 and r.faults_total == 2
    assert r.preemptions_total is None  # vLLM's num_preemptions is at 0: Ray does not export it
    r = read_replica(fixture_text("ray-serve_v2.60.0-vllm_v0.34.0_sleeping-level1.txt"))
    assert r.rejects_total is None  # no refusal yet, and no HTTP family under Ray: unknown, not 0


def test_two_ray_replicas_on_one_node_are_each_their_own_engines() -> None:
    """One Ray node's export holds every replica on the node, each engine "0" of its own worker."""
    text = fixture_text("ray-serve_v2.60.0-vllm_v0.34.0_capacity-and-deferred.txt")
    worker = text.split('WorkerId="', 1)[1].split('"', 1)[0]
    second = "".join(
        ln.replace(worker, "f" * len(worker)) + "\n"
        for ln in text.splitlines()
        if ln.startswith(("ray_vllm_num_requests_", "ray_vllm_kv_cache_usage_perc"))
    )
    r = read_replica(text + second)
    assert len(r.engines) == 2 and (r.waiting, r.deferred, r.running) == (14, 4, 10)


def test_vllm_034_aborted_and_errored_requests_are_not_admitted() -> None:
    """40 finished: 28 length + 8 stop served, 2 aborted by their clients, 2 in error (answered 500)."""
    r = read_replica(fixture_text("vllm_v0.34.0_capacity-and-deferred.txt"))
    assert r.admitted_total == 36
    assert r.faults_total == 2  # the errored; no HTTP family in the logger's payload
    assert r.rejects_total == 3


_HTTP = 'http_requests_total{{handler="/v1/chat/completions",method="POST",status="{status}"}} {n}\n'


def test_vllm_5xx_beside_the_admission_counter_are_faults() -> None:
    text = fixture_text("vllm_v0.34.0_capacity-and-deferred.txt")
    # 3 refusals (503) and 4 other 5xx: 2 errored requests, 2 from an engine that failed outright
    r = read_replica(text + _HTTP.format(status="2xx", n=36) + _HTTP.format(status="5xx", n=7))
    assert (r.rejects_total, r.faults_total, r.admitted_total) == (3, 4, 36)
    assert {c for c, _, _ in r.counter_series} >= {"faults", "-faults", "rejects"}


def test_vllm_5xx_without_the_admission_counter_are_all_refusals_and_the_errored_are_faults() -> None:
    """Before vLLM's admission counter every generation 5xx reads as a refusal, as in 0.2.0: a request that
    ends in error while streaming was answered 200 and is in no 5xx, so taking the errored out of the 5xx
    would hide real refusals (over-reading rejects is the safer error)."""
    text = "\n".join(
        ln for ln in fixture_text("vllm_v0.34.0_capacity-and-deferred.txt").splitlines() if "admission" not in ln
    )
    r = read_replica(text + "\n" + _HTTP.format(status="5xx", n=7))
    assert (r.rejects_total, r.faults_total) == (7, 2)
    assert r.finished_total == 40 and r.admitted_total == 36  # every finish reason left the engine


def test_sglang_0523_aborted_and_failed_requests_are_not_admitted_and_500s_are_faults() -> None:
    text = fixture_text("sglang_v0.5.23_aborts-and-500s.txt")
    assert "made by SGLang 0.5.23's" in text.splitlines()[0]
    r = read_replica(text)
    # num_requests_total 40: 30 served, 2 refused (503), 3 failed (500), 5 aborted by their clients
    assert (r.rejects_total, r.faults_total, r.admitted_total) == (2, 3, 30)
    assert r.itl is not None and r.itl.count > 0


@pytest.mark.parametrize(
    "fixture",
    ["vllm_v0.34.0_capacity-and-deferred.txt", "ray-serve_v2.60.0-vllm_v0.34.0_capacity-and-deferred.txt"],
)
def test_inter_token_latency_and_token_counters_are_read(fixture: str) -> None:
    r = read_replica(fixture_text(fixture))
    assert r.itl is not None and r.itl.count == 4 * 40  # four gaps per request, as the stats gave
    assert (r.prompt_tokens_total, r.generation_tokens_total) == (256 * 40, 64 * 40)


def test_the_old_inter_token_name_is_read_and_never_added_to_the_new() -> None:
    new = fixture_text("vllm_v0.34.0_capacity-and-deferred.txt")
    old = new.replace("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
    both = new + "\n".join(
        ln for ln in old.splitlines() if "time_per_output_token_seconds" in ln and "request_" not in ln
    )
    assert read_replica(old).itl == read_replica(new).itl == read_replica(both).itl
