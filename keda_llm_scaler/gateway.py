"""Requests a gateway holds for a pool: the demand of a pool that has no replica to scrape.

A pool scaled to zero has no replica to scrape: only the gateway in front of it sees the requests waiting
for it. llm-d's router (the EPP of the Gateway API Inference Extension) holds them in its flow-control
queue while no endpoint exists and exports the queue's size per pool:

    llm_d_epp_flow_control_queue_size{fairness_id, priority, inference_pool, model_name, target_model_name}

(``inference_extension_flow_control_queue_size`` before llm-d renamed its families; both are exported
while the old one is deprecated, never added). A trigger names the gateway's /metrics URL and, optionally,
another family and labels (KEDA's HTTP add-on interceptor, an Envoy gateway's pending requests per
backend). The reading is the sum of the family's series whose labels match.

The gateway is scraped by the replicas' scrape path (the same address guards, size cap, deadline and
worker processes): ``GatewaySpec.channel`` carries the spec where a replica's engine and model go.
Pure: no I/O.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Final

from keda_llm_scaler.errors import InvalidSignal, MissingSignal
from keda_llm_scaler.promtext import SampleNames, parse_samples

__all__ = [
    "DEFAULT_GATEWAY_FAMILIES",
    "GATEWAY_ENGINE",
    "POOL_LABEL",
    "GatewaySpec",
    "parse_labels",
    "read_gateway",
    "valid_family",
]

# What a scrape passes as its engine to say "this is the gateway, and the model argument is its spec".
GATEWAY_ENGINE: Final = "gateway"
DEFAULT_GATEWAY_FAMILIES: Final = ("llm_d_epp_flow_control_queue_size", "inference_extension_flow_control_queue_size")
POOL_LABEL: Final = "inference_pool"
# The router's own prefixes: a router that answers with its other families and no queue series at all has
# held nothing yet (Prometheus' Go client writes no family without a series), which is 0, not missing.
_ROUTER_FAMILIES: Final = re.compile(r"^(?:llm_d_epp_|inference_extension_)", re.MULTILINE)
_LABEL_NAME: Final = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_METRIC_NAME: Final = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")


@dataclass(frozen=True, slots=True)
class GatewaySpec:
    """Where a pool's held requests are read: the gateway's URL, the family (the first of ``families``
    present), and the labels its series must carry."""

    url: str
    families: tuple[str, ...] = DEFAULT_GATEWAY_FAMILIES
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def channel(self) -> str:
        """The spec as one line, for the scrape path's ``model`` argument (``from_channel`` reads it)."""
        labels = ",".join(f"{k}={v}" for k, v in self.labels)
        return f"{'|'.join(self.families)} {labels}"

    @classmethod
    def from_channel(cls, url: str, channel: str) -> GatewaySpec:
        families, _, labels = channel.partition(" ")
        return cls(url, tuple(families.split("|")), parse_labels(labels))


def parse_labels(text: str) -> tuple[tuple[str, str], ...]:
    """``name=value,name=value`` (values without commas or quotes), sorted by name. ValueError names the
    part that is wrong."""
    out: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not _LABEL_NAME.match(name) or not value or any(c in value for c in "\"'{}\\ "):
            raise ValueError(f"{part!r} is not name=value (a Prometheus label name, a plain value)")
        if name in out and out[name] != value:
            raise ValueError(f"label {name!r} given twice")
        out[name] = value
    return tuple(sorted(out.items()))


def valid_family(name: str) -> bool:
    return bool(_METRIC_NAME.match(name))


def read_gateway(text: str, spec: GatewaySpec) -> float:
    """The requests the gateway holds for the pool: the sum of the first present family's matching
    series. A family the gateway exports with no matching series reads 0 (the router creates a queue's
    series at its first request); so does llm-d's router without the family, if it answers with its other
    families. Any other gateway without the family is missing data, never 0 (a misspelt family must not
    read as an idle pool forever)."""
    samples = parse_samples(text, SampleNames(set(spec.families)))
    family = next((f for f in spec.families if samples.get(f)), None)
    if family is None:
        if spec.families == DEFAULT_GATEWAY_FAMILIES and _ROUTER_FAMILIES.search(text):
            return 0.0
        raise MissingSignal(" or ".join(spec.families))
    wanted = dict(spec.labels)
    total = 0.0
    for s in samples[family]:
        if any(s.labels.get(k) != v for k, v in wanted.items()):
            continue
        if math.isnan(s.value):
            continue
        if math.isinf(s.value) or s.value < 0:
            raise InvalidSignal(family, s.value, "a finite queue size >= 0")
        total += s.value
    return total
