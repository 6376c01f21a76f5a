"""Trigger metadata: defaults, every key's validation naming the key, address safety, hints."""

from __future__ import annotations

import dataclasses

import pytest

from keda_llm_scaler.demand import DemandConfig
from keda_llm_scaler.errors import BadMetadata
from keda_llm_scaler.fleet import demand_config
from keda_llm_scaler.metadata import DEFAULTS, metadata_hints, parse_trigger
from keda_llm_scaler.policy import ScoringParams
from keda_llm_scaler.target import DEMAND_RETAIN_S

BASE = {"scalerAddress": "scaler.keda:9090", "endpoints": "http://10.0.0.7:8000"}


def parse(extra: dict[str, str] | None = None, *, base: dict[str, str] | None = None, **kw: bool):
    return parse_trigger("serving", "llm", {**(BASE if base is None else base), **(extra or {})}, **kw)


def test_defaults() -> None:
    cfg = parse()
    assert cfg.discovery.kind == "static"
    assert cfg.discovery.endpoints == ("http://10.0.0.7:8000/metrics",)
    assert (cfg.engine, cfg.model) == ("auto", None)
    assert cfg.scoring.target_kv_usage == 0.85 and cfg.scoring.target_queue_depth == 5.0
    assert (cfg.activation_threshold, cfg.target_value) == (0.0, 1.0)
    assert (cfg.scrape_interval, cfg.scrape_timeout, cfg.stale_after) == (5.0, 2.0, 15.0)


def test_defaults_are_the_documented_values_from_one_source() -> None:
    """Each default is defined once (the dataclass field that holds it, else metadata.DEFAULTS); these are
    the values the README documents, and the demand's trend window follows its calm one (300 s: 360 s)."""
    assert DEFAULTS == {
        "engine": "auto",
        "metricsPath": "/metrics",
        "targetKvUsage": 0.85,
        "targetQueueDepth": 5.0,
        "targetUtilization": 0.9,
        "ttftSloQuantile": 0.95,
        "itlSloQuantile": 0.95,
        "demandWindow": 300.0,
        "startupBudgetSeconds": 900.0,
        "activationThreshold": 0.0,
        "targetValue": 1.0,
        "scrapeInterval": 5.0,
        "scrapeTimeout": 2.0,
        "scheme": "http",
        "workloadClass": "interactive",
    }
    scoring = ScoringParams()
    assert parse().scoring == scoring  # no scoring key given: the metadata defaults are the scoring defaults
    assert (
        scoring.target_kv_usage,
        scoring.target_queue_depth,
        scoring.target_utilization,
        scoring.ttft_slo_quantile,
        scoring.demand_window_s,
    ) == (
        DEFAULTS["targetKvUsage"],
        DEFAULTS["targetQueueDepth"],
        DEFAULTS["targetUtilization"],
        DEFAULTS["ttftSloQuantile"],
        DEFAULTS["demandWindow"],
    )
    assert (scoring.replica_capacity, scoring.startup_s, scoring.ttft_slo_s) == (None, None, None)
    assert parse({"service": "vllm"}, base={}).discovery.startup_budget_s == DEFAULTS["startupBudgetSeconds"]
    windows = demand_config(scoring)
    assert windows == DemandConfig()
    assert (windows.calm_window_s, windows.trend_window_s) == (300.0, 360.0)
    assert (windows.headroom_sigmas, windows.growth_cap, windows.history_s) == (2.0, 0.2, 360.0)
    wide = demand_config(dataclasses.replace(scoring, demand_window_s=600.0))
    assert (wide.calm_window_s, wide.trend_window_s) == (600.0, 720.0)
    assert DEMAND_RETAIN_S == 1.2 * 3600.0  # the longest demandWindow's trend window


def test_the_key_is_every_field() -> None:
    """A target's identity changes with any field (two triggers differing in one are two targets)."""
    cfg = parse()
    assert cfg.key == tuple(getattr(cfg, f.name) for f in dataclasses.fields(cfg))
    other = parse_trigger(
        "other-ns",
        "other",
        {
            "engine": "vllm",
            "model": "m",
            "targetKvUsage": "0.5",
            "activationThreshold": "1",
            "targetValue": "2",
            "scrapeInterval": "10",
            "scrapeTimeout": "3",
            "staleAfter": "60",
            "workloadClass": "batch",
            "endpoints": "http://10.0.0.8:8000",
            "gatewayMetricsUrl": "http://10.0.0.9:9090",
            "fleet": "chat",
            "poolTier": "burst",
        },
    )
    for f in dataclasses.fields(cfg):
        changed = dataclasses.replace(cfg, **{f.name: getattr(other, f.name)})
        assert changed.key != cfg.key, f.name


def test_keda_and_unknown_keys_are_ignored_and_do_not_change_identity() -> None:
    extra = {"enableTLS": "false", "unsafeSsl": "true", "metricType": "Value", "tokenFromEnv": "x", "foo": "bar"}
    assert parse(extra).key == parse().key


def test_endpoints_normalised_sorted_deduplicated() -> None:
    cfg = parse({"endpoints": " http://b:8000/ ,http://a:8000, http://b:8000,https://[::1]:8443/custom/path"})
    assert cfg.discovery.endpoints == (
        "http://a:8000/metrics",
        "http://b:8000/metrics",
        "https://[::1]:8443/custom/path",
    )
    assert parse({"metricsPath": "/m"}).discovery.endpoints == ("http://10.0.0.7:8000/m",)


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"dnsName": "vllm.serving.svc"}, "endpoints | dnsName | service"),  # with endpoints: two keys
        ({"endpoints": "ftp://10.0.0.1/"}, "endpoints"),
        ({"endpoints": "file:///etc/passwd"}, "endpoints"),
        ({"endpoints": "http://169.254.169.254/latest/meta-data"}, "endpoints"),
        ({"endpoints": "http://[fe80::1]:8000"}, "endpoints"),
        ({"endpoints": "http://[::ffff:169.254.169.254]:80"}, "endpoints"),
        ({"endpoints": "http://user:pw@10.0.0.1:8000"}, "endpoints"),
        ({"endpoints": "http://10.0.0.1:99999"}, "endpoints"),
        ({"engine": "tgi"}, "engine"),
        ({"targetKvUsage": "abc"}, "targetKvUsage"),
        ({"targetKvUsage": "0"}, "targetKvUsage"),
        ({"targetKvUsage": "85"}, "targetKvUsage"),
        ({"targetKvUsage": "nan"}, "targetKvUsage"),
        ({"targetQueueDepth": "-1"}, "targetQueueDepth"),
        ({"activationThreshold": "-0.5"}, "activationThreshold"),
        ({"targetValue": "0"}, "targetValue"),
        ({"targetValue": "inf"}, "targetValue"),
        ({"scrapeInterval": "0.1"}, "scrapeInterval"),
        ({"scrapeInterval": "5s"}, "scrapeInterval"),
        ({"scrapeTimeout": "10"}, "scrapeTimeout"),
        ({"metricsPath": "metrics"}, "metricsPath"),
        ({"staleAfter": "1"}, "staleAfter"),
        ({"workloadClass": "realtime"}, "workloadClass"),
        ({"workloadClass": "batch,interactive"}, "workloadClass"),
    ],
)
def test_bad_values_name_the_key_and_accepted_values(extra: dict[str, str], key: str) -> None:
    with pytest.raises(BadMetadata) as err:
        parse(extra)
    assert err.value.key == key
    assert f"metadata key {key!r}" in str(err.value) and "accepted:" in str(err.value)


def test_workload_class_is_a_view_parameter() -> None:
    assert parse().workload_class == "interactive"  # the default: never inactive while replicas exist
    assert parse({"workloadClass": ""}).workload_class == "interactive"
    assert parse({"workloadClass": " Batch "}).workload_class == "batch"
    batch, interactive = parse({"workloadClass": "batch"}), parse({"workloadClass": "interactive"})
    assert interactive.key == parse().key  # the default spelled out is the same target
    # two triggers differing only by class are two targets on one fleet (one scrape loop)
    assert batch.key != interactive.key and batch.fleet_key == interactive.fleet_key
    with pytest.raises(BadMetadata) as err:
        parse({"workloadClass": "realtime"})
    assert str(err.value).endswith("accepted: interactive | batch")


def test_no_discovery_key_is_zero_config_and_two_are_refused() -> None:
    cfg = parse(base={"scalerAddress": "x:1"})
    assert (cfg.discovery.kind, cfg.discovery.namespace, cfg.discovery.port_from_slice) == ("workload", "serving", True)
    with pytest.raises(BadMetadata, match="at most one discovery key"):
        parse(base={"endpoints": "http://10.0.0.1:8000", "service": "vllm"})


def test_dns_and_service_discovery() -> None:
    dns = parse(base={"dnsName": "vllm-headless.serving.svc.cluster.local", "engine": "sglang"})
    assert (dns.discovery.kind, dns.discovery.port) == ("dns", 30000)
    svc = parse(base={"service": "vllm", "port": "8001"})
    assert (svc.discovery.kind, svc.discovery.namespace, svc.discovery.port) == ("kubernetes", "serving", 8001)
    with pytest.raises(BadMetadata, match="cross-namespace") as err:
        parse(base={"service": "other/vllm"})
    assert err.value.key == "service"
    assert parse(base={"service": "other/vllm"}, allow_cross_namespace=True).discovery.namespace == "other"
    with pytest.raises(BadMetadata) as err:
        parse(base={"service": "vllm", "port": "http"})
    assert err.value.key == "port"
    with pytest.raises(BadMetadata) as err:
        parse(base={"dnsName": "169.254.169.254"})
    assert err.value.key == "dnsName"


def test_hints_for_likely_mistakes() -> None:
    hints = metadata_hints(
        {
            **BASE,
            "metricType": "Value",
            "caCert": "x",
            "targetKVUsage": "0.8",
            "endpoint": "http://x",
            "enableTLS": "true",
            "fooFromEnv": "y",
            "zzz": "1",
        }
    )
    text = "\n".join(hints)
    assert "metricType is a trigger field" in text
    assert "TriggerAuthentication" in text
    assert "did you mean 'targetKvUsage'" in text
    assert "did you mean 'endpoints'" in text
    assert "enableTLS" not in text and "fooFromEnv" not in text and "zzz" not in text


def test_registry_logs_hints_once_per_metadata() -> None:
    from structlog.testing import capture_logs

    from keda_llm_scaler.registry import TargetRegistry
    from keda_llm_scaler.scrape import Scraper

    registry = TargetRegistry(Scraper())
    with capture_logs() as logs:
        for _ in range(3):
            registry.config_for("serving", "llm", {**BASE, "metricType": "Value"})
    hints = [e for e in logs if e["event"] == "metadata_hint"]
    assert len(hints) == 1 and "metricType" in hints[0]["hint"]


def test_the_demand_keys_are_validated_naming_the_key() -> None:
    from keda_llm_scaler.errors import BadMetadata
    from keda_llm_scaler.metadata import metadata_hints, parse_trigger

    base = {"endpoints": "http://10.0.0.7:8000"}
    cfg = parse_trigger(
        "ns",
        "so",
        {
            **base,
            "targetUtilization": "0.8",
            "replicaCapacity": "12.5",
            "startupSeconds": "240",
            "ttftSloSeconds": "2",
            "ttftSloQuantile": "0.99",
            "itlSloSeconds": "0.05",
            "itlSloQuantile": "0.9",
            "demandWindow": "600",
        },
    )
    assert (cfg.scoring.itl_slo_s, cfg.scoring.itl_slo_quantile) == (0.05, 0.9)
    s = cfg.scoring
    assert (
        s.target_utilization,
        s.replica_capacity,
        s.startup_s,
        s.ttft_slo_s,
        s.ttft_slo_quantile,
        s.demand_window_s,
    ) == (0.8, 12.5, 240.0, 2.0, 0.99, 600.0)
    defaults = parse_trigger("ns", "so", base).scoring
    assert (defaults.target_utilization, defaults.replica_capacity, defaults.startup_s, defaults.ttft_slo_s) == (
        0.9,
        None,
        None,
        None,
    )
    for key, bad in (
        ("targetUtilization", "0"),
        ("targetUtilization", "1e-300"),
        ("targetUtilization", "1.5"),
        ("replicaCapacity", "-1"),
        ("replicaCapacity", "nan"),
        ("replicaCapacity", "1e-300"),
        ("startupSeconds", "inf"),
        ("ttftSloSeconds", "fast"),
        ("ttftSloQuantile", "1"),
        ("itlSloSeconds", "0"),
        ("itlSloSeconds", "inf"),
        ("itlSloQuantile", "0.1"),
        ("demandWindow", "5"),
    ):
        with pytest.raises(BadMetadata) as err:
            parse_trigger("ns", "so", {**base, key: bad})
        assert key in str(err.value)
    with pytest.raises(BadMetadata, match="demandWindow"):  # fewer than 3 bins at a 300 s scrape
        parse_trigger("ns", "so", {**base, "scrapeInterval": "300", "scrapeTimeout": "2", "demandWindow": "600"})
    slow = parse_trigger("ns", "so", {**base, "scrapeInterval": "300", "scrapeTimeout": "2"})
    assert slow.scoring.demand_window_s == 900.0  # the default stretches to 3 bins rather than failing
    assert any("ttftSloSeconds" in h for h in metadata_hints({**base, "ttftSloQuantile": "0.9"}))
    assert any("itlSloSeconds" in h for h in metadata_hints({**base, "itlSloQuantile": "0.9"}))


@pytest.mark.parametrize("port", ["¹", "٨٠٠٠", "\uff18\uff10\uff10\uff10", "0", "65536", "+80", " 80 x", "1e3"])
def test_ports_are_ascii_numbers_in_range(port: str) -> None:
    # "¹" was INTERNAL (int() failed after isdigit() said yes); "٨٠٠٠" read as 8000
    with pytest.raises(BadMetadata) as err:
        parse(base={"service": "vllm", "port": port})
    assert err.value.key == "port"


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://" + "a" * 300 + ":8000",  # not a host name (past 253 characters)
        "http://bad..host:8000",
        "http://10.0.0.7:8000/" + "p" * 600,  # past 512 characters
    ],
    ids=["long-host", "empty-label", "long-url"],
)
def test_an_endpoint_that_is_no_host_or_too_long_is_refused_naming_the_key(endpoint: str) -> None:
    with pytest.raises(BadMetadata) as err:
        parse_trigger("serving", "llm", {"endpoints": endpoint})
    assert err.value.key == "endpoints" and len(str(err.value).encode()) < 300
