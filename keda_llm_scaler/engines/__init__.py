"""Engine adapters and payload auto-detection."""

from __future__ import annotations

from typing import Final

from keda_llm_scaler.engines.base import EngineAdapter, Samples
from keda_llm_scaler.engines.sglang import SglangAdapter
from keda_llm_scaler.engines.vllm import VllmAdapter
from keda_llm_scaler.errors import UnrecognizedPayload
from keda_llm_scaler.promtext import SampleNames, parse_samples
from keda_llm_scaler.signals import ReplicaSignals

__all__ = ["ADAPTERS", "ENGINE_CHOICES", "EngineAdapter", "read_replica", "sample_names_for"]

ADAPTERS: Final[dict[str, EngineAdapter]] = {"vllm": VllmAdapter(), "sglang": SglangAdapter()}
ENGINE_CHOICES: Final = ("auto", *ADAPTERS)

_ALL_NAMES: Final = SampleNames(set().union(*(a.sample_names.names for a in ADAPTERS.values())))


def sample_names_for(engine: str) -> SampleNames:
    return _ALL_NAMES if engine == "auto" else ADAPTERS[engine].sample_names


def detect(samples: Samples) -> EngineAdapter:
    for adapter in ADAPTERS.values():
        if adapter.claims(samples):
            return adapter
    raise UnrecognizedPayload("no vLLM (vllm:num_requests_*) or SGLang (sglang:num_*_reqs) families in the payload")


def read_replica(text: str, engine: str = "auto", model: str | None = None) -> ReplicaSignals:
    """Parse one replica's /metrics text into signals; raises ReplicaError or TextFormatError."""
    samples = parse_samples(text, sample_names_for(engine))
    adapter = detect(samples) if engine == "auto" else ADAPTERS[engine]
    return adapter.extract(samples, model)
