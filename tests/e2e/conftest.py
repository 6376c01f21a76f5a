"""The end-to-end tests run inside ``scripts/controlplane run`` (the README's test command does this);
outside it the top-level conftest leaves this directory out."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from keda_llm_scaler.controlplane.api import Api
from tests.e2e.kube import Fleet, Pods, admin_api


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.controlplane)


# what a failed test shows of the control plane: the lines of these logs that name its namespace
_LOGS_ON_FAILURE = ("keda-operator", "keda-llm-scaler", "pod-standin")
_LOG_LINES_ON_FAILURE = 60


def _log_lines_naming(log: Path, namespace: str) -> list[str]:
    try:
        text = log.read_text(errors="replace")
    except OSError as exc:
        return [f"(unreadable: {exc})"]
    return [line for line in text.splitlines() if namespace in line][-_LOG_LINES_ON_FAILURE:]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    # an intermittent failure in CI is diagnosed from its report alone: the run's logs are gone by then
    outcome = yield
    report = outcome.get_result()
    fleet = getattr(item, "funcargs", {}).get("fleet")
    workdir = os.environ.get("KLS_CONTROLPLANE_DIR")
    if report.when != "call" or not report.failed or fleet is None or not workdir:
        return
    for name in _LOGS_ON_FAILURE:
        lines = _log_lines_naming(Path(workdir) / "logs" / f"{name}.log", fleet.namespace)
        report.sections.append((f"{name}.log, lines naming {fleet.namespace}", "\n".join(lines) or "(none)"))


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
