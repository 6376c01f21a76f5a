"""Trigger metadata -> a validated TriggerConfig. Pure: the same metadata always gives the same config.

KEDA forwards the whole ``trigger.metadata`` map (``scalerAddress``, ``enableTLS``, ``unsafeSsl``, keys
ending in ``FromEnv`` ...), every value a string. Keys this scaler does not define are accepted and
ignored; likely mistakes get a hint in the log.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import ipaddress
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from keda_llm_scaler.addresses import normalize_host, refusal
from keda_llm_scaler.demand import bin_seconds
from keda_llm_scaler.engines import ENGINE_CHOICES
from keda_llm_scaler.errors import BadMetadata, BadObjectName, quote_value
from keda_llm_scaler.gateway import DEFAULT_GATEWAY_FAMILIES, POOL_LABEL, GatewaySpec, parse_labels, valid_family
from keda_llm_scaler.policy import ScoringParams
from keda_llm_scaler.pools import PoolSpec, parse_tier

__all__ = [
    "DEFAULTS",
    "KNOWN_KEYS",
    "MAX_DEMAND_WINDOW_S",
    "METRIC_NAME",
    "WORKLOAD_CLASSES",
    "Discovery",
    "TriggerConfig",
    "check_address",
    "check_object_ref",
    "endpoint_urls",
    "metadata_hints",
    "parse_trigger",
]

METRIC_NAME: Final = "llm_composite"
# How IsActive treats an idle fleet (``target.activity``): interactive never reports inactive while the
# fleet has members; batch does as soon as nothing is in flight or queued.
INTERACTIVE: Final = "interactive"
BATCH: Final = "batch"
WORKLOAD_CLASSES: Final = (INTERACTIVE, BATCH)

DISCOVERY_KEYS: Final = ("endpoints", "dnsName", "service")
# a fleet of pools (``keda_llm_scaler.pools``): ScaledObjects of one namespace with the same ``fleet``
POOL_KEYS: Final = ("fleet", "pool", "poolTier", "poolSize", "replicaCostPerHour")
MAX_POOL_SIZE: Final = 100_000
MAX_REPLICA_COST: Final = 1e6
KNOWN_KEYS: Final = frozenset(
    {
        *DISCOVERY_KEYS,
        "port",
        "scheme",
        "engine",
        "model",
        "metricsPath",
        "targetKvUsage",
        "targetQueueDepth",
        "activationThreshold",
        "targetValue",
        "scrapeInterval",
        "scrapeTimeout",
        "staleAfter",
        "targetUtilization",
        "replicaCapacity",
        "startupSeconds",
        "startupBudgetSeconds",
        "ttftSloSeconds",
        "ttftSloQuantile",
        "itlSloSeconds",
        "itlSloQuantile",
        "gatewayMetricsUrl",
        "gatewayMetric",
        "gatewayPool",
        "gatewayLabels",
        "demandWindow",
        "workloadClass",
        *POOL_KEYS,
    }
)
# Keys KEDA itself reads and forwards: never worth a hint.
KEDA_KEYS: Final = frozenset({"scalerAddress", "enableTLS", "unsafeSsl"})
MISPLACED: Final = {
    "metricType": "metricType is a trigger field, not metadata: as metadata it has no effect on the HPA",
    "useCachedMetrics": "useCachedMetrics is a trigger field, not metadata",
    "caCert": "TLS material belongs in a TriggerAuthentication (KEDA ignores it in metadata)",
    "tlsClientCert": "TLS material belongs in a TriggerAuthentication (KEDA ignores it in metadata)",
    "tlsClientKey": "TLS material belongs in a TriggerAuthentication (KEDA ignores it in metadata)",
    "tlsCertFile": "tlsCertFile was removed in KEDA v2.17; use a TriggerAuthentication",
}
MAX_ENDPOINTS: Final = 1000
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_HOSTNAME = re.compile(
    r"^(?=.{1,253}\.?$)([A-Za-z0-9_]([-A-Za-z0-9_]{0,61}[A-Za-z0-9])?\.)*"
    r"[A-Za-z0-9_]([-A-Za-z0-9_]{0,61}[A-Za-z0-9])?\.?$"
)


@dataclass(frozen=True, slots=True)
class Discovery:
    """Where the replicas are: exactly one of the three kinds."""

    kind: str  # "static" | "dns" | "kubernetes" | "workload" (zero-config scaleTargetRef)
    endpoints: tuple[str, ...] = ()  # static: full scrape URLs, sorted
    dns_name: str = ""
    service: str = ""
    namespace: str = ""
    port: int = 0
    # No `port` given: `service` scrapes a single-port EndpointSlice on its port, zero-config scrapes
    # the pod template's container port (named http/metrics, else the first); else the engine default.
    port_from_slice: bool = False
    scheme: str = "http"
    metrics_path: str = "/metrics"
    # A pod not ready this long after creation is failed_to_start, no longer capacity on its way.
    startup_budget_s: float = 900.0


@dataclass(frozen=True, slots=True)
class TriggerConfig:
    namespace: str
    name: str
    discovery: Discovery
    engine: str
    model: str | None
    scoring: ScoringParams
    activation_threshold: float
    target_value: float
    scrape_interval: float
    scrape_timeout: float
    stale_after: float
    workload_class: str = INTERACTIVE  # a view parameter (in ``key``, not in ``fleet_key``)
    # where the requests held for this pool are read while it has no ready replica (gatewayMetricsUrl)
    gateway: GatewaySpec | None = None
    # the pool of a fleet this ScaledObject scales (fleet, pool, poolTier, poolSize, replicaCostPerHour): a
    # view parameter (in ``key``, not in ``fleet_key``): its answer is its share of the fleet's demand
    pool: PoolSpec | None = None

    @property
    def key(self) -> tuple[object, ...]:
        """Identity of a target: one ScaledObject's fleet as this trigger describes it (every field, in
        order)."""
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self))

    @property
    def target_id(self) -> str:
        """The ``target`` label on the scaler's own metrics: stable across processes (unlike hash()), so a
        client that parses the same metadata (``keda-llm-scaler probe``) finds its target's series."""
        return hashlib.sha256(repr(self.key).encode()).hexdigest()[:8]

    @property
    def fleet_key(self) -> tuple[object, ...]:
        """Identity of what is scraped: triggers with the same fleet key share one scrape loop and score
        its observations each with their own parameters. Zero-config discovery reads the ScaledObject's
        own scaleTargetRef, so there the ScaledObject is part of what is scraped."""
        owner = (self.namespace, self.name) if self.discovery.kind == "workload" else ()
        return (
            *owner,
            self.discovery,
            self.engine,
            self.model,
            self.scrape_interval,
            self.scrape_timeout,
            self.gateway,
        )

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.name}"


def _field_default(cls: type, name: str) -> Any:
    """The default of a dataclass field: where a metadata key's default is defined when a field holds it."""
    (f,) = (f for f in dataclasses.fields(cls) if f.name == name)
    if f.default is dataclasses.MISSING:
        raise TypeError(f"{cls.__name__}.{name} has no default")
    return f.default


# A key absent or empty takes its default. Keys a dataclass field holds take that field's default (one
# definition each); the others, which every TriggerConfig sets, are defined here.
DEFAULTS: Final[dict[str, float | str]] = {
    "engine": "auto",
    "metricsPath": _field_default(Discovery, "metrics_path"),
    "targetKvUsage": _field_default(ScoringParams, "target_kv_usage"),
    "targetQueueDepth": _field_default(ScoringParams, "target_queue_depth"),
    "targetUtilization": _field_default(ScoringParams, "target_utilization"),
    "ttftSloQuantile": _field_default(ScoringParams, "ttft_slo_quantile"),
    "itlSloQuantile": _field_default(ScoringParams, "itl_slo_quantile"),
    "demandWindow": _field_default(ScoringParams, "demand_window_s"),
    "startupBudgetSeconds": _field_default(Discovery, "startup_budget_s"),
    "activationThreshold": 0.0,
    "targetValue": 1.0,
    "scrapeInterval": 5.0,
    "scrapeTimeout": 2.0,
    "scheme": _field_default(Discovery, "scheme"),
    "workloadClass": _field_default(TriggerConfig, "workload_class"),
}
MAX_DEMAND_WINDOW_S: Final = 3600.0


def check_address(host: str, key: str) -> None:
    """Refuse link-local targets (cloud metadata services live there), metadata service names and
    non-unicast addresses, in every spelling the resolver accepts (``keda_llm_scaler.addresses``). Names
    are checked again on what they resolve to, when the scrape connects."""
    why = refusal(host)
    if why is not None:
        raise BadMetadata(key, f"{quote_value(host)}: {why} is refused", "routable replica addresses")


def _number(meta: Mapping[str, str], key: str, lo: float, hi: float, *, lo_open: bool = False) -> float:
    default = DEFAULTS.get(key)
    raw = meta.get(key)
    bounds = f"a number {'>' if lo_open else '>='} {lo:g} and <= {hi:g}"
    if raw is None or raw.strip() == "":
        if default is None:
            raise BadMetadata(key, "is required", bounds)
        return float(default)
    try:
        value = float(raw.strip())
    except ValueError:
        raise BadMetadata(key, f"{quote_value(raw)} is not a number", bounds) from None
    if not math.isfinite(value) or value > hi or value < lo or (lo_open and value == lo):
        raise BadMetadata(key, f"{quote_value(raw)} is out of range", bounds)
    return value


def _optional(meta: Mapping[str, str], key: str, lo: float, hi: float) -> float | None:
    """An optional number in [lo, hi]: absent or empty means "learn it" (or "off")."""
    if not meta.get(key, "").strip():
        return None
    return _number(meta, key, lo, hi)


def _demand_window(meta: Mapping[str, str], interval: float) -> float:
    bins = bin_seconds(interval)
    if not meta.get("demandWindow", "").strip():  # the default, long enough for any scrape interval
        return max(float(DEFAULTS["demandWindow"]), 3 * bins)
    window = _number(meta, "demandWindow", 5.0, MAX_DEMAND_WINDOW_S)
    if window < 3 * bins:
        raise BadMetadata(
            "demandWindow",
            f"{window:g}s holds fewer than 3 arrival bins of {bins:g}s at scrapeInterval {interval:g}s",
            f"a number of seconds >= {3 * bins:g}",
        )
    return window


def _choice(meta: Mapping[str, str], key: str, choices: tuple[str, ...]) -> str:
    raw = meta.get(key, "").strip().lower() or str(DEFAULTS[key])
    if raw not in choices:
        raise BadMetadata(key, f"{quote_value(meta.get(key))} is not supported", " | ".join(choices))
    return raw


def _port(meta: Mapping[str, str], engine: str) -> int:
    raw = meta.get("port", "").strip()
    if not raw:
        return 30000 if engine == "sglang" else 8000  # each engine's default serving port
    # ASCII digits only: str.isdigit() takes "¹" (then int() fails: INTERNAL) and "٨٠٠٠" (read as 8000)
    if not re.fullmatch(r"[0-9]{1,5}", raw) or not 1 <= int(raw) <= 65535:
        raise BadMetadata("port", f"{quote_value(raw)} is not a port number", "an integer 1-65535")
    return int(raw)


MAX_URL_CHARS: Final = 512  # a 253-character host name, a port and a path fit; a log line quoting it stays short


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def endpoint_urls(raw: str, metrics_path: str, key: str = "endpoints") -> tuple[str, ...]:
    """``key``: the metadata key the URLs came from, named in every refusal."""
    accepted = "comma-separated http(s) base URLs, e.g. http://10.0.0.7:8000,http://10.0.0.8:8000"
    urls: set[str] = set()
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        if len(item) > MAX_URL_CHARS:
            raise BadMetadata(key, f"{quote_value(item)} is longer than {MAX_URL_CHARS} characters", accepted)
        try:
            parts = urlsplit(item)
            port = parts.port
        except ValueError:
            raise BadMetadata(key, f"{quote_value(item)} is not a URL", accepted) from None
        if parts.scheme not in ("http", "https"):
            raise BadMetadata(key, f"scheme of {quote_value(item)} is not http or https", accepted)
        if not parts.hostname:
            raise BadMetadata(key, f"{quote_value(item)} has no host", accepted)
        if port == 0:  # urlsplit reads ":0" as port 0, and the scrape would then go to the scheme's default
            raise BadMetadata(key, f"{quote_value(parts.hostname)}: port 0 is not a port", accepted)
        check_address(parts.hostname, key)
        if parts.username or parts.password:
            raise BadMetadata(key, f"{quote_value(parts.hostname)}: credentials in URLs are refused", accepted)
        # A base URL gets metricsPath appended; a URL that already names a path is used as it is.
        path = parts.path if parts.path not in ("", "/") else metrics_path
        # the canonical spelling is what is scraped: `2130706433`, `0177.0.0.1`, `127.1`, a trailing dot or
        # full-width dots are checked as the address they mean, so they must also connect to it
        canonical = normalize_host(parts.hostname)
        if not _is_ip(canonical) and not _HOSTNAME.match(canonical):
            raise BadMetadata(key, f"{quote_value(parts.hostname)} is not a host name or address", accepted)
        host = f"[{canonical}]" if ":" in canonical else canonical
        netloc = f"{host}:{port}" if port else host
        urls.add(f"{parts.scheme}://{netloc}{path}" + (f"?{parts.query}" if parts.query else ""))
    if not urls:
        raise BadMetadata(key, "is empty", accepted)
    if len(urls) > MAX_ENDPOINTS:
        raise BadMetadata(key, f"{len(urls)} endpoints", f"at most {MAX_ENDPOINTS}")
    return tuple(sorted(urls))


def _discovery(meta: Mapping[str, str], namespace: str, engine: str, allow_cross_namespace: bool) -> Discovery:
    present = [k for k in DISCOVERY_KEYS if meta.get(k, "").strip()]
    if len(present) > 1:
        raise BadMetadata(
            " | ".join(DISCOVERY_KEYS),
            f"at most one discovery key, several given ({', '.join(present)})",
            "endpoints=<URLs> | dnsName=<headless Service name> | service=<name> (+ port), or "
            "none for the ScaledObject's scaleTargetRef",
        )
    metrics_path = meta.get("metricsPath", "").strip() or str(DEFAULTS["metricsPath"])
    if not metrics_path.startswith("/") or any(c in metrics_path for c in " ?#"):
        raise BadMetadata("metricsPath", f"{quote_value(metrics_path)} is not an absolute path", "a path like /metrics")
    budget = _number(meta, "startupBudgetSeconds", 30.0, 86400.0)
    if not present:  # zero-config: the pods of the ScaledObject's scaleTargetRef
        return Discovery(
            "workload",
            namespace=namespace,
            port=_port(meta, engine),
            scheme=_choice(meta, "scheme", ("http", "https")),
            metrics_path=metrics_path,
            port_from_slice=not meta.get("port", "").strip(),
            startup_budget_s=budget,
        )
    kind = present[0]
    if kind == "endpoints":
        return Discovery("static", endpoints=endpoint_urls(meta["endpoints"], metrics_path))
    scheme = _choice(meta, "scheme", ("http", "https"))
    port = _port(meta, engine)
    if kind == "dnsName":
        name = meta["dnsName"].strip().lower()
        if not _HOSTNAME.match(name):
            raise BadMetadata(
                "dnsName", f"{quote_value(name)} is not a DNS name", "e.g. vllm-headless.serving.svc.cluster.local"
            )
        check_address(name, "dnsName")
        return Discovery("dns", dns_name=name, port=port, scheme=scheme, metrics_path=metrics_path)
    service = meta["service"].strip()
    svc_ns, _, svc_name = service.rpartition("/")
    svc_ns = svc_ns or namespace
    if not _DNS_LABEL.match(svc_name) or (svc_ns and not _DNS_LABEL.match(svc_ns)):
        raise BadMetadata("service", f"{quote_value(service)} is not a Service name", "<name> or <namespace>/<name>")
    if svc_ns != namespace and not allow_cross_namespace:
        raise BadMetadata(
            "service",
            f"Service in namespace {quote_value(svc_ns)} but the ScaledObject is in {namespace!r}; "
            "cross-namespace discovery is disabled on this scaler",
            "a Service in the ScaledObject's own namespace",
        )
    return Discovery(
        "kubernetes",
        service=svc_name,
        namespace=svc_ns,
        port=port,
        scheme=scheme,
        port_from_slice=not meta.get("port", "").strip(),
        metrics_path=metrics_path,
        startup_budget_s=budget,
    )


# Kubernetes' own rules for the names KEDA sends (apimachinery validation): a namespace is a DNS-1123
# label, a ScaledObject's name a DNS-1123 subdomain. Nothing else can come from a real ScaledObject.
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def check_object_ref(namespace: str, name: str) -> None:
    """Raise BadObjectName unless ``namespace`` and ``name`` are names the API server accepts; run before
    either reaches a log line, a series label or a target."""
    if len(namespace) > 63 or not _DNS1123_LABEL.fullmatch(namespace):
        raise BadObjectName("namespace", namespace, "a DNS-1123 label: at most 63 of a-z, 0-9 and '-'")
    if len(name) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(name):
        raise BadObjectName("name", name, "a DNS-1123 subdomain: at most 253 of a-z, 0-9, '-' and '.'")


def parse_trigger(
    namespace: str, name: str, meta: Mapping[str, str], *, allow_cross_namespace: bool = False
) -> TriggerConfig:
    """Validate trigger metadata; raises BadMetadata naming the key and the accepted values."""
    engine = _choice(meta, "engine", ENGINE_CHOICES)
    discovery = _discovery(meta, namespace, engine, allow_cross_namespace)
    interval = _number(meta, "scrapeInterval", 0.5, 300.0)
    # The default timeout shrinks with a short interval; an explicit one must fit inside it.
    timeout_meta = {
        "scrapeTimeout": meta.get("scrapeTimeout", "").strip() or str(min(float(DEFAULTS["scrapeTimeout"]), interval))
    }
    timeout = _number(timeout_meta, "scrapeTimeout", 0.0, 60.0, lo_open=True)
    if timeout > interval:
        raise BadMetadata(
            "scrapeTimeout",
            f"{timeout:g}s is longer than scrapeInterval {interval:g}s",
            "a number of seconds <= scrapeInterval",
        )
    default_ttl = max(3 * interval, 15.0)
    stale_after = _number(
        {"staleAfter": meta.get("staleAfter", "") or str(default_ttl)}, "staleAfter", interval, 3600.0
    )
    model = meta.get("model", "").strip() or None
    return TriggerConfig(
        namespace=namespace,
        name=name,
        discovery=discovery,
        engine=engine,
        model=model,
        scoring=ScoringParams(
            target_kv_usage=_number(meta, "targetKvUsage", 0.0, 1.0, lo_open=True),
            target_queue_depth=_number(meta, "targetQueueDepth", 0.0, 1e6, lo_open=True),
            target_utilization=_number(meta, "targetUtilization", 0.05, 1.0),
            replica_capacity=_optional(meta, "replicaCapacity", 0.001, 1e6),
            startup_s=_optional(meta, "startupSeconds", 1.0, 86400.0),
            ttft_slo_s=_optional(meta, "ttftSloSeconds", 0.01, 3600.0),
            ttft_slo_quantile=_number(meta, "ttftSloQuantile", 0.5, 0.999),
            itl_slo_s=_optional(meta, "itlSloSeconds", 0.001, 60.0),
            itl_slo_quantile=_number(meta, "itlSloQuantile", 0.5, 0.999),
            demand_window_s=_demand_window(meta, interval),
        ),
        activation_threshold=_number(meta, "activationThreshold", 0.0, 1e9),
        target_value=_number(meta, "targetValue", 0.001, 1e9),
        scrape_interval=interval,
        scrape_timeout=timeout,
        stale_after=stale_after,
        workload_class=_choice(meta, "workloadClass", WORKLOAD_CLASSES),
        gateway=_gateway(meta, name),
        pool=_pool(meta, name),
    )


def _pool(meta: Mapping[str, str], name: str) -> PoolSpec | None:
    """fleet and the keys that describe this ScaledObject's pool in it: its name (pool, default the
    ScaledObject's), its tier (poolTier: reserved | burst | 0-99, required), its size (poolSize: the
    reserved pool's size, a burst pool's maximum; default the ScaledObject's maxReplicaCount where the
    scaler can read it) and the price of one of its replicas (replicaCostPerHour)."""
    fleet = meta.get("fleet", "").strip()
    if not fleet:
        for key in POOL_KEYS[1:]:
            if meta.get(key, "").strip():
                raise BadMetadata(key, "is set without fleet", "fleet: the name shared by the pools of one model")
        return None
    if len(fleet) > 63 or not _DNS1123_LABEL.fullmatch(fleet):
        raise BadMetadata("fleet", f"{quote_value(fleet)} is not a fleet name", "a DNS-1123 label (a-z, 0-9, '-')")
    pool = meta.get("pool", "").strip() or name
    if len(pool) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(pool):
        raise BadMetadata("pool", f"{quote_value(pool)} is not a pool name", "a DNS-1123 name (a-z, 0-9, '-', '.')")
    raw_tier = meta.get("poolTier", "").strip()
    if not raw_tier:
        raise BadMetadata("poolTier", "is required with fleet", "reserved | burst | an order number 0-99")
    try:
        tier = parse_tier(raw_tier)
    except ValueError:
        raise BadMetadata("poolTier", f"{quote_value(raw_tier)} is not a tier", "reserved | burst | 0-99") from None
    size: int | None = None
    raw_size = meta.get("poolSize", "").strip()
    if raw_size:
        # ASCII digits only, as for port: str.isdigit() takes "¹" and "٢"
        if not re.fullmatch(r"[0-9]{1,6}", raw_size) or int(raw_size) > MAX_POOL_SIZE:
            raise BadMetadata(
                "poolSize", f"{quote_value(raw_size)} is not a pool size", f"an integer 0-{MAX_POOL_SIZE}"
            )
        size = int(raw_size)
    cost = _optional(meta, "replicaCostPerHour", 0.0, MAX_REPLICA_COST)
    return PoolSpec(fleet=fleet, pool=pool, tier=tier, size=size, cost_per_hour=cost)


def _gateway(meta: Mapping[str, str], name: str) -> GatewaySpec | None:
    """gatewayMetricsUrl and the keys that refine it: the family (gatewayMetric, default llm-d's router's
    flow-control queue), the pool (gatewayPool, default the ScaledObject's name, matched on the router's
    ``inference_pool`` label) and other labels to match (gatewayLabels)."""
    raw = meta.get("gatewayMetricsUrl", "").strip()
    if not raw:
        for key in ("gatewayMetric", "gatewayPool", "gatewayLabels"):
            if meta.get(key, "").strip():
                raise BadMetadata(
                    key, "is set without gatewayMetricsUrl", "gatewayMetricsUrl: the gateway's /metrics URL"
                )
        return None
    if "," in raw:
        raise BadMetadata("gatewayMetricsUrl", "names more than one URL", "one http(s) URL of the gateway's /metrics")
    (url,) = endpoint_urls(raw, "/metrics", "gatewayMetricsUrl")
    family = meta.get("gatewayMetric", "").strip()
    if family and not valid_family(family):
        raise BadMetadata("gatewayMetric", f"{quote_value(family)} is not a metric name", "a Prometheus metric name")
    try:
        labels = dict(parse_labels(meta.get("gatewayLabels", "")))
    except ValueError as exc:
        raise BadMetadata("gatewayLabels", str(exc), "name=value,name=value") from None
    pool = meta.get("gatewayPool", "").strip()
    if not family:  # llm-d's router: its pool label, this ScaledObject's pool unless named
        if pool and not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", pool):
            raise BadMetadata("gatewayPool", f"{quote_value(pool)} is not an InferencePool name", "a DNS-1123 name")
        labels.setdefault(POOL_LABEL, pool or name)
    elif pool:
        raise BadMetadata("gatewayPool", "applies to the default gatewayMetric only", "gatewayLabels: label=value")
    families = (family,) if family else DEFAULT_GATEWAY_FAMILIES
    return GatewaySpec(url, families, tuple(sorted(labels.items())))


def metadata_hints(meta: Mapping[str, str]) -> list[str]:
    """Human hints for keys that are probably mistakes; the keys themselves are ignored."""
    hints = []
    lowered = {k.lower(): k for k in KNOWN_KEYS}
    if meta.get("ttftSloQuantile", "").strip() and not meta.get("ttftSloSeconds", "").strip():
        hints.append("ttftSloQuantile: has no effect without ttftSloSeconds")
    if meta.get("itlSloQuantile", "").strip() and not meta.get("itlSloSeconds", "").strip():
        hints.append("itlSloQuantile: has no effect without itlSloSeconds")
    for key in sorted(meta):
        if key in KNOWN_KEYS or key in KEDA_KEYS or key.endswith("FromEnv"):
            continue
        if key in MISPLACED:
            hints.append(f"{key}: {MISPLACED[key]}")
        elif key.lower() in lowered:
            hints.append(f"{key}: keys are case-sensitive, did you mean {lowered[key.lower()]!r}?")
        elif close := difflib.get_close_matches(key, KNOWN_KEYS, n=1, cutoff=0.8):
            hints.append(f"{key}: unknown key, did you mean {close[0]!r}?")
    return hints
