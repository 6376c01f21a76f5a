"""The package's import shape (issue #22): no import cycle anywhere in keda_llm_scaler, and the layer contracts
of pyproject.toml ([tool.importlinter]) kept.

The graph is grimp's, the one import-linter checks: every import counts, those under ``if TYPE_CHECKING:``
and those inside functions included. CI also runs ``lint-imports``; these tests make a plain ``pytest`` run
check the same.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "keda_llm_scaler"


def cycles(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, and modules importing themselves: every
    import cycle is inside one of them (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges.get(node, ()):
                    found.append(sorted(component))
    return found


def _edges(graph: grimp.ImportGraph, squash: int | None = None) -> dict[str, set[str]]:
    """The package's imports between its own modules; with ``squash``, each module named by its ancestor at
    that depth (2: keda_llm_scaler.sim.replay counts as keda_llm_scaler.sim), imports inside one dropped."""

    def name(module: str) -> str:
        return module if squash is None else ".".join(module.split(".")[:squash])

    edges: dict[str, set[str]] = {}
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            a, b = name(importer), name(imported)
            if a != b or squash is None:
                edges.setdefault(a, set()).add(b)
    return edges


def _explain(graph: grimp.ImportGraph, component: list[str]) -> str:
    lines = []
    members = set(component)
    for importer in component:
        for imported in sorted(set(graph.find_modules_directly_imported_by(importer)) & members):
            for detail in graph.get_import_details(importer=importer, imported=imported):
                lines.append(f"  {importer} -> {imported} (l.{detail['line_number']}: {detail['line_contents']})")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(PACKAGE, cache_dir=None)  # TYPE_CHECKING imports included (grimp's default)


def test_the_cycle_finder_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"a"}}) == [["a"]]
    assert cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def _type_checking_imports() -> set[tuple[str, str]]:
    """(importer, imported) for every import under ``if TYPE_CHECKING:`` in the package's source."""
    found = set()
    for path in (ROOT / PACKAGE).rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        importer = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                for stmt in ast.walk(node):
                    if isinstance(stmt, ast.ImportFrom) and (stmt.module or "").split(".")[0] == PACKAGE:
                        found.add((importer, str(stmt.module)))
    return found


def test_type_checking_imports_are_in_the_graph(graph: grimp.ImportGraph) -> None:
    # a cycle made only of `if TYPE_CHECKING:` imports is still a cycle: the graph must hold them
    for importer, imported in _type_checking_imports():
        assert graph.direct_import_exists(importer=importer, imported=imported, as_packages=True), (importer, imported)


def test_no_module_of_the_package_is_in_an_import_cycle(graph: grimp.ImportGraph) -> None:
    found = cycles(_edges(graph))
    assert not found, "import cycles:\n" + "\n\n".join(_explain(graph, c) for c in found)


def test_no_subpackage_is_in_an_import_cycle_with_its_siblings(graph: grimp.ImportGraph) -> None:
    # a subpackage taken whole (keda_llm_scaler.sim, say): the server importing sim.a while sim.b imports the
    # server is a cycle between the two that no single module is in
    found = cycles(_edges(graph, squash=2))
    assert not found, found


def test_the_layer_contracts_are_kept() -> None:
    # lint-imports comes with the test extra, next to this interpreter
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert exe is not None, "lint-imports not found: pip install -e '.[test]'"
    got = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stdout[-4000:] + got.stderr[-2000:]
    assert "0 broken" in got.stdout
