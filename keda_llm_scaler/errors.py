"""The scaler's exceptions.

    ScalerError
    ├── BadMetadata        trigger metadata is malformed or out of range  -> INVALID_ARGUMENT
    │   └── BadObjectName      the ScaledObjectRef's name or namespace is not a Kubernetes name
    ├── UnknownMetric      GetMetrics asked for a name we never returned  -> NOT_FOUND
    ├── NoFreshData        no replica of a non-empty fleet has fresh data -> UNAVAILABLE
    ├── TooManyTargets     the scaler already serves --max-targets targets -> RESOURCE_EXHAUSTED
    │                      (keda_llm_scaler.registry)
    ├── DiscoveryError     the replica set could not be determined this time (keda_llm_scaler.discovery):
    │                      the last members found are kept; a target never resolved answers NoFreshData
    └── ReplicaError       one replica could not be read (kept as data on that replica, never raised to KEDA)
        ├── MissingSignal      a family the composite needs is absent (never read as zero)
        ├── ModelNotFound      the `model` filter matches no series
        ├── InvalidSignal      a value no engine can mean (negative, infinite, KV above 1, a bad bucket bound)
        └── UnrecognizedPayload no known engine's families in the payload

The gRPC layer maps these to status codes in exactly one place (keda_llm_scaler.service).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "BadMetadata",
    "BadObjectName",
    "InvalidSignal",
    "MissingSignal",
    "ModelNotFound",
    "NoFreshData",
    "ReplicaError",
    "ScalerError",
    "UnknownMetric",
    "UnrecognizedPayload",
    "quote_prefix",
]


class ScalerError(Exception):
    """Base of every error the scaler raises on purpose."""


class BadMetadata(ScalerError):
    def __init__(self, key: str, problem: str, accepted: str) -> None:
        self.key = key
        super().__init__(f"metadata key {quote_value(key)}: {problem}; accepted: {accepted}")


def quote_prefix(value: str, limit: int = 40) -> str:
    """A user value as an error message may quote it: at most ``limit`` characters, printable, and the
    full length said when it was cut (a 1 MB name must not become a 1 MB reply or log line)."""
    shown = repr(value[:limit])
    return shown if len(value) <= limit else f"{shown}... ({len(value)} characters)"


def quote_value(value: object) -> str:
    """A metadata value as a refusal quotes it: enough of a URL or a number to find it, never the whole of
    a value of up to 256 KiB (the reply would exceed gRPC's metadata limit and reach KEDA as
    RESOURCE_EXHAUSTED instead of the reason)."""
    text = str(value)
    limit = 80
    while limit > 8 and len(repr(text[:limit]).encode()) > 100:  # wide characters: bytes, not characters
        limit -= 8
    return quote_prefix(text, limit)


class BadObjectName(BadMetadata):
    """The ScaledObjectRef's ``name`` or ``namespace`` is not a Kubernetes name. Checked before any
    target, series or log line exists: KEDA only ever sends names the API server accepted."""

    def __init__(self, key: str, value: str, accepted: str) -> None:
        self.key = key
        ScalerError.__init__(
            self, f"ScaledObjectRef {key} {quote_prefix(value)} is not a Kubernetes name; accepted: {accepted}"
        )


class UnknownMetric(ScalerError):
    def __init__(self, asked: str, served: str) -> None:
        super().__init__(f"unknown metric name {quote_prefix(asked)}: this scaler serves {served!r}")


class NoFreshData(ScalerError):
    """Raised instead of answering 0, so that KEDA's fallback applies."""


class ReplicaError(ScalerError):
    reason = "error"


class MissingSignal(ReplicaError):
    reason = "missing_signal"

    def __init__(self, family: str) -> None:
        self.family = family
        super().__init__(f"family {family} is absent (metrics disabled, or the engine is still starting)")


class ModelNotFound(ReplicaError):
    reason = "model_not_found"

    def __init__(self, model: str, seen: Iterable[str]) -> None:
        super().__init__(f"no series with model_name={model!r}; models served: {sorted(set(seen))}")


class InvalidSignal(ReplicaError):
    """Garbage is a failure of that replica, never a reading: a KV of +Inf or -0.5 must not read as an idle
    replica (which could scale a loaded fleet to zero)."""

    reason = "invalid_signal"

    def __init__(self, family: str, value: object, accepted: str) -> None:
        self.family = family
        super().__init__(f"{family} = {value!r} is not a possible value ({accepted})")


class UnrecognizedPayload(ReplicaError):
    reason = "unrecognized_payload"
