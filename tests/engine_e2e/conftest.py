"""The closed loop on real engines: real vLLM in every pod of the real control plane, scaled by real KEDA
and the real HPA through the scaler. They run inside ``scripts/controlplane run --pods vllm`` (the README's
test command does this); anywhere else the top-level conftest leaves this directory out."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from keda_llm_scaler.controlplane.api import Api
from tests.e2e.kube import Pods, admin_api


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.controlplane)
        item.add_marker(pytest.mark.engine)


@pytest.fixture(scope="session")
def api() -> Iterator[Api]:
    a = admin_api()
    yield a
    a.close()


@pytest.fixture(scope="session")
def pods() -> Pods:
    return Pods()
