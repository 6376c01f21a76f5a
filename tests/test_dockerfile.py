"""The container image recipe: parsed, and its hardening points asserted (no Docker engine here)."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "docker" / "Dockerfile").read_text()


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and heredoc bodies skipped."""
    out: list[tuple[str, str]] = []
    lines = iter(text.splitlines())
    for line in lines:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        while line.rstrip().endswith("\\"):
            line = line.rstrip()[:-1] + " " + next(lines).strip()
        word, _, rest = line.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        if m := re.search(r"<<'?(\w+)'?", rest):
            for body in lines:
                if body.strip() == m.group(1):
                    break
    return out


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for ins in instructions(DOCKERFILE):
        if ins[0] == "FROM":
            result.append([])
        if result:
            result[-1].append(ins)
    return result


def test_multi_stage_on_a_slim_base() -> None:
    builder, runtime = stages()
    assert re.match(r"python:\$\{PYTHON_VERSION\}-slim-bookworm AS builder", builder[0][1])
    assert re.match(r"python:\$\{PYTHON_VERSION\}-slim-bookworm AS runtime", runtime[0][1])
    assert ("COPY", "--from=builder --chown=10001:10001 /opt/venv /opt/venv") in runtime


def test_dependencies_are_a_layer_before_the_source() -> None:
    builder = stages()[0]
    order = [f"{w} {a}" for w, a in builder]
    deps = next(i for i, s in enumerate(order) if s.startswith("RUN pip install --requirement"))
    source = next(i for i, s in enumerate(order) if s.startswith("COPY keda_llm_scaler"))
    assert order.index("COPY pyproject.toml README.md ./") < deps < source
    assert "compileall" in " ".join(order[source:])  # byte-compiled: the root filesystem is read-only


def test_requirements_extraction_matches_the_project() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(d.startswith("grpcio>=") for d in deps)  # what the builder's tomllib snippet installs


def test_runtime_is_non_root_numeric_without_build_tools() -> None:
    runtime = stages()[1]
    users = [a for w, a in runtime if w == "USER"]
    assert users == ["10001:10001"]
    runs = " ".join(a for w, a in runtime if w == "RUN")
    for tool in ("apt-get", "gcc", "build-essential", "pip install", "grpc_tools"):
        assert tool not in runs
    entry = [a for w, a in runtime if w == "ENTRYPOINT"]
    cmd = [a for w, a in runtime if w == "CMD"]
    assert json.loads(entry[0]) == ["keda-llm-scaler"] and json.loads(cmd[0]) == ["serve"]  # exec form
    exposed = " ".join(a for w, a in runtime if w == "EXPOSE").split()
    assert exposed == ["9090", "8080"]
    env = " ".join(a for w, a in runtime if w == "ENV")
    assert "PYTHONUNBUFFERED=1" in env and 'PATH="/opt/venv/bin:$PATH"' in env


def test_dockerignore_keeps_the_context_small() -> None:
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", "tests/", "charts/"} <= ignored
    assert "keda_llm_scaler" not in ignored and "pyproject.toml" not in ignored
