"""The end-to-end tests run inside ``scripts/controlplane run`` (the README's test command does this);
outside it the top-level conftest leaves this directory out."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from keda_llm_scaler.controlplane.api import Api
from tests.e2e.kube import Fleet, Pods, admin_api


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.controlplane)


@pytest.fixture(scope="session")
def api() -> Iterator[Api]:
    a = admin_api()
    yield a
    a.close()


@pytest.fixture(scope="session")
def pods() -> Pods:
    return Pods()


@pytest.fixture
def fleet(api: Api, pods: Pods, request: pytest.FixtureRequest) -> Iterator[Fleet]:
    prefix = request.node.name.removeprefix("test_").replace("_", "-")[:20].strip("-")
    f = Fleet.in_new_namespace(api, prefix)
    yield f
    pods.load(f.namespace, f.app, 0)
    f.delete_namespace()


@pytest.fixture(scope="session")
def hpa_sync_s() -> float:
    return float(os.environ.get("KLS_HPA_SYNC_PERIOD", "15"))
