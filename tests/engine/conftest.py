"""The real-engine tests run inside ``scripts/engine run`` (``scripts/engine test`` does this; so does
``.ci/run``); outside it the top-level conftest leaves this directory out."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.engine)


@dataclass(frozen=True)
class Engines:
    urls: list[str]
    model: str
    cgroups: list[Path]
    cpus: float
    max_num_seqs: int

    def engine_core_pids(self, index: int) -> list[int]:
        """The processes that run engine ``index``'s scheduler and model (vLLM's EngineCore and Worker):
        stopping them freezes its queue and gauges while its API server still answers /metrics."""
        pids = []
        for pid in (self.cgroups[index] / "cgroup.procs").read_text().split():
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if comm.startswith(("VLLM::EngineCor", "VLLM::Worker")):
                pids.append(int(pid))
        return pids


@pytest.fixture(scope="session")
def engines() -> Engines:
    return Engines(
        urls=os.environ["KLS_ENGINE_URLS"].split(","),
        model=os.environ["KLS_ENGINE_MODEL"],
        cgroups=[Path(p) for p in os.environ["KLS_ENGINE_CGROUPS"].split(",")],
        cpus=float(os.environ["KLS_ENGINE_CPUS"]),
        max_num_seqs=int(os.environ["KLS_ENGINE_MAX_NUM_SEQS"]),
    )
