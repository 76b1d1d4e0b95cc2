"""The layout of DESIGN.md holds: imports point one way, and testbed/ has no import circle.

    testbed -> {engine, simulator} -> scheduler;  dashboard -> testbed

Read from the source (every import statement, at module level or inside a function), so a
lazy import that closes a circle counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("scheduler", "engine", "simulator", "testbed", "dashboard")
# Which of the project's packages each package may import (besides itself).
ALLOWED = {
    "scheduler": set(),
    "engine": {"scheduler"},
    "simulator": {"scheduler"},
    "testbed": {"scheduler", "engine", "simulator", "dashboard"},  # `testbed dashboard` starts the app
    "dashboard": {"testbed"},
}
THIRD_PARTY_FORBIDDEN = {"scheduler": {"torch", "simpy"}}  # the core runs and tests anywhere, fast


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}


def _imports(name: str, path: Path) -> set[str]:
    """Every module this one imports, as absolute dotted names."""
    out = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)  # `from testbed.runs import cli`
    return out


MODULES = _modules()
GRAPH = {name: {m for m in _imports(name, path) if m in MODULES and m != name} for name, path in MODULES.items()}


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_point_one_way(package):
    wrong = []
    for name, path in MODULES.items():
        if name.split(".")[0] != package:
            continue
        for imported in _imports(name, path):
            top = imported.split(".")[0]
            if top in PACKAGES and top != package and top not in ALLOWED[package]:
                wrong.append(f"{name} imports {imported}")
            if top in THIRD_PARTY_FORBIDDEN.get(package, ()):
                wrong.append(f"{name} imports {imported}")
    assert not wrong, "\n".join(wrong)


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan): each is a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def visit(n: str) -> None:
        index[n] = low[n] = len(index)
        stack.append(n)
        on_stack.add(n)
        for m in sorted(graph[n]):
            if m not in index:
                visit(m)
                low[n] = min(low[n], low[m])
            elif m in on_stack:
                low[n] = min(low[n], index[m])
        if low[n] == index[n]:
            component = []
            while True:
                m = stack.pop()
                on_stack.discard(m)
                component.append(m)
                if m == n:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for n in sorted(graph):
        if n not in index:
            visit(n)
    return circles


def test_no_import_circle_anywhere():
    """No module reaches itself through imports, in any package: at module level, inside a
    function, or only for type checking (a circle a reader has to hold in mind all the same).
    An edge to a top-level package (its __init__) does not count: every module imports it."""
    graph = {n: {m for m in targets if m not in PACKAGES} for n, targets in GRAPH.items()}
    circles = import_circles(graph)
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)
