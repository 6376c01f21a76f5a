"""Engine adapters and payload auto-detection."""

from __future__ import annotations

from typing import Final

from keda_llm_scaler.engines.base import EngineAdapter, Samples
from keda_llm_scaler.engines.sglang import SglangAdapter
from keda_llm_scaler.engines.vllm import VllmAdapter
from keda_llm_scaler.errors import UnrecognizedPayload
from keda_llm_scaler.promtext import Sample, SampleNames, parse_samples
from keda_llm_scaler.signals import ReplicaSignals

__all__ = ["ADAPTERS", "ENGINE_CHOICES", "EngineAdapter", "read_replica", "sample_names_for"]

ADAPTERS: Final[dict[str, EngineAdapter]] = {"vllm": VllmAdapter(), "sglang": SglangAdapter()}
ENGINE_CHOICES: Final = ("auto", *ADAPTERS)

# Spellings of the same families seen in the field, read as the engine's own names:
# - vLLM under Ray Serve LLM records through Ray, whose exporter names every family `ray_` + the vLLM name
#   with each character outside [A-Za-z0-9_] turned into `_` (Ray 2.4x+: `ray_vllm_num_requests_waiting`;
#   counters keep the `_total` Ray adds) and adds Ray's labels (WorkerId, ReplicaId, SessionName …);
#   Ray 2.3x kept the colon (`ray_vllm:`);
# - some SGLang builds and gateways re-export `sglang:` as `sglang_` (Prometheus names without a colon).
ALIASES: Final = (("ray_vllm:", "vllm:"), ("ray_vllm_", "vllm:"), ("sglang_", "sglang:"))


def _with_aliases(names: SampleNames) -> SampleNames:
    extra = {alias + n.removeprefix(canon) for n in names.names for alias, canon in ALIASES if n.startswith(canon)}
    return SampleNames(names.names | extra)


_ALL_NAMES: Final = _with_aliases(SampleNames(set().union(*(a.sample_names.names for a in ADAPTERS.values()))))
_BY_ENGINE: Final = {name: _with_aliases(a.sample_names) for name, a in ADAPTERS.items()}


def sample_names_for(engine: str) -> SampleNames:
    return _ALL_NAMES if engine == "auto" else _BY_ENGINE[engine]


def _canonical(samples: dict[str, list[Sample]]) -> dict[str, list[Sample]]:
    """Aliased families under the engine's own names (a payload with both keeps both: duplicates of
    one series then fail as any duplicate does)."""
    out: dict[str, list[Sample]] = {}
    for name, series in samples.items():
        canon = name
        for alias, own in ALIASES:
            if name.startswith(alias):
                canon = own + name.removeprefix(alias)
                break
        if canon != name:
            series = [Sample(canon, s.labels, s.value) for s in series]
        out.setdefault(canon, []).extend(series)
    return out


def detect(samples: Samples) -> EngineAdapter:
    for adapter in ADAPTERS.values():
        if adapter.claims(samples):
            return adapter
    raise UnrecognizedPayload("no vLLM (vllm:num_requests_*) or SGLang (sglang:num_*_reqs) families in the payload")


def read_replica(text: str, engine: str = "auto", model: str | None = None) -> ReplicaSignals:
    """Parse one replica's /metrics text into signals; raises ReplicaError or TextFormatError."""
    samples = _canonical(parse_samples(text, sample_names_for(engine)))
    adapter = detect(samples) if engine == "auto" else ADAPTERS[engine]
    return adapter.extract(samples, model)
