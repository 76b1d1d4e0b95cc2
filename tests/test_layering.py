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


def test_no_import_circle_in_testbed():
    """A depth-first search for a back edge among testbed's modules."""
    nodes = sorted(n for n in GRAPH if n.split(".")[0] == "testbed")
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(GRAPH[n]):
            if not m.startswith("testbed") or m == "testbed":
                continue
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (cycle := visit(m)):
                return cycle
        stack.pop()
        state[n] = 2
        return None

    for n in nodes:
        if n not in state and (cycle := visit(n)):
            pytest.fail("import circle: " + " -> ".join(cycle))

