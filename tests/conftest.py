from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

if TYPE_CHECKING:
    import grpc

    from keda_llm_scaler.server import ScalerServer

# Property tests draw the same examples on every run unless asked to explore: a CI run must not fail on a
# counterexample no one has seen. `HYPOTHESIS_PROFILE=explore pytest tests/test_policy.py` searches anew;
# add what it finds as an @example.
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("explore", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

FIXTURES = Path(__file__).parent / "fixtures"
METRICS = FIXTURES / "metrics"


def fixture_text(name: str) -> str:
    return (METRICS / name).read_text()


@pytest.fixture
def metrics_dir() -> Path:
    return METRICS


@pytest.fixture
async def scaler() -> AsyncIterator[ScalerServer]:
    """A real scaler in process on loopback ports (``keda_llm_scaler.testing.scalerproc.BASE``)."""
    from keda_llm_scaler.testing.scalerproc import running_scaler  # only for the tests that ask: it imports the server

    async with running_scaler() as server:
        yield server


@pytest.fixture
async def channel(scaler: ScalerServer) -> AsyncIterator[grpc.aio.Channel]:
    from keda_llm_scaler.testing.scalerproc import channel_to

    async with channel_to(scaler) as ch:
        yield ch


# The end-to-end tests need the real control plane: they run inside `scripts/controlplane run`, which
# sets KLS_PODS (README, "Tests"); anywhere else their directory is not collected.
# With real engines in the pods (`scripts/controlplane run --pods vllm`, KLS_PODS_ENGINE=vllm) only
# tests/engine_e2e runs there: the other e2e tests drive simulated replicas.
_PODS_ENGINE = os.environ.get("KLS_PODS_ENGINE", "sim") if os.environ.get("KLS_PODS") else None
collect_ignore_glob = [] if _PODS_ENGINE == "sim" else ["e2e/*"]
if _PODS_ENGINE != "vllm":
    collect_ignore_glob.append("engine_e2e/*")
# The real-engine tests need real vLLM engines: they run inside `scripts/engine run`, which sets
# KLS_ENGINE_URLS (`scripts/engine test`); anywhere else their directory is not collected.
if not os.environ.get("KLS_ENGINE_URLS"):
    collect_ignore_glob.append("engine/*")
