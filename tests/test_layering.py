"""Dependencies point one way: floor <- audit <- tools <- policy <- lifecycle <- gateways,
with approvals beside the gateways (the lifecycle reaches it through a named hook and
after-commit signals), and the pages,
commands and wiring of every app on top. No two modules import each other, not even
through an import inside a function. docs/architecture.md draws the same picture.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

# No database, no Redis: the same on both backends (tests/conftest.py).
pytestmark = pytest.mark.backend_independent

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (
    "floor",
    "audit",
    "teams",
    "dispatcher",
    "approvals",
    "harness_site",
    "demo",
    "agentauth",
    "identity",
)

# Lower numbers are lower layers; a module may import its own layer and those below.
LAYERS = {
    "floor": -1,
    "audit": 0,
    "teams": 0,
    "tools": 1,
    "policy": 2,
    "lifecycle": 3,
    "gateways": 4,
    "approvals": 4,
    "interface": 5,
}
# Siblings on one layer that must not know each other.
STRANGERS = {("gateways", "approvals"), ("approvals", "gateways")}
# What a person or a process starts: pages, sockets, commands, admin, app wiring.
INTERFACE_LEAVES = {"views", "urls", "consumers", "routing", "admin", "apps", "checks"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    if (
        parts[0] in ("harness_site", "demo", "identity")
        or "management" in parts
        or "migrations" in parts
    ):
        return "interface"
    if parts[-1] in INTERFACE_LEAVES:
        return "interface"
    if parts[0] in ("floor", "audit", "teams"):
        return parts[0]
    if parts[0] == "approvals":
        return "approvals"
    if len(parts) > 1 and parts[1] in ("tools", "policy", "gateways"):
        return parts[1]
    return "lifecycle"


def project_modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" not in path.parts:
                found[module_name(path)] = path
    return found


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules imported anywhere in the file (top level or inside functions)."""
    own = module_name(path)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for name in names:
            # The longest project module the name starts with (a module or a name in it).
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != own and modules[name].name != "__init__.py":
                targets.add(name)
    return targets


def import_graph() -> dict[str, set[str]]:
    """A copy of the project's import graph, read once per run (every file parsed)."""
    return {name: set(targets) for name, targets in _import_graph().items()}


@functools.cache
def _import_graph() -> dict[str, frozenset[str]]:
    modules = project_modules()
    return {name: frozenset(imports_of(path, modules)) for name, path in modules.items()}


def test_every_module_imports_only_its_layer_and_those_below() -> None:
    wrong = []
    for source, targets in import_graph().items():
        here = layer_of(source)
        for target in targets:
            there = layer_of(target)
            if LAYERS[there] > LAYERS[here] or (here, there) in STRANGERS:
                wrong.append(f"{source} ({here}) imports {target} ({there})")
    assert not wrong, "Imports against the layering:\n" + "\n".join(sorted(wrong))


def test_no_import_cycles() -> None:
    graph = import_graph()
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*path[path.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "Import cycles:\n" + "\n".join(cycles)


def test_the_layer_test_sees_a_violation() -> None:
    """The classifier is not vacuous: a tool importing the lifecycle would be caught."""
    assert layer_of("dispatcher.tools.read_file") == "tools"
    assert layer_of("dispatcher.admission") == "lifecycle"
    assert LAYERS[layer_of("dispatcher.admission")] > LAYERS[layer_of("dispatcher.tools.base")]
    graph = import_graph()
    assert "dispatcher.policy.stages" in graph["dispatcher.admission"]
    assert "audit.services" in graph["dispatcher.transitions"]
