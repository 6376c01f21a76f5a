"""What a production install carries: the server's dependencies only, and no simulator at run time."""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, requires

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from packaging.requirements import Requirement

from keda_llm_scaler.testing.serveproc import serve

HEAVY = {"matplotlib", "numpy", "pillow", "fonttools", "contourpy", "kiwisolver"}


def _name(req: Requirement) -> str:
    return re.sub(r"[-_.]+", "-", req.name).lower()


def test_a_plain_install_brings_no_plotting_stack() -> None:
    # Walk the installed metadata from the project's own requirements, following only requirements that
    # apply without extras: that is what `pip install keda-llm-scaler` (or the image) resolves.
    seen: set[str] = set()
    todo = ["keda-llm-scaler"]
    while todo:
        dist = todo.pop()
        if dist in seen:
            continue
        seen.add(dist)
        try:
            reqs = requires(dist) or []
        except PackageNotFoundError:
            continue  # not installed here (a platform-specific dependency)
        for line in reqs:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(_name(req))
    assert "grpcio" in seen and "httpx" in seen  # the walk did follow the real requirements
    assert not seen & HEAVY, sorted(seen & HEAVY)
    sim_extra = [Requirement(r) for r in requires("keda-llm-scaler") or [] if 'extra == "sim"' in r]
    assert "matplotlib" in {_name(r) for r in sim_extra}  # the simulator's plots come with its extra


def test_serve_imports_no_simulator_module() -> None:
    # The interpreter reports every import of the real `serve` process (PYTHONPROFILEIMPORTTIME); the
    # server must be up and answering before the list is read, so lazy imports on first use count too.
    with serve(env={"PYTHONPROFILEIMPORTTIME": "1"}) as s, grpc.insecure_channel(s.address) as ch:
        health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="readiness"), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    imported = {m.group(1).strip() for m in re.finditer(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)", s.log(), re.M)}
    assert "keda_llm_scaler.server" in imported and "keda_llm_scaler.service" in imported
    sim = sorted(m for m in imported if m.startswith("keda_llm_scaler.sim"))
    assert not sim, sim
    heavy = sorted(m for m in imported if m.split(".")[0].lower() in HEAVY | {"pil"})
    assert not heavy, heavy
